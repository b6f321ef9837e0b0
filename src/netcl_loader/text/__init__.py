"""Token data for language models: TokenFiles (nanoGPT and Megatron files, packed) and Mixture.

Token files are read in place through memory maps; the loader's workers cut
and pack each batch straight into its ring slot, as a dict of
``input_ids``, ``labels``, ``position_ids``, ``cu_seqlens`` and
``max_seqlen``, with the loader's guarantees: an order that is a pure
function of ``(seed, epoch)``, exact resume, the same batches for every
``num_workers``.
"""
from __future__ import annotations

from ._datasets import PACKINGS, Mixture, TokenFiles
from ._packing import IGNORE_INDEX

__all__ = ["TokenFiles", "Mixture", "IGNORE_INDEX", "PACKINGS"]

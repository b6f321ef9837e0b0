"""The PyTorch face: a ``torch.utils.data.DataLoader`` made by netcl_loader's engine.

Switching from PyTorch takes one changed import::

    from netcl_loader.torch import DataLoader      # was: from torch.utils.data import DataLoader

:class:`DataLoader` here is a subclass of ``torch.utils.data.DataLoader``:
frameworks that check for one (Lightning, Accelerate, Hugging Face's Trainer)
treat it as one.  Its attributes are the ones PyTorch sets, with PyTorch's
values and PyTorch's rules for reassignment; underneath, the engine of
:class:`netcl_loader.DataLoader` (the shared-memory ring, the persistent
worker pool, the compiled collate) makes the batches.  Importing this module
imports torch.

The package is layered, each module importing only those listed before it:
``samplers`` (the orders), ``hooks`` (into iterations and frameworks),
``loader`` (the ``DataLoader``), ``trainer`` (``TrainerMixin``).
"""
from .._errors import LoaderTimeout
from ..engine.worker_info import get_worker_info  # re-exported, as torch.utils.data has it
from .loader import DataLoader
from .samplers import EngineOrderSampler, random_split
from .trainer import TrainerMixin

__all__ = ["DataLoader", "EngineOrderSampler", "LoaderTimeout", "TrainerMixin",
           "get_worker_info", "random_split"]

# The public names show, pickle and are documented under the module users import
# them from: reprs, pickles and frameworks that re-create a loader from its class
# name it as ``netcl_loader.torch``, not the submodule that defines it.
for _public in (DataLoader, EngineOrderSampler, TrainerMixin, random_split):
    _public.__module__ = __name__
del _public

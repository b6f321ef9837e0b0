"""SharedBatchRingBuffer: a ring of batch slots in shared memory, usable across processes.

The public face of the engine's ring (``netcl_loader.engine.ring``): the same
ring the loaders' workers write, usable on its own.  A producer claims a slot
(:meth:`~SharedBatchRingBuffer.acquire`), writes a batch into it and publishes it
(:meth:`~SharedBatchRingBuffer.write`, or both at once with
:meth:`~SharedBatchRingBuffer.put`); a consumer waits for the oldest published
batch (:meth:`~SharedBatchRingBuffer.wait_ready`), reads it as copies or views
and frees the slot (:meth:`~SharedBatchRingBuffer.get` does all three).  Pickle
the ring into a process while it starts to share it.

``convert_output`` applies a loader's ``output`` rule (NumPy, torch) to a batch
read from a ring.
"""
from ._ring import SharedMemoryError
from .engine.output import convert_output
from .engine.ring import SharedBatchRingBuffer, SlotOverflowError

__all__ = ["SharedBatchRingBuffer", "SlotOverflowError", "SharedMemoryError", "convert_output"]

# Shown, pickled and documented under this module's name, where users import them.
for _public in (SharedBatchRingBuffer, SlotOverflowError):
    _public.__module__ = __name__
del _public

"""The engine: the Python half of the loader under both faces.

Not a public API: users reach it through ``netcl_loader.DataLoader`` and
``netcl_loader.torch.DataLoader``.  It sits on the compiled core (``_ring``,
``_slots``, ``_collate``, ``_seed`` and the ``_protocol``/``_errors`` modules
they share) and the ``stats`` recorder, and imports nothing above it: never
``dataloader``, ``torch``, ``images``, ``text``, ``remote`` or ``selftest``.

Modules, bottom to top:

- ``deadline``, ``tree``, ``system``: waits sliced by a deadline, the one walker over
  a batch's structure, memory and CPU limits;
- ``options``, ``order``, ``position``: the checked arguments (frozen groups by
  concern), the order of an epoch (pure functions), where a loader stands;
- ``layout``, ``output``: a batch in its slot, and the rule for what a batch is
  handed out as;
- ``worker_info``, ``seeding``, ``batches``: what a worker is, its seeds, and the
  batch makers both paths use;
- ``lifeline``, ``worker``: a worker's tie to its parent, and its loop;
- ``pool``, ``epoch``: the worker processes and one epoch's dispatch and delivery.
"""

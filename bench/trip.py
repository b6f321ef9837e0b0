"""One batch's trip: the package's files and functions one ``next()`` runs in the main process.

    python bench/trip.py

Counts, with ``sys.setprofile``, the functions of ``netcl_loader`` that one
steady-state ``next()`` calls (after five warm-up batches), for the NumPy and
the PyTorch face, in-process (``num_workers=0``: the batch is made in this
process) and with two workers (the batch is received from a slot).  A batch not
yet published when asked for adds the wait path (``_wait``, ``Deadline``,
``Pool.kick_all``): run it on a quiet machine.
"""
import os
import sys

import numpy as np

import netcl_loader

PACKAGE = os.path.dirname(netcl_loader.__file__)
SAMPLES, BATCH, WARM = 4096, 32, 5


class Arrays:
    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return np.full((3, 32, 32), i % 251, np.uint8), i


def trip(loader):
    """``[(file, function)]`` the package runs for one ``next()``, in first-call order."""
    it = iter(loader)
    for _ in range(WARM):
        next(it)
    seen = {}

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            key = (os.path.relpath(frame.f_code.co_filename, PACKAGE), frame.f_code.co_qualname)
            seen.setdefault(key, None)

    sys.setprofile(profile)
    try:
        next(it)
    finally:
        sys.setprofile(None)
    del it
    return list(seen)


def show(name, calls):
    files = sorted({f for f, _ in calls})
    print(f"{name}: {len(files)} files, {len(calls)} functions")
    for f, fn in calls:
        print(f"    {f}:{fn}")


def main():
    for workers in (0, 2):
        show(f"NumPy face, num_workers={workers}",
             trip(netcl_loader.DataLoader(Arrays(), batch_size=BATCH, num_workers=workers)))
    try:
        import torch
        from netcl_loader.torch import DataLoader
    except ImportError:
        print("PyTorch face: torch is not installed")
        return

    class Tensors(torch.utils.data.Dataset):
        def __len__(self):
            return SAMPLES

        def __getitem__(self, i):
            return torch.full((3, 32, 32), i % 251, dtype=torch.uint8), i

    for workers in (0, 2):
        show(f"PyTorch face, num_workers={workers}",
             trip(DataLoader(Tensors(), batch_size=BATCH, shuffle=True, num_workers=workers)))


if __name__ == "__main__":
    main()

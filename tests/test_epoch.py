"""The epoch iterator's delivery modes (_epoch.DELIVERY) and the leases that free slots (_pool)."""
import gc

import numpy as np
import pytest

from netcl_loader import ArrayDataset, DataLoader
from netcl_loader._epoch import DELIVERY, MAX_LENT_SLOTS
from netcl_loader._pool import LEASE_NEXT_CALL, LEASE_REFS, LEASE_UPLOAD
from netcl_loader.shared_batch import COPY, LEND, VIEW

N, B = 64, 4


def _loader(**kw):
    data = np.arange(N * 8, dtype=np.float32).reshape(N, 8)
    return DataLoader(ArrayDataset(data, np.arange(N)), batch_size=B, shuffle=False,
                      num_workers=2, seed=0, **kw)


def _in_ring(loader, arr):
    """True when ``arr``'s memory lies in one of the loader's ring slots."""
    ring = loader._pool.ring
    p = arr.__array_interface__["data"][0]
    return any(seg is not None and seg.address <= p < seg.address + seg.nbytes
               for seg in (ring.segment(i) for i in range(ring.num_slots)))


def _warm(it, loader):
    """Batches until they come from the ring (the first ones size the slots by pipe)."""
    while True:
        x, y = next(it)
        if _in_ring(loader, x):
            return x, y


def test_the_table_has_one_row_per_mode():
    assert DELIVERY == {"lend": (LEND, LEASE_REFS), "zero_copy": (VIEW, LEASE_NEXT_CALL),
                        "copy": (COPY, None)}


def test_lend_keeps_the_slot_until_the_caller_drops_every_array():
    with _loader() as dl:
        it = iter(dl)
        x, y = _warm(it, dl)
        pool = dl._pool
        kinds = [k for k, _ in pool.leases.values()]
        assert kinds.count(LEASE_REFS) == 1
        first = x[0, 0]
        next(it)  # x still held: its slot stays leased
        assert sum(1 for k, _ in pool.leases.values() if k == LEASE_REFS) == 2
        assert x[0, 0] == first and x.flags.writeable
        del x, y
        gc.collect()
        next(it)  # the dropped batch's slot is reclaimed at this call
        assert sum(1 for k, _ in pool.leases.values() if k == LEASE_REFS) <= 2


def test_zero_copy_views_expire_at_the_next_call():
    with _loader(zero_copy=True) as dl:
        it = iter(dl)
        x, _ = _warm(it, dl)
        pool = dl._pool
        assert not x.flags.writeable
        assert [k for k, _ in pool.leases.values()] == [LEASE_NEXT_CALL]
        next(it)
        assert [k for k, _ in pool.leases.values()] == [LEASE_NEXT_CALL]  # only the new one


def test_copy_frees_the_slot_at_once_when_the_caller_keeps_more_than_the_lent_slots():
    with _loader() as dl:
        it = iter(dl)
        kept = [_warm(it, dl)]
        kept += [next(it) for _ in range(MAX_LENT_SLOTS + 2)]
        lent = [b for b in kept if _in_ring(dl, b[0])]
        assert len(lent) == MAX_LENT_SLOTS
        copies = kept[MAX_LENT_SLOTS:]
        assert all(not _in_ring(dl, b[0]) for b in copies)
        assert sum(1 for k, _ in dl._pool.leases.values() if k == LEASE_REFS) == MAX_LENT_SLOTS
        rest = list(it)
        got = np.concatenate([b[1] for b in kept + rest])
        assert got.tolist() == list(range(got[0], N))


def test_an_upload_leases_its_slot_until_the_copies_complete(cl_queue):
    pytest.importorskip("pyopencl")
    with _loader() as dl:
        dl.bind_queue(cl_queue)
        it = iter(dl)
        seen_upload_lease = False
        for _ in range(8):
            gb = next(it)
            kinds = [k for k, _ in dl._pool.leases.values()]
            seen_upload_lease |= LEASE_UPLOAD in kinds
            gb.wait()
        assert seen_upload_lease
        dl.bind_queue(None)  # waits for pending copies and frees their slots
        assert LEASE_UPLOAD not in [k for k, _ in dl._pool.leases.values()]

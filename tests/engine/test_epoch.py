"""The epoch iterator's delivery modes (_epoch.DELIVERY) and the leases that free slots (_slots)."""
import gc

import numpy as np
import pytest

from netcl_loader import ArrayDataset, DataLoader
from netcl_loader.engine.epoch import DELIVERY, MAX_LENT_SLOTS
from netcl_loader._slots import LEASE_NEXT_CALL, LEASE_REFS, LEASE_UPLOAD
from netcl_loader.engine.layout import COPY, LEND, VIEW

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
        kinds = [k for k, _ in pool.slots.leases.values()]
        assert kinds.count(LEASE_REFS) == 1
        first = x[0, 0]
        next(it)  # x still held: its slot stays leased
        assert sum(1 for k, _ in pool.slots.leases.values() if k == LEASE_REFS) == 2
        assert x[0, 0] == first and x.flags.writeable
        del x, y
        gc.collect()
        next(it)  # the dropped batch's slot is reclaimed at this call
        assert sum(1 for k, _ in pool.slots.leases.values() if k == LEASE_REFS) <= 2


def test_zero_copy_views_expire_at_the_next_call():
    with _loader(zero_copy=True) as dl:
        it = iter(dl)
        x, _ = _warm(it, dl)
        pool = dl._pool
        assert not x.flags.writeable
        assert [k for k, _ in pool.slots.leases.values()] == [LEASE_NEXT_CALL]
        next(it)
        assert [k for k, _ in pool.slots.leases.values()] == [LEASE_NEXT_CALL]  # only the new one


def test_copy_frees_the_slot_at_once_when_the_caller_keeps_more_than_the_lent_slots():
    with _loader() as dl:
        it = iter(dl)
        kept = [_warm(it, dl)]
        kept += [next(it) for _ in range(MAX_LENT_SLOTS + 2)]
        lent = [b for b in kept if _in_ring(dl, b[0])]
        assert len(lent) == MAX_LENT_SLOTS
        copies = kept[MAX_LENT_SLOTS:]
        assert all(not _in_ring(dl, b[0]) for b in copies)
        assert sum(1 for k, _ in dl._pool.slots.leases.values() if k == LEASE_REFS) == MAX_LENT_SLOTS
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
            kinds = [k for k, _ in dl._pool.slots.leases.values()]
            seen_upload_lease |= LEASE_UPLOAD in kinds
            gb.wait()
        assert seen_upload_lease
        dl.bind_queue(None)  # waits for pending copies and frees their slots
        assert LEASE_UPLOAD not in [k for k, _ in dl._pool.slots.leases.values()]


# -- a second iter() while an iteration is still held ----------------------------------

MODES = [pytest.param({"num_workers": 0}, id="in-process"),
         pytest.param({"num_workers": 2}, id="ring"),
         pytest.param({"num_workers": 2, "use_shared_mem": False}, id="pipes")]


def _numbers(**kw):
    return DataLoader(list(range(100)), batch_size=10, shuffle=False, seed=0, **kw)


@pytest.mark.parametrize("mode", MODES)
def test_a_peek_inside_the_loop_warns_and_the_loop_raises_instead_of_stopping_short(mode):
    """``next(iter(loader))`` inside the loop over the same loader used to end the
    loop's iteration without a word (60 samples of 1,000 seen).  The new iter()
    warns, naming the batches left, and the loop's next ``next()`` raises."""
    with _numbers(**mode) as loader:
        seen = 0
        with pytest.raises(RuntimeError, match="ended by a newer iteration of the same loader"):
            for k, batch in enumerate(loader):
                seen += len(batch)
                if k == 3:
                    with pytest.warns(UserWarning, match="with 6 batches left") as caught:
                        peek = next(iter(loader))
        assert len(caught) == 1
        assert seen == 40
        assert peek.tolist() == list(range(10))  # the peek is a whole new iteration


@pytest.mark.parametrize("mode", MODES)
def test_zip_of_a_loader_with_itself_raises_instead_of_yielding_nothing(mode):
    with _numbers(**mode) as loader:
        with pytest.warns(UserWarning, match="with 10 batches left"):
            with pytest.raises(RuntimeError, match="newer iteration"):
                list(zip(loader, loader))
        # The loader itself is fine: the next epoch is whole.
        assert sum(len(b) for b in loader) == 100


@pytest.mark.parametrize("mode", MODES)
def test_a_validation_pass_over_the_training_loader_mid_epoch_is_not_a_quiet_cut(mode):
    with _numbers(**mode) as loader:
        train = iter(loader)
        trained = [next(train) for _ in range(4)]
        with pytest.warns(UserWarning, match="epoch 0, still held, with 6 batches left"):
            validated = sum(len(b) for b in loader)
        assert validated == 100
        with pytest.raises(RuntimeError, match="still had 6 batches to yield"):
            next(train)
        with pytest.raises(RuntimeError):  # every later call too, never a StopIteration
            next(train)
        assert len(trained) == 4


@pytest.mark.parametrize("mode", MODES)
def test_break_then_a_new_epoch_is_quiet(mode):
    """An iterator let go (a ``break``, then dropped) ends without a word, as does a
    one-off peek outside a loop and an iterator that yielded all its batches."""
    import warnings
    with _numbers(**mode) as loader, warnings.catch_warnings():
        warnings.simplefilter("error")
        for epoch in range(3):
            for k, batch in enumerate(loader):
                if k == 2:
                    break
        assert next(iter(loader)).tolist() == list(range(10))
        assert sum(len(b) for b in loader) == 100
        done = iter(loader)
        for _ in range(len(loader)):
            next(done)
        assert sum(len(b) for b in loader) == 100  # nothing was left: nothing to say
        with pytest.raises(StopIteration):
            next(done)


class _FailsAt:
    """Rows whose index ``bad`` raises."""

    def __init__(self, n, bad):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError(f"bad row {i}")
        return np.full(3, i, np.float32)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loop_left_by_a_dataset_error_is_let_go_quietly(num_workers):
    """A ``for`` loop that a dataset error ended has let its iterator go, as a
    ``break`` does: the next ``iter()`` neither warns nor finds it held, with
    the garbage collector off (no reference cycle through the error keeps the
    iterator alive), and the new epoch starts from its first batch."""
    import gc
    import warnings
    loader = DataLoader(_FailsAt(40, 13), batch_size=4, shuffle=False, num_workers=num_workers)
    gc.disable()
    try:
        with loader:
            with pytest.raises(KeyError, match="bad row 13"):
                for _ in loader:
                    pass
            with warnings.catch_warnings():
                warnings.simplefilter("error")   # a warning at iter() fails the test
                it = iter(loader)
            assert next(it)[0].tolist() == [0, 0, 0]   # a new epoch, from its start
    finally:
        gc.enable()


class _LongerThanItsLength:
    """A stream that yields more samples than ``__len__`` says (a hint)."""

    def __len__(self):
        return 4

    def __iter__(self):
        return iter(np.full(2, i, np.float32) for i in range(12))


def test_a_held_stream_past_its_length_is_not_ended_quietly():
    import warnings
    with DataLoader(_LongerThanItsLength(), batch_size=2, num_workers=0) as loader:
        first = iter(loader)
        for _ in range(2):            # as many batches as the length says, of 6
            next(first)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            second = iter(loader)
        assert any("unknown number of batches" in str(w.message) for w in caught)
        with pytest.raises(RuntimeError, match="newer iteration"):
            next(first)
        assert len(list(second)) == 6

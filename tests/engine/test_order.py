"""The order of an epoch, its batches, their number and resume checks: pure functions (_order)."""
import numpy as np
import pytest

from netcl_loader.engine.order import (STATE_KEYS, STATE_VERSION, Progress, check_state, global_order,
                                 group, index_batches, local_order, num_batches, numbered,
                                 shard_length)


def test_global_order_depends_on_seed_and_epoch_alone():
    a = global_order(100, 7, 3, True)
    assert sorted(a.tolist()) == list(range(100)) and a.dtype == np.int64
    assert np.array_equal(a, global_order(100, 7, 3, True))
    assert not np.array_equal(a, global_order(100, 7, 4, True))
    assert not np.array_equal(a, global_order(100, 8, 3, True))
    assert global_order(5, 7, 3, False).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("n,ws,drop_last", [(10, 3, False), (10, 3, True), (9, 3, False),
                                            (2, 4, False), (2, 4, True), (0, 2, False)])
def test_local_order_shards_as_distributed_sampler_does(n, ws, drop_last):
    order = np.arange(n, dtype=np.int64)[::-1].copy()
    total = (n // ws) * ws if drop_last else -(-n // ws) * ws
    padded = [order[i % n] for i in range(total)] if n else []
    shards = [local_order(order, r, ws, drop_last).tolist() for r in range(ws)]
    for r in range(ws):
        assert shards[r] == padded[r::ws]
        assert len(shards[r]) == shard_length(n, ws, drop_last)
    if not drop_last and n:
        assert set().union(*map(set, shards)) == set(order.tolist())


def test_index_batches_and_their_number():
    order = np.arange(10, dtype=np.int64)
    assert [b.tolist() for b in index_batches(order, 4, False)] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                                     [8, 9]]
    assert [b.tolist() for b in index_batches(order, 4, True)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(index_batches(order, None, False)) == 10
    assert (num_batches(10, 4, False), num_batches(10, 4, True), num_batches(10, None, True)) == \
        (3, 2, 10)
    assert list(group(iter(range(5)), 2, False)) == [[0, 1], [2, 3], [4]]
    assert list(group(iter(range(5)), 2, True)) == [[0, 1], [2, 3]]


def test_progress_keeps_a_prefix_and_the_done_batches_past_it():
    p = Progress()
    for seq in (1, 3, 0):
        p.mark(seq)
    assert p.snapshot() == (2, {3})
    p.mark(2)
    assert p.snapshot() == (4, set())
    assert [s for s, _ in numbered("abcdef", 2, {3, 5})] == [2, 4]


def _state(**over):
    mine = {"version": STATE_VERSION, "epoch": 1, "batches_done": 2, "extra_done": [4],
            "seed": 5, "dataset_len": 40, "batch_size": 4, "drop_last": False, "shuffle": True,
            "world_size": 1, "rank": 0}
    mine.update(over)
    return mine


def test_check_state_accepts_its_own_state():
    assert check_state(_state(), _state(), 10, False) == (1, 2, {4}, 5)


@pytest.mark.parametrize("key,value", [("extra_done", "123"), ("batches_done", 2.7),
                                       ("batches_done", "3"), ("batches_done", True),
                                       ("epoch", -5), ("seed", -1), ("extra_done", [1.5]),
                                       ("batches_done", 11), ("extra_done", [2]),
                                       ("version", 99), ("batch_size", 8)])
def test_check_state_names_the_key_and_value_it_refuses(key, value):
    with pytest.raises(ValueError, match=key):
        check_state(_state(**{key: value}), _state(), 10, False)


@pytest.mark.parametrize("key", STATE_KEYS)
def test_check_state_names_a_missing_key(key):
    state = _state()
    del state[key]
    with pytest.raises(ValueError, match=repr(key)):
        check_state(state, _state(), 10, False)


def test_check_state_wants_a_dict():
    with pytest.raises(TypeError, match="dict"):
        check_state([1, 2], _state(), 10, False)

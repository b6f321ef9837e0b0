"""Where a loader stands (_position.Position): epochs, resumes, carrying a position over."""
import pickle

import numpy as np
import pytest

from netcl_loader import ArrayDataset, DataLoader
from netcl_loader.engine.position import Position

DS = ArrayDataset(np.arange(40, dtype=np.float32).reshape(20, 2))


def test_set_epoch_keeps_a_resume_of_that_epoch_and_drops_any_other():
    p = Position()
    p.resume, p.order_start = (3, 2, set()), (3, 8)
    p.set_epoch(3)
    assert p.resume == (3, 2, set()) and p.order_start == (3, 8)
    p.set_epoch(4)
    assert p.resume is None and p.order_start is None
    assert p.next_iteration() == (4, 0, set(), None) and p.epoch_from_caller


def test_the_epoch_to_start_is_a_loaded_states_else_the_next():
    p = Position()
    p.next_epoch = 5
    assert p.epoch_to_start() == p.current_epoch() == 5
    p.resume = (2, 1, set())
    assert p.epoch_to_start() == p.current_epoch() == 2


def test_a_carried_position_pickles_and_is_taken_up_whole():
    p = Position()
    p.set_epoch(7)
    p.stopped, p.generation = (6, 3, {5}), 2
    q = Position()
    q.carry_over(pickle.loads(pickle.dumps(p.carried())))
    assert q.carried() == p.carried() and q.running() is None


def test_a_side_iteration_takes_the_next_epoch_and_the_loader_moves_past_it():
    p, side = Position(), Position()
    p.next_epoch = 4
    p.lend_next_epoch(side)
    assert (side.next_epoch, p.next_epoch) == (4, 5)


def test_the_loaders_state_round_trips_through_its_position():
    with DataLoader(DS, batch_size=4, num_workers=0, seed=1) as dl:
        it = iter(dl)
        first = [next(it)[0].tolist() for _ in range(2)]
        assert dl._position.in_iteration() and dl._position.current_epoch() == 0
        state = dl.state_dict()
        rest = [b[0].tolist() for b in it]
    assert (state["epoch"], state["batches_done"]) == (0, 2)
    with DataLoader(DS, batch_size=4, num_workers=0, seed=1) as dl:
        dl.load_state_dict(state)
        assert dl._position.resume == (0, 2, set())
        assert [b[0].tolist() for b in dl] == rest and len(first + rest) == 5


def test_a_refused_state_leaves_the_position_as_it_was():
    with DataLoader(DS, batch_size=4, num_workers=0, seed=1) as dl:
        state = dl.state_dict()
        before = dl._position.carried()
        with pytest.raises(ValueError, match="batch_size"):
            dl.load_state_dict({**state, "batch_size": 5})
        assert dl._position.carried() == before

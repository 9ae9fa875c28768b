"""The engine's side of a recall (kvpot.state.recall_cells) against a recording stand-in for the pot: what it
hands the runtime, when, and what a saved context holds (tests/test_infllm_lookup.py and
tests/test_infllm_distance.py check the same calls on the runtime itself)."""

from __future__ import annotations

import numpy as np
import pytest

from kvpot.policies.base import Fetch, Recall
from kvpot.state.recall_cells import SAVED, RecallCells, check_saved


class Recorder:
    """Records each runtime call; lookup_take hands back `fetched` (positions [L, n_blocks * block_size])."""

    def __init__(self, fetched=None):
        self.calls: list[tuple] = []
        self.fetched = fetched

    def lookup_set(self, store, cell0, n_blocks, n_local):
        self.calls.append(("lookup_set", store, cell0, n_blocks, n_local))

    def distance_set(self, cell0, n, distance):
        self.calls.append(("distance_set", cell0, n, distance))

    def lookup_hold(self, on):
        self.calls.append(("lookup_hold", on))

    def lookup_take(self, n_blocks, block_size):
        self.calls.append(("lookup_take", n_blocks, block_size))
        return None if self.fetched is None else (None, self.fetched)


class Store:
    def lookup_store(self):
        return "store"


L, H, M, N_INIT, BS, N_BLOCKS, N_LOCAL = 2, 3, 12, 4, 4, 2, 40


def recall(fetch: bool, distance: int | None) -> Recall:
    return Recall(k=np.zeros((L, H, M, 8), np.float32), v=np.zeros((L, H, M, 8), np.float32),
                  rope_from=np.zeros(M, np.int32), rope_to=0, positions=np.zeros((L, H, M), np.int64),
                  fetch=Fetch(first=N_INIT, n_blocks=N_BLOCKS, block_size=BS, n_local=N_LOCAL) if fetch else None,
                  distance=distance)


def test_apply_hands_the_runtime_the_lookup_and_the_distance_of_the_recalled_cells():
    pot = Recorder()
    rc = RecallCells(pot, Store())
    rc.apply(recall(fetch=True, distance=N_LOCAL), cell0=20)
    assert pot.calls == [("lookup_set", "store", 20 + N_INIT, N_BLOCKS, N_LOCAL), ("distance_set", 20, M, N_LOCAL)]
    assert rc.export() == {"_fetch_cell0": 20 + N_INIT, "_fetch_n": N_BLOCKS, "_fetch_bs": BS, "_fetch_local": N_LOCAL,
                           "_mem_cell0": 20, "_mem_n": M, "_mem_distance": N_LOCAL}
    rc.hold(True)
    assert pot.calls[-1] == ("lookup_hold", True)
    rc.after_compaction()
    pot.calls.clear()
    rc.hold(False)
    rc.book(np.zeros((L, H, 40), np.int64))
    assert pot.calls == []  # the runtime dropped both with the compaction: nothing left to hold or book


def test_a_recall_without_fetch_or_distance_hands_nothing():
    pot = Recorder()
    rc = RecallCells(pot, Store())
    rc.apply(recall(fetch=False, distance=None), cell0=5)
    rc.hold(True)
    assert pot.calls == []
    assert set(rc.export().values()) == {0}


def test_book_writes_the_fetched_stream_positions_into_their_cells():
    fetched = np.arange(L * N_BLOCKS * BS).reshape(L, N_BLOCKS * BS) + 100
    pot = Recorder(fetched)
    rc = RecallCells(pot, Store())
    rc.apply(recall(fetch=True, distance=None), cell0=10)
    positions = np.full((L, H, 30), -7, np.int64)
    rc.book(positions)
    c0 = 10 + N_INIT
    want = np.full((L, H, 30), -7, np.int64)
    for layer in range(L):
        for head in range(H):
            want[layer, head, c0:c0 + N_BLOCKS * BS] = fetched[layer]
    np.testing.assert_array_equal(positions, want)


def test_restore_sets_the_runtime_up_again_and_reads_an_older_context_as_none():
    pot = Recorder()
    saved = RecallCells(Recorder(), Store())
    saved.apply(recall(fetch=True, distance=N_LOCAL), cell0=8)
    rc = RecallCells(pot, Store())
    rc.restore(saved.export())
    assert rc.export() == saved.export()
    assert pot.calls == [("lookup_set", "store", 8 + N_INIT, N_BLOCKS, N_LOCAL), ("distance_set", 8, M, N_LOCAL)]
    older = RecallCells(Recorder(), Store())
    older.restore({"tokens_seen": 5})  # a context saved before the lookup and the distance existed
    assert older.export() == dict.fromkeys(SAVED, 0) and older.pot.calls == []


@pytest.mark.parametrize(("values", "message"), [
    ({"_fetch_cell0": 60, "_fetch_n": 2, "_fetch_bs": 3}, "recalled blocks run past the context's 64 cells"),
    ({"_mem_cell0": 60, "_mem_n": 5}, "memory cells run past the context's 64 cells"),
])
def test_check_saved_refuses_cells_past_the_context(values, message):
    with pytest.raises(ValueError, match=message):
        check_saved(values, 64)
    ok = dict(values)
    ok[next(iter(values))] -= 6  # the same cells, 6 earlier: inside
    check_saved(ok, 64)

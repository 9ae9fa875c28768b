"""The engine's side of a `Recall` that outlives the compaction it follows: the recalled cells the
runtime keeps treating apart until the next compaction (`Recall.fetch`: cells every ubatch's graph
refills from the policy's `lookup_store()`; `Recall.distance`: cells every query sees at one
distance). InfLLM is the method that asks for both today; the engine holds one `RecallCells` for any
policy and calls it at fixed points, so it never names a method's fields.

It imports nothing from the runtime: `kvpot.state.engine_state` checks a saved context's values with
`SAVED` and `check_saved` before any model loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kvpot.policies.base import Policy, Recall
    from kvpot.runtime.pot import Pot

_INT32_MAX = 2**31 - 1  # llama.cpp positions are int32

# What a saved context holds, under the names contexts have always used (ones saved before the lookup
# or the distance existed lack them: each reads as 0, none): name -> (type, smallest, largest), where
# "n_ctx" stands for the context's cell count (kvpot.state.engine_state.N_CTX)
SAVED = {
    "_fetch_cell0": (int, 0, "n_ctx"), "_fetch_n": (int, 0, "n_ctx"), "_fetch_bs": (int, 0, "n_ctx"),
    "_fetch_local": (int, 0, "n_ctx"), "_mem_cell0": (int, 0, "n_ctx"), "_mem_n": (int, 0, "n_ctx"),
    "_mem_distance": (int, 0, _INT32_MAX),
}


def check_saved(values: dict, n_ctx: int) -> None:
    """The saved cell ranges lie inside the context (types and ranges of each value are checked by
    the caller against SAVED); ValueError says which does not."""
    get = lambda name: values.get(name, 0)  # noqa: E731
    if get("_fetch_cell0") + get("_fetch_n") * get("_fetch_bs") > n_ctx:
        raise ValueError(f"engine's recalled blocks run past the context's {n_ctx} cells")
    if get("_mem_cell0") + get("_mem_n") > n_ctx:
        raise ValueError(f"engine's memory cells run past the context's {n_ctx} cells")


class RecallCells:
    """Cells [fetch_cell0, + fetch_n * fetch_bs) that the graph refills per ubatch (fetch_n = 0: none),
    and cells [mem_cell0, + mem_n) every query sees mem_distance positions back (mem_n = 0: none).

    The engine calls, in order: `apply` after appending a recall's cells, `book` after every decode,
    `hold` before a prompt (off) and an answer (on), `after_compaction` once the runtime dropped the
    cells, `export` / `restore` with a saved context."""

    def __init__(self, pot: Pot | None, policy: Policy | None):
        self.pot = pot
        self.policy = policy
        self.fetch_cell0 = self.fetch_n = self.fetch_bs = self.fetch_local = 0
        self.mem_cell0 = self.mem_n = self.mem_distance = 0

    def apply(self, rec: Recall, cell0: int) -> None:
        """The recall's cells now start at cell0: hand the runtime what treats them apart."""
        m = rec.k.shape[2]
        if rec.fetch is not None and rec.fetch.n_blocks:
            f = rec.fetch
            self.fetch_cell0, self.fetch_n, self.fetch_bs, self.fetch_local = cell0 + f.first, f.n_blocks, f.block_size, f.n_local
            self.set_lookup()
        if rec.distance is not None and m:
            self.mem_cell0, self.mem_n, self.mem_distance = cell0, m, rec.distance
            self.pot.distance_set(cell0, m, rec.distance)

    def set_lookup(self) -> None:
        """Turn the in-graph lookup on over the fetch cells, reading the policy's store."""
        self.pot.lookup_set(self.policy.lookup_store(), self.fetch_cell0, self.fetch_n, self.fetch_local)

    def book(self, positions: np.ndarray) -> None:
        """After a decode: write into positions [L, H, N] (in place) the stream positions of the tokens
        the in-graph lookup just put into its cells."""
        if not self.fetch_n:
            return
        got = self.pot.lookup_take(self.fetch_n, self.fetch_bs)
        if got is not None:
            pos = got[1]
            positions[:, :, self.fetch_cell0:self.fetch_cell0 + pos.shape[1]] = pos[:, None, :]

    def hold(self, on: bool) -> None:
        """on: later decodes keep the blocks the last lookup chose (an answer reads its question's
        blocks: one generated token's query is a poor choice of blocks, answers derail, measured in
        docs/benchmarks.md, InfLLM); off: each ubatch looks its blocks up again (a new turn)."""
        if self.fetch_n:
            self.pot.lookup_hold(on)

    def after_compaction(self) -> None:
        """The runtime dropped the lookup and the distance with the cells a compaction moved."""
        self.fetch_n = self.mem_n = 0

    def export(self) -> dict[str, int]:
        """The values a saved context holds (every key of SAVED)."""
        return {"_fetch_cell0": self.fetch_cell0, "_fetch_n": self.fetch_n, "_fetch_bs": self.fetch_bs,
                "_fetch_local": self.fetch_local, "_mem_cell0": self.mem_cell0, "_mem_n": self.mem_n,
                "_mem_distance": self.mem_distance}

    def restore(self, values: dict) -> None:
        """Take a saved context's values (a missing one is 0) and set the runtime up again; the
        policy's state, whose store the lookup reads, is loaded first."""
        get = lambda name: int(values.get(name, 0))  # noqa: E731
        self.fetch_cell0, self.fetch_n, self.fetch_bs, self.fetch_local = (
            get("_fetch_cell0"), get("_fetch_n"), get("_fetch_bs"), get("_fetch_local"))
        self.mem_cell0, self.mem_n, self.mem_distance = get("_mem_cell0"), get("_mem_n"), get("_mem_distance")
        if self.fetch_n:
            self.set_lookup()
        if self.mem_n:
            self.pot.distance_set(self.mem_cell0, self.mem_n, self.mem_distance)

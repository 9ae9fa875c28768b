"""H2O: keep the heavy hitters (most attended cells so far) and the recent cells."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvpot.errors import KvpotError
from kvpot.policies.base import Policy, PotView, TapRequest, keep_ends, keep_top_and_recent


@dataclass
class H2O(Policy):
    """H2O (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of
    Large Language Models"), with scores accumulated over every row of every chunk.

    heavy_ratio: the share of the budget given to heavy hitters (default 0.5, the paper's equal
                 split of the cache between heavy-hitter and recent tokens). The paper's
                 recent_ratio is the rest: `budget - heavy` most recent cells are kept, with
                 `heavy = round(budget * heavy_ratio)`; among the older cells the `heavy`
                 with the largest accumulated attention are kept, per (layer, head).
    """

    name = "h2o"
    heavy_ratio: float = 0.5
    # [L, H, N] float64: attention mass each cell has received since it entered the pot
    _acc: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.heavy_ratio <= 1.0:
            raise KvpotError(f"h2o: heavy_ratio must be between 0 and 1, got {self.heavy_ratio}")

    def before_chunk(self, n_tokens: int) -> TapRequest:
        return TapRequest(tap_last=-1)

    def after_chunk(self, view: PotView) -> None:
        shape = (view.n_layer, view.n_head_kv, view.n_cells)
        acc = self._acc if self._acc is not None else np.zeros(shape[:2] + (0,))
        if acc.shape[:2] != shape[:2] or acc.shape[2] > view.n_cells:
            raise ValueError(f"h2o: accumulator {acc.shape} does not fit the pot {shape}")
        acc = np.concatenate([acc, np.zeros(shape[:2] + (view.n_cells - acc.shape[2],))], axis=-1)
        if view.scores is not None:
            acc += view.scores
        self._acc = acc

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        self.check_budget(budget)
        if view.n_cells <= budget:
            return None
        if self._acc is None:  # nothing observed yet: keep the most recent cells
            return keep_ends(view.positions, 0, budget)
        if self._acc.shape != view.positions.shape:
            raise ValueError(f"h2o: accumulator {self._acc.shape} does not fit the pot {view.positions.shape}")
        heavy = round(budget * self.heavy_ratio)  # int(round(...)): Python 3 rounds half to even
        acc = self._acc
        return keep_top_and_recent(view.positions, heavy, budget - heavy,
                                   lambda older: np.take_along_axis(acc, older, axis=-1))

    def after_compaction(self, keep: np.ndarray) -> None:
        if self._acc is not None:
            self._acc = np.take_along_axis(self._acc, keep, axis=-1)

    def reset(self) -> None:
        self._acc = None

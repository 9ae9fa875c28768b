"""A toy pot policy, as small as a method can be: the file a new method starts from (docs/architecture.md,
"Adding a method"). tests/test_toy_policy.py registers it and reads a document with it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvpot.errors import KvpotError
from kvpot.policies.base import Policy, PotView


@dataclass
class EveryNth(Policy):
    """Keeps every stride-th token: of the cells held, those whose stream position is a multiple of
    `stride`, newest first, then the others, newest first, `budget` in all (per layer and KV head).

    stride: keep tokens at positions 0, stride, 2 * stride, ... first (default 2: every other token)
    """

    name = "every_nth"
    stride: int = 2

    def __post_init__(self) -> None:
        if self.stride < 1:
            raise KvpotError(f"every_nth: stride must be positive, got {self.stride}")

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        self.check_budget(budget)
        if view.n_cells <= budget:
            return None
        pos = view.positions
        # np.lexsort sorts by its last key first: on-stride cells before the others, then newest first
        order = np.lexsort((-pos, pos % self.stride != 0), axis=-1)
        return np.sort(order[..., :budget], axis=-1).astype(np.int64)

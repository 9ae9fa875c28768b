"""Full attention: the reference every pot policy is measured against."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvpot.policies.base import Policy, PotView


@dataclass
class FullAttention(Policy):
    """Full attention (no eviction): every token read stays in the KV cache.

    No parameters. `select` never evicts, so the document must fit the context; the engine
    refuses a longer one with a clear error.
    """

    name = "full"

    def cache_cells(self, budget: int, chunk: int) -> int:
        # nothing is distilled, so no chunk of room past the budget: a document of `budget` tokens
        # fits a context of budget + the answer's room, as in stock llama.cpp
        return budget

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        return None

"""Middle truncation, as LongBench (Bai et al. 2023) shortens prompts that exceed the context."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvpot.policies.base import Policy, PotView, keep_ends


@dataclass
class Truncate(Policy):
    """LongBench truncation (Bai et al. 2023, "LongBench: A Bilingual, Multitask Benchmark for
    Long Context Understanding"): a prompt longer than max_length keeps its first half and its
    last half and drops the middle.

    max_length is the pot budget. Of `budget` cells, per (layer, head), keep the `budget // 2`
    with the smallest stream positions and the `budget - budget // 2` with the largest.
    cr_rope: a truncated prompt is read again from position 0, so head and tail end up adjacent
             (default True; False keeps the original positions, an ablation)
    """

    name = "truncate"
    cr_rope: bool = True

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        self.check_budget(budget)
        if view.n_cells <= budget:
            return None
        return keep_ends(view.positions, budget // 2, budget - budget // 2)

"""SnapKV: keep the cells the last rows of the input attend to, clustered by pooling."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from kvpot.errors import KvpotError
from kvpot.policies.base import BudgetTooSmall, Policy, PotView, TapRequest, keep_ends, keep_top_and_recent

POOLINGS = ("avgpool", "maxpool")


def pool1d(x: np.ndarray, kernel: int, pooling: str) -> np.ndarray:
    """1-D pooling along the last axis, stride 1, padding kernel // 2 (odd kernel: same length).

    avgpool: torch's avg_pool1d with count_include_pad=True (zero padding, always divide by kernel).
    maxpool: torch's max_pool1d (padding never wins).
    """
    pad = kernel // 2
    width = [(0, 0)] * (x.ndim - 1) + [(pad, pad)]
    if pooling == "avgpool":
        windows = sliding_window_view(np.pad(x, width, constant_values=0.0), kernel, axis=-1)
        return windows.sum(axis=-1) / kernel
    if pooling == "maxpool":
        windows = sliding_window_view(np.pad(x, width, constant_values=-np.inf), kernel, axis=-1)
        return windows.max(axis=-1)
    raise ValueError(f"unknown pooling {pooling!r}")


@dataclass
class SnapKV(Policy):
    """SnapKV (Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before Generation"),
    applied after every chunk of a chunked prefill.

    window:  window_size, the observation window: the last rows of each chunk whose attention
             votes for the cells to keep; those rows' own tokens are always kept (default 32).
    kernel:  kernel_size of the pooling that clusters the votes (default 5, odd).
    pooling: "avgpool" (default) or "maxpool".
    The paper's max_capacity_prompt is the pot budget; the other `budget - window` cells are the
    top prefix cells by pooled vote, per (layer, head).
    """

    name = "snapkv"
    window: int = 32
    kernel: int = 5
    pooling: str = "avgpool"

    def __post_init__(self) -> None:
        if self.window < 1:
            raise KvpotError(f"snapkv: window must be >= 1, got {self.window}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise KvpotError(f"snapkv: kernel must be a positive odd number, got {self.kernel}")
        if self.pooling not in POOLINGS:
            raise KvpotError(f"snapkv: pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")

    def before_chunk(self, n_tokens: int) -> TapRequest:
        return TapRequest(tap_last=self.window)

    def check_budget(self, budget: int) -> None:
        if self.window >= budget:
            raise BudgetTooSmall(f"snapkv: budget ({budget}) must exceed window ({self.window})")

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        self.check_budget(budget)
        if view.n_cells <= budget:
            return None
        if view.scores is None:  # nothing tapped yet: keep the most recent cells
            return keep_ends(view.positions, 0, budget)
        # the window's own rows are the newest cells; of the older ones the top by pooled vote, with the
        # votes pooled over the older cells in stream order (clusters of neighbouring tokens)
        def pooled_votes(older: np.ndarray) -> np.ndarray:
            votes = np.take_along_axis(view.scores, older, axis=-1).astype(np.float64)
            return pool1d(votes, self.kernel, self.pooling)

        return keep_top_and_recent(view.positions, budget - self.window, self.window, pooled_votes)

"""StreamingLLM: attention sinks plus a sliding window of recent tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvpot.errors import KvpotError
from kvpot.policies.base import BudgetTooSmall, Policy, PotView, keep_ends


@dataclass
class StreamingLLM(Policy):
    """StreamingLLM (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks").

    n_sink: the paper's start_size, the initial tokens kept as attention sinks (default 4).
    The paper's recent_size is the rest of the budget: `budget - n_sink` most recent tokens.
    Chosen per (layer, head) by stream position.
    cr_rope: positions by place in the cache, not in the text, as the paper assigns them
            (section 3.2; default True; False keeps each token's original position, an ablation)
    """

    name = "streaming"
    n_sink: int = 4
    cr_rope: bool = True

    def __post_init__(self) -> None:
        if self.n_sink < 0:
            raise KvpotError(f"streaming: n_sink must be >= 0, got {self.n_sink}")

    def sink_tokens(self) -> int:
        return self.n_sink

    def check_budget(self, budget: int) -> None:
        if budget <= self.n_sink:
            raise BudgetTooSmall(f"streaming: the budget ({budget}) must exceed n_sink ({self.n_sink}) to leave room for "
                                 f"recent tokens (or lower n_sink: streaming:n_sink=N)", least=self.n_sink + 1)

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        self.check_budget(budget)
        if view.n_cells <= budget:
            return None
        return keep_ends(view.positions, self.n_sink, budget - self.n_sink)

"""Locret: evict by the causal importance trained retaining heads predict, keeping stabilizers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvpot.converters.adapter import RetainingHeads, read_retaining_heads
from kvpot.errors import KvpotError
from kvpot.policies.base import BudgetTooSmall, GraphPieces, Policy, PotView, TapRequest


@dataclass
class Locret(Policy, GraphPieces):
    """Locret (Huang et al. 2025, "Locret: Enhancing Eviction in Long-Context LLM Inference with Trained
    Retaining Heads", section 3.3 and Algorithm 1) on the pot.

    heads: the retaining-heads adapter GGUF (`kvpot convert locret`, `kvpot train locret`), checked
           against the model before use; empty: the heads shipped for a known model (models/)
    n_s:   stabilizer length: at every compaction the newest n_s cells of each (layer, KV head) are
           kept whatever their score, for a continuous local context (default: a quarter of the
           budget, at most the paper's 2500)
    n_loc: local length: the last n_loc prompt tokens are read without eviction. kvpot reads the
           question after the document and never evicts it, so this is the least room kept for it
           (default 100, as in the paper's table 2)
    The paper's budget b is the pot budget (--budget), its chunk size B the engine's chunk (--chunk).
    Each token's score is computed once, inside the llama.cpp graph, when the token is read
    (fc2(act(fc1([Q; K; V]))) on the layer's pre-RoPE projections, one score per KV head); the pot then
    keeps the top b per layer and KV head. Positions are renumbered after each eviction (CR-RoPE).

    Decision: the paper does not force stabilizers at the last chunk; a stream's last chunk is not
    known in advance here, so they are kept at every compaction (the ablation in its figure 4 shows
    stabilizers help and never hurt retrieval).
    """

    name = "locret"
    heads: str = ""
    n_s: int | None = None
    n_loc: int = 100
    cr_rope: bool = True
    # [L, H, N] float32: the predicted causal importance of each cell, from when its token was read
    _score: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.n_s is not None and self.n_s < 0:
            raise KvpotError(f"locret: n_s must be >= 0, got {self.n_s}")
        if self.n_loc < 0:
            raise KvpotError(f"locret: n_loc must be >= 0, got {self.n_loc}")

    # -- engine hooks ---------------------------------------------------------------------------

    adapter_kind = "locret"

    def retaining_heads(self, model_path: Path, shipped: Path | None = None) -> RetainingHeads:
        # without heads=, the heads shipped for a known model (handed in by the engine or the checks)
        path = Path(self.heads).expanduser() if self.heads else shipped
        if path is None:
            raise KvpotError("locret needs retaining heads for this model: --policy locret:heads=HEADS.gguf "
                             "(made by `kvpot train locret` or `kvpot convert locret`)")
        return read_retaining_heads(path, model=model_path)

    def cache_cells(self, budget: int, chunk: int) -> int:
        return budget + chunk + self.n_loc

    def before_chunk(self, n_tokens: int) -> TapRequest:
        return TapRequest(head_scores=True)

    def stabilizers(self, budget: int) -> int:
        n_s = self.n_s if self.n_s is not None else min(2500, budget // 4)
        if n_s >= budget:
            raise BudgetTooSmall(f"locret: the budget ({budget}) must exceed the stabilizer length n_s ({n_s}) "
                                 f"(or lower it: locret:n_s=N)", least=n_s + 1)
        return n_s

    def check_budget(self, budget: int) -> None:
        super().check_budget(budget)
        self.stabilizers(budget)

    def after_chunk(self, view: PotView) -> None:
        n_new = view.chunk_positions.size
        L, H = view.positions.shape[:2]
        if view.head_scores is None and n_new:
            # ranking unscored cells would keep an arbitrary set while the run looks like Locret's
            raise KvpotError("locret: the chunk came back without retaining-head scores (the heads did not run); "
                             "Locret cannot rank the cells it read")
        if self._score is None:
            self._score = np.zeros((L, H, 0), dtype=np.float32)
        new = view.head_scores if n_new else np.zeros((L, H, 0), dtype=np.float32)
        if new.shape != (L, H, n_new):
            raise KvpotError(f"locret: chunk scores {new.shape} do not fit the chunk {(L, H, n_new)}")
        # the chunk is the last n_new cells; cells this policy never saw scored (a context reopened
        # from before it was chosen) rank lowest but above nothing: score 0
        unseen = view.n_cells - n_new - self._score.shape[2]
        if unseen < 0 or self._score.shape[:2] != (L, H):
            raise KvpotError(f"locret: {self._score.shape} scores do not fit a pot of {view.positions.shape}")
        self._score = np.concatenate([self._score, np.zeros((L, H, unseen), np.float32), new.astype(np.float32)],
                                     axis=2)

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        n_s = self.stabilizers(budget)
        if view.n_cells <= budget:
            return None
        if self._score is None or self._score.shape != view.positions.shape:
            got = "no scores" if self._score is None else f"scores for {self._score.shape}"
            raise KvpotError(f"locret: {got} for a pot of {view.positions.shape} cells; Locret evicts only "
                             "by its retaining heads' scores")
        # Algorithm 1: the newest n_s cells get +inf, then the top b by score, per (layer, head)
        rank = self._score.astype(np.float64).copy()
        order = np.argsort(view.positions, axis=-1, kind="stable")
        if n_s:
            np.put_along_axis(rank, order[..., -n_s:], np.inf, axis=-1)
        top = np.argsort(-rank, axis=-1, kind="stable")[..., :budget]
        return np.sort(top, axis=-1).astype(np.int64, copy=False)

    def after_compaction(self, keep: np.ndarray) -> None:
        if self._score is not None:
            self._score = np.take_along_axis(self._score, keep, axis=-1)

    def reset(self) -> None:
        self._score = None

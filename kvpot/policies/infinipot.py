"""InfiniPot: continual context distillation (CCD) with a catalyst prompt (CaP) and novelty (NuC)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvpot.errors import KvpotError
from kvpot.policies.base import BudgetTooSmall, Catalyst, GraphPieces, Policy, PotView, QuestionFirst, TapRequest
from kvpot.policies.snapkv import POOLINGS, pool1d

# Table 2 of the paper. CaP-Q's row is partly illegible in our copy; we append the question to CaP-G.
CATALYSTS = {
    "G": "Summarize the critical points highlighted in this section.",
    "G1": "Summarize this section.",
    "G2": "Highlight the critical points from this section.",
    "P": "\n\n\n",
    "U": "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",
}
CAP_CHOICES = ("auto", "Q", "none", "custom", *CATALYSTS)


def cap_q(question: str) -> str:
    return f"{CATALYSTS['G']} Question: {question.strip()}"


@dataclass
class InfiniPot(Policy, QuestionFirst, Catalyst, GraphPieces):
    """InfiniPot (Kim et al. 2024), section 3 and appendix B.

    pot:        |M|, cells the memory pot holds before a distillation (default: --budget, so the pot
                never holds more than the budget; a pot above --budget is refused)
    keep:       |C|, cells kept by each distillation, |C| < |M| (default |M| / 2, the paper's ratio:
                its main setting is |M| = 4096 with |C| = 2048)
    nuc_ratio:  alpha, share of |C| given to the highest-NuC tokens, T = alpha * |C| (default 0.5)
    cap:        catalyst prompt: "auto" (CaP-Q when the question is known before reading, else
                CaP-G), "G", "G1", "G2", "P", "U", "Q", "custom" (cap_text) or "none" (no CaP:
                the slots NuC leaves go to the most recent tokens, the paper's "CCD w/o CaP")
    cap_text:   the catalyst for cap="custom"
    cr_rope:    CR-RoPE, positions restart at 0..|C|-1 after each distillation (section 3.5)
    kernel:     not in the paper: CaP's scores pooled over each head's cells in stream order before
                the selection, as SnapKV's codebase (which the paper's implementation follows) pools its
                votes, so the neighbours of a token the catalyst attends to go with it: the digits of a
                code after the words a question shares with it (docs/benchmarks.md, "What loses the
                digits"). 1 (default): no pooling, the paper's selection; odd numbers above 1 pool.
    pooling:    "maxpool" (default: a neighbour of an attended token scores as that token) or "avgpool"
    n_sink:     not in the paper: the first n_sink tokens of the stream stay in every head (default 4),
                StreamingLLM's attention sinks. The paper's models start with a BOS that takes so much
                attention that CaP keeps it anyway; a model without BOS (SmolLM2) uses its first
                tokens as sinks, and with NuC taking half of |C| CaP dropped them in some heads,
                which broke the answer (docs/benchmarks.md). 0 gives the paper's selection exactly.

    Each distillation: the catalyst is decoded after the pot and its rows tapped (eq. 2, per
    layer and KV head), NuC is -log p of each token when it was read (eq. 4), T cells with the
    highest NuC are taken first and the rest per head by CaP mass (appendix B), catalyst cells
    are never kept.
    """

    name = "infinipot"
    pot: int | None = None
    keep: int | None = None
    nuc_ratio: float = 0.5
    cap: str = "auto"
    cap_text: str = ""
    cr_rope: bool = True
    kernel: int = 1
    pooling: str = "maxpool"
    n_sink: int = 4
    _question: str | None = field(default=None, init=False, repr=False, compare=False)
    _nuc: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.pot is not None and self.keep is not None:
            self._check_sizes()
        elif (self.keep is not None and self.keep < 1) or (self.pot is not None and self.pot < 2):
            raise KvpotError(f"infinipot: keep (|C|) must be at least 1 and pot (|M|) at least 2, got "
                             f"keep={self.keep}, pot={self.pot}")
        if not 0.0 <= self.nuc_ratio <= 1.0:
            raise KvpotError(f"infinipot: nuc_ratio must be within [0, 1], got {self.nuc_ratio}")
        if self.cap not in CAP_CHOICES:
            raise KvpotError(f"infinipot: cap must be one of {', '.join(CAP_CHOICES)}, got {self.cap!r}")
        if self.n_sink < 0:
            raise KvpotError(f"infinipot: n_sink must be >= 0, got {self.n_sink}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise KvpotError(f"infinipot: kernel must be a positive odd number (1: no pooling), got {self.kernel}")
        if self.pooling not in POOLINGS:
            raise KvpotError(f"infinipot: pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.cap == "custom" and not self.cap_text.strip():
            raise KvpotError("infinipot: cap=custom needs cap_text")

    def _check_sizes(self) -> None:
        if not 1 <= self.keep < self.pot:
            raise KvpotError(f"infinipot: keep (|C| = {self.keep}) must be at least 1 and below pot (|M| = {self.pot})")
        if not 0 <= self.n_sink < self.keep:
            raise KvpotError(f"infinipot: n_sink must be within [0, keep = {self.keep}), got {self.n_sink}")

    def _sizes(self) -> tuple[int, int]:
        if self.pot is None or self.keep is None:
            raise KvpotError("internal: infinipot's pot and keep are set by fit(budget, chunk) before reading")
        return self.pot, self.keep

    # -- hooks ----------------------------------------------------------------------------------

    def check_budget(self, budget: int) -> None:
        """The pot is the budget unless pot= sets it, |C| half the pot unless keep= sets it; a budget
        that leaves |C| no larger than the sinks, or a pot above the budget, is refused with the least
        budget that works (None: only pot=, keep= or n_sink= can fix it)."""
        super().check_budget(budget)
        if self.pot is not None:
            if self.pot > budget:
                raise BudgetTooSmall(f"infinipot: pot (|M| = {self.pot}) is more than --budget {budget}: the pot "
                                     "never holds more than the budget (lower pot or raise --budget)", least=self.pot)
            return
        keep = self.keep if self.keep is not None else budget // 2
        if 1 <= keep < budget and 0 <= self.n_sink < keep:
            return
        if self.keep is None:  # |C| = budget // 2 must hold the sinks and one more cell
            least = 2 * (max(self.n_sink, 0) + 1)
        else:
            least = self.keep + 1 if 0 <= self.n_sink < self.keep else None
        raise BudgetTooSmall(f"infinipot: n_sink must be within [0, keep = {keep}), got {self.n_sink} (--budget "
                             f"{budget} is a pot of |M| = {budget} cells keeping |C| = {keep}, which must hold "
                             "the sinks and at least one more)", least=least)

    def fit(self, budget: int, chunk: int) -> None:
        self.check_budget(budget)
        if self.pot is None:
            self.pot = budget
        if self.keep is None:
            self.keep = self.pot // 2
        self._check_sizes()

    def set_question(self, text: str) -> None:
        self._question = text

    def cache_cells(self, budget: int, chunk: int) -> int:
        return self._sizes()[0]  # the pot never grows past |M|

    def budget_at(self, step: int, budget: int) -> int:
        return self._sizes()[1]

    def before_chunk(self, n_tokens: int) -> TapRequest:
        return TapRequest(logprobs=self.wants_logprobs())

    def wants_logprobs(self) -> bool:
        return self.nuc_ratio > 0

    def wants_compaction(self, n_cells: int, budget: int, next_chunk: int) -> bool:
        # next_chunk already includes the catalyst's length (the engine adds it)
        return n_cells + next_chunk > self._sizes()[0]

    def sink_tokens(self) -> int:
        return self.n_sink

    def catalyst_text(self) -> str | None:
        if self.cap == "none":
            return None
        if self.cap == "custom":
            return self.cap_text
        if self.cap == "Q" or (self.cap == "auto" and self._question):
            return cap_q(self._question or "")
        return CATALYSTS["G" if self.cap == "auto" else self.cap]

    def after_chunk(self, view: PotView) -> None:
        L, H = view.positions.shape[:2]
        n_new = view.chunk_positions.size
        if self._nuc is None:
            self._nuc = np.zeros((L, H, 0), dtype=np.float32)
        new = np.zeros(n_new, dtype=np.float32)
        if view.logprobs is not None:
            new = np.nan_to_num(-view.logprobs.astype(np.float32), nan=0.0)  # the stream's first token has none
        self._nuc = np.concatenate([self._nuc, np.broadcast_to(new, (L, H, n_new))], axis=2)

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        C = self._sizes()[1]
        real = view.positions >= 0                                  # catalyst cells are -1
        n_real = int(real[0, 0].sum())
        if n_real <= C:
            raise KvpotError(f"infinipot: the pot holds {n_real} tokens, not more than keep ({C}); raise pot or lower keep")
        nuc = self._padded_nuc(view.n_cells)
        scores = view.scores
        if scores is not None and self.kernel > 1:
            scores = pool_cap(scores, view.positions, self.kernel, self.pooling)
        return select_ccd(scores, nuc, view.positions, C, self.nuc_ratio, self.n_sink)

    def after_compaction(self, keep: np.ndarray) -> None:
        if self._nuc is not None:
            self._nuc = np.take_along_axis(self._padded_nuc(int(keep.max()) + 1), keep, axis=2)

    def reset(self) -> None:
        self._nuc = None
        self._question = None

    def _padded_nuc(self, n_cells: int) -> np.ndarray:
        """NuC per cell; catalyst cells (appended after the last chunk) get 0."""
        nuc = self._nuc
        if nuc.shape[2] < n_cells:
            pad = np.zeros(nuc.shape[:2] + (n_cells - nuc.shape[2],), dtype=np.float32)
            nuc = np.concatenate([nuc, pad], axis=2)
        return nuc[:, :, :n_cells]


def pool_cap(scores: np.ndarray, positions: np.ndarray, kernel: int, pooling: str) -> np.ndarray:
    """CaP's scores [L, H, cells] pooled along each head's cells, which hold the stream in order (a
    distillation keeps cells in order and chunks are appended), over the document's cells only: the
    catalyst's cells (position -1, after the last chunk) neither pool nor are pooled into."""
    real = positions >= 0
    fill = 0.0 if pooling == "avgpool" else -np.inf
    pooled = pool1d(np.where(real, scores.astype(np.float64), fill), kernel, pooling)
    return np.where(real, pooled, scores)


def select_ccd(scores: np.ndarray | None, nuc: np.ndarray, positions: np.ndarray, keep: int,
               nuc_ratio: float, n_sink: int = 0) -> np.ndarray:
    """Appendix B: T = alpha*|C| highest-NuC cells first (their CaP score raised to the maximum), then
    per (layer, head) the top |C| by CaP score; catalyst cells (position -1) are never chosen.
    Without CaP scores, recency (stream position) ranks the remaining slots. Before all of them, the
    cells holding the stream's first n_sink tokens (the attention sinks), in every head."""
    real = positions >= 0
    rep = scores.astype(np.float64) if scores is not None else positions.astype(np.float64)
    rep = np.where(real, rep, -np.inf)
    top = np.nanmax(rep, axis=2, keepdims=True)
    T = round(nuc_ratio * keep)
    if T > 0:
        novelty = np.where(real, nuc.astype(np.float64), -np.inf)
        # the sinks are kept anyway: NuC's T slots go to other tokens
        novelty = np.where(real & (positions < n_sink), -np.inf, novelty)
        top_nuc = np.argsort(-novelty, axis=2, kind="stable")[:, :, :T]
        np.put_along_axis(rep, top_nuc, np.broadcast_to(top + 1.0, top_nuc.shape), axis=2)
    if n_sink:
        rep = np.where(real & (positions < n_sink), top + 2.0, rep)
    chosen = np.argsort(-rep, axis=2, kind="stable")[:, :, :keep]
    return np.sort(chosen, axis=2)

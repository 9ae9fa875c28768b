"""IMDC: a pruner run with incremental memory and, optionally, decremental chunks."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvpot.errors import KvpotError
from kvpot.policies.base import BudgetTooSmall, ExternalMemory, GraphPieces, LengthAware, Policy, PotView, Wrapping
from kvpot.policies.full_attention import FullAttention
from kvpot.policies.imdc_schedule import (
    FUNCTIONS,
    PER_LAYER,
    adaptive_memory,
    chunk_schedule,
    memory_schedule,
    n_chunks,
    retention_ratio,
    square_sqrt_layers,
)
from kvpot.policies.registry import POLICIES
from kvpot.policies.wrappers import KeyRerotation, PerLayerBudgets

# IMDC sizes every step itself: the tokens it reads (chunk_size), when it compacts (wants_compaction) and
# the cells that survive (budget_at); its pruner only chooses which cells those are, within the budget it
# is handed. A policy that sizes one of these its own way, or keeps cells outside that budget, would hold
# more than m_i (or m_max): it cannot be IMDC's pruner. hook -> (where its default is, why)
_OWN_SIZING = {
    "budget_at": (Policy, "keeps a number of cells of its own after each step (not IMDC's m_i)"),
    "chunk_size": (Policy, "reads in steps of its own size (not IMDC's c_i)"),
    "wants_compaction": (Policy, "decides its own compactions"),
    "recall": (ExternalMemory, "brings back cells from a memory outside the pot after each compaction"),
    "memory_fold": (GraphPieces, "folds cells into a memory of its own"),
}

# where the cells' RoPE positions go after each compaction (IMDC's `positions`)
POSITIONS = ("reencode", "pruner")


def unfit_pruner(cls: type) -> str | None:
    """Why a pruner of policy class `cls` cannot keep within the budgets IMDC hands it, or None when it can."""
    if cls.select in (Policy.select, FullAttention.select):
        return "keeps every cell it reads"
    for hook, (owner, why) in _OWN_SIZING.items():
        if getattr(cls, hook, None) not in (None, getattr(owner, hook)):
            return why
    return None


@dataclass
class IMDC(Wrapping, LengthAware):
    """IMDC ("Memorize Step by Step: Efficient Long-Context Prefilling with Incremental Memory and
    Decremental Chunk", section 3 and appendix A.1) around a pruner, as kvpress's ChunkPress(press):
    IMDC decides how many tokens each step reads and how many cells survive it; the pruner
    (SnapKV, StreamingLLM, ...) decides which cells those are.

    pruner:            the policy that chooses the cells to keep (its taps and select), within the
                       budget IMDC hands it; a policy that keeps every cell (full) or sizes
                       its steps or memory itself (infinipot, edgeinfinite, infllm) is refused
    m_max:             maximum memory size, the cells kept after the last chunk (default: --budget;
                       an m_max above --budget is refused)
    chunk:             c, the average chunk size (default: --chunk, or m_max / 2 when that is larger:
                       with memory growing to m_max, eq. 6 gives the last steps c + m_hat - m_max
                       tokens, which stays positive only with c near m_max / 2 or above, the
                       paper's own ratio, m_max 1024 with c 512)
    function:          memory schedule m_i, floored to integers, m_{n-1} = m_max:
                       "fixed"  FM, m_i = m_max and c_i = c
                       "linear" eq. 1, m_i = (m_max - m_0) i / (n - 1) + m_0
                       "square" eq. 7, m_i = (m_max - m_0) i^2 / (n - 1)^2 + m_0
                       "sqrt"   eq. 8, m_i = (m_max - m_0) sqrt(i) / sqrt(n - 1) + m_0
                       per pot layer (the pot masks the cells a layer no longer holds):
                       "square-sqrt" appendix A.1, SQUARE in the lower half of the pot layers,
                                SQRT in the upper half; chunks planned with their mean
                       "adaptive" eq. 2-3, m_i^j = p_j / sum(p) N b_i with b_i the linear
                                schedule and p_j layer j's retention ratio (eq. 2) at the last
                                compaction; each layer within [m_0, m_max], the N layers
                                together N b_i (step 1, with no retention measured yet, b_1)
    decremental_chunk: IMDC, eq. 4-6: c_0 = c, c_i = c + m_hat - m_{i-1} with
                       m_hat = sum_{i=0}^{n-2} m_i / (n - 1), so the attention length
                       c_i + m_{i-1} stays at c + m_hat (up to one token of rounding);
                       False: IM, c_i = c (default True)
    m_0:               initial memory size (default floor(m_max / n), at least 1, section 4.1, and at
                       least the smallest budget the pruner works with: over many chunks (SnapKV's
                       33 cells at m_max 2048: past 62 chunks, 64K tokens with c 1024) the paper's
                       floor would hand the pruner fewer cells than it keeps)
    expected_tokens:   the input length to plan for when the engine has not declared one; the
                       engine declares it (set_expected_length) when it starts reading, so this
                       mostly sizes the context (cache_cells) before the first document
    positions:         "reencode" (default): after every compaction the kept cells are re-encoded to
                       positions 0..m_i-1 and the next chunk follows at m_i.. (CR-RoPE), as section 4.1
                       ("Iterative Compression") does: "encode position embedding for memory and
                       chunk at each iteration independently instead of reusing the position
                       embedding from the previous steps"; whatever the pruner's own choice.
                       "pruner": the pruner's own choice (its cr_rope): SnapKV and H2O keep every
                       token at its text position, StreamingLLM and truncation re-encode.
                       A context saved with a spec that predates this parameter reopens as it was
                       saved (the RoPE position of every saved key is in the file, docs/formats.md
                       `POT `); the parameter only decides the compactions after reopening, those of
                       a question read through the pot, which then re-encode like the rest of IMDC.

    n = ceil(T / c) for an input of T tokens (including the BOS the engine adds). The steps read
    exactly T tokens for any T: see chunk_schedule for which chunk gives up the n*c - T surplus.
    Steps past the schedule (a second feed of the same document) read c tokens and keep m_max.
    """

    name = "imdc"
    pruner: Policy
    m_max: int | None = None
    chunk: int | None = None
    function: str = "linear"
    decremental_chunk: bool = True
    m_0: int | None = None
    expected_tokens: int | None = None
    positions: str = "reencode"
    _declared: int | None = field(default=None, init=False, repr=False, compare=False)
    # (n_tokens, chunks, memory) of the last schedule computed
    _plan: tuple[int, np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)
    # pot layers (learned from the first view) and eq. 2's retention per layer at the last compaction
    _n_layer: int | None = field(default=None, init=False, repr=False, compare=False)
    _retention: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise KvpotError(f"imdc: positions must be one of {', '.join(POSITIONS)}, got {self.positions!r}")
        if self.function not in FUNCTIONS:
            raise KvpotError(f"imdc: function must be one of {', '.join(FUNCTIONS)}, got {self.function!r}")
        if not isinstance(self.pruner, Policy) or isinstance(self.pruner, IMDC):
            raise KvpotError(f"imdc: pruner must be a pruning policy (e.g. SnapKV()), got {self.pruner!r}")
        unfit = unfit_pruner(type(self.pruner))
        if unfit:
            fit = ", ".join(n for n, cls in POLICIES.items() if cls is not IMDC and unfit_pruner(cls) is None)
            raise KvpotError(f"imdc: pruner {self.pruner.name} {unfit}, so the memory would not stay within IMDC's "
                             f"budget; choose a pruner that drops cells to the budget it is given ({fit})")
        if self.function in PER_LAYER and type(self.pruner).after_compaction is not Policy.after_compaction:
            # a per-cell score carried across compactions (H2O) would have to follow padded keep lists
            raise KvpotError(f"imdc: function={self.function} sizes each layer separately and works with "
                             f"pruners that keep no per-cell state (snapkv, streaming), not {self.pruner.name}")
        if (self.m_max is not None and self.m_max < 1) or (self.chunk is not None and self.chunk < 1):
            raise KvpotError(f"imdc: m_max ({self.m_max}) and chunk ({self.chunk}) must be positive")
        self._check_m_0()  # against m_max once fit has set it
        if self.expected_tokens is not None and self.expected_tokens < 1:
            raise KvpotError(f"imdc: expected_tokens must be positive, got {self.expected_tokens}")

    def _check_m_0(self) -> None:
        if self.m_0 is not None and not 1 <= self.m_0 <= (self.m_max or self.m_0):
            raise KvpotError(f"imdc: m_0 must be within [1, m_max={self.m_max}], got {self.m_0}")

    def check_budget(self, budget: int) -> None:
        """m_max and m_0 never exceed the budget (the memory starts at m_0 and grows to m_max); then the
        pruner's own least budget."""
        if self.m_max is None and self.m_0 is not None and self.m_0 > budget:
            raise BudgetTooSmall(f"imdc: m_0 ({self.m_0}) is more than --budget {budget}: the memory starts at m_0 "
                                 "and grows to the budget (lower m_0 or raise --budget)", least=self.m_0)
        super().check_budget(budget)

    def fit(self, budget: int, chunk: int) -> None:
        self.check_budget(budget)
        from_budget = self.m_max is None
        if from_budget:
            self.m_max = budget
        elif self.m_max > budget:
            raise BudgetTooSmall(f"imdc: m_max ({self.m_max}) is more than --budget {budget}: the memory never "
                                 "holds more than the budget (lower m_max or raise --budget)")
        if self.chunk is None:
            self.chunk = max(chunk, -(-self.m_max // 2))
        self._check_m_0()
        try:
            self.pruner.fit(self.m_max, self.chunk)  # the pruner's own sizes; each step then gives it m_i
        except BudgetTooSmall as e:
            if from_budget:
                raise  # its `least` is the budget to ask for
            raise BudgetTooSmall(f"imdc: m_max ({self.m_max}) is too small for its pruner {self.pruner.name}, which "
                                 f"needs at least {e.least}: raise m_max") from None
        if self._length() is not None:
            self._schedule_arrays()

    def _sizes(self) -> tuple[int, int]:
        if self.m_max is None or self.chunk is None:
            raise KvpotError("internal: imdc's m_max and chunk are set by fit(budget, chunk) before reading")
        return self.m_max, self.chunk

    # -- the schedule ---------------------------------------------------------------------------

    def _length(self) -> int | None:
        return self._declared if self._declared is not None else self.expected_tokens

    def _schedule_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(chunks, memory) for the input length in force; refuses when none is known."""
        n_tokens = self._length()
        if n_tokens is None:
            raise KvpotError("imdc: the number of chunks needs the input length; none was declared, "
                             "so set expected_tokens (e.g. imdc:pruner=snapkv,expected_tokens=32768)")
        if self._plan is None or self._plan[0] != n_tokens:
            m_max, c = self._sizes()
            n = n_chunks(n_tokens, c)
            memory = memory_schedule(self.function, m_max, self._m_0(n), n)
            chunks = chunk_schedule(memory, c, n_tokens, self.decremental_chunk and self.function != "fixed")
            if chunks.min() < 1:
                i = int(np.argmin(chunks))
                raise KvpotError(
                    f"imdc: eq. 6 gives step {i} of {n} a chunk of {chunks[i]} tokens ({self.function} memory "
                    f"reaches {memory[i - 1]} cells before it); use a larger chunk, a smaller m_max, "
                    "another function or decremental_chunk=false")
            # the smallest memory any step gives the pruner (per-layer functions: down to m_0)
            smallest = int(memory.min()) if self.function not in PER_LAYER else min(int(memory.min()), self._m_0(n))
            try:
                self.pruner.check_budget(smallest)
            except BudgetTooSmall as e:
                needs = f"which needs at least {e.least}: set m_0 (imdc:...,m_0={e.least})" if e.least else f"({e}): set m_0"
                raise BudgetTooSmall(f"imdc: over {n} chunks the {self.function} schedule keeps as few as {smallest} "
                                     f"cells, too few for its pruner {self.pruner.name}, {needs} or raise the budget or "
                                     "the chunk") from None
            self._plan = (n_tokens, chunks, memory)
        return self._plan[1], self._plan[2]

    def _m_0(self, n: int) -> int:
        if self.m_0 is not None:
            return self.m_0
        paper = max(1, self.m_max // n)
        try:  # past m_max / least chunks the paper's floor is less than the pruner keeps (SnapKV: window + 1)
            self.pruner.check_budget(paper)
        except BudgetTooSmall as e:
            if e.least is not None and e.least <= self.m_max:
                return e.least
        return paper

    def layer_memory(self, step: int, n_layer: int) -> np.ndarray:
        """m_i^j for the pot layers j at step i, [n_layer]; the same for every layer unless the
        function is per-layer (adaptive: from the retention the last compaction measured)."""
        chunks, memory = self._schedule_arrays()
        n = memory.size
        if step >= n:
            return np.full(n_layer, self.m_max, dtype=np.int64)
        if self.function == "square-sqrt" and n > 1:
            m_0 = self._m_0(n)
            square = memory_schedule("square", self.m_max, m_0, n)[step]
            sqrt = memory_schedule("sqrt", self.m_max, m_0, n)[step]
            return np.where(square_sqrt_layers(n_layer), square, sqrt).astype(np.int64)
        if self.function == "adaptive" and step > 0:
            retention = self._retention if self._retention is not None and self._retention.size == n_layer else None
            shares = adaptive_memory(int(memory[step]), retention, min(self._m_0(n), int(memory[step])), self.m_max)
            return np.broadcast_to(shares, (n_layer,)).astype(np.int64)
        return np.full(n_layer, memory[step], dtype=np.int64)

    def schedule(self) -> list[tuple[int, int]]:
        """(c_i, m_i) for every step i: tokens read, then cells kept after the compaction."""
        chunks, memory = self._schedule_arrays()
        return list(zip(chunks.tolist(), memory.tolist()))

    def peak_cells(self) -> int:
        """max_i (c_i + m_{i-1}), m_{-1} = 0: the longest attention of any step. Per-layer functions
        count the layer with the most memory: SQRT for square-sqrt, m_max (its cap) for adaptive
        after step 1."""
        chunks, memory = self._schedule_arrays()
        before = memory
        if self.function == "square-sqrt" and memory.size > 1:
            before = memory_schedule("sqrt", self.m_max, self._m_0(memory.size), memory.size)
        elif self.function == "adaptive":
            before = np.concatenate([memory[:1], np.full(memory.size - 1, self.m_max)])
        return int((chunks + np.concatenate([[0], before[:-1]])).max())

    # -- engine hooks ---------------------------------------------------------------------------

    def set_expected_length(self, n_tokens: int) -> None:
        if n_tokens < 1:
            raise KvpotError(f"imdc: the input length must be positive, got {n_tokens}")
        self._declared = n_tokens
        self._schedule_arrays()  # an infeasible schedule fails before any decoding
        LengthAware.of(self.pruner).set_expected_length(n_tokens)

    def cache_cells(self, budget: int, chunk: int) -> int:
        # the engine's budget and chunk are IMDC's m_max and c; c + m_max bounds every schedule
        # (c_i + m_{i-1} <= c + m_hat for i >= 1, c_0 <= c, m_hat <= m_max)
        m_max, c = self._sizes()
        return self.peak_cells() if self._length() is not None else c + m_max

    def chunk_size(self, step: int, chunk: int) -> int:
        chunks, _ = self._schedule_arrays()
        return int(chunks[step]) if step < chunks.size else self._sizes()[1]

    def budget_at(self, step: int, budget: int) -> int | np.ndarray:
        if self.function in PER_LAYER and self._n_layer is not None:
            return self.layer_memory(step, self._n_layer)
        _, memory = self._schedule_arrays()
        return int(memory[step]) if step < memory.size else self._sizes()[0]

    def wants_compaction(self, n_cells: int, budget: int | np.ndarray, next_chunk: int) -> bool:
        return n_cells > int(np.min(budget))

    # -- the pruner as IMDC runs it: every other hook (before_chunk, after_compaction, sink_tokens, ...)
    # goes to it through Wrapping, and its capabilities (a question, a catalyst) are found through IMDC --

    @property
    def wrapped(self) -> Policy:
        """The pruner with IMDC's two cross-cutting changes around it (kvpot.policies.wrappers): one layer
        at a time where the schedule sizes each layer apart (PerLayerBudgets), and with positions=reencode
        its kept keys re-rotated to 0..m_i-1 after every compaction, whatever the pruner's own choice
        (KeyRerotation); positions=pruner leaves the pruner's cr_rope."""
        per_layer = PerLayerBudgets(self.pruner)
        return KeyRerotation(per_layer) if self.positions == "reencode" else per_layer

    def after_chunk(self, view: PotView) -> None:
        self._n_layer = view.n_layer
        self.pruner.after_chunk(view)

    def select(self, view: PotView, budget: int | np.ndarray) -> np.ndarray | None:
        keep = self.wrapped.select(view, budget)
        if keep is not None and self.function == "adaptive":
            self._retention = retention_ratio(view, np.asarray(keep))
        return keep

    def reset(self) -> None:
        self._declared = None
        self._retention = None
        self.pruner.reset()

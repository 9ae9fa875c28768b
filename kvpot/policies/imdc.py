"""IMDC: a pruner run with incremental memory and, optionally, decremental chunks."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvpot.errors import KvpotError
from kvpot.policies.base import Policy, PotView, TapRequest

FUNCTIONS = ("fixed", "linear", "sqrt", "square")
# the paper's schedules that give each layer its own memory size (eq. 2-3; appendix A.1 puts
# SQUARE in the lower layers and SQRT in the higher ones); every layer of the pot holds as many cells
PER_LAYER = ("adaptive", "square-sqrt")


def n_chunks(n_tokens: int, chunk: int) -> int:
    """n = ceil(n_tokens / c): the fewest chunks whose average size is at most c."""
    return max(1, -(-n_tokens // chunk))


def memory_schedule(function: str, m_max: int, m_0: int, n: int) -> np.ndarray:
    """m_i, i = 0..n-1, floored to integers: eq. 1 (linear), eq. 7 (square), eq. 8 (sqrt),
    m_max throughout for "fixed". m_{n-1} = m_max exactly; a single chunk keeps m_max."""
    if function == "fixed" or n == 1:
        return np.full(n, m_max, dtype=np.int64)
    i = np.arange(n, dtype=np.int64)
    d, k = m_max - m_0, n - 1
    # integer arithmetic so the floor is exact (i / k in floats can land just below an integer)
    if function == "linear":
        grow = d * i // k
    elif function == "square":
        grow = d * i * i // (k * k)
    elif function == "sqrt":
        # floor(d * sqrt(i / k)) == isqrt(floor(d^2 i / k)); the float root is off by at most one
        x = d * d * i // k
        grow = np.floor(np.sqrt(x.astype(np.float64))).astype(np.int64)
        grow -= grow * grow > x
        grow += (grow + 1) * (grow + 1) <= x
    else:
        raise ValueError(f"unknown function {function!r}")
    return m_0 + grow


def chunk_schedule(memory: np.ndarray, chunk: int, n_tokens: int, decremental: bool) -> np.ndarray:
    """c_i, i = 0..n-1, summing to n_tokens, with n = memory.size = ceil(n_tokens / chunk).

    The paper's chunks sum to n*c; the shortfall e = n*c - n_tokens (0 <= e < c) comes off
      - the last chunk with a fixed chunk (FM, IM): c, c, ..., c - e, as without IMDC;
      - the first chunk with decremental chunks (eq. 6): IMDC's last chunks are its smallest
        (c + m_hat - m_{n-2}, e.g. ~1024/n tokens with m_max = 2c) and cannot take up to c - 1
        tokens, while step 0 is the only step without memory in its attention, so shrinking it
        leaves eq. 5 (constant attention for i >= 1) intact and never raises the peak.
    Eq. 6 in integers: with m_hat = q + r / (n - 1), c_i = c + q - m_{i-1}, plus one token for
    the last r steps, so steps 1..n-1 hold exactly (n - 1) c tokens and the attention length
    c_i + m_{i-1} is floor(c + m_hat) or ceil(c + m_hat).
    """
    n = memory.size
    chunks = np.full(n, chunk, dtype=np.int64)
    excess = n * chunk - n_tokens
    if not decremental or n == 1:
        chunks[-1] -= excess
        return chunks
    q, r = divmod(int(memory[:-1].sum()), n - 1)
    chunks[1:] += q - memory[:-1]
    chunks[n - r:] += 1  # the tail, where eq. 6's chunks are smallest
    chunks[0] -= excess
    return chunks


@dataclass
class IMDC(Policy):
    """IMDC ("Memorize Step by Step: Efficient Long-Context Prefilling with Incremental Memory and
    Decremental Chunk", section 3 and appendix A.1) around a pruner, as kvpress's ChunkPress(press):
    IMDC decides how many tokens each step reads and how many cells survive it; the pruner
    (SnapKV, StreamingLLM, ...) decides which cells those are.

    pruner:            the policy that chooses the cells to keep (taps, select, CR-RoPE are its own)
    m_max:             maximum memory size, the cells kept after the last chunk (default 1024)
    chunk:             c, the average chunk size (default 512)
    function:          memory schedule m_i, floored to integers, m_{n-1} = m_max:
                       "fixed"  FM, m_i = m_max and c_i = c
                       "linear" eq. 1, m_i = (m_max - m_0) i / (n - 1) + m_0
                       "square" eq. 7, m_i = (m_max - m_0) i^2 / (n - 1)^2 + m_0
                       "sqrt"   eq. 8, m_i = (m_max - m_0) sqrt(i) / sqrt(n - 1) + m_0
                       ("adaptive", eq. 2-3, and "square-sqrt", appendix A.1, size each layer
                       differently; the pot holds as many cells in every layer, so both refuse)
    decremental_chunk: IMDC, eq. 4-6: c_0 = c, c_i = c + m_hat - m_{i-1} with
                       m_hat = sum_{i=0}^{n-2} m_i / (n - 1), so the attention length
                       c_i + m_{i-1} stays at c + m_hat (up to one token of rounding);
                       False: IM, c_i = c (default True)
    m_0:               initial memory size (default floor(m_max / n), at least 1, section 4.1)
    expected_tokens:   the input length to plan for when the engine has not declared one; the
                       engine declares it (set_expected_length) when it starts reading, so this
                       mostly sizes the context (cache_cells) before the first document

    n = ceil(T / c) for an input of T tokens (including the BOS the engine adds). The steps read
    exactly T tokens for any T: see chunk_schedule for which chunk gives up the n*c - T surplus.
    Steps past the schedule (a second feed of the same document) read c tokens and keep m_max.
    """

    name = "imdc"
    pruner: Policy
    m_max: int = 1024
    chunk: int = 512
    function: str = "linear"
    decremental_chunk: bool = True
    m_0: int | None = None
    expected_tokens: int | None = None
    _declared: int | None = field(default=None, init=False, repr=False, compare=False)
    # (n_tokens, chunks, memory) of the last schedule computed
    _plan: tuple[int, np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.function in PER_LAYER:
            raise KvpotError(f"imdc: function={self.function} needs a different memory size per layer, "
                             "which the pot (the same number of cells in every layer) does not support yet")
        if self.function not in FUNCTIONS:
            raise KvpotError(f"imdc: function must be one of {', '.join(FUNCTIONS)}, got {self.function!r}")
        if not isinstance(self.pruner, Policy) or isinstance(self.pruner, IMDC):
            raise KvpotError(f"imdc: pruner must be a pruning policy (e.g. SnapKV()), got {self.pruner!r}")
        if self.m_max < 1 or self.chunk < 1:
            raise KvpotError(f"imdc: m_max ({self.m_max}) and chunk ({self.chunk}) must be positive")
        if self.m_0 is not None and not 1 <= self.m_0 <= self.m_max:
            raise KvpotError(f"imdc: m_0 must be within [1, m_max={self.m_max}], got {self.m_0}")
        if self.expected_tokens is not None and self.expected_tokens < 1:
            raise KvpotError(f"imdc: expected_tokens must be positive, got {self.expected_tokens}")

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
            n = n_chunks(n_tokens, self.chunk)
            m_0 = self.m_0 if self.m_0 is not None else max(1, self.m_max // n)
            memory = memory_schedule(self.function, self.m_max, m_0, n)
            chunks = chunk_schedule(memory, self.chunk, n_tokens, self.decremental_chunk and self.function != "fixed")
            if chunks.min() < 1:
                i = int(np.argmin(chunks))
                raise KvpotError(
                    f"imdc: eq. 6 gives step {i} of {n} a chunk of {chunks[i]} tokens ({self.function} memory "
                    f"reaches {memory[i - 1]} cells before it); use a larger chunk, a smaller m_max, "
                    "another function or decremental_chunk=false")
            self._plan = (n_tokens, chunks, memory)
        return self._plan[1], self._plan[2]

    def schedule(self) -> list[tuple[int, int]]:
        """(c_i, m_i) for every step i: tokens read, then cells kept after the compaction."""
        chunks, memory = self._schedule_arrays()
        return list(zip(chunks.tolist(), memory.tolist()))

    def peak_cells(self) -> int:
        """max_i (c_i + m_{i-1}), m_{-1} = 0: the longest attention of any step."""
        chunks, memory = self._schedule_arrays()
        return int((chunks + np.concatenate([[0], memory[:-1]])).max())

    # -- engine hooks ---------------------------------------------------------------------------

    def set_expected_length(self, n_tokens: int) -> None:
        if n_tokens < 1:
            raise KvpotError(f"imdc: the input length must be positive, got {n_tokens}")
        self._declared = n_tokens
        self._schedule_arrays()  # an infeasible schedule fails before any decoding
        self.pruner.set_expected_length(n_tokens)

    def cache_cells(self, budget: int, chunk: int) -> int:
        # the engine's budget and chunk are IMDC's m_max and c; c + m_max bounds every schedule
        # (c_i + m_{i-1} <= c + m_hat for i >= 1, c_0 <= c, m_hat <= m_max)
        return self.peak_cells() if self._length() is not None else self.chunk + self.m_max

    def chunk_size(self, step: int, chunk: int) -> int:
        chunks, _ = self._schedule_arrays()
        return int(chunks[step]) if step < chunks.size else self.chunk

    def budget_at(self, step: int, budget: int) -> int:
        _, memory = self._schedule_arrays()
        return int(memory[step]) if step < memory.size else self.m_max

    def wants_compaction(self, n_cells: int, budget: int, next_chunk: int) -> bool:
        return n_cells > budget

    # -- the pruner's hooks ---------------------------------------------------------------------

    @property
    def cr_rope(self) -> bool:  # type: ignore[override]
        return self.pruner.cr_rope

    def set_question(self, text: str) -> None:
        self.pruner.set_question(text)

    def before_chunk(self, n_tokens: int) -> TapRequest:
        return self.pruner.before_chunk(n_tokens)

    def after_chunk(self, view: PotView) -> None:
        self.pruner.after_chunk(view)

    def catalyst_text(self) -> str | None:
        return self.pruner.catalyst_text()

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        return self.pruner.select(view, budget)

    def after_compaction(self, keep: np.ndarray) -> None:
        self.pruner.after_compaction(keep)

    def reset(self) -> None:
        self._declared = None
        self.pruner.reset()

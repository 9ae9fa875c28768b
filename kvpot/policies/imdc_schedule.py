"""IMDC's schedules as plain functions of integers: memory sizes m_i (eq. 1, 7, 8, appendix A.1's
SQUARE-SQRT), chunk sizes c_i (eq. 4-6), the adaptive per-layer sizes (eq. 2-3). Floors are exact
(integer arithmetic); the IMDC policy (imdc.py) applies them."""

from __future__ import annotations

import numpy as np

from kvpot.policies.base import PAD, PotView

FUNCTIONS = ("fixed", "linear", "sqrt", "square", "square-sqrt", "adaptive")
# schedules that give each pot layer its own memory size
PER_LAYER = ("square-sqrt", "adaptive")


def n_chunks(n_tokens: int, chunk: int) -> int:
    """n = ceil(n_tokens / c): the fewest chunks whose average size is at most c."""
    return max(1, -(-n_tokens // chunk))


def memory_schedule(function: str, m_max: int, m_0: int, n: int) -> np.ndarray:
    """m_i, i = 0..n-1, floored to integers: eq. 1 (linear), eq. 7 (square), eq. 8 (sqrt),
    m_max throughout for "fixed". m_{n-1} = m_max exactly; a single chunk keeps m_max.

    Per-layer functions give the size the chunks are planned with (the mean over layers):
    "adaptive" its base b_i, the linear schedule (eq. 3 shares N b_i among the N layers);
    "square-sqrt" floor((square_i + sqrt_i) / 2), the mean of the pair appendix A.1 combines."""
    if function == "fixed" or n == 1:
        return np.full(n, m_max, dtype=np.int64)
    if function == "adaptive":
        return memory_schedule("linear", m_max, m_0, n)
    if function == "square-sqrt":
        return (memory_schedule("square", m_max, m_0, n) + memory_schedule("sqrt", m_max, m_0, n)) // 2
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


def square_sqrt_layers(n_layer: int) -> np.ndarray:
    """Appendix A.1: SQUARE for the lower layers, SQRT for the higher ones; the lower half is the
    first n_layer // 2 pot layers (so a single pot layer follows SQRT). True where SQUARE applies."""
    return np.arange(n_layer) < n_layer // 2


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


def proportional_share(total: int, weights: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Integers x_j in [lo, hi] summing to `total` (clamped to [N lo, N hi]), proportional to the
    weights where the bounds allow: shares that fall outside are pinned to the bound and the rest
    re-shared among the others (water-filling); the units the floors leave go to the largest
    fractional parts, ties to the lower layer. Zero weights everywhere share equally."""
    w = np.asarray(weights, dtype=np.float64)
    n = w.size
    total = min(max(int(total), n * lo), n * hi)
    if not np.any(w > 0):
        w = np.ones(n)
    x = np.zeros(n)
    free = np.ones(n, dtype=bool)
    while free.any():
        rest = total - x[~free].sum()
        wf = w[free]
        x[free] = rest * wf / wf.sum() if wf.sum() > 0 else rest / free.sum()
        out = free & ((x < lo) | (x > hi))
        if not out.any():
            break
        x[out] = np.clip(x[out], lo, hi)
        free &= ~out
    out_int = np.clip(np.floor(x + 1e-9), lo, hi).astype(np.int64)
    short = total - int(out_int.sum())
    if short > 0:
        frac = np.where(out_int < hi, x - out_int, -np.inf)
        for j in np.argsort(-frac, kind="stable")[:short]:
            out_int[j] += 1
    return out_int


def adaptive_memory(base: int, retention: np.ndarray | None, lo: int, hi: int) -> np.ndarray:
    """Eq. 3 for one step i > 0: m_i^j = p_j / sum(p) * N * b_i, in integers that sum to N b_i
    (proportional_share), each within [lo, hi]. p_j is the retention ratio eq. 2 measured at the
    last compaction; without one yet (or all zero: step 0 has no earlier memory to retain), every
    layer takes b_i."""
    n = 1 if retention is None else retention.size
    if retention is None or not np.any(retention > 0):
        return np.full(n, base, dtype=np.int64)
    return proportional_share(n * base, retention, lo, hi)


def retention_ratio(view: PotView, keep: np.ndarray) -> np.ndarray:
    """Eq. 2 per pot layer, |M_{i-1} ∩ M_i| / |M_i|, averaged over the layer's KV heads: the share
    of the cells a layer keeps now that were already in its memory before this step's chunk."""
    start = view.chunk_positions[0] if view.chunk_positions.size else view.tokens_seen
    held = keep != PAD
    pos = np.take_along_axis(view.positions, np.where(held, keep, 0), axis=2)
    old = held & (pos >= 0) & (pos < start)
    return (old.sum(axis=2) / np.maximum(held.sum(axis=2), 1)).mean(axis=1)

"""The read-once locator's memory: one representative key per block of the input, per pot layer and KV head,
kept for every block read (not only those the pot keeps), so a question asked after the read can find the
blocks it needs again.

What a block keeps is InfLLM's representative (paper 003, section 3.2: a block is found again by the dot
product of the lookup query with its representative keys), made query-agnostic: InfLLM picks a block's
repr_topk tokens by the attention they received while local, which needs the attention of every read row
(a tap that costs the read its speed); here the representative is the mean of the block's keys, which the
read has anyway. Keys are taken at RoPE position 0 (Engine reads the chunk's cells re-rotated there) and
kept as f16: 2 bytes x layers x KV heads x d_k per block, 28 x 2 x 128 x 2 = 14 KB per 64 tokens on the 1.5B
model (29 MB at 128K tokens, 3 % of its Q4_K_M weights).

A question scores every block at every layer and KV head with its own lookup query (the question's queries
summed over its tokens and over the query heads of each KV group, rotated to `ANGLE`: the graph's
kvpot-lookup query_sum); each (layer, head)'s scores are standardised over the blocks (heads differ in scale,
and Qwen's key bias shifts a head's every score alike) and summed over the heads the caller weighs.

Plain numpy, no llama.cpp: the engine feeds it (Engine._feed_chunk) and saves it (Engine.export_state).
"""

from __future__ import annotations

import numpy as np

from kvpot.errors import KvpotError

DEFAULT_BLOCK = 64   # tokens per block: a passage of a few lines; measured against 32 and 128 (docs/benchmarks.md)
ANGLE = 0            # RoPE distance the question's queries see every block at (0: content alone, no position)
SCORE_PART = 4096    # blocks scored per step: bounded scratch for an input of any length


def keys_bytes(n_layer: int, n_head_kv: int, d_k: int, tokens: int, block: int = DEFAULT_BLOCK) -> int:
    """The memory the keys of `tokens` tokens take (f16 means, one per block, and each block's span)."""
    return -(-tokens // block) * (2 * n_layer * n_head_kv * d_k + 16)


def uses_keys(locator: str) -> bool:
    """Whether a reading keeps the keys for questions located `locator`'s way (RunSettings.locator): the keys and
    mix locators score them; bm25 and pot never do, so a reading for those keeps none and costs nothing."""
    return locator in ("keys", "mix")


class BlockKeys:
    """Mean keys per block of consecutive stream positions: reps [n_blocks, L, H, d_k] f16, each block's first
    stream position and length. A block ends at `block` tokens or where the stream jumps (a chat turn read
    between two reads); the last block stays open until more of the stream arrives."""

    def __init__(self, n_layer: int, n_head_kv: int, d_k: int, block: int = DEFAULT_BLOCK):
        if block < 1:
            raise KvpotError(f"locator block size must be positive, got {block}")
        self.shape = (n_layer, n_head_kv, d_k)
        self.block = block
        self._reps: list[np.ndarray] = []            # closed blocks, in parts of up to `block` rows appended at once
        self._first: list[int] = []
        self._len: list[int] = []
        self._open_sum = np.zeros(self.shape, dtype=np.float64)
        self._open_first = -1
        self._open_len = 0

    # -- reading --------------------------------------------------------------------------------

    def add(self, keys: np.ndarray, first_pos: int) -> None:
        """Book the keys [L, H, n, d_k] (at RoPE 0) of stream positions first_pos .. first_pos + n - 1."""
        if keys.ndim != 4 or keys.shape[:2] != self.shape[:2] or keys.shape[3] != self.shape[2]:
            raise KvpotError(f"internal: locator keys {keys.shape} do not fit {self.shape}")
        n = keys.shape[2]
        if self._open_len and first_pos != self._open_first + self._open_len:
            self._close()
        at = 0
        while at < n:
            if not self._open_len:
                self._open_first = first_pos + at
            take = min(self.block - self._open_len, n - at)
            self._open_sum += keys[:, :, at:at + take].sum(axis=2, dtype=np.float64)
            self._open_len += take
            at += take
            if self._open_len == self.block:
                self._close()

    def _close(self) -> None:
        if not self._open_len:
            return
        self._reps.append((self._open_sum / self._open_len).astype(np.float16)[None])
        self._first.append(self._open_first)
        self._len.append(self._open_len)
        self._open_sum[...] = 0.0
        self._open_len, self._open_first = 0, -1

    def _packed(self) -> np.ndarray:
        """The closed blocks' reps as one array (joined once, then kept joined)."""
        if len(self._reps) > 1:
            self._reps = [np.concatenate(self._reps, axis=0)]
        return self._reps[0] if self._reps else np.zeros((0, *self.shape), dtype=np.float16)

    # -- asking ---------------------------------------------------------------------------------

    @property
    def n_blocks(self) -> int:
        return len(self._first) + (1 if self._open_len else 0)

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self._reps) + self._open_sum.nbytes + 16 * len(self._first)

    def spans(self) -> np.ndarray:
        """[n_blocks, 2] int64: each block's first stream position and its end (exclusive)."""
        first = self._first + ([self._open_first] if self._open_len else [])
        lens = self._len + ([self._open_len] if self._open_len else [])
        out = np.zeros((len(first), 2), dtype=np.int64)
        out[:, 0] = first
        out[:, 1] = out[:, 0] + np.asarray(lens, dtype=np.int64)
        return out

    def head_scores(self, query: np.ndarray) -> np.ndarray:
        """[n_blocks, L, H] float32: each block's representative dotted with the query [L, H, d_k] of its head."""
        if query.shape != self.shape:
            raise KvpotError(f"internal: locator query {query.shape} does not fit {self.shape}")
        reps = self._packed()
        q = query.astype(np.float32)
        out = np.empty((self.n_blocks, *self.shape[:2]), dtype=np.float32)
        for s in range(0, reps.shape[0], SCORE_PART):
            part = reps[s:s + SCORE_PART].astype(np.float32)
            out[s:s + part.shape[0]] = np.einsum("blhd,lhd->blh", part, q)
        if self._open_len:
            out[-1] = np.einsum("lhd,lhd->lh", (self._open_sum / self._open_len).astype(np.float32), q)
        return out

    def scores(self, query: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """[n_blocks] float64: the blocks' scores standardised per (layer, head) over the blocks and summed
        with `weights` [L, H] (None: every head alike)."""
        s = self.head_scores(query).astype(np.float64)
        if s.shape[0] == 0:
            return np.zeros(0)
        z = (s - s.mean(axis=0)) / np.maximum(s.std(axis=0), 1e-9)
        w = np.ones(self.shape[:2]) if weights is None else np.asarray(weights, dtype=np.float64)
        return np.einsum("blh,lh->b", z, w)

    # -- saving ---------------------------------------------------------------------------------

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(values, arrays) for a saved context (Engine.export_state): everything `from_state` needs."""
        values = {"block": self.block, "open_first": self._open_first, "open_len": self._open_len}
        arrays = {"reps": np.ascontiguousarray(self._packed()),
                  "first": np.asarray(self._first, dtype=np.int64), "len": np.asarray(self._len, dtype=np.int64),
                  "open_sum": self._open_sum.copy()}
        return values, arrays

    @classmethod
    def from_state(cls, shape: tuple[int, int, int], values: dict, arrays: dict[str, np.ndarray]) -> BlockKeys:
        """A locator saved by `state`, checked (`check_state`) against the model's shape: a saved context of
        another model, or a damaged one, is refused, not scored."""
        try:
            check_state(values, arrays, shape=shape)
        except ValueError as e:
            raise KvpotError(f"the saved context's locator is damaged or made for another model ({e})") from None
        out = cls(*shape, block=int(values["block"]))
        reps = arrays["reps"]
        out._reps = [reps] if reps.shape[0] else []
        out._first, out._len = [int(x) for x in arrays["first"]], [int(x) for x in arrays["len"]]
        out._open_sum = arrays["open_sum"].astype(np.float64)
        out._open_first, out._open_len = int(values["open_first"]), int(values["open_len"])
        return out


MAX_BLOCK = 1 << 16


def check_state(values, arrays: dict[str, np.ndarray], shape: tuple[int, int, int] | None = None,
                tokens_seen: int | None = None) -> None:
    """What `BlockKeys.state` saved, checked without a model (a saved context's header check runs it on the file
    alone): types, shapes that agree with each other (and with `shape` when the model is known), block lengths
    within the block size, spans in order and inside the `tokens_seen` tokens read. Raises ValueError."""
    if not isinstance(values, dict) or set(values) != {"block", "open_first", "open_len"}:
        raise ValueError("locator fields are not block, open_first, open_len")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values.values()):
        raise ValueError("locator fields are not integers")
    block, open_first, open_len = values["block"], values["open_first"], values["open_len"]
    if not 1 <= block <= MAX_BLOCK or not 0 <= open_len < block or (open_len and open_first < 0):
        raise ValueError("locator block or open block out of range")
    names = {"reps", "first", "len", "open_sum"}
    if not names <= set(arrays):
        raise ValueError(f"locator arrays {sorted(names - set(arrays))} are missing")
    reps, first, lens, open_sum = (arrays[k] for k in ("reps", "first", "len", "open_sum"))
    if reps.dtype != np.float16 or reps.ndim != 4 or open_sum.dtype != np.float64 or open_sum.shape != reps.shape[1:]:
        raise ValueError("locator keys are not f16 [blocks, layers, KV heads, d_k] with a matching open sum")
    if shape is not None and tuple(reps.shape[1:]) != tuple(shape):
        raise ValueError(f"locator keys of shape {tuple(reps.shape[1:])}, not this model's {tuple(shape)}")
    if first.dtype != np.int64 or lens.dtype != np.int64 or first.shape != lens.shape or first.shape != (reps.shape[0],):
        raise ValueError("locator block spans do not match its keys")
    if lens.size and (lens.min() < 1 or lens.max() > block or first.min() < 0):
        raise ValueError("locator block spans out of range")
    ends = first + lens
    if lens.size > 1 and np.any(first[1:] < ends[:-1]):
        raise ValueError("locator blocks overlap")
    last = max(int(ends[-1]) if ends.size else 0, open_first + open_len if open_len else 0)
    if open_len and ends.size and open_first < ends[-1]:
        raise ValueError("locator's open block overlaps a closed one")
    if tokens_seen is not None and last > tokens_seen:
        raise ValueError("locator blocks lie past the tokens read")

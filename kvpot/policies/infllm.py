"""InfLLM: initial + local tokens in the pot; evicted tokens in blocks on disk, the top-k blocks recalled per chunk.

The block store's file over its life (made, opened for a saved context, kept, deleted, its disk
cost) is kvpot/policies/infllm_store.py; this module is the paper's method."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvpot.errors import KvpotError
from kvpot.policies.base import (
    NO_TAPS,
    BudgetTooSmall,
    ExternalMemory,
    Fetch,
    Policy,
    PotView,
    Recall,
    TapRequest,
    keep_ends,
)
from kvpot.policies.infllm_store import STORE_TYPES, BlockStoreFile
from kvpot.runtime.blocks import CACHE_RULES, BlockStoreError, format_name, split_format

# the public code's llama-3 configuration (thunlp/InfLLM config/llama-3-inf-llm.yaml), for reference:
# block_size 128, n_init 128, n_local 4096, topk 16, repr_topk 4, max_cached_block 32, exc_block_size 512,
# i.e. of the 6272 cells attention sees, 2 % initial, 65 % local, 33 % retrieved blocks.

PAPER = dict(block_size=128, n_init=128, n_local=4096, topk=16, repr_topk=4, max_cached_block=32, exc_block_size=512)


def default_split(budget: int, chunk: int) -> dict[str, int]:
    """The parameters `fit` fills in, scaled from the public configuration for kvpot's budgets (the
    small test models run at 1-4K cells): initial tokens 1/32 of the budget (4..128), blocks of 128
    tokens from a budget of 4096 up and of 64 below (so a 2048-cell pot still holds 8 retrieved
    blocks), a quarter of the budget for retrieved blocks, the rest local, and execution blocks of an
    eighth of the budget in whole blocks (at most the chunk, at least a block). At budget 2048: n_init
    64, block_size 64, topk 8, n_local 1472, exc_block_size 256.

    Why an eighth: the public configuration's 512 queries per lookup are an eighth of its 4096-token
    window. With distance="chunk" (row i of a chunk sees the memory n_local + i back) longer execution
    blocks spread the memory's distance over more of the window; the passkey grids were measured with an
    eighth, so it stays (docs/benchmarks.md, InfLLM)."""
    n_init = max(4, min(128, budget // 32))
    block_size = 128 if budget >= 4096 else 64
    topk = max(1, (budget // 4) // block_size)
    exc = max(block_size, (budget // 8) // block_size * block_size)
    return dict(n_init=n_init, block_size=block_size, topk=topk, n_local=budget - n_init - topk * block_size,
                exc_block_size=min(chunk, exc))


@dataclass
class InfLLM(Policy, BlockStoreFile, ExternalMemory):
    """InfLLM (Xiao et al. 2024, "InfLLM: Training-Free Long-Context Extrapolation for LLMs with an
    Efficient Context Memory"), section 3.

    Attention sees n_init initial tokens, the topk blocks of the context memory most relevant to the
    current chunk, and the n_local most recent tokens. Tokens leaving the local window become
    blocks of block_size tokens, written to a block store on disk (docs/formats.md) and read back
    through a cache of max_cached_block blocks per layer (appendix D), so RAM does not grow with the input.

    block_size:       l_bs, tokens per memory unit (block)
    n_init:           initial tokens, always attended
    n_local:          the local window (the paper's n_local); tokens older than it become blocks.
                      Blocks leave whole, so the window holds n_local - block_size + 1 .. n_local tokens
    topk:             k_m, memory units retrieved per chunk
    repr_topk:        r_k, representative tokens per block (default 4, the public code's)
    max_cached_block: blocks each layer's in-RAM cache holds after a lookup, as stored (default 2 * topk,
                      the paper's appendix D: twice the blocks a lookup loads)
    cache:            how a full cache picks the block that leaves (ggml_ext/kvpot-block-cache.h):
                      "freq" (default, the paper's appendix D): the lowest frequency score, which after
                      every lookup of the layer decays by cache_decay and gains the attention the block
                      received; "lru", "fifo", "random" (seeded): the rules its Figure 4 compares
                      with. The rule changes which reads hit the cache, never what a lookup fetches
    cache_decay:      d, the frequency score's decay per lookup (default 0.1, the paper's)
    exc_block_size:   l_X, the chunk of queries one lookup serves; kvpot reads in chunks of this size
    store:            block store file, which must not exist yet (default: a new file under KVPOT_HOME/blocks/)
    store_type:       the row format of the stored K and V: "f16" (2 bytes a value, as llama.cpp's own
                      f16 cache), "q8_0" (1.06) or "q4_0" (0.56; ggml's formats, blocks of 32 values),
                      or one for keys and one for values, "q8_0/q4_0" (keys need the finer format: a
                      few large key channels are what q4_0 loses, docs/benchmarks.md).
                      Default STORE_TYPE, q8_0 keys and q4_0 values (each f16 where the model's key or
                      value dim is not a multiple of 32). The representative keys stay f32 (they rank blocks). A saved context's store
                      keeps the format it was written in
    distance:         "constant" (default): every query sees the initial tokens and the retrieved blocks
                      n_local positions back, as the paper does (a per-head bias on those cells' logits,
                      ggml_ext/kvpot-distance.h); "chunk": they sit n_local before the chunk that reads
                      them, so row i of a chunk sees them n_local + i back
    lookup:           "graph" (default): each ubatch looks its blocks up inside every pot layer with its
                      own queries, as the paper does; "host": the previous chunk's queries choose on the
                      CPU between decodes, and a question is decoded twice (kvpot's first version,
                      kept as the reference the in-graph lookup is tested against)

    `--budget` (cells in RAM) is n_init + n_local + topk * block_size; `fit(budget, chunk)` fills the
    parameters left unset (default_split above) and refuses a budget that cannot work.

    Representative keys: the paper's r_m, the mean attention logit q.k a token receives from the
    queries that follow it while it is local (eq. in section 3.2), summed in the graph as a logit tap
    (TapRequest.tap_what = "logits": the rows' summed query times each key, one product per cell) and
    divided by the rows counted. A chunk's own cells are scored from later chunks only, so every
    query counted comes after the token (causal). The public code ranks by attention probability
    received instead; that needs an [n_cells x n_rows] softmax per layer in every chunk and read
    SmolLM2-135M at half StreamingLLM's speed (docs/benchmarks.md).
    A block's representative per KV head is the mean of the keys of its repr_topk best tokens for
    that head (query heads of a group summed); relevance is the dot product of the chunk's summed
    queries with it, summed over heads: one selection per layer, shared by all heads.

    Positions: keys are stored at RoPE position 0; queries are looked up rotated to n_local, and the
    recalled cells (initial tokens and blocks) are re-rotated so that they sit n_local before the
    chunk that reads them; with distance="constant" the attention then corrects each query row's
    logits on those cells to the paper's: query at n_local, memory key at 0, for every row of every
    chunk and every generated token. Local tokens keep their own positions (no CR-RoPE).

    Lookup timing: with lookup="graph", after every compaction the recall puts the initial tokens
    back and reserves min(topk, blocks stored) * block_size cells after them; each ubatch's graph then
    chooses and fetches, per pot layer and before that layer's attention, the blocks most relevant to
    its own queries (ggml_ext/kvpot-lookup.cpp), as the paper does; the engine holds the lookup while it
    generates an answer, so the answer reads its question's blocks. With lookup="host" a chunk is
    decoded with the blocks its predecessor's queries chose, and a question is decoded once to
    capture its queries, taken out, and decoded again with the blocks those chose.
    """

    name = "infllm"
    block_size: int | None = None
    n_init: int | None = None
    n_local: int | None = None
    topk: int | None = None
    repr_topk: int = 4
    max_cached_block: int | None = None
    exc_block_size: int | None = None
    store: str | None = None
    store_type: str | None = None
    lookup: str = "graph"
    distance: str = "constant"
    cache: str = "freq"
    cache_decay: float = 0.1

    _fit: dict | None = field(default=None, init=False, repr=False, compare=False)
    _local_start: int = field(default=-1, init=False, repr=False, compare=False)   # stream pos of the oldest local token
    _local_score: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)  # [L, H, n] float64
    _local_rows: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)   # [n]: queries summed
    _init_k: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)  # [L, H, n_init, d_k] at RoPE 0
    _init_v: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)
    _queries: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)  # [L, H, d_k]
    _runtime: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("block_size", "n_init", "n_local", "topk", "max_cached_block", "exc_block_size"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "n_init" else 1):
                raise KvpotError(f"infllm: {name} must be {'>= 0' if name == 'n_init' else 'positive'}, got {value}")
        if self.distance not in ("constant", "chunk"):
            raise KvpotError(f"infllm: distance must be constant or chunk, got {self.distance!r}")
        if self.store_type is not None:
            try:
                self.store_type = format_name(*split_format(self.store_type))  # "q8_0/q8_0" is "q8_0"
            except BlockStoreError:
                raise KvpotError(f"infllm: store_type must be one of {', '.join(STORE_TYPES)}, or keys/values as "
                                 f"q8_0/q4_0, got {self.store_type!r}") from None
        if self.cache not in CACHE_RULES:
            raise KvpotError(f"infllm: cache must be one of {', '.join(CACHE_RULES)}, got {self.cache!r}")
        if not 0.0 <= self.cache_decay <= 1.0:
            raise KvpotError(f"infllm: cache_decay must be within 0..1, got {self.cache_decay}")
        if self.lookup not in ("graph", "host"):
            raise KvpotError(f"infllm: lookup must be graph or host, got {self.lookup!r}")
        if self.repr_topk < 1:
            raise KvpotError(f"infllm: repr_topk must be positive, got {self.repr_topk}")
        if self.block_size is not None and self.repr_topk > self.block_size:
            raise KvpotError(f"infllm: repr_topk ({self.repr_topk}) cannot exceed block_size ({self.block_size})")

    # -- parameters ------------------------------------------------------------------------------

    def sink_tokens(self) -> int:
        return self._p("n_init") if self._fit else 0  # the initial tokens, which the paper keeps as sinks

    def fit(self, budget: int, chunk: int) -> None:
        """Fill the parameters left unset from the budget (cells in RAM) and the chunk."""
        d = default_split(budget, chunk)
        p = {name: getattr(self, name) for name in ("block_size", "n_init", "topk", "exc_block_size")}
        for name, value in p.items():
            if value is None:
                p[name] = d[name]
        if self.n_local is None:
            p["n_local"] = budget - p["n_init"] - p["topk"] * p["block_size"]
        else:
            p["n_local"] = self.n_local
        p["max_cached_block"] = self.max_cached_block or 2 * p["topk"]
        need = p["n_init"] + p["n_local"] + p["topk"] * p["block_size"]
        if need > budget:
            raise BudgetTooSmall(f"infllm: n_init + n_local + topk * block_size = {need} exceeds the budget ({budget})")
        if p["n_local"] < p["exc_block_size"] + p["block_size"]:
            raise BudgetTooSmall(
                f"infllm: budget {budget} leaves n_local = {p['n_local']}, less than a chunk ({p['exc_block_size']}) "
                f"plus a block ({p['block_size']}); raise the budget or lower topk/block_size")
        if self.repr_topk > p["block_size"]:
            raise BudgetTooSmall(f"infllm: repr_topk ({self.repr_topk}) exceeds block_size ({p['block_size']})")
        self._prepare_store()
        self._fit = p

    def _p(self, name: str) -> int:
        if self._fit is None:
            raise KvpotError("internal: infllm used before fit(budget, chunk)")
        return self._fit[name]

    def cache_cells(self, budget: int, chunk: int) -> int:
        if self._fit is None:
            self.fit(budget, chunk)
        return budget + self._p("exc_block_size")

    def chunk_size(self, step: int, chunk: int) -> int:
        return self._p("exc_block_size") if self._fit else chunk

    # -- reading ---------------------------------------------------------------------------------

    def before_chunk(self, n_tokens: int) -> TapRequest:
        if self._blocks is None and self._store_path is None and self._fit is not None:
            self._check_store_target()  # no saved context brought the store: the reading makes a new one
        # every row taps (attention received while local); the queries are looked up at angle n_local
        angle = self._p("n_local") if self._fit and self.lookup == "host" else None
        return TapRequest(tap_last=-1, tap_what="logits", query_angle=angle)

    def before_prompt(self, n_tokens: int) -> TapRequest:
        if self._fit is None or not self._store_blocks or self.lookup == "graph":
            return NO_TAPS
        return TapRequest(query_angle=self._p("n_local"))

    def after_chunk(self, view: PotView) -> None:
        self._runtime = view.read_cells is not None
        if view.queries is not None:
            self._queries = np.asarray(view.queries, dtype=np.float32)
        if not self._runtime or self._fit is None:
            return
        self._grow_scores(view)
        if view.scores is None:
            return
        pos = view.positions[0, 0]
        # the chunk's own cells wait for later chunks: every query counted for a token comes after it
        start = int(view.chunk_positions.min()) if view.chunk_positions.size else view.tokens_seen
        cells = np.flatnonzero((pos >= self._local_start) & (pos < start))
        self._local_score[..., pos[cells] - self._local_start] += view.scores[..., cells]
        self._local_rows[pos[cells] - self._local_start] += view.chunk_positions.size

    def _grow_scores(self, view: PotView) -> None:
        """Attention received while local, one slot per stream position from the oldest local token
        up to the newest read (tokens decoded without taps, e.g. a question, start at zero)."""
        if self._local_start < 0:
            self._local_start = self._p("n_init")
        L, H = view.n_layer, view.n_head_kv
        n_span = max(0, view.tokens_seen - self._local_start)
        acc = self._local_score if self._local_score is not None else np.zeros((L, H, 0))
        rows = self._local_rows if self._local_rows is not None else np.zeros(acc.shape[2])
        if acc.shape[2] < n_span:
            acc = np.concatenate([acc, np.zeros((L, H, n_span - acc.shape[2]))], axis=-1)
            rows = np.concatenate([rows, np.zeros(n_span - rows.shape[0])])
        self._local_score, self._local_rows = acc, rows

    def wants_compaction(self, n_cells: int, budget: int, next_chunk: int) -> bool:
        if not self._runtime or self._fit is None:
            return n_cells > budget
        n_loc = (self._local_score.shape[2] if self._local_score is not None else 0)
        return n_loc > self._p("n_local") or self._store_blocks > 0

    def select(self, view: PotView, budget: int) -> np.ndarray | None:
        if view.queries is not None:
            self._queries = np.asarray(view.queries, dtype=np.float32)
        if view.read_cells is None or self._fit is None:
            return self._select_without_runtime(view, budget)
        self._grow_scores(view)
        pos = view.positions[0, 0]
        local_cells = view.positions >= self._local_start
        if np.any(local_cells != local_cells[:1, :1]) or np.any(np.where(local_cells, view.positions != pos, False)):
            raise KvpotError("internal: infllm's local tokens are not in the same cells in every layer and head")
        local = np.flatnonzero(pos >= self._local_start)
        local = local[np.argsort(pos[local], kind="stable")]
        if self._init_k is None:
            self._capture_init(view, pos)
        n_loc = local.size
        bs, n_local = self._p("block_size"), self._p("n_local")
        n_evict = math.ceil(max(0, n_loc - n_local) / bs) * bs
        if n_evict:
            self._evict(view, local[:n_evict], pos)
        kept = local[n_evict:]
        if kept.size == 0:
            raise KvpotError("internal: infllm would keep no local token")
        return np.broadcast_to(np.sort(kept), (view.n_layer, view.n_head_kv, kept.size)).astype(np.int64)

    def _select_without_runtime(self, view: PotView, budget: int) -> np.ndarray | None:
        """With no runtime behind the view (no cells to read, no store), InfLLM is its initial + local part."""
        if budget < 2:
            raise BudgetTooSmall(f"infllm needs a budget of at least 2 cells, got {budget}")
        if view.n_cells <= budget:
            return None
        n_first = min(self.n_init if self.n_init is not None else default_split(budget, 1)["n_init"], budget - 1)
        return keep_ends(view.positions, n_first, budget - n_first)

    def _capture_init(self, view: PotView, pos: np.ndarray) -> None:
        n_init = self._p("n_init")
        cells = np.flatnonzero((pos >= 0) & (pos < n_init))
        if cells.size == 0:
            self._init_k = np.zeros((view.n_layer, view.n_head_kv, 0, 1), dtype=np.float32)
            self._init_v = self._init_k.copy()
            return
        cells = cells[np.argsort(pos[cells])]
        if not np.array_equal(cells, np.arange(cells[0], cells[0] + cells.size)):
            raise KvpotError("internal: infllm's initial tokens are not in consecutive cells")
        self._init_k, self._init_v = view.read_cells(int(cells[0]), int(cells.size), 0)

    def _evict(self, view: PotView, cells: np.ndarray, pos: np.ndarray) -> None:
        """The oldest local cells leave as whole blocks: keys at RoPE 0, representatives, into the store."""
        if not np.array_equal(cells, np.arange(cells[0], cells[0] + cells.size)):
            raise KvpotError("internal: infllm's evicted tokens are not in consecutive cells")
        k, v = view.read_cells(int(cells[0]), int(cells.size), 0)
        store = self._store_for_append(view.n_layer, view.n_head_kv, k.shape[3], v.shape[3])
        bs, r = self._p("block_size"), self.repr_topk
        stream = pos[cells]
        idx = stream - self._local_start
        score = self._local_score[..., idx] / np.maximum(self._local_rows[idx], 1)  # r_m: mean logit, [L, H, n]
        for b in range(cells.size // bs):
            sl = slice(b * bs, (b + 1) * bs)
            kb = k[:, :, sl]
            # per (layer, head): the repr_topk tokens with the highest r_m (ties: earlier)
            top = np.argsort(-score[..., sl], axis=-1, kind="stable")[..., :r]
            reps = np.take_along_axis(kb, top[..., None], axis=2).mean(axis=2)
            store.append(stream[sl].astype(np.int32), reps, kb, v[:, :, sl])
        self._store_blocks = store.n_blocks
        self._store_hash = None
        drop = int(stream[-1]) + 1 - self._local_start
        self._local_score = self._local_score[..., drop:]
        self._local_rows = self._local_rows[drop:]
        self._local_start += drop

    # -- lookup ----------------------------------------------------------------------------------

    def choose_blocks(self, n_layer: int) -> np.ndarray:
        """[L, k] block indices to recall per layer (ascending): every block while there are at most
        topk, else the topk by relevance to the last queries (the newest while none were captured)."""
        n, topk = self._store_blocks, self._p("topk")
        if n <= topk:
            return np.broadcast_to(np.arange(n), (n_layer, n)).copy()
        if self._queries is None:
            return np.broadcast_to(np.arange(n - topk, n), (n_layer, topk)).copy()
        rows = [np.sort(self._blocks.topk(layer, self._queries[layer], topk)[0]) for layer in range(n_layer)]
        return np.stack(rows).astype(np.int64)

    def lookup_store(self):
        return self._blocks if self.lookup == "graph" else None

    def recall(self, pos_next: int) -> Recall | None:
        if not self._runtime or self._fit is None or self._init_k is None:
            return None
        if self.lookup == "graph":
            return self._recall_for_graph(pos_next)
        L, H = self._init_k.shape[:2]
        chosen = self.choose_blocks(L) if self._store_blocks else np.zeros((L, 0), dtype=np.int64)
        ks, vs, ps = [], [], []
        for layer in range(L):
            kl, vl, pl = [self._init_k[layer]], [self._init_v[layer]], [np.arange(self._init_k.shape[2])]
            for b in chosen[layer]:
                bpos, _, bk, bv = self._blocks.read(layer, int(b))
                kl.append(bk)
                vl.append(bv)
                pl.append(bpos)
            ks.append(np.concatenate(kl, axis=1))
            vs.append(np.concatenate(vl, axis=1))
            ps.append(np.broadcast_to(np.concatenate(pl), (H, sum(p.size for p in pl))))
        k, v = np.stack(ks), np.stack(vs)
        if k.shape[2] == 0:
            return None
        return Recall(k=k, v=v, rope_from=np.zeros(k.shape[2], dtype=np.int32),
                      rope_to=max(0, pos_next - self._p("n_local")), positions=np.stack(ps).astype(np.int64),
                      distance=self._memory_distance())

    def _recall_for_graph(self, pos_next: int) -> Recall | None:
        """The initial tokens, and cells for min(topk, blocks stored) blocks that every ubatch's graph
        fills with the blocks its own queries choose (zeros until then; positions: the newest blocks)."""
        L, H, n_init, d_k = self._init_k.shape
        d_v = self._init_v.shape[3]
        bs = self._p("block_size")
        n = min(self._p("topk"), self._store_blocks)
        m = n_init + n * bs
        if m == 0:
            return None
        if n:
            d_k, d_v = self._blocks.shape[2:4]  # (no initial tokens: _init_k is [L, H, 0, 1])
        k = np.zeros((L, H, m, d_k), dtype=np.float32)
        v = np.zeros((L, H, m, d_v), dtype=np.float32)
        k[:, :, :n_init], v[:, :, :n_init] = self._init_k, self._init_v
        # placeholder positions until the first graph's fetch is booked (kvpot.state.recall_cells, RecallCells.book): the n
        # blocks evicted last, which end where the local window starts (tokens leave it in stream order)
        guess = np.arange(self._local_start - n * bs, self._local_start)
        pos = np.concatenate([np.arange(n_init), guess]).astype(np.int64)
        return Recall(k=k, v=v, rope_from=np.zeros(m, dtype=np.int32), rope_to=max(0, pos_next - self._p("n_local")),
                      positions=np.broadcast_to(pos, (L, H, m)).copy(),
                      fetch=Fetch(first=n_init, n_blocks=n, block_size=bs, n_local=self._p("n_local")) if n else None,
                      distance=self._memory_distance())

    def _memory_distance(self) -> int | None:
        return self._p("n_local") if self.distance == "constant" else None

    # -- saving ----------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        out = {name: getattr(self, name) for name in
               ("_local_start", "_local_score", "_local_rows", "_init_k", "_init_v", "_queries", "_runtime", "_store_path", "_store_blocks")}
        out["_fit"] = dict(self._fit) if self._fit else None
        out["_store_hash"] = self.store_digest() if self._blocks is not None else None
        if self._store_path:
            self._exported.add(self._store_path)
        return {k: v for k, v in out.items() if v is not None}

    def load_state_dict(self, state: dict) -> None:
        self.reset()
        known = {"_fit", "_local_start", "_local_score", "_local_rows", "_init_k", "_init_v", "_queries", "_runtime", "_store_path",
                 "_store_blocks", "_store_hash"}
        for name, value in state.items():
            if name not in known:
                raise KvpotError(f"saved state of infllm has an unknown field {name!r}")
            setattr(self, name, value)
        self._open_saved_store()

    def reset(self) -> None:
        """Forget the document, and the store with it (BlockStoreFile._close_store)."""
        self._close_store()
        self._local_start = -1
        self._local_score = None
        self._local_rows = None
        self._init_k = self._init_v = None
        self._queries = None
        self._runtime = False

"""The friendly API over kvpot_* for one context: compact, tap, log-probs, stats, read-back."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from kvpot.errors import KvpotError
from kvpot.runtime import api
from kvpot.runtime.library import load as load_runtime

# kvpot.h: KVPOT_TAP_ATTENTION, KVPOT_TAP_QK
TAP_MODES = {"attention": 0, "logits": 1}


class PotCallError(KvpotError):
    """A kvpot_* call refused its arguments or failed; carries the C error code."""

    def __init__(self, fn: str, code: int, message: str):
        super().__init__(f"{fn}: {message}")
        self.code = code


@dataclass(frozen=True)
class PotStats:
    n_pot_layers: int
    n_head_kv: int
    n_cells_used: int
    n_cells_total: int
    n_swa_used: int
    budget: int
    n_compactions: int
    pos_next: int
    bytes_used: int
    bytes_total: int


def _i32(a) -> tuple[np.ndarray, ctypes.POINTER]:
    arr = np.ascontiguousarray(a, dtype=np.int32)
    return arr, arr.ctypes.data_as(api.c_i32_p)


class Pot:
    """The pot of a LlamaContext. It holds the context wrapper, not a raw pointer, so a call after
    the context was closed is one clear error instead of a use of freed memory."""

    def __init__(self, context):
        self.lib = load_runtime()
        self.context = context
        n = self._check("kvpot_pot_layers", self.lib.kvpot_pot_layers(self.ctx, None, 0))
        ids = np.zeros(n, dtype=np.int32)
        self.lib.kvpot_pot_layers(self.ctx, ids.ctypes.data_as(api.c_i32_p), n)
        self.layer_ids = ids.tolist()
        self.n_head_kv = self.stats().n_head_kv
        self._lookup_held = False  # kvpot_lookup_hold's last word, so held lookups are not asked what they fetched

    @property
    def ctx(self):
        """The live llama_context pointer; refuses once the context is closed."""
        ptr = getattr(self.context, "ptr", None)
        if not ptr:
            raise KvpotError("the pot's llama.cpp context is closed")
        return ptr

    def _check(self, fn: str, rc: int) -> int:
        if rc < 0:
            raise PotCallError(fn, rc, self.lib.kvpot_last_error().decode(errors="replace"))
        return rc

    @property
    def n_layers(self) -> int:
        return len(self.layer_ids)

    def stats(self) -> PotStats:
        s = api.kvpot_pot_stats()
        self._check("kvpot_pot_stats_get", self.lib.kvpot_pot_stats_get(self.ctx, ctypes.byref(s)))
        return PotStats(**{name: getattr(s, name) for name, _ in s._fields_})

    def set_budget(self, n_cells: int) -> None:
        self._check("kvpot_pot_set_budget", self.lib.kvpot_pot_set_budget(self.ctx, n_cells))

    def reset(self) -> None:
        self._check("kvpot_pot_reset", self.lib.kvpot_pot_reset(self.ctx))

    def compact(self, keep: np.ndarray, cr_rope: bool) -> None:
        """keep: int [L, H, n_keep]; keep[l, h, j] moves to cell j."""
        keep = np.asarray(keep)
        if keep.ndim != 3:
            raise PotCallError("kvpot_pot_compact", api.KVPOT_ERR_ARG, f"keep must be [layers, heads, n], got shape {keep.shape}")
        arr, ptr = _i32(keep)
        L, H, n = arr.shape
        self._check("kvpot_pot_compact", self.lib.kvpot_pot_compact(self.ctx, ptr, L, H, n, cr_rope))

    def tap_request(self, positions, what: str = "attention") -> None:
        """Tap the query rows at these positions in the next decodes. what: "attention" (the probability
        each cell receives) or "logits" (the pre-softmax q·k·kq_scale it receives, InfLLM's r_m)."""
        if what not in TAP_MODES:
            raise PotCallError("kvpot_tap_mode", api.KVPOT_ERR_ARG, f"tap what must be one of {', '.join(TAP_MODES)}")
        self._check("kvpot_tap_mode", self.lib.kvpot_tap_mode(self.ctx, TAP_MODES[what]))
        arr, ptr = _i32(positions)
        self._check("kvpot_tap_request", self.lib.kvpot_tap_request(self.ctx, ptr, arr.size))

    def tap_clear(self) -> None:
        self._check("kvpot_tap_request", self.lib.kvpot_tap_request(self.ctx, None, 0))

    def tap_get(self, n_cells: int) -> np.ndarray:
        """[L, H, n_cells] attention mass per cell from the tapped rows."""
        out = np.zeros((self.n_layers, self.n_head_kv, n_cells), dtype=np.float32)
        for l in range(self.n_layers):
            self._check("kvpot_tap_get", self.lib.kvpot_tap_get(
                self.ctx, l, out[l].ctypes.data_as(api.c_f32_p), self.n_head_kv, n_cells))
        return out

    def logprobs_request(self, pos0: int, targets) -> None:
        arr, ptr = _i32(targets)
        self._check("kvpot_logprobs_request", self.lib.kvpot_logprobs_request(self.ctx, pos0, ptr, arr.size))

    def logprobs_clear(self) -> None:
        self._check("kvpot_logprobs_request", self.lib.kvpot_logprobs_request(self.ctx, 0, None, 0))

    def logprobs_get(self, n: int) -> np.ndarray:
        out = np.zeros(n, dtype=np.float32)
        self._check("kvpot_logprobs_get", self.lib.kvpot_logprobs_get(self.ctx, out.ctypes.data_as(api.c_f32_p), n))
        return out

    def read(self, ipot: int, head: int, which: str, cell0: int, n_cells: int, head_dim: int) -> np.ndarray:
        """[n_cells, head_dim] floats of K ('k', after RoPE) or V ('v') for one pot layer and KV head."""
        out = np.zeros((n_cells, head_dim), dtype=np.float32)
        self._check("kvpot_pot_read", self.lib.kvpot_pot_read(
            self.ctx, ipot, head, 0 if which == "k" else 1, cell0, n_cells, out.ctypes.data_as(api.c_f32_p), out.size))
        return out

    def settle(self) -> None:
        """Apply llama.cpp's pending K-shifts now (before saving the sequence state)."""
        self._check("kvpot_pot_settle", self.lib.kvpot_pot_settle(self.ctx))

    def state_bytes(self) -> bytes:
        size = self._check("kvpot_pot_state_size", self.lib.kvpot_pot_state_size(self.ctx))
        buf = ctypes.create_string_buffer(size)
        self._check("kvpot_pot_state_get", self.lib.kvpot_pot_state_get(self.ctx, buf, size))
        return buf.raw[:size]

    def set_state_bytes(self, data: bytes) -> None:
        self._check("kvpot_pot_state_set", self.lib.kvpot_pot_state_set(self.ctx, data, len(data)))

    def cell_positions(self, n: int) -> np.ndarray:
        out = np.zeros(n, dtype=np.int32)
        self._check("kvpot_pot_cell_pos", self.lib.kvpot_pot_cell_pos(self.ctx, out.ctypes.data_as(api.c_i32_p), n))
        return out

    # -- InfLLM: cells out of and into the pot at one RoPE angle, lookup queries ------------------

    def read_at(self, cell0: int, n_cells: int, rope_to: int, d_k: int, d_v: int) -> tuple[np.ndarray, np.ndarray]:
        """K [L, H, n, d_k] re-rotated to RoPE position rope_to, and V [L, H, n, d_v], of cells [cell0, cell0 + n)."""
        k = np.zeros((self.n_layers, self.n_head_kv, n_cells, d_k), dtype=np.float32)
        v = np.zeros((self.n_layers, self.n_head_kv, n_cells, d_v), dtype=np.float32)
        self._check("kvpot_pot_read_at", self.lib.kvpot_pot_read_at(
            self.ctx, cell0, n_cells, rope_to, k.ctypes.data_as(api.c_f32_p), v.ctypes.data_as(api.c_f32_p)))
        return k, v

    def insert(self, k: np.ndarray, v: np.ndarray, rope_from, rope_to: int) -> None:
        """Append cells after the pot: k [L, H, n, d_k] stored at rope_from [n], re-rotated to rope_to."""
        k = np.ascontiguousarray(k, dtype=np.float32)
        v = np.ascontiguousarray(v, dtype=np.float32)
        if k.ndim != 4 or v.ndim != 4 or k.shape[:3] != (self.n_layers, self.n_head_kv, v.shape[2]) or v.shape[:2] != k.shape[:2]:
            raise PotCallError("kvpot_pot_insert", api.KVPOT_ERR_ARG, f"k {k.shape} / v {v.shape} do not fit the pot")
        arr, ptr = _i32(rope_from)
        if arr.shape != (k.shape[2],):
            raise PotCallError("kvpot_pot_insert", api.KVPOT_ERR_ARG, "rope_from needs one position per cell")
        self._check("kvpot_pot_insert", self.lib.kvpot_pot_insert(
            self.ctx, k.shape[2], k.ctypes.data_as(api.c_f32_p), v.ctypes.data_as(api.c_f32_p), ptr, rope_to))

    def query_request(self, on: bool, angle: int = 0) -> None:
        self._check("kvpot_query_request", self.lib.kvpot_query_request(self.ctx, on, angle))

    def query_take(self, d_k: int) -> np.ndarray | None:
        """[L, H, d_k] lookup queries accumulated since the request (None when nothing was captured)."""
        out = np.zeros((self.n_layers, self.n_head_kv, d_k), dtype=np.float32)
        got = [self._check("kvpot_query_take", self.lib.kvpot_query_take(
            self.ctx, l, out[l].ctypes.data_as(api.c_f32_p), out[l].size)) for l in range(self.n_layers)]
        return out if all(got) else None

    def lookup_set(self, store, cell0: int = 0, n_fetch: int = 0, n_local: int = 0) -> None:
        """InfLLM's lookup inside the layer: every later ubatch fetches, per pot layer, the n_fetch blocks of
        `store` (a kvpot.runtime.blocks.BlockStore) most relevant to its own queries into the placed cells
        [cell0, cell0 + n_fetch * block_size) before the layer's attention; store None turns it off."""
        ptr = store.ptr if store is not None else None
        self._check("kvpot_lookup_set", self.lib.kvpot_lookup_set(self.ctx, ptr, cell0, n_fetch, n_local))
        self._lookup_held = False  # a new lookup starts unheld (kvpot_lookup_set)

    def distance_set(self, cell0: int, n_cells: int, distance: int) -> None:
        """From the next decode on, every query sees the placed cells [cell0, cell0 + n_cells) `distance`
        positions back, whatever its own position (InfLLM's memory); n_cells 0 turns it off."""
        self._check("kvpot_distance_set", self.lib.kvpot_distance_set(self.ctx, cell0, n_cells, distance))

    def lookup_hold(self, hold: bool) -> None:
        """While held, graphs do not fetch: the lookup's cells keep the blocks the last fetch chose."""
        self._check("kvpot_lookup_hold", self.lib.kvpot_lookup_hold(self.ctx, hold))
        self._lookup_held = hold

    def lookup_take(self, n_fetch: int, block_size: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(blocks [L, n_fetch], stream positions [L, n_fetch * block_size]) the last graph fetched per pot
        layer, or None when nothing was fetched since the last take; a fetch that failed raises here.
        While held nothing is fetched, so nothing is asked of the runtime (one call per layer and token)."""
        if self._lookup_held:
            return None
        blocks = np.zeros((self.n_layers, n_fetch), dtype=np.int32)
        pos = np.zeros((self.n_layers, n_fetch * block_size), dtype=np.int32)
        got = [self._check("kvpot_lookup_take", self.lib.kvpot_lookup_take(
            self.ctx, l, blocks[l].ctypes.data_as(api.c_i32_p), n_fetch, pos[l].ctypes.data_as(api.c_i32_p), pos.shape[1]))
            for l in range(self.n_layers)]
        return (blocks, pos) if all(got) else None

    # -- Locret's retaining heads -----------------------------------------------------------------

    def set_heads(self, heads) -> None:
        """Score every token of every layer inside the graph with these retaining heads
        (kvpot.converters.adapter.RetainingHeads, already checked against the model); None removes them."""
        if heads is None:
            self._check("kvpot_heads_set", self.lib.kvpot_heads_set(self.ctx, 0, 0, 0, 0, 0, None, None))
            self._heads_kv = 0
            return
        fc1 = np.ascontiguousarray(np.stack(heads.fc1), dtype=np.float32)  # [n_layer, hidden, width]
        fc2 = np.ascontiguousarray(np.stack(heads.fc2), dtype=np.float32)  # [n_layer, n_head_kv, hidden]
        n_layer, hidden, width = fc1.shape
        act = {"silu": 0, "gelu": 1}[heads.activation]
        self._check("kvpot_heads_set", self.lib.kvpot_heads_set(
            self.ctx, n_layer, hidden, width, fc2.shape[1], act,
            fc1.ctypes.data_as(api.c_f32_p), fc2.ctypes.data_as(api.c_f32_p)))
        self._heads_kv = int(fc2.shape[1])

    def enable_heads(self, on: bool) -> None:
        self._check("kvpot_heads_enable", self.lib.kvpot_heads_enable(self.ctx, on))

    def take_head_scores(self, il: int, n_tokens: int) -> np.ndarray:
        """[n, n_head_kv] retaining-head scores of model layer il for the n <= n_tokens tokens decoded
        since the last take (then forgotten)."""
        n_kv = getattr(self, "_heads_kv", 0)
        out = np.zeros((n_tokens, max(n_kv, 1)), dtype=np.float32)
        n = self._check("kvpot_heads_take", self.lib.kvpot_heads_take(
            self.ctx, il, out.ctypes.data_as(api.c_f32_p), n_tokens, n_kv))
        return out[:n]

    # -- training capture for the retaining heads ------------------------------------------------

    def capture(self, on: bool) -> None:
        """Capture, in every following decode, each layer's heads input [Q; K; V] and the tapped
        query rows (after RoPE, times kq_scale); switching drops what was captured."""
        self._check("kvpot_capture_enable", self.lib.kvpot_capture_enable(self.ctx, on))

    def take_qkv(self, il: int, n_tokens: int, width: int) -> np.ndarray:
        """[n, width] heads input of model layer il for the n <= n_tokens tokens decoded since the last take."""
        out = np.zeros((n_tokens, width), dtype=np.float32)
        n = self._check("kvpot_capture_qkv_take", self.lib.kvpot_capture_qkv_take(
            self.ctx, il, out.ctypes.data_as(api.c_f32_p), n_tokens, width))
        return out[:n]

    def take_q(self, ipot: int, n_rows: int, n_head: int, head_dim: int) -> np.ndarray:
        """[n, n_head, head_dim] tapped query rows of pot layer ipot (after RoPE, times kq_scale)."""
        out = np.zeros((n_rows, n_head, head_dim), dtype=np.float32)
        n = self._check("kvpot_capture_q_take", self.lib.kvpot_capture_q_take(
            self.ctx, ipot, out.ctypes.data_as(api.c_f32_p), n_rows, n_head, head_dim))
        return out[:n]

    # -- EdgeInfinite's gated memory --------------------------------------------------------------

    def set_gate(self, gate) -> None:
        """Mix a compressive memory into every pot layer's attention through this memory-gating module
        (kvpot.converters.adapter.MemoryGate, already checked against the model); gives the context a zeroed
        memory. None removes gate and memory."""
        if gate is None:
            self._check("kvpot_gate_set", self.lib.kvpot_gate_set(self.ctx, 0, 0, 0, 0, None, None, None, None, None))
            return
        arrs = [np.ascontiguousarray(a, dtype=np.float32) for a in (gate.w1, gate.b1, gate.w2, gate.b2, gate.g)]
        n_layer, d_h, d_v = arrs[0].shape
        self._check("kvpot_gate_set", self.lib.kvpot_gate_set(
            self.ctx, n_layer, d_v, d_h, arrs[4].shape[1], *(a.ctypes.data_as(api.c_f32_p) for a in arrs)))
        self._gate_keep = arrs  # the C side copied them; kept only so a failing call can be inspected

    def fold(self, cells) -> None:
        """Fold cells into the memory: M += sigma(K)^T V, z += sum sigma(k). cells: [L, H, n] per pot layer
        and KV head, or [n] for the same in all. They stay in the cache until the next compaction."""
        cells = np.asarray(cells)
        if cells.ndim == 1:
            cells = np.broadcast_to(cells, (self.n_layers, self.n_head_kv, cells.size))
        if cells.ndim != 3:
            raise PotCallError("kvpot_memory_fold", api.KVPOT_ERR_ARG, f"cells must be [layers, heads, n], got {cells.shape}")
        arr, ptr = _i32(cells)
        L, H, n = arr.shape
        self._check("kvpot_memory_fold", self.lib.kvpot_memory_fold(self.ctx, ptr, L, H, n))

    def folded(self) -> int:
        """Tokens folded into the memory since it was zeroed (0: attention is stock)."""
        return self._check("kvpot_memory_folded", self.lib.kvpot_memory_folded(self.ctx))

    def memory_bytes(self) -> bytes:
        """M, z and the folded count as bytes (layout in kvpot.h); b"" without a gate."""
        size = self._check("kvpot_memory_state_size", self.lib.kvpot_memory_state_size(self.ctx))
        if size == 0:
            return b""
        buf = ctypes.create_string_buffer(size)
        self._check("kvpot_memory_state_get", self.lib.kvpot_memory_state_get(self.ctx, buf, size))
        return buf.raw[:size]

    def set_memory_bytes(self, data: bytes) -> None:
        self._check("kvpot_memory_state_set", self.lib.kvpot_memory_state_set(self.ctx, data, len(data)))

    def memory(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(M [L, H, d_k, d_v], z [L, H, d_k], tokens folded) read back from the context."""
        return parse_memory(self.memory_bytes())


def parse_memory(data: bytes) -> tuple[np.ndarray, np.ndarray, int]:
    """Decode kvpot_memory_state_get's bytes into (M [L, H, d_k, d_v], z [L, H, d_k], n_folded)."""
    head = np.frombuffer(data, dtype="<i4", count=6)
    if len(data) < 32 or int(head[0]) != 0x4D50564B:
        raise KvpotError("not a kvpot memory state")
    L, H, dk, dv = (int(x) for x in head[2:6])
    n_folded = int(np.frombuffer(data, dtype="<i8", count=1, offset=24)[0])
    per = H * dk * (dv + 1)
    body = np.frombuffer(data, dtype="<f4", offset=32)
    if body.size != L * per:
        raise KvpotError("kvpot memory state has the wrong size")
    body = body.reshape(L, per)
    m = body[:, :H * dk * dv].reshape(L, H, dv, dk).transpose(0, 1, 3, 2)
    z = body[:, H * dk * dv:].reshape(L, H, dk)
    return np.ascontiguousarray(m), np.ascontiguousarray(z), n_folded

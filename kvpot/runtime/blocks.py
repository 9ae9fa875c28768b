"""InfLLM's block store (ggml_ext/kvpot-blocks.*): evicted K/V in blocks with representative keys, in a
file that lookups read through a bounded cache per layer (ggml_ext/kvpot-block-cache.h). The format is
in docs/formats.md ("InfLLM block store")."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import numpy as np

from kvpot.errors import KvpotError
from kvpot.runtime import api
from kvpot.runtime.library import load as load_runtime
from kvpot.runtime.owned import Owned


class BlockStoreError(KvpotError):
    """The store cannot be opened (missing, truncated, foreign, other shape) or a call failed."""


# the K/V row formats a store may hold, by name, as ggml_type numbers (ggml.h's enum)
KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}
# the eviction rules of the per-layer caches (kvpot.h KVPOT_CACHE_*): the paper's frequency score, and
# the rules its Figure 4 compares it with
CACHE_RULES = {"freq": 0, "lru": 1, "fifo": 2, "random": 3}
# a row format's bytes per value: ggml's blocks of 32 values, q8_0 34 bytes and q4_0 18
BYTES_PER_VALUE = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def split_format(fmt: str) -> tuple[str, str]:
    """(keys' row format, values' row format) of a store format: "q8_0" stores both in q8_0, "q8_0/q4_0"
    keys in q8_0 and values in q4_0. Keys rank and select what attention reads, and a model's keys can
    hold a few channels hundreds of times larger than the rest, so they may need a finer format than
    the values."""
    k, sep, v = fmt.partition("/")
    k, v = k.strip(), (v.strip() if sep else k.strip())
    for t in (k, v):
        if t not in KV_TYPES:
            raise BlockStoreError(f"block store format {fmt!r}: {t!r} is not one of {', '.join(KV_TYPES)}")
    return k, v


def format_name(k_type: str, v_type: str) -> str:
    """The store format of keys in k_type and values in v_type, as split_format reads it."""
    return k_type if k_type == v_type else f"{k_type}/{v_type}"


@dataclass(frozen=True)
class BlockStoreInfo:
    n_layer: int
    n_head_kv: int
    d_k: int
    d_v: int
    block_size: int
    n_blocks: int
    max_cached: int
    n_cached: int
    record_bytes: int
    file_bytes: int
    hits: int
    misses: int
    kv_type: str  # the store format: one row format for K and V ("q8_0"), or keys/values ("q8_0/q4_0")


@dataclass(frozen=True)
class LayerCache:
    """One layer's block cache: its counts since the rule was set, the blocks it holds (ascending) and their
    frequency scores s_b."""

    hits: int
    misses: int
    blocks: np.ndarray
    scores: np.ndarray


def _f32(a: np.ndarray):
    return a.ctypes.data_as(api.c_f32_p)


class BlockStore(Owned):
    """An open store; close() (or the context manager) frees it. Shapes: L pot layers, H KV heads.

    create=True makes a new file and refuses an existing one (O_EXCL in the C open: no path replaces a
    file); create=False opens a store kvpot wrote, checked against the file's length before any read.
    kv_type: the store format, the row format K and V are stored in ("f16", "q8_0", "q4_0") or one for
    each ("q8_0/q4_0": keys, values; split_format); None takes the file's (and makes f16)."""

    def __init__(self, path: str | os.PathLike, *, n_layer: int = 0, n_head_kv: int = 0, d_k: int = 0, d_v: int = 0,
                 block_size: int = 0, kv_type: str | None = None, max_cached: int = 32, create: bool = False):
        self.lib = load_runtime()
        self.path = os.fspath(path)
        if "\0" in self.path:  # C would read the name only up to it
            raise BlockStoreError(f"block store path {self.path!r} holds a NUL character")
        if kv_type is not None:
            codes = [KV_TYPES[t] for t in split_format(kv_type)]
        else:
            codes = [KV_TYPES["f16"] if create else 0] * 2
        ptr = self.lib.kvpot_blocks_open(os.fsencode(self.path), n_layer, n_head_kv, d_k, d_v, block_size, *codes,
                                         max_cached, create)
        if not ptr:
            raise BlockStoreError(self.lib.kvpot_last_error().decode(errors="replace"))
        self._ptr = ptr
        i = self.info()
        self.shape = (i.n_layer, i.n_head_kv, i.d_k, i.d_v, i.block_size)

    @property
    def ptr(self):
        if not self._ptr:
            raise BlockStoreError(f"block store {self.path} is closed")
        return self._ptr

    def close(self) -> None:
        if getattr(self, "_ptr", None):
            self.lib.kvpot_blocks_free(self._ptr)
            self._ptr = None

    def _check(self, fn: str, rc: int) -> int:
        if rc < 0:
            raise BlockStoreError(f"{fn}: {self.lib.kvpot_last_error().decode(errors='replace')}")
        return rc

    def info(self) -> BlockStoreInfo:
        s = api.kvpot_blocks_info()
        self._check("kvpot_blocks_info_get", self.lib.kvpot_blocks_info_get(self.ptr, ctypes.byref(s)))
        got = {name: getattr(s, name) for name, _ in s._fields_}
        name = {code: name for name, code in KV_TYPES.items()}
        got["kv_type"] = format_name(name[got.pop("k_type")], name[got.pop("v_type")])
        return BlockStoreInfo(**got)

    @property
    def n_blocks(self) -> int:
        return self.info().n_blocks

    def append(self, pos: np.ndarray, repr_: np.ndarray, k: np.ndarray, v: np.ndarray) -> int:
        """One block for every layer: pos [bs], repr [L, H, d_k], k [L, H, bs, d_k], v [L, H, bs, d_v]."""
        L, H, dk, dv, bs = self.shape
        pos = np.ascontiguousarray(pos, dtype=np.int32)
        repr_ = np.ascontiguousarray(repr_, dtype=np.float32)
        k = np.ascontiguousarray(k, dtype=np.float32)
        v = np.ascontiguousarray(v, dtype=np.float32)
        want = {"pos": (bs,), "repr": (L, H, dk), "k": (L, H, bs, dk), "v": (L, H, bs, dv)}
        for name, arr in (("pos", pos), ("repr", repr_), ("k", k), ("v", v)):
            if arr.shape != want[name]:
                raise BlockStoreError(f"block {name} has shape {arr.shape}, the store takes {want[name]}")
        return self._check("kvpot_blocks_append", self.lib.kvpot_blocks_append(
            self.ptr, pos.ctypes.data_as(api.c_i32_p), _f32(repr_), _f32(k), _f32(v)))

    def read(self, layer: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(pos [bs], repr [H, d_k], k [H, bs, d_k], v [H, bs, d_v]) of one block of one layer, read as a
        lookup of it alone through the layer's cache that gives it no attention."""
        L, H, dk, dv, bs = self.shape
        pos = np.zeros(bs, dtype=np.int32)
        repr_ = np.zeros((H, dk), dtype=np.float32)
        k = np.zeros((H, bs, dk), dtype=np.float32)
        v = np.zeros((H, bs, dv), dtype=np.float32)
        self._check("kvpot_blocks_read", self.lib.kvpot_blocks_read(
            self.ptr, layer, block, pos.ctypes.data_as(api.c_i32_p), _f32(repr_), _f32(k), _f32(v)))
        return pos, repr_, k, v

    def topk(self, layer: int, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(top k block indices best first, relevance of every block) for q [H, d_k]."""
        L, H, dk, dv, bs = self.shape
        q = np.ascontiguousarray(q, dtype=np.float32)
        if q.shape != (H, dk):
            raise BlockStoreError(f"query has shape {q.shape}, the store takes {(H, dk)}")
        out = np.zeros(k, dtype=np.int32)
        scores = np.zeros(self.n_blocks, dtype=np.float32)
        self._check("kvpot_blocks_topk", self.lib.kvpot_blocks_topk(
            self.ptr, layer, _f32(q), k, out.ctypes.data_as(api.c_i32_p), _f32(scores)))
        return out, scores

    @property
    def layer_caches(self) -> bool:
        """Whether the runtime keeps a cache per layer (kvpot_blocks_cache_*; one built before them does not)."""
        return hasattr(self.lib, "kvpot_blocks_cache_get")

    def set_cache(self, rule: str, decay: float = 0.1, seed: int = 0) -> None:
        """Every layer's cache evicts by `rule` (CACHE_RULES), the frequency score decaying by `decay` at
        each lookup; `seed` seeds the random rule. Empties the caches and their counts."""
        if rule not in CACHE_RULES:
            raise BlockStoreError(f"cache rule {rule!r} is not one of {', '.join(CACHE_RULES)}")
        self._check("kvpot_blocks_cache_set", self.lib.kvpot_blocks_cache_set(self.ptr, CACHE_RULES[rule], decay, seed))

    def cache_lookup(self, layer: int, blocks, attention=None) -> None:
        """One lookup of a layer's cache as the in-graph lookup makes it: `blocks` read through the cache,
        every score decayed and block i's raised by attention[i], then the cache cut back to its size."""
        blocks = np.ascontiguousarray(blocks, dtype=np.int32)
        att = None if attention is None else np.ascontiguousarray(attention, dtype=np.float32)
        if att is not None and att.shape != blocks.shape:
            raise BlockStoreError(f"attention has shape {att.shape}, the blocks {blocks.shape}")
        self._check("kvpot_blocks_cache_lookup", self.lib.kvpot_blocks_cache_lookup(
            self.ptr, layer, blocks.ctypes.data_as(api.c_i32_p), None if att is None else _f32(att), blocks.size))

    def cache(self, layer: int) -> LayerCache:
        """A layer's cache: hits, misses, the blocks it holds and their scores."""
        hits, misses = ctypes.c_int64(), ctypes.c_int64()
        n = self._check("kvpot_blocks_cache_get", self.lib.kvpot_blocks_cache_get(
            self.ptr, layer, ctypes.byref(hits), ctypes.byref(misses), None, None, 0))
        blocks, scores = np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.float32)
        self._check("kvpot_blocks_cache_get", self.lib.kvpot_blocks_cache_get(
            self.ptr, layer, None, None, blocks.ctypes.data_as(api.c_i32_p), _f32(scores), n))
        return LayerCache(hits=hits.value, misses=misses.value, blocks=blocks, scores=scores)

    def limit(self, n_blocks: int) -> None:
        """Show only the first n_blocks blocks (a reopened context's); the file is never cut, and the
        store then refuses to append (its end is not the file's)."""
        self._check("kvpot_blocks_truncate", self.lib.kvpot_blocks_truncate(self.ptr, n_blocks))

    def sync(self) -> None:
        self._check("kvpot_blocks_sync", self.lib.kvpot_blocks_sync(self.ptr))

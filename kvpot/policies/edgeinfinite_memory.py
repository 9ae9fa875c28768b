"""A NumPy reference of EdgeInfinite's gated compressive memory.

The reference here is the specification the in-graph layer (ggml_ext/kvpot-memory.cpp) and the torch
training forward (kvpot/train/edgeinfinite.py) are both tested against. Per pot layer and KV head:

    fold a segment:  M += sigma(K)^T V,  z += sum_j sigma(k_j)       (paper eq. 5, 6; K after RoPE, as cached)
    read out:        A_mem = sigma(Q) M / (sigma(Q) z)                (eq. 7; Q as the attention receives it)
    gate:            A_com from A_mem and the attention output A_dot  (eq. 8, 9; MemoryGate.mix)
    sigma = ELU + 1.  No memory yet (nothing folded): A_com = A_dot (eq. 10).

The trained gate, its shapes and initial values are the adapter type MemoryGate in
kvpot.converters.adapter, with Locret's heads.
"""

from __future__ import annotations

import numpy as np


def sigma(x: np.ndarray) -> np.ndarray:
    """ELU(x) + 1 (> 0 everywhere)."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def fold(m: np.ndarray, z: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One KV head: M [d_k, d_v], z [d_k] plus a segment's keys [n, d_k] and values [n, d_v]."""
    sk = sigma(k)
    return m + sk.T @ np.asarray(v, dtype=np.float64), z + sk.sum(axis=0)


def read(m: np.ndarray, z: np.ndarray, q: np.ndarray) -> np.ndarray:
    """A_mem [n_tokens, n_head, d_v] for queries q [n_tokens, n_head, d_k] from M [H, d_k, d_v], z [H, d_k];
    query head h reads KV head h // (n_head / H)."""
    n_head, n_kv = q.shape[1], m.shape[0]
    kv_of = np.arange(n_head) // (n_head // n_kv)
    sq = sigma(q)                                                     # [T, n_head, d_k]
    num = np.einsum("thk,hkv->thv", sq, m[kv_of].astype(np.float64))
    den = np.einsum("thk,hk->th", sq, z[kv_of].astype(np.float64))
    return num / den[..., None]

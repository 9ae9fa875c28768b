"""EdgeInfinite's memory-gating module and a NumPy reference of the gated compressive memory.

The reference here is the specification the in-graph layer (ggml_ext/kvpot-memory.cpp) and the torch
training forward (kvpot/train/edgeinfinite.py) are both tested against. Per pot layer and KV head:

    fold a segment:  M += sigma(K)^T V,  z += sum_j sigma(k_j)       (paper eq. 5, 6; K after RoPE, as cached)
    read out:        A_mem = sigma(Q) M / (sigma(Q) z)                (eq. 7; Q as the attention receives it)
    gate:            A~ = W2 ReLU(W1 A_mem + b1) + b2                 (eq. 8)
                     A_com = sigmoid(g) A~ + (1 - sigmoid(g)) A_dot   (eq. 9), then W_o as usual
    sigma = ELU + 1.  No memory yet (nothing folded): A_com = A_dot (eq. 10).

Shapes (decisions; the paper gives none, only "about 0.15 % of the weights" for its 3B model):
  * W1 [d_h, d_v], b1 [d_h], W2 [d_v, d_h], b2 [d_v]: one MLP per layer, shared by the layer's query
    heads, acting on each head's d_v-vector (the paper's eq. 8 is written per head, A_mem in R^{L x d});
    d_h = d_v by default.
  * g [n_head, d_v]: per query head and channel (the paper calls g "a gating vector"; per channel is the
    Infini-attention choice, per head keeps heads that use the memory apart from those that do not).
  Per layer that is 2 d_v^2 + d_h + d_v + n_head d_v weights. SmolLM2-135M (30 layers, d = 64, 9 heads):
  30 x 8 896 = 266 880 weights, 0.20 % of its 134.5M. Gemma-3-270M's 3 global (pot) layers (d = 256,
  4 heads): 3 x 132 608 = 397 824, 0.15 % of 268M. A per-head MLP would be 9x (SmolLM2: 1.8 %) and a
  full-width one (n_head d_v)^2 far more; a shared d x d MLP is what lands near the paper's figure.
Initial values (the "untrained gate" ablation is exactly this): W1 = W2 = I, b1 = +c, b2 = -c with
  c = INIT_OFFSET, so A~ = A_mem while every A_mem channel is above -c (A_mem is a convex combination
  of cached values, so that holds unless a value channel reaches -c); g = INIT_G = -4, sigmoid(g) = 0.018:
  the untrained layer is within 2 % of the stock attention output, and training opens the gate where
  the memory helps (a frozen backbone cannot absorb the paper's Infini-attention start at g = 0, which
  halves every attention output).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvpot.errors import KvpotError

INIT_OFFSET = 8.0
INIT_G = -4.0


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


@dataclass
class MemoryGate:
    """The trained part, per pot layer (model layer ids in `layers`)."""

    layers: list[int]
    w1: np.ndarray  # [L, d_h, d_v]
    b1: np.ndarray  # [L, d_h]
    w2: np.ndarray  # [L, d_v, d_h]
    b2: np.ndarray  # [L, d_v]
    g: np.ndarray   # [L, n_head, d_v]
    base: object = field(default=None, compare=False)  # kvpot.converters.adapter.BaseIdentity

    @classmethod
    def initial(cls, layers: list[int], d_v: int, n_head: int, d_h: int | None = None, base=None) -> MemoryGate:
        d_h = d_v if d_h is None else d_h
        L = len(layers)
        eye = np.eye(d_h, d_v, dtype=np.float32)
        return cls(layers=list(layers), w1=np.tile(eye, (L, 1, 1)), b1=np.full((L, d_h), INIT_OFFSET, np.float32),
                   w2=np.tile(eye.T, (L, 1, 1)), b2=np.full((L, d_v), -INIT_OFFSET, np.float32),
                   g=np.full((L, n_head, d_v), INIT_G, np.float32), base=base)

    @property
    def d_v(self) -> int:
        return int(self.w1.shape[2])

    @property
    def d_h(self) -> int:
        return int(self.w1.shape[1])

    @property
    def n_head(self) -> int:
        return int(self.g.shape[1])

    def check_shapes(self) -> None:
        L, d_h, d_v = self.w1.shape
        want = {"w1": (L, d_h, d_v), "b1": (L, d_h), "w2": (L, d_v, d_h), "b2": (L, d_v), "g": (L, self.n_head, d_v)}
        if len(self.layers) != L:
            raise KvpotError(f"memory gate: {len(self.layers)} layer ids for {L} layers of weights")
        for name, shape in want.items():
            a = getattr(self, name)
            if a.shape != shape:
                raise KvpotError(f"memory gate: {name} is {list(a.shape)}, expected {list(shape)}")
            if not np.isfinite(a).all():
                raise KvpotError(f"memory gate: {name} holds NaN or infinite weights")

    def mix(self, layer: int, a_mem: np.ndarray, a_dot: np.ndarray) -> np.ndarray:
        """A_com [n_tokens, n_head, d_v] for pot layer `layer` (index into `layers`), in float64."""
        w1, b1, w2, b2 = (a[layer].astype(np.float64) for a in (self.w1, self.b1, self.w2, self.b2))
        h = np.maximum(a_mem @ w1.T + b1, 0.0)
        a_tl = h @ w2.T + b2
        sg = 1.0 / (1.0 + np.exp(-self.g[layer].astype(np.float64)))  # [n_head, d_v]
        return sg * a_tl + (1.0 - sg) * np.asarray(a_dot, dtype=np.float64)

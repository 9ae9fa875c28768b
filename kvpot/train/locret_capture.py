"""Locret's training features and labels, read from the patched llama.cpp itself.

Features: per layer and prompt token, the retaining heads' input [Q; K; V] (pre-RoPE projections of
the layer's normed input), captured by kvpot_capture_enable from the very graph tensor the in-graph
heads read (kvpot_heads_input), so what training sees is what inference feeds the heads.

Labels (Locret section 3.3): the causal importance of prompt token k at KV head j of layer i is
S[k]_j = max over answer rows p and over the query heads h of KV group j of the pre-softmax score
q_p,h · k_k (RoPE applied, times the attention's kq_scale, e.g. 1/sqrt(d)); only prompt keys get
labels, and every answer row comes after every prompt key, so the causal mask removes nothing.

Decision (the simplest correct way to get both halves of q·k): the sample is decoded once with full
attention (a context as long as the sample, no eviction). The answer rows' queries come from the
score tap, which already gathers those rows after RoPE (kvpot_capture_q_take, scaled by kq_scale);
the keys are read back from the pot (kvpot_pot_read: as stored, after RoPE, and after Gemma's k_norm).
The max is taken here in NumPy. Soft-capped architectures (Gemma-2) get labels before the cap: the
cap is monotone, so it would not change which cells rank high.

Layers the pot does not hold (Gemma-3's sliding-window layers, bounded by their window) have no
labels; their heads are never read by the Locret policy and are written as zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvpot.converters.adapter import BaseIdentity
from kvpot.train.documents import Sample


def causal_importance(q_rows: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Labels [n_keys, n_head_kv] from q_rows [n_rows, n_head, d] (after RoPE, times kq_scale) and
    keys [n_keys, n_head_kv, d] (after RoPE): max over rows and over the group's query heads of q·k.
    Query head h belongs to KV head h // (n_head / n_head_kv), as in llama.cpp's GQA broadcast."""
    n_rows, n_head, d = q_rows.shape
    n_keys, n_head_kv, _ = keys.shape
    n_group = n_head // n_head_kv
    out = np.empty((n_keys, n_head_kv), dtype=np.float32)
    for j in range(n_head_kv):
        qj = q_rows[:, j * n_group:(j + 1) * n_group, :].reshape(-1, d).astype(np.float32)
        out[:, j] = (keys[:, j, :].astype(np.float32) @ qj.T).max(axis=1)
    return out


@dataclass
class Captured:
    """One sample's training data for the layers the pot holds."""

    x: np.ndarray   # [n_layers, n_prompt, width] float16: the heads' input
    y: np.ndarray   # [n_layers, n_prompt, n_head_kv] float32: the labels
    kind: str


class Capturer:
    """Decode samples with capture on and turn what comes back into (features, labels)."""

    def __init__(self, ctx, pot, base: BaseIdentity, n_batch: int):
        self.ctx, self.pot, self.base, self.n_batch = ctx, pot, base, n_batch

    def run(self, sample: Sample) -> Captured:
        b, pot = self.base, self.pot
        T, n_prompt = len(sample.tokens), sample.n_prompt
        self.ctx.clear()
        pot.reset()  # also switches capture off: on again, with nothing captured yet
        pot.capture(True)
        pot.tap_request(np.arange(n_prompt, T))
        try:
            for i in range(0, T, self.n_batch):
                self.ctx.decode(sample.tokens[i:i + self.n_batch], i, logits="last")
            pos = pot.cell_positions(T)
            if sorted(pos.tolist()) != list(range(T)):
                raise RuntimeError("the sample's cells do not hold positions 0..T-1 (a fresh context was expected)")
            x_of = {il: pot.take_qkv(il, T, b.qkv_width()) for il in range(b.n_layer)}
            xs = [x_of[il][:n_prompt].astype(np.float16) for il in pot.layer_ids]
            ys = []
            for ipot in range(pot.n_layers):
                q = pot.take_q(ipot, T - n_prompt, b.n_head, b.head_dim_k)
                if q.shape[0] != T - n_prompt:
                    raise RuntimeError(f"captured {q.shape[0]} answer rows, expected {T - n_prompt}")
                keys = np.stack([pot.read(ipot, h, "k", 0, T, b.head_dim_k) for h in range(b.n_head_kv)], axis=1)
                by_pos = np.empty_like(keys)
                by_pos[pos] = keys  # cell c holds position pos[c]
                ys.append(causal_importance(q, by_pos[:n_prompt]))
        finally:
            pot.tap_clear()
            pot.capture(False)
        if any(x.shape[0] != n_prompt for x in xs) or not ys:
            raise RuntimeError(f"capture returned {[x.shape for x in xs]} features for {n_prompt} prompt tokens")
        return Captured(x=np.stack(xs), y=np.stack(ys), kind=sample.kind)

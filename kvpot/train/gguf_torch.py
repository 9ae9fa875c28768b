"""A frozen llama-architecture forward in torch, on the weights of a GGUF file (dequantized to f32).

Why our own loader and forward rather than transformers' GGUF reader: the keys must be the keys the
llama.cpp cache holds, so the RoPE is llama.cpp's own form for the architecture (LLAMA: rope type
NORM, adjacent pairs, on the converter-permuted attn_q/attn_k weights), and the gated memory's training
forward must be the computation the graph does; a 100-line forward keeps that visible, and leaves out
a multi-hundred-MB dependency. Supported: the llama architecture (SmolLM2). The forward takes a cached
prefix (the sink) and a memory hook per layer, the way kvpot reads a long text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvpot.errors import KvpotError


@dataclass
class LlamaWeights:
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_base: float
    rms_eps: float
    tensors: dict  # name -> torch.Tensor (f32, torch layout [out, in])


def load_llama(path: Path) -> LlamaWeights:
    import gguf
    import torch

    reader = gguf.GGUFReader(str(path))
    kv = {f.name: f.contents() for f in reader.fields.values()}
    arch = kv.get("general.architecture")
    if arch != "llama":
        raise KvpotError(f"training supports llama-architecture models for now; {Path(path).name} is {arch}")
    n_embd = int(kv["llama.embedding_length"])
    n_head = int(kv["llama.attention.head_count"])
    tensors = {}
    for t in reader.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        tensors[t.name] = torch.from_numpy(np.array(arr.reshape(shape), dtype=np.float32))
    if "output.weight" not in tensors:
        tensors["output.weight"] = tensors["token_embd.weight"]  # tied embeddings
    return LlamaWeights(n_layer=int(kv["llama.block_count"]), n_head=n_head,
                        n_head_kv=int(kv.get("llama.attention.head_count_kv", n_head)),
                        head_dim=int(kv.get("llama.attention.key_length", n_embd // n_head)),
                        rope_base=float(kv.get("llama.rope.freq_base", 10000.0)),
                        rms_eps=float(kv.get("llama.attention.layer_norm_rms_epsilon", 1e-5)), tensors=tensors)


def rms_norm(x, w, eps: float):
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_norm(x, pos, base: float):
    """llama.cpp's GGML_ROPE_TYPE_NORM: rotate adjacent pairs (2i, 2i+1) by pos * base^(-2i/d).
    x [T, heads, d], pos [T]."""
    import torch

    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = (pos.to(torch.float64)[:, None] * inv[None, :]).to(x.dtype)  # [T, d/2]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return out.flatten(-2)


def forward(w: LlamaWeights, tokens, pos0: int, prefix=None, mix=None, logits: bool = True):
    """Logits [T, n_vocab] for `tokens` at positions pos0.., attending causally to themselves and to
    `prefix` (per layer (K, V) [P, H, d], RoPE'd, earlier positions), and the layer's K, V [T, H, d].

    mix(il, q, a_dot) -> A_com: the memory hook, called with the layer's RoPE'd queries [T, n_head, d]
    and attention output [T, n_head, d] before W_o (None: stock).
    Returns (logits, [(K, V) per layer]); logits None with logits=False (a pass that only builds the cache
    or the memory: the output projection over the vocabulary is a sixth of SmolLM2's forward)."""
    import torch

    t = w.tensors
    T = len(tokens)
    pos = torch.arange(pos0, pos0 + T)
    x = t["token_embd.weight"][torch.as_tensor(tokens)]
    group = w.n_head // w.n_head_kv
    kvs = []
    for il in range(w.n_layer):
        p = f"blk.{il}."
        h = rms_norm(x, t[p + "attn_norm.weight"], w.rms_eps)
        q = (h @ t[p + "attn_q.weight"].T).view(T, w.n_head, w.head_dim)
        k = (h @ t[p + "attn_k.weight"].T).view(T, w.n_head_kv, w.head_dim)
        v = (h @ t[p + "attn_v.weight"].T).view(T, w.n_head_kv, w.head_dim)
        q, k = rope_norm(q, pos, w.rope_base), rope_norm(k, pos, w.rope_base)
        kvs.append((k, v))
        if prefix is not None:
            kk, vv = torch.cat([prefix[il][0], k]), torch.cat([prefix[il][1], v])
        else:
            kk, vv = k, v
        P = kk.shape[0] - T
        kk = kk.repeat_interleave(group, dim=1)  # query head h reads KV head h // group
        vv = vv.repeat_interleave(group, dim=1)
        s = torch.einsum("thd,shd->hts", q, kk) / w.head_dim ** 0.5
        mask = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P)
        s = s.masked_fill(~mask, float("-inf"))
        a = torch.einsum("hts,shd->thd", s.softmax(-1), vv)
        if mix is not None:
            a = mix(il, q, a)
        x = x + a.reshape(T, -1) @ t[p + "attn_output.weight"].T
        h = rms_norm(x, t[p + "ffn_norm.weight"], w.rms_eps)
        ff = torch.nn.functional.silu(h @ t[p + "ffn_gate.weight"].T) * (h @ t[p + "ffn_up.weight"].T)
        x = x + ff @ t[p + "ffn_down.weight"].T
    if not logits:
        return None, kvs
    x = rms_norm(x, t["output_norm.weight"], w.rms_eps)
    return x @ t["output.weight"].T, kvs

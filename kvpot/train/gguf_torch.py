"""A frozen decoder forward in torch, on the weights of a GGUF file (dequantized to f32).

Why our own loader and forward rather than transformers' GGUF reader: the keys must be the keys the
llama.cpp cache holds, so the RoPE is llama.cpp's own form for the architecture (LLAMA: rope type NORM,
adjacent pairs, on the converter-permuted attn_q/attn_k weights; GEMMA3 and QWEN2: NEOX, halves), and the
gated memory's training forward must be the computation the graph does; a short forward keeps that
visible, and leaves out a multi-hundred-MB dependency. Supported: llama (SmolLM2), gemma3 (Gemma-3-270M)
and qwen2 (Qwen2.5-Coder: biases on Q, K and V, added before RoPE), the computation of llama.cpp's
`src/models/{llama,gemma3,qwen2}.cpp`. The forward takes a cached prefix per layer
and a memory hook, the way kvpot reads a long text.

Gemma-3's sliding-window layers: while kvpot reads, those layers keep llama.cpp's live window of the last
n_swa tokens, at positions that keep their distances to each other (docs/pot.md, "Positions"), whatever
the pot layers keep. So a window layer here attends by *text* position (`text0`), to the text just before
(`Prefix.window`), and a pot layer by *cache* position (`pos0`), to what the pot keeps (`Prefix.pot`).
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvpot.errors import KvpotError
from kvpot.models.gguf_file import read_gguf

ARCHS = ("llama", "gemma3", "qwen2")
NEOX_ARCHS = ("gemma3", "qwen2")  # llama.cpp's rope type per architecture (llama_model_rope_type)


@dataclass
class ModelWeights:
    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: list[float]   # per layer (Gemma-3: 1e4 on window layers, the model's base on the others)
    swa: list[bool]          # per layer: a sliding-window layer (attends the last n_swa tokens)
    n_swa: int
    kq_scale: float          # the logit is (q . k) * kq_scale (Gemma-3 pre-scales Q, llama.cpp then uses 1)
    tensors: dict = field(repr=False)  # name -> torch.Tensor (f32, torch layout [out, in])

    @property
    def neox(self) -> bool:
        """RoPE on the halves of each head (NEOX) rather than adjacent pairs (NORM)."""
        return self.arch in NEOX_ARCHS

    @property
    def pot_layers(self) -> list[int]:
        """The layers whose KV cache is kvpot's pot (all but the window layers)."""
        return [il for il in range(self.n_layer) if not self.swa[il]]


def load_weights(path: Path) -> ModelWeights:
    import gguf
    import torch

    # kvpot's own header walk (gguf-py's reader builds an object per vocabulary entry: ~20 s on a
    # 152K-token vocabulary), the one per-layer array the forward needs kept
    kv, infos = read_gguf(Path(path), keep_arrays=frozenset({"gemma3.attention.sliding_window_pattern"}))
    arch = kv.get("general.architecture")
    if arch not in ARCHS:
        raise KvpotError(f"training supports {' and '.join(ARCHS)} models; {Path(path).name} is {arch}")
    a = arch
    n_layer = int(kv[f"{a}.block_count"])
    n_embd = int(kv[f"{a}.embedding_length"])
    n_head = int(kv[f"{a}.attention.head_count"])
    head_dim = int(kv.get(f"{a}.attention.key_length", n_embd // n_head))
    base = float(kv.get(f"{a}.rope.freq_base", 10000.0))
    swa, n_swa = [False] * n_layer, 0
    if a == "gemma3":
        if kv.get(f"{a}.final_logit_softcapping") or kv.get(f"{a}.rope.scaling.type") not in (None, "none"):
            raise KvpotError(f"{Path(path).name}: logit soft-capping and RoPE scaling are not in the training forward")
        n_swa = int(kv.get(f"{a}.attention.sliding_window", 0))
        if n_swa > 0:  # llama.cpp: a pattern array, else every 6th layer is global (load_swa_pattern(ml, 6))
            pattern = kv.get(f"{a}.attention.sliding_window_pattern", 6)
            swa = ([bool(x) for x in pattern] if isinstance(pattern, list)
                   else [il % int(pattern) < int(pattern) - 1 for il in range(n_layer)])
    base_swa = float(kv.get(f"{a}.rope.freq_base_swa", 10000.0))
    tensors = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for t in infos:
            raw = np.frombuffer(mm, dtype=np.uint8, count=t.n_bytes, offset=t.offset)
            qtype = gguf.GGMLQuantizationType(t.gtype)
            if qtype not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
                raw = raw.reshape(-1, t.n_bytes // max(1, math.prod(t.dims[1:])))  # rows of blocks
            shape = tuple(reversed(t.dims))
            tensors[t.name] = torch.from_numpy(np.array(gguf.quants.dequantize(raw, qtype).reshape(shape),
                                                        dtype=np.float32))
            del raw  # no view of the map outlives it
    if "output.weight" not in tensors:
        tensors["output.weight"] = tensors["token_embd.weight"]  # tied embeddings
    return ModelWeights(arch=a, n_layer=n_layer, n_head=n_head,
                        n_head_kv=int(kv.get(f"{a}.attention.head_count_kv", n_head)), head_dim=head_dim,
                        rms_eps=float(kv.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
                        rope_base=[base_swa if s else base for s in swa], swa=swa, n_swa=n_swa,
                        kq_scale=_kq_scale(a, n_layer, n_embd, n_head, head_dim), tensors=tensors)


def _kq_scale(arch: str, n_layer: int, n_embd: int, n_head: int, head_dim: int) -> float:
    """The attention logit's scale: 1/sqrt(head_dim), except Gemma-3-27B's 1/sqrt(n_embd / n_head)
    (llama.cpp's gemma3 f_attention_scale, applied to Q there)."""
    if arch == "gemma3" and n_layer == 62:
        return 1.0 / (n_embd / n_head) ** 0.5
    return 1.0 / head_dim ** 0.5


def _project(h, t: dict, name: str):
    """h @ W.T, plus the bias where the model has one (qwen2's Q, K and V; llama.cpp's build_qkv adds it
    before the reshape and RoPE)."""
    out = h @ t[name + ".weight"].T
    bias = t.get(name + ".bias")
    return out if bias is None else out + bias


def rms_norm(x, w, eps: float):
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, base: float, neox: bool):
    """llama.cpp's RoPE: NORM rotates adjacent pairs (2i, 2i+1), NEOX the halves (i, i + d/2), by
    pos * base^(-2i/d). x [T, heads, d], pos [T]."""
    import torch

    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = (pos.to(torch.float64)[:, None] * inv[None, :]).to(x.dtype)  # [T, d/2]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x0, x1 = (x[..., :d // 2], x[..., d // 2:]) if neox else (x[..., 0::2], x[..., 1::2])
    r0, r1 = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return torch.cat([r0, r1], dim=-1) if neox else torch.stack([r0, r1], dim=-1).flatten(-2)


@dataclass
class Prefix:
    """What a pass attends to before its own tokens, per layer (K RoPE'd, V) [P, H, d]: `pot` for pot
    layers (what the cache keeps: the sink, unfolded cells), `window` for window layers (the text just
    before, at most n_swa tokens)."""
    pot: list
    window: list

    @staticmethod
    def empty(w: ModelWeights) -> Prefix:
        return Prefix(pot=[None] * w.n_layer, window=[None] * w.n_layer)

    def of(self, w: ModelWeights, il: int):
        return self.window[il] if w.swa[il] else self.pot[il]

    def after(self, w: ModelWeights, kvs: list, keep: bool) -> Prefix:
        """The prefix once a pass's K, V are in the cache: window layers always slide on; pot layers add
        them only when `keep` (cells not folded)."""
        import torch

        def cat(old, new):
            return new if old is None else (torch.cat([old[0], new[0]]), torch.cat([old[1], new[1]]))

        window = [cat(self.window[il], kvs[il]) if w.swa[il] else None for il in range(w.n_layer)]
        window = [None if x is None else (x[0][-w.n_swa:], x[1][-w.n_swa:]) for x in window]
        pot = [cat(self.pot[il], kvs[il]) if keep and not w.swa[il] else self.pot[il] for il in range(w.n_layer)]
        return Prefix(pot=pot, window=window)


def forward(w: ModelWeights, tokens, pos0: int, prefix: Prefix | None = None, mix=None, logits: bool = True,
            text0: int | None = None):
    """Logits [T, n_vocab] for `tokens` at cache positions pos0.. (text positions text0.., default pos0,
    on window layers), attending causally to themselves and to `prefix`, and the layer's K, V [T, H, d].

    mix(il, q, a_dot) -> A_com: the memory hook, called with the layer's RoPE'd queries [T, n_head, d] in
    the unscaled convention (the logit is q . k / sqrt(d)) and attention output [T, n_head, d] before W_o
    (None: stock). Returns (logits, [(K, V) per layer]); logits None with logits=False (a pass that only
    builds the cache or the memory: the output projection over the vocabulary is most of Gemma-3-270M)."""
    import torch

    t = w.tensors
    gemma = w.arch == "gemma3"
    T = len(tokens)
    text0 = pos0 if text0 is None else text0
    pos, tpos = torch.arange(pos0, pos0 + T), torch.arange(text0, text0 + T)
    x = t["token_embd.weight"][torch.as_tensor(tokens)]
    if gemma:
        x = x * (x.shape[-1] ** 0.5)
    group = w.n_head // w.n_head_kv
    kvs = []
    for il in range(w.n_layer):
        p = f"blk.{il}."
        h = rms_norm(x, t[p + "attn_norm.weight"], w.rms_eps)
        q = _project(h, t, p + "attn_q").view(T, w.n_head, w.head_dim)
        k = _project(h, t, p + "attn_k").view(T, w.n_head_kv, w.head_dim)
        v = _project(h, t, p + "attn_v").view(T, w.n_head_kv, w.head_dim)
        if gemma:
            q, k = rms_norm(q, t[p + "attn_q_norm.weight"], w.rms_eps), rms_norm(k, t[p + "attn_k_norm.weight"], w.rms_eps)
        at = tpos if w.swa[il] else pos
        q, k = rope(q, at, w.rope_base[il], w.neox), rope(k, at, w.rope_base[il], w.neox)
        kvs.append((k, v))
        pre = prefix.of(w, il) if prefix is not None else None
        kk, vv = (k, v) if pre is None else (torch.cat([pre[0], k]), torch.cat([pre[1], v]))
        P = kk.shape[0] - T
        kk = kk.repeat_interleave(group, dim=1)  # query head h reads KV head h // group
        vv = vv.repeat_interleave(group, dim=1)
        s = torch.einsum("thd,shd->hts", q, kk) * w.kq_scale
        mask = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P)
        if w.swa[il]:  # llama.cpp's standard window: key text position > query's - n_swa (prefix: the text just before)
            kpos = torch.arange(text0 - P, text0 + T)
            mask &= kpos[None, :] > tpos[:, None] - w.n_swa
        s = s.masked_fill(~mask, float("-inf"))
        a = torch.einsum("hts,shd->thd", s.softmax(-1), vv)
        if mix is not None:
            a = mix(il, q * (w.kq_scale * w.head_dim ** 0.5), a)
        o = a.reshape(T, -1) @ t[p + "attn_output.weight"].T
        x = x + (rms_norm(o, t[p + "post_attention_norm.weight"], w.rms_eps) if gemma else o)
        h = rms_norm(x, t[p + "ffn_norm.weight"], w.rms_eps)
        g = h @ t[p + "ffn_gate.weight"].T
        g = torch.nn.functional.gelu(g, approximate="tanh") if gemma else torch.nn.functional.silu(g)
        ff = (g * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
        x = x + (rms_norm(ff, t[p + "post_ffw_norm.weight"], w.rms_eps) if gemma else ff)
    if not logits:
        return None, kvs
    x = rms_norm(x, t["output_norm.weight"], w.rms_eps)
    return x @ t["output.weight"].T, kvs

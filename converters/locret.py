"""Convert published Locret retaining heads (a torch.save'd state dict) into a kvpot adapter GGUF.

The published checkpoints (hyx21/Locret-llama-3.1-8B-instruct, hyx21/Locret-phi-3-mini-128K) hold,
for every layer i, `model.layers.{i}.self_attn.fc1.weight` [hidden, (n_head + 2 n_head_kv) head_dim]
and `model.layers.{i}.self_attn.fc2.weight` [n_head_kv, hidden] in bf16. The official loader keeps
keys containing "fc" and loads with strict=False, so a mismatched key would be ignored there; here
an unknown key, a missing layer or a wrong shape is refused, naming it.

fc1's input columns follow the Hugging Face layout of Q and K; in a llama-arch GGUF each head's q/k rows
were reordered by llama.cpp's converter, so fc1's Q and K columns are reordered the same way here
(`gguf_qkv_columns`).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from kvpot.converters.adapter import (
    ACTIVATIONS,
    AdapterError,
    BaseIdentity,
    RetainingHeads,
    check_adapter_output,
    write_retaining_heads,
)
from kvpot.converters.torch_checkpoint import read_state_dict

_KEY = re.compile(r"model\.layers\.(\d+)\.self_attn\.(fc1|fc2)\.weight")

# How the base GGUF's Q and K rows relate to the Hugging Face checkpoint the published heads were trained on,
# by general.architecture, as the pinned llama.cpp makes them (convert_hf_to_gguf.py, conversion/*.py):
# - permuted: LlamaModel (undo_permute = True) applies LlamaModel.permute to q_proj and k_proj (weights and
#   biases), reordering each head's rows from HF's rotate_half layout [first half; second half] to adjacent
#   pairs, because llama.cpp runs these models with LLAMA_ROPE_TYPE_NORM (RoPE on adjacent pairs;
#   src/llama-model.cpp, llama_model_rope_type). HF's Llama and Mistral checkpoints both become "llama".
# - as in HF: Qwen2Model, Qwen3Model, Phi3MiniModel (fused qkv split as is), GemmaModel, Gemma2Model and
#   Gemma3Model copy q/k unchanged; llama.cpp runs them with LLAMA_ROPE_TYPE_NEOX (halves, as HF does).
# Any other architecture is refused rather than guessed ("mistral" included: the pinned llama.cpp has no
# such architecture, its Mistral conversions are "llama" or "mistral3").
_QK_PERMUTED = frozenset({"llama"})
_QK_AS_HF = frozenset({"qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3"})


def gguf_qkv_columns(base: BaseIdentity) -> np.ndarray | None:
    """For a base whose GGUF permuted q/k rows: cols with [Q; K; V]_gguf = [Q; K; V]_hf[cols], so that
    fc1_hf[:, cols] · [Q; K; V]_gguf = fc1_hf · [Q; K; V]_hf. None where the GGUF keeps HF's layout.

    llama.cpp's LlamaModel.permute(w, n_head) is w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2).reshape(w.shape):
    row r of the GGUF's weight is row perm[r] of HF's, perm = arange(n_head d).reshape(n_head, 2, d/2)
    .swapaxes(1, 2).ravel(), with n_head_kv heads for k_proj; V is never moved."""
    if base.arch in _QK_AS_HF:
        return None
    if base.arch not in _QK_PERMUTED:
        raise AdapterError(f"architecture {base.arch!r}: how llama.cpp lays out its Q and K rows against the "
                           "checkpoint's is not known here, so the heads cannot be converted for it")
    d = base.head_dim_k
    if d % 2:
        raise AdapterError(f"architecture {base.arch!r} with an odd head size {d}: llama.cpp cannot have "
                           "permuted its q/k rows in pairs")

    def perm(n_head: int) -> np.ndarray:
        return np.arange(n_head * d).reshape(n_head, 2, d // 2).swapaxes(1, 2).reshape(n_head * d)

    nq, nk = base.n_head * d, base.n_head_kv * d
    return np.concatenate([perm(base.n_head), nq + perm(base.n_head_kv), np.arange(nq + nk, base.qkv_width())])


def heads_from_state_dict(state: dict[str, np.ndarray], base: BaseIdentity, where: str) -> RetainingHeads:
    layers: dict[int, dict[str, np.ndarray]] = {}
    for key, arr in state.items():
        m = _KEY.fullmatch(key)
        if not m:
            raise AdapterError(f"{where}: unexpected key {key!r} (a Locret checkpoint holds only "
                               "model.layers.N.self_attn.fc1/fc2.weight)")
        il = int(m.group(1))
        if il >= base.n_layer:
            raise AdapterError(f"{where}: {key} is for layer {il}, the model has {base.n_layer} layers "
                               "(is the checkpoint for this model?)")
        layers.setdefault(il, {})[m.group(2)] = arr
    missing = [il for il in range(base.n_layer) if set(layers.get(il, {})) != {"fc1", "fc2"}]
    if missing:
        il = missing[0]
        which = "fc1 and fc2" if il not in layers else ("fc2" if "fc1" in layers[il] else "fc1")
        raise AdapterError(f"{where}: layer {il} has no {which} ({len(missing)} layer(s) incomplete)")
    if base.arch not in ACTIVATIONS:
        raise AdapterError(f"{where}: no known activation for architecture {base.arch!r}")
    try:
        cols = gguf_qkv_columns(base)
    except AdapterError as e:
        raise AdapterError(f"{where}: {e}") from None
    heads = RetainingHeads(base=base, activation=ACTIVATIONS[base.arch],
                           fc1=[layers[il]["fc1"].astype(np.float32) for il in range(base.n_layer)],
                           fc2=[layers[il]["fc2"].astype(np.float32) for il in range(base.n_layer)])
    try:
        heads.check_shapes()
    except AdapterError as e:
        raise AdapterError(f"{where}: {e} (is the checkpoint for this model?)") from None
    if cols is not None:
        # the graph hands the heads the GGUF's Q and K (kvpot_hook_qkv: wq·x, wk·x before RoPE)
        heads.fc1 = [np.ascontiguousarray(w[:, cols]) for w in heads.fc1]
    return heads


def convert_locret(checkpoint: Path, base_model: Path, out: Path) -> RetainingHeads:
    """Read the checkpoint without running any of it, check it against the base model, write the adapter
    (where: checked before anything is read; never over the checkpoint or the model)."""
    check_adapter_output(out, inputs=(checkpoint, base_model))
    base = BaseIdentity.of_model(base_model)
    heads = heads_from_state_dict(read_state_dict(checkpoint), base, str(checkpoint))
    # bf16 weights stay exactly what was published; anything else is kept at f32
    exact_bf16 = all(not np.any(w.view(np.uint32) & 0xFFFF) for w in heads.fc1 + heads.fc2)
    write_retaining_heads(out, heads, dtype="bf16" if exact_bf16 else "f32",
                          source=f"converted from {Path(checkpoint).name} (Locret retaining heads)")
    return heads

"""Convert published Locret retaining heads (a torch.save'd state dict) into a kvpot adapter GGUF.

The published checkpoints (hyx21/Locret-llama-3.1-8B-instruct, hyx21/Locret-phi-3-mini-128K) hold,
for every layer i, `model.layers.{i}.self_attn.fc1.weight` [hidden, (n_head + 2 n_head_kv) head_dim]
and `model.layers.{i}.self_attn.fc2.weight` [n_head_kv, hidden] in bf16. The official loader keeps
keys containing "fc" and loads with strict=False, so a mismatched key would be ignored there; here
an unknown key, a missing layer or a wrong shape is refused, naming it.
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
    heads = RetainingHeads(base=base, activation=ACTIVATIONS[base.arch],
                           fc1=[layers[il]["fc1"].astype(np.float32) for il in range(base.n_layer)],
                           fc2=[layers[il]["fc2"].astype(np.float32) for il in range(base.n_layer)])
    try:
        heads.check_shapes()
    except AdapterError as e:
        raise AdapterError(f"{where}: {e} (is the checkpoint for this model?)") from None
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

"""Writes tests/data/locret-tiny.torch.bin with real torch (kept so the reader is checked against
torch.save's own output in CI, where torch is not installed). The values follow value() below, which
tests/test_locret_convert.py recomputes; re-run with any torch >= 1.6:

    python tests/data/make_torch_locret_fixture.py   # written with torch 2.13.0+cpu
"""

from pathlib import Path

import torch

N_LAYER, HIDDEN, WIDTH, N_KV = 2, 4, 6, 3


def value(layer: int, which: int, i: int, j: int) -> float:
    return ((layer * 131 + which * 71 + i * 13 + j * 7) % 97 - 48) / 37.0


state = {}
for il in range(N_LAYER):
    for which, shape in ((1, (HIDDEN, WIDTH)), (2, (N_KV, HIDDEN))):
        t = torch.tensor([[value(il, which, i, j) for j in range(shape[1])] for i in range(shape[0])])
        state[f"model.layers.{il}.self_attn.fc{which}.weight"] = t.to(torch.bfloat16)
# a non-contiguous view, as a sliced parameter would be saved
state["model.layers.1.self_attn.fc2.weight"] = state["model.layers.1.self_attn.fc2.weight"].t().contiguous().t()
torch.save(state, Path(__file__).with_name("locret-tiny.torch.bin"))

"""EdgeInfinite's memory and gate in torch: the equations of kvpot.policies.edgeinfinite_memory (the memory)
and kvpot.converters.adapter.MemoryGate (the gate) as trainable code, shared by the training step
(kvpot.train.edgeinfinite) and the engine-shaped step (kvpot.train.edgeinfinite_emulate)."""

from __future__ import annotations

import numpy as np

from kvpot.converters.adapter import MemoryGate
from kvpot.errors import KvpotError


def load_torch():
    try:
        import torch
    except ImportError:
        raise KvpotError("training needs torch: pip install 'kvpot[train]' (or torch==2.13.0 for a CPU build)") from None
    return torch


def sigma(x):
    """ELU(x) + 1."""
    torch = load_torch()
    return torch.nn.functional.elu(x) + 1.0


def fold(m, z, k, v):
    """M [H, d_k, d_v], z [H, d_k] plus keys k [n, H, d_k] (RoPE'd) and values v [n, H, d_v]."""
    torch = load_torch()
    sk = sigma(k)
    return m + torch.einsum("nhk,nhv->hkv", sk, v), z + sk.sum(0)


def read(m, z, q):
    """A_mem [T, n_head, d_v] for q [T, n_head, d_k]; query head h reads KV head h // group."""
    torch = load_torch()
    group = q.shape[1] // m.shape[0]
    sq = sigma(q)
    mg, zg = m.repeat_interleave(group, 0), z.repeat_interleave(group, 0)
    return torch.einsum("thk,hkv->thv", sq, mg) / torch.einsum("thk,hk->th", sq, zg)[..., None]


class GateModule:
    """The trainable gate: torch parameters shaped as MemoryGate's arrays."""

    def __init__(self, gate):
        torch = load_torch()
        self.layers = list(gate.layers)
        self.base = gate.base
        self.params = {n: torch.nn.Parameter(torch.tensor(np.asarray(getattr(gate, n)), dtype=torch.float32))
                       for n in ("w1", "b1", "w2", "b2", "g")}

    def parameters(self):
        return list(self.params.values())

    def mix(self, layer: int, a_mem, a_dot):
        """A_com = sigmoid(g) (W2 ReLU(W1 A_mem + b1) + b2) + (1 - sigmoid(g)) A_dot; a_* [T, n_head, d_v]."""
        torch = load_torch()
        p = self.params
        h = torch.relu(a_mem @ p["w1"][layer].T + p["b1"][layer])
        a_tl = h @ p["w2"][layer].T + p["b2"][layer]
        sg = torch.sigmoid(p["g"][layer])
        return sg * a_tl + (1.0 - sg) * a_dot

    def to_gate(self) -> MemoryGate:
        arr = {n: p.detach().numpy().astype(np.float32).copy() for n, p in self.params.items()}
        return MemoryGate(layers=self.layers, base=self.base, **arr)


def empty_memory(weights, gate: GateModule) -> dict:
    """M, z per pot layer the gate mixes (the window layers have none)."""
    torch = load_torch()
    H, d = weights.n_head_kv, weights.head_dim
    return {il: (torch.zeros(H, d, d), torch.zeros(H, d)) for il in gate.layers}


def fold_all(mem: dict, kvs: list) -> dict:
    return {il: fold(m, z, kvs[il][0], kvs[il][1]) for il, (m, z) in mem.items()}


def memory_mix(gate: GateModule, mem: dict, on: bool):
    """The forward's hook: stock attention while nothing is folded (eq. 10), else the gated mix."""
    pot_index = {il: i for i, il in enumerate(gate.layers)}

    def mix(il, q, a_dot):
        if not on or il not in pot_index:
            return a_dot
        m, z = mem[il]
        return gate.mix(pot_index[il], read(m, z, q), a_dot)
    return mix

"""Fit Locret's retaining heads on captured (features, labels) with torch (the `train` extra).

The loss is the paper's equation 3, per layer and KV head: Smooth-L1(predicted, label) plus
alpha * L2 between the predictions of neighbouring tokens (alpha = 0.0025), averaged over tokens,
heads and layers (equation 2 sums them; a mean only rescales the step, and AdamW is nearly
indifferent to that). Optimiser as in appendix A.1 and the public code: AdamW, betas (0.9, 0.95),
gradient norm clipped at 0.5, batch of one sample, a linear schedule that warms up over the first
2/3 of the steps (2000 of 3000 in the paper) and decays to zero.

Scaled down for a 2-core CPU (the paper: d_R 1024, 3000 steps of 10240 tokens on an A800):
hidden size 32 (an adapter of about 2 MB in f16), 48 samples of 768 tokens, 240 steps (5 passes
over the samples), learning rate 2e-3 (the paper's 5e-4 barely moves in 240 steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvpot.converters.adapter import ACTIVATIONS, AdapterError, BaseIdentity, RetainingHeads
from kvpot.errors import KvpotError
from kvpot.train.locret_capture import Captured


@dataclass
class FitConfig:
    hidden: int = 32
    steps: int = 240
    lr: float = 2e-3
    warmup: float = 2 / 3       # fraction of the steps
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    clip: float = 0.5
    alpha: float = 0.0025       # weight of the smoothing term (equation 3)
    seed: int = 0
    threads: int = 2


def import_torch():
    try:
        import torch
    except ImportError:
        raise KvpotError("training needs torch: pip install 'kvpot[train]' (a CPU build: pip install torch==2.13.0)") \
            from None
    return torch


def locret_loss(torch, pred, y, alpha: float):
    """Equation 3 on pred, y [n_layers, n_tokens, n_head_kv]."""
    reg = torch.nn.functional.smooth_l1_loss(pred, y)
    smooth = ((pred[:, 1:] - pred[:, :-1]) ** 2).mean()
    return reg + alpha * smooth


class HeadsModel:
    """All trained layers' heads at once: fc2(act(fc1(x))) as batched matmuls over layers."""

    def __init__(self, torch, n_layers: int, width: int, hidden: int, n_head_kv: int, activation: str, seed: int):
        g = torch.Generator().manual_seed(seed)
        # torch.nn.Linear's default initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        b1, b2 = 1 / np.sqrt(width), 1 / np.sqrt(hidden)
        self.torch = torch
        self.w1 = ((torch.rand(n_layers, hidden, width, generator=g) * 2 - 1) * b1).requires_grad_()
        self.w2 = ((torch.rand(n_layers, n_head_kv, hidden, generator=g) * 2 - 1) * b2).requires_grad_()
        self.activation = activation

    def params(self):
        return [self.w1, self.w2]

    def __call__(self, x):
        """x [n_layers, n_tokens, width] -> [n_layers, n_tokens, n_head_kv]."""
        F = self.torch.nn.functional
        h = self.torch.bmm(x, self.w1.transpose(1, 2))
        h = F.silu(h) if self.activation == "silu" else F.gelu(h, approximate="tanh")
        return self.torch.bmm(h, self.w2.transpose(1, 2))


def fit(data: list[Captured], base: BaseIdentity, layer_ids: list[int], cfg: FitConfig, on_step=None):
    """Train on the captured samples; returns (model, losses). on_step(step, loss) after each step."""
    torch = import_torch()
    if not data:
        raise KvpotError("no training samples")
    if base.arch not in ACTIVATIONS:
        raise AdapterError(f"no known activation for architecture {base.arch!r}")
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(max(1, cfg.threads))
    model = HeadsModel(torch, len(layer_ids), base.qkv_width(), cfg.hidden, base.n_head_kv,
                       ACTIVATIONS[base.arch], cfg.seed)
    opt = torch.optim.AdamW(model.params(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    warm = max(1, int(round(cfg.warmup * cfg.steps)))

    def lr_at(step: int) -> float:  # linear warmup, then linear decay to 0 (the paper's linear scheduler)
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (cfg.steps - step) / max(1, cfg.steps - warm))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rng = np.random.default_rng(cfg.seed)
    order: list[int] = []
    losses = []
    for step in range(cfg.steps):
        if not order:  # a new pass over the samples, in a seeded order
            order = rng.permutation(len(data)).tolist()
        s = data[order.pop()]
        x = torch.from_numpy(s.x.astype(np.float32))
        y = torch.from_numpy(s.y)
        loss = locret_loss(torch, model(x), y, cfg.alpha)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.params(), cfg.clip)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_step:
            on_step(step, losses[-1])
    return model, losses


def evaluate(model, data: list[Captured], alpha: float) -> float:
    """Mean loss over samples, without training."""
    torch = model.torch
    with torch.no_grad():
        return float(np.mean([float(locret_loss(torch, model(torch.from_numpy(s.x.astype(np.float32))),
                                                torch.from_numpy(s.y), alpha)) for s in data]))


def to_heads(model, base: BaseIdentity, layer_ids: list[int]) -> RetainingHeads:
    """The adapter's heads: trained layers from the model, zeros for the layers the pot does not hold
    (their scores are never read)."""
    w1 = model.w1.detach().numpy().astype(np.float32)
    w2 = model.w2.detach().numpy().astype(np.float32)
    hidden = w1.shape[1]
    fc1 = [np.zeros((hidden, base.qkv_width()), np.float32) for _ in range(base.n_layer)]
    fc2 = [np.zeros((base.n_head_kv, hidden), np.float32) for _ in range(base.n_layer)]
    for i, il in enumerate(layer_ids):
        fc1[il], fc2[il] = w1[i], w2[i]
    heads = RetainingHeads(base=base, activation=model.activation, fc1=fc1, fc2=fc2)
    heads.check_shapes()
    return heads

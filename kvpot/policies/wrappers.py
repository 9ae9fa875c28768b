"""Cross-cutting behaviour as wrappers around a policy, in the manner of kvpress's presses around a
press (KeyRerotationPress, PerLayerCompressionPress): each changes one thing about the policy it
wraps and hands every other hook to it (`Wrapping`). IMDC runs its pruner through both."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvpot.policies.base import DEAD, PAD, Policy, PotView, Wrapping


class _Around(Wrapping):
    """A wrapper holding the policy it wraps as its `policy` field, named as that policy."""

    policy: Policy

    @property
    def wrapped(self) -> Policy:
        return self.policy

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.policy.name


@dataclass
class KeyRerotation(_Around):
    """CR-RoPE around any policy (InfiniPot's section 3.5; kvpress's KeyRerotationPress): after every
    compaction the kept keys are re-rotated so cell j sits at position j, and the next chunk follows
    at n, whatever positions the wrapped policy would keep. The runtime does the rotation
    (ggml_ext/kvpot-compact-plan.cpp); this says that it should."""

    policy: Policy
    cr_rope = True


@dataclass
class PerLayerBudgets(_Around):
    """A policy that chooses per (layer, KV head) with one budget, run with a budget per pot layer
    (kvpress's PerLayerCompressionPress): where `budget_at` hands select an array [L], or an earlier
    per-layer compaction left cells DEAD in some layers, the wrapped policy chooses one layer at a
    time among the cells that layer holds, keeping budgets[l] of them (rows padded with PAD);
    with one budget and no dead cell it chooses as it always does. IMDC's square-sqrt and adaptive
    schedules size each layer apart through it."""

    policy: Policy

    def select(self, view: PotView, budget: int | np.ndarray) -> np.ndarray | None:
        budgets = np.asarray(budget, dtype=np.int64)
        if budgets.ndim == 0 and not np.any(view.positions == DEAD):
            return self.policy.select(view, int(budgets))
        return select_per_layer(self.policy, view, np.broadcast_to(budgets, (view.n_layer,)))


def layer_view(view: PotView, layer: int) -> tuple[PotView, np.ndarray]:
    """One layer of a view with its dead cells left out, and the cell index each sub-view cell has in
    the full view (dead cells are the same in every head of a layer)."""
    cells = np.flatnonzero(view.positions[layer, 0] != DEAD)
    sub = PotView(n_layer=1, n_head_kv=view.n_head_kv, n_cells=int(cells.size),
                  positions=view.positions[layer:layer + 1][..., cells],
                  scores=None if view.scores is None else view.scores[layer:layer + 1][..., cells],
                  logprobs=view.logprobs, chunk_positions=view.chunk_positions, tokens_seen=view.tokens_seen)
    return sub, cells


def select_per_layer(policy: Policy, view: PotView, budgets: np.ndarray) -> np.ndarray:
    """Run a per-(layer, head) policy one layer at a time on the cells that layer holds, keeping
    budgets[l] cells in layer l (all it holds when that is fewer); rows padded with PAD."""
    rows = []
    for layer in range(view.n_layer):
        sub, cells = layer_view(view, layer)
        kept = policy.select(sub, int(budgets[layer])) if sub.n_cells > budgets[layer] else None
        if kept is None:
            kept = np.broadcast_to(np.arange(sub.n_cells), (1, view.n_head_kv, sub.n_cells))
        rows.append(cells[np.asarray(kept)[0]])
    width = max(r.shape[1] for r in rows)
    keep = np.full((view.n_layer, view.n_head_kv, width), PAD, dtype=np.int64)
    for layer, r in enumerate(rows):
        keep[layer, :, :r.shape[1]] = r
    return keep

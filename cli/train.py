"""`kvpot train`: train kvpot's trained pieces on a frozen model (torch from the `train` extra).

The command only parses and reports; the training lives in kvpot/training/ (one module per method).
"""

from __future__ import annotations

from pathlib import Path

import typer

from kvpot.model_ref import resolve_model

from ._common import err, user_errors

app = typer.Typer(help="Train adapters (docs/formats.md) on a frozen model; needs torch (pip install 'kvpot[train]').",
                  no_args_is_help=True)


@app.command("edgeinfinite")
@user_errors
def edgeinfinite(
    model: str = typer.Option(..., "--model", "-m", help="the base model: a known name or a .gguf path"),
    out: Path = typer.Option(..., "--output", "-o", help="the memory-gate adapter GGUF to write"),
    steps: int = typer.Option(150, "--steps", help="optimizer steps (one document window each)"),
    seed: int = typer.Option(0, "--seed", help="seed of the data windows and torch"),
    l_sink: int = typer.Option(32, "--l-sink", help="sink tokens of a training window"),
    l_seg: int = typer.Option(128, "--l-seg", help="segment length of a training window"),
    n_seg: int = typer.Option(3, "--n-seg", help="segments per window (the last one is trained on)"),
    lr: float = typer.Option(5e-3, "--lr", help="Adam learning rate (the paper's 0.005)"),
) -> None:
    """Train EdgeInfinite's memory-gating module for MODEL (frozen backbone; LM loss on long offline text)."""
    from kvpot.errors import KvpotError
    from kvpot.training.edgeinfinite import TrainConfig, train

    if steps < 0 or l_sink < 0 or l_seg < 2 or n_seg < 2 or lr <= 0:
        raise KvpotError("train edgeinfinite: needs steps >= 0, l-sink >= 0, l-seg >= 2, n-seg >= 2, lr > 0")
    facts, _ = resolve_model(model)
    cfg = TrainConfig(L_sink=l_sink, L_seg=l_seg, n_seg=n_seg, steps=steps, lr=lr, seed=seed)
    summary = train(facts.path, out, cfg, log=lambda s: err.print(s))
    err.print(f"{out}: memory gate for {facts.name}, {summary['steps']} steps, "
              f"loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}")

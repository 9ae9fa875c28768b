"""`kvpot convert`: turn published trained parts into kvpot adapter GGUF files."""

from __future__ import annotations

from pathlib import Path

import typer

from kvpot.models.resolve import resolve_model

from ._common import err, user_errors
from ._options import KvpotCommand, KvpotGroup

app = typer.Typer(cls=KvpotGroup, help="Convert published checkpoints into kvpot adapter GGUF files (docs/formats.md).",
                  no_args_is_help=True)


@app.command("locret", cls=KvpotCommand)
@user_errors
def locret(
    checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT",
                                     help="Locret retaining heads as published (a torch.save'd .bin)"),
    base: str = typer.Option(..., "--base", "-m", help="the base model: a known name or a .gguf path"),
    out: Path = typer.Option(..., "--output", "-o", help="the adapter GGUF to write"),
) -> None:
    """Convert Locret's retaining heads for BASE into an adapter GGUF.

    The checkpoint is read without running any code it holds (a weights-only reader); unknown keys,
    missing layers and shapes that do not match BASE are refused.
    """
    from kvpot.converters.adapter import check_adapter_output
    from kvpot.converters.locret import convert_locret

    check_adapter_output(out)
    facts, _ = resolve_model(base)
    with err.status(f"converting {checkpoint.name} for {facts.name}"):
        heads = convert_locret(checkpoint, facts.path, out)
    err.print(f"{out}: retaining heads for {heads.base.n_layer} layers, hidden {heads.hidden}, {heads.activation}")

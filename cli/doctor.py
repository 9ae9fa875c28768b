"""`kvpot doctor`: what this installation is built from and where it keeps things."""

from __future__ import annotations

import platform
import sys

import typer
from rich.table import Table

import kvpot
from kvpot import paths
from kvpot.build.pins import LLAMA_CPP_COMMIT
from kvpot.errors import KvpotError
from kvpot.models.registry import KNOWN
from kvpot.pull import cached_path

from ._common import err, user_errors


def _cpu_features() -> str:
    import llama_cpp

    raw = llama_cpp.llama_print_system_info().decode(errors="replace")
    # "CPU : SSE3 = 1 | AVX = 1 | ..." -> the features that are on
    on = [part.split("=")[0].strip() for part in raw.replace("CPU :", "|").split("|") if part.strip().endswith("= 1")]
    return " ".join(on) or raw.strip()


@user_errors
def doctor() -> None:
    """Show the kvpot runtime (llama.cpp commit, kvpot ABI, backends, CPU features) and cache paths."""
    from kvpot.runtime import library

    table = Table(title="kvpot doctor", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("kvpot", kvpot.__version__)
    table.add_row("python", f"{platform.python_version()} ({sys.executable})")
    table.add_row("platform", f"{platform.system()} {platform.machine()}")
    problem = None
    try:
        info = library.info()
        table.add_row("llama-cpp-python", info.llama_cpp_version)
        table.add_row("llama.cpp commit", f"{info.llama_commit} (pinned {LLAMA_CPP_COMMIT})")
        table.add_row("kvpot ABI", f"library {info.abi}, python {kvpot.ABI_VERSION}")
        table.add_row("backends", ", ".join(info.backends))
        table.add_row("CPU features", _cpu_features())
        table.add_row("libllama", info.library_path)
    except KvpotError as e:
        problem = e
        table.add_row("runtime", f"[red]{e}[/red]")
    table.add_row("kvpot home", str(paths.home()))
    table.add_row("models", str(paths.models_dir()))
    table.add_row("build cache", str(paths.build_dir()))
    for m in KNOWN.values():
        table.add_row(f"model {m.name}", "cached" if cached_path(m).is_file() else "not pulled")
    err.print(table)
    if problem is not None:
        raise typer.Exit(problem.exit_code)

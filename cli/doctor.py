"""`kvpot doctor`: what this installation is built from and where it keeps things."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

import kvpot
from kvpot import paths
from kvpot.build.pins import LLAMA_CPP_COMMIT
from kvpot.errors import KvpotError
from kvpot.models.pull import cached_path
from kvpot.models.registry import KNOWN

from ._common import err, out, user_errors


def _cpu_rows(table: Table) -> list[str]:
    """Rows for the CPU the runtime was built for and the one it runs on; returns warnings."""
    from kvpot.runtime import cpu

    rep = cpu.report()
    warnings = []
    table.add_row("CPU built for", " ".join(rep.built_for) or "no SIMD features")
    table.add_row("CPU here", "unknown (no /proc/cpuinfo)" if rep.host is None else " ".join(rep.host))
    table.add_row("CPU weight buffers", ", ".join(rep.extra_bufts) or "none (plain CPU memory)")
    if rep.amx_built or rep.amx_buffer:
        table.add_row("AMX", "[yellow]ON (built with KVPOT_CPU_AMX=ON; unsafe)[/yellow]")
        warnings.append("this runtime keeps ggml's AMX path, which crashes on some CPUs (llama.cpp issue 20824); "
                        "rebuild without KVPOT_CPU_AMX=ON")
    else:
        table.add_row("AMX", f"off: {cpu.AMX_WHY}")
    if rep.missing_here:
        warnings.append(f"the runtime was built for a CPU with {' '.join(rep.missing_here)}, which this one lacks: "
                        "expect 'Illegal instruction'; rebuild here with `make runtime`")
    elif rep.unused_here:
        warnings.append(f"this CPU has {' '.join(rep.unused_here)}, which the runtime was not built for; "
                        "`make runtime` here builds a faster one")
    return warnings


def _device_rows(table: Table, backends: list[str]) -> list[str]:
    """ggml's devices with their free memory, and where a model's layers and the pot would go."""
    import os

    from kvpot.runtime.devices import devices, layer_devices

    devs = devices()
    gib = lambda b: f"{b / 2**30:,.1f} GiB"  # noqa: E731
    table.add_row("devices", "; ".join(f"{d.name} ({d.description}, {d.kind}, {gib(d.free_bytes)} free of "
                                       f"{gib(d.total_bytes)})" for d in devs))
    on = layer_devices(devs)
    table.add_row("layers and pot on", " + ".join(d.name for d in on) if on else "CPU (RAM)")
    warnings = []
    if "Vulkan" in backends and not any(d.backend == "Vulkan" for d in devs) \
            and "GGML_VK_VISIBLE_DEVICES" not in os.environ:
        # ggml-vulkan passes over CPU-type Vulkan devices (Mesa's lavapipe/llvmpipe) unless they are named
        warnings.append("this runtime has Vulkan but no Vulkan device is in use; a software driver such as "
                        "lavapipe is used only when named: GGML_VK_VISIBLE_DEVICES=0")
    return warnings


def block_stores(folder: Path) -> str:
    """InfLLM's block stores under KVPOT_HOME: saved contexts reference theirs; a reading that was killed
    (SIGKILL, out of memory) could not delete its own, and at ~3 KB a token read they add up."""
    files = sorted(folder.glob("*.kvblk")) if folder.is_dir() else []
    if not files:
        return f"none in {folder}"
    size = sum(f.stat().st_size for f in files)
    return (f"{len(files)} in {folder}, {size / 2**20:,.1f} MiB (saved InfLLM contexts read theirs; "
            f"any other is left by a killed reading and can be deleted)")


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
    warnings: list[str] = []
    try:
        info = library.info()
        table.add_row("llama-cpp-python", info.llama_cpp_version)
        table.add_row("llama.cpp commit", f"{info.llama_commit} (pinned {LLAMA_CPP_COMMIT})")
        table.add_row("kvpot ABI", f"library {info.abi}, python {kvpot.ABI_VERSION}")
        table.add_row("backends", ", ".join(info.backends))
        warnings = _cpu_rows(table)
        warnings += _device_rows(table, info.backends)
        table.add_row("libllama", info.library_path)
    except KvpotError as e:
        problem = e
        table.add_row("runtime", f"[red]{e}[/red]")
    table.add_row("kvpot home", str(paths.home()))
    table.add_row("models", str(paths.models_dir()))
    table.add_row("build cache", str(paths.build_dir()))
    table.add_row("block stores", block_stores(paths.blocks_dir()))
    for m in KNOWN.values():
        table.add_row(f"model {m.name}", "cached" if cached_path(m).is_file() else "not pulled")
    out.print(table)  # the report asked for: stdout (`kvpot doctor > report.txt`); warnings stay on stderr
    for w in warnings:
        err.print(f"[yellow]warning:[/yellow] {w}", soft_wrap=True)
    if problem is not None:  # the table says it where it was asked for; stderr says it too
        err.print(f"[red]error:[/red] {escape(str(problem))}", soft_wrap=True)
        raise typer.Exit(problem.exit_code)

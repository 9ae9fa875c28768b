"""Attention over a pot's cells on this CPU, with and without flash attention: one layer's attention of a
chunk (its queries against every cell) at each model's head shape, timed both ways by tests/attn_speed.c
against the installed llama_cpp's libggml, and the layer's time times the model's layers beside it (what a
chunk spends attending). What `--flash-attn auto` rests on for a CPU, and why a larger pot reads slower.

    python -m studies.attn_speed -m qwen2.5-coder-1.5b --cells 2560 --cells 8704 --cells 16896 --json docs/bench/flash/attn-speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from kvpot import paths
from kvpot.build.cross import staged_tree
from kvpot.models.resolve import resolve_model
from kvpot.runtime.cpu import describe_host
from kvpot.safe_write import write_text_file

SOURCE = Path(__file__).resolve().parents[1] / "tests" / "attn_speed.c"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies.attn_speed", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", action="append", required=True, help="known model names or paths (repeatable)")
    p.add_argument("--cells", action="append", type=int, required=True, help="cells attended over (repeatable)")
    p.add_argument("--rows", type=int, default=512, help="rows of the chunk (kvpot's default step)")
    p.add_argument("--reps", type=int, default=3, help="timed runs of each graph (after one untimed)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p


def build() -> Path:
    """tests/attn_speed.c linked against the ggml the installed llama_cpp wheel ships (this CPU's build)."""
    import llama_cpp.llama_cpp as raw

    lib_dir = Path(raw._lib._name).parent
    exe = paths.build_dir() / "attn-speed" / "attn_speed"
    exe.parent.mkdir(parents=True, exist_ok=True)
    include = staged_tree() / "ggml" / "include"
    cc = os.environ.get("CC", "cc")
    run = subprocess.run([cc, "-O2", str(SOURCE), "-o", str(exe), f"-I{include}", f"-L{lib_dir}", "-lggml",
                          "-lggml-base", "-lggml-cpu", "-lm", f"-Wl,-rpath,{lib_dir}"], capture_output=True, text=True)
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"error: {cc} could not build {SOURCE.name}: {last}")
    return exe


def measure(exe: Path, head_dim: int, n_head: int, n_head_kv: int, cells: int, rows: int, threads: int, reps: int) -> dict:
    out = subprocess.run([str(exe), str(head_dim), str(n_head), str(n_head_kv), str(cells), str(rows), str(threads),
                          str(reps)], check=True, capture_output=True, text=True).stdout.split()
    got = dict(zip(out[::2], map(float, out[1::2])))
    return {"cells": cells, "off_ms": got["flash_off_ms"], "on_ms": got["flash_on_ms"], "max_abs_diff": got["max_abs_diff"],
            "nmse": got["nmse"]}


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    exe = build()
    print(describe_host())
    results = []
    print(f"{'model':<22} {'cells':>7} {'off ms':>8} {'on ms':>8} {'on/off speed':>12} {'global layers, off':>19} {'max diff':>9}")
    for spec in ns.model:
        facts, _ = resolve_model(spec)
        # a sliding-window layer attends over its window, not the pot: only the global layers count
        n_global = sum(not swa for swa in facts.swa_layers) if facts.swa_layers else facts.n_layer
        for cells in ns.cells:
            r = measure(exe, facts.head_dim_k, facts.n_head, facts.n_head_kv, cells, ns.rows, ns.threads, ns.reps)
            r.update(model=spec, head_dim=facts.head_dim_k, n_head=facts.n_head, n_head_kv=facts.n_head_kv,
                     n_global_layers=n_global, speed_on_vs_off=r["off_ms"] / r["on_ms"])
            results.append(r)
            print(f"{spec:<22} {cells:>7,} {r['off_ms']:>8.1f} {r['on_ms']:>8.1f} {r['speed_on_vs_off']:>11.2f}x "
                  f"{r['off_ms'] * n_global / 1e3:>17.2f} s {r['max_abs_diff']:>9.1e}")
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_file(ns.json, json.dumps({"cpu": describe_host(), "rows": ns.rows,
                                       "threads": ns.threads, "reps": ns.reps, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

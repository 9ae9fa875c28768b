"""The compute buffer llama.cpp reserves at context creation, with the output head's rows left at its default
(n_outputs_max 0: every row of a step) and at what kvpot's engine asks for (kvpot.runtime.outputs).

    python -m studies.outputs_reserve --json docs/bench/rss/compute-buffer-rows.json [-m MODEL ...]

The size is llama.cpp's own log line ("compute buffer size = N MiB", every device's summed), read through
kvpot's log file. A context of --ctx cells read in --chunk-token steps, flash attention off (kvpot's
default where the device holds the cells without it).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

MODELS = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies.outputs_reserve")
    p.add_argument("-m", "--model", action="append", help=f"registry name or GGUF path (default: {', '.join(MODELS)})")
    p.add_argument("--ctx", type=int, default=8704, help="context cells (default: the 0.5B's 8,192-cell pot + a chunk)")
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--json", required=True)
    return p


def reserved_bytes(model, log: Path, n_ctx: int, chunk: int, n_outputs_max: int) -> int:
    """The compute buffer llama.cpp logs for a new context, in bytes (to its 0.01 MiB)."""
    from kvpot.runtime.llama import ContextParams, LlamaContext

    start = log.stat().st_size if log.exists() else 0
    ctx = LlamaContext(model, ContextParams(n_ctx=n_ctx, n_batch=chunk, n_threads=1, n_outputs_max=n_outputs_max))
    ctx.close()
    with open(log, "rb") as f:
        f.seek(start)
        sizes = re.findall(r"compute buffer size = +([0-9.]+) MiB", f.read().decode(errors="replace"))
    return round(sum(float(s) for s in sizes) * 2**20)


def main(argv: list[str] | None = None) -> int:
    import json

    from kvpot.bench.throughput import run_meta
    from kvpot.models.resolve import resolve_model
    from kvpot.runtime import logs
    from kvpot.runtime.llama import LlamaModel
    from kvpot.runtime.outputs import outputs_max
    from kvpot.safe_write import write_text_file

    ns = parser().parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "llama.log"
        logs.install(log)
        for name in ns.model or MODELS:
            facts, _ = resolve_model(name)
            model = LlamaModel(str(facts.path))
            try:
                row = {"model": name, "n_vocab": model.n_vocab, "n_ctx": ns.ctx, "chunk": ns.chunk}
                for what, k in (("llama.cpp default", 0), ("last row", outputs_max(ns.chunk, False)),
                                ("NuC", outputs_max(ns.chunk, True))):
                    row[what] = {"n_outputs_max": k or ns.chunk,
                                 "compute_buffer_bytes": reserved_bytes(model, log, ns.ctx, ns.chunk, k)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
            finally:
                model.close()
        logs.install("")
    meta = run_meta() | {"command": " ".join(["python -m studies.outputs_reserve", *(argv or sys.argv[1:])])}
    write_text_file(Path(ns.json), json.dumps(meta | {"rows": rows}, indent=1) + "\n", "the compute-buffer record")
    return 0


if __name__ == "__main__":
    sys.exit(main())

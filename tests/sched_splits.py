"""Which device runs each node of kvpot's graphs: one SmolLM2 run through every graph piece kvpot adds,
with ggml's scheduler debug output (GGML_SCHED_DEBUG=2) read from llama.cpp's log, written as JSON.

`python tests/sched_splits.py MODEL OUT.json` (the environment must set GGML_SCHED_DEBUG=2 before
libllama loads; tests/test_vulkan.py runs it, docs/pot.md's Vulkan section reports it). For each step:
the splits (backend, inputs copied in) and every non-view node as (op, name, backend) in graph order.
`python tests/sched_splits.py --summary OUT.json` prints it as the markdown table in docs/pot.md.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import devicelib  # noqa: E402,F401  (KVPOT_TEST_DEVICE: the device's environment, before libllama loads)

CHUNK = 64
N_CTX = 512

_SPLIT = re.compile(r"## SPLIT #(\d+): (\S+) # (\d+) inputs")
_NODE = re.compile(r"node #\s*(\d+) \(\s*([^)]*?)\):\s+(\S*) \(\s*[^)]*\) \[\s*(\S+)")


class SchedLog:
    """llama.cpp's log text, written to a file by kvpot's C filter and cut into steps by mark()."""

    def __init__(self, path: Path):
        from kvpot.runtime import logs
        from kvpot.runtime.library import load

        load()
        self.path = path
        path.unlink(missing_ok=True)
        logs.install(path)  # every message is flushed as it is written, so the size marks a step
        self.marks: list[tuple[str, int]] = [("load", 0)]

    def mark(self, name: str) -> None:
        self.marks.append((name, self.path.stat().st_size if self.path.exists() else 0))

    @property
    def steps(self) -> list[tuple[str, list[str]]]:
        data = self.path.read_bytes() if self.path.exists() else b""
        ends = [off for _, off in self.marks[1:]] + [len(data)]
        return [(name, data[off:end].decode("utf-8", errors="replace").splitlines())
                for (name, off), end in zip(self.marks, ends)]

    def parsed(self) -> dict:
        out = {}
        for name, lines in self.steps:
            graphs = []
            for ln in lines:
                m = _SPLIT.search(ln)
                if m:
                    if m.group(1) == "0":
                        graphs.append({"splits": [], "nodes": []})
                    if graphs:
                        graphs[-1]["splits"].append({"backend": m.group(2), "inputs": int(m.group(3))})
                    continue
                m = _NODE.search(ln)
                if m and graphs:
                    graphs[-1]["nodes"].append([m.group(2).strip(), m.group(3), m.group(4)])
            out[name] = graphs
        return out


def summary(parsed: dict) -> str:
    """One markdown row per step: splits, nodes per backend, and the nodes off the first backend."""
    rows = ["| step | graphs | splits (backend: inputs) | nodes per backend | nodes not on the device |",
            "| --- | --- | --- | --- | --- |"]
    for step, graphs in parsed.items():
        if not graphs or step == "load log":
            continue
        splits = "; ".join(", ".join(f"{sp['backend']}: {sp['inputs']}" for sp in g["splits"]) for g in graphs)
        count: dict[str, int] = {}
        off: dict[str, int] = {}
        for g in graphs:
            for op, name, backend in g["nodes"]:
                count[backend] = count.get(backend, 0) + 1
                if backend == "CPU":
                    off[f"{op} {name}"] = off.get(f"{op} {name}", 0) + 1
        per = ", ".join(f"{b} {n}" for b, n in sorted(count.items()))
        cpu = ", ".join(f"`{k}`" + (f" x{n}" if n > 1 else "") for k, n in off.items()) or "none"
        rows.append(f"| {step} | {len(graphs)} | {splits} | {per} | {cpu} |")
    return "\n".join(rows)


def main() -> None:
    if sys.argv[1] == "--summary":
        print(summary(json.loads(Path(sys.argv[2]).read_text())))
        return
    model_path, out_path = sys.argv[1], sys.argv[2]
    log = SchedLog(Path(out_path).with_suffix(".log"))

    from potlib import decode_chunks, new_ctx
    from test_memory_gate import random_gate
    from test_retaining_heads import random_heads

    from kvpot.bench.logbook import logbook
    from kvpot.converters.adapter import BaseIdentity
    from kvpot.runtime.llama import LlamaModel
    from kvpot.runtime.pot import Pot

    model = LlamaModel(model_path)
    text, _, _ = logbook(n_entries=8, seed=11)
    doc = (model.bos() + model.tokenize(text))[:300]
    ctx = new_ctx(model, N_CTX, CHUNK)
    pot = Pot(ctx)
    L, H, d = pot.n_layers, pot.n_head_kv, 64

    log.mark("decode")
    decode_chunks(ctx, doc[:192], CHUNK)
    log.mark("decode + score tap")
    pot.tap_request([192 + 3, 192 + CHUNK - 1])
    ctx.decode(doc[192:256], 192, logits="last")
    pot.tap_get(256)
    pot.tap_clear()
    log.mark("decode + log-probs")
    pot.logprobs_request(256, doc[257:300])
    ctx.decode(doc[256:299], 256, logits="all")
    pot.logprobs_get(43)
    pot.logprobs_clear()

    rng = np.random.default_rng(0)
    keep = np.sort(np.stack([np.stack([rng.choice(299, 120, replace=False) for _ in range(H)]) for _ in range(L)]), -1)
    log.mark("compaction (gather)")
    pot.compact(keep, cr_rope=False)
    log.mark("InfLLM read-out (read_at)")
    k, v = pot.read_at(10, 32, 0, d, d)
    log.mark("InfLLM insert")
    pot.insert(k, v, np.zeros(32, np.int32), 5)
    log.mark("decode + lookup query")
    pot.query_request(True, 0)
    p = pot.stats().pos_next
    ctx.decode(doc[CHUNK:2 * CHUNK], p, logits="last")
    pot.query_take(d)
    pot.query_request(False)

    keep2 = np.sort(np.stack([np.stack([rng.choice(120, 100, replace=False) for _ in range(H)]) for _ in range(L)]), -1)
    log.mark("compaction + CR-RoPE")
    pot.compact(keep2, cr_rope=True)
    base = BaseIdentity.of_model(model_path)
    pot.set_heads(random_heads(base, "silu"))
    log.mark("decode + retaining heads")
    p = pot.stats().pos_next
    ctx.decode(doc[:CHUNK], p, logits="last")
    pot.set_heads(None)
    # ragged: each layer keeps its own number of live cells (dead ones masked per layer)
    ragged = np.broadcast_to(np.arange(100), (L, H, 100)).copy()
    ragged[::2, :, 80:] = -1
    log.mark("compaction, ragged (per-layer live cells)")
    pot.compact(ragged, cr_rope=True)
    log.mark("decode, per-layer masks")
    p = pot.stats().pos_next
    ctx.decode(doc[:CHUNK], p, logits="last")

    ctx.close()

    ctx = new_ctx(model, N_CTX, CHUNK)
    pot = Pot(ctx)
    pot.set_gate(random_gate(list(pot.layer_ids), d, 9))
    decode_chunks(ctx, doc[:192], CHUNK)
    log.mark("memory fold")
    pot.fold(np.arange(4, 68))
    log.mark("decode + memory read-out")
    ctx.decode(doc[192:256], 192, logits="last")
    log.mark("end")
    ctx.close()
    model.close()

    out = log.parsed()
    # the load log's device lines, for tests/devicelib.py's check_used in the parent test session
    out["load log"] = [ln for _, lines in log.steps for ln in lines if any(k in ln for k in devicelib.KEYS)]
    Path(out_path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""How long `make bench-ruler` (the 1.5B's RULER grid) would read on a 2-core machine: an estimate, not a
measurement. The grid's document tokens (every sample's document at each length, once per policy and budget
that reads it: `default` is full attention at 8K and 32K, so only its 128K reads are its own; full attention
is refused past the 32K window) divided by reading speeds from result files:

- `measured`: the mean reading speed of the RULER run given (the 0.5B at 8K, full attention), for every
  read of the grid; the 1.5B costs more per token than the 0.5B, so this undercounts on the same load.
- `1.5B alone`: the 1.5B's own reading speeds recorded on this machine: full attention at 8K and 32K
  (docs/bench/qa-1.5b-8k.json, qa-1.5b-32k.json) and its pots (docs/bench/speed/qwen2.5-coder-1.5b-*.json,
  2,048 cells), a pot's speed taken for every length (its cost per token does not grow with the input).

    python -m kvpot.bench.ruler_estimate RULER_JSON OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvpot.bench.qa_inputs import doc_tokens
from kvpot.bench.ruler import TASKS

LENGTHS = (8192, 32768, 131072)
WINDOW = 32768           # the 1.5B's trained context: full attention reads up to it
SAMPLES = 10             # RULER_SAMPLES of the Makefile
METHODS = 8              # RULER_METHODS of the Makefile
BUDGETS = 2              # 2,048 and 8,192 cells
DOCS = Path(__file__).resolve().parent.parent.parent / "docs" / "bench"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _read_speeds(path: Path, resolved: str = "full") -> list[float]:
    data = json.loads(path.read_text())
    rows = data["cases"] if isinstance(data, dict) else data
    return [r["read_tok_s"] for r in rows if r.get("read_tok_s") and r.get("resolved_policy", "").startswith(resolved)
            and not r.get("same_reading_as")]


def estimate(ruler_json: Path, docs: Path = DOCS) -> dict:
    per_length = {n: len(TASKS) * SAMPLES * doc_tokens(n) for n in LENGTHS}  # one document per task sample
    reads = {"full": {n: per_length[n] for n in LENGTHS if n <= WINDOW},
             "default": {n: per_length[n] for n in LENGTHS if n > WINDOW},
             "methods": {n: per_length[n] * METHODS * BUDGETS for n in LENGTHS}}
    total = sum(t for by in reads.values() for t in by.values())
    measured = _mean(_read_speeds(ruler_json))
    pots = [p["tok_s"] for f in sorted((docs / "speed").glob("qwen2.5-coder-1.5b-*.json"))
            for p in json.loads(f.read_text())["pot"] if p.get("tok_s")]
    alone = {8192: _mean(_read_speeds(docs / "qa-1.5b-8k.json")), 32768: _mean(_read_speeds(docs / "qa-1.5b-32k.json")),
             "pot": _mean(pots)}
    seconds_alone = (sum(t / alone[n] for n, t in reads["full"].items())
                     + sum(t / alone["pot"] for key in ("default", "methods") for t in reads[key].values()))
    hours = {"measured": round(total / measured / 3600), "1.5B alone": round(seconds_alone / 3600)}
    return {"what": "an estimate of make bench-ruler's reading time on 2 cores, not a measurement",
            "grid": {"lengths": LENGTHS, "tasks": len(TASKS), "samples": SAMPLES, "methods": METHODS,
                     "budgets": BUDGETS, "document_tokens": reads, "total_tokens": total},
            "speeds_tok_s": {"measured": round(measured, 1), "measured_from": str(ruler_json),
                             "1.5B alone": {str(k): round(v, 1) for k, v in alone.items()}},
            "hours_on_2_cores": hours, "cpu_core_hours": {k: 2 * v for k, v in hours.items()}}


def main(argv: list[str]) -> int:
    from kvpot.bench.throughput import run_meta
    from kvpot.safe_write import write_text_file

    if len(argv) != 2:
        print("usage: python -m kvpot.bench.ruler_estimate RULER_JSON OUT", file=sys.stderr)
        return 2
    out = {"meta": run_meta(), **estimate(Path(argv[0]))}
    write_text_file(argv[1], json.dumps(out, indent=1) + "\n", "the estimate")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Which code each multi-key miss of saved `bench niah` grids is nearest to: the asked key's or another
needle's (kvpot.bench.niah.nearest_code), so that a miss such as "85321" for the key 32518 is read as the
code 85322 of another place with one digit changed, not as the key's digits out of order.

    python -m studies.niah_misses docs/bench/beyond/niah-qwen15-16k-2048*.json

The needles' codes come from the case's seed and depth (kvpot.bench.haystack.draw_needles, the draw the
grid made), so grids written before the results carried `nearer` are read too; no model is loaded."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvpot.bench.haystack import draw_needles
from kvpot.bench.niah import TASKS, edit_distance, first_number, nearest_code


def misses(rows: list[dict]) -> list[dict]:
    """One line's figures per multi-key miss: the answer's number, its distance to the key and to the
    nearest other code, and which is nearer. A row whose key is not its seed's draw is refused."""
    out = []
    for r in rows:
        if r.get("task") != "multikey" or r["correct"]:
            continue
        needles = draw_needles(r["seed"], r["depth"], TASKS["multikey"])
        if needles[0].key != r["key"]:
            raise ValueError(f"{r['policy']} @ {r['depth']} seed {r['seed']}: key {r['key']} is not this "
                             f"seed's draw ({needles[0].key}): a grid of another haystack")
        others = [n.key for n in needles[1:]]
        number = first_number(r["answer"])
        near = min(others, key=lambda k: edit_distance(number, k))
        out.append({"policy": r["policy"], "depth": r["depth"], "seed": r["seed"], "key": r["key"],
                    "answer": number, "to_key": edit_distance(number, r["key"]), "other": near,
                    "to_other": edit_distance(number, near), "nearer": nearest_code(r["answer"], r["key"], others)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies.niah_misses", description=__doc__.split("\n\n")[0])
    ap.add_argument("grids", nargs="+", type=Path, help="JSON files written by `kvpot bench niah --json`")
    a = ap.parse_args(argv)
    found = []
    for path in a.grids:
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
            found += [{"file": path.name, **m} for m in misses(rows)]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: {path}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    print("| grid | policy | depth | seed | key | answer | edits to the key | nearest other code | edits to it | nearer |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for m in found:
        print(f"| {m['file']} | {m['policy']} | {m['depth']:g} | {m['seed']} | {m['key']} | {m['answer'] or '-'} | "
              f"{m['to_key']} | {m['other']} | {m['to_other']} | {m['nearer'] or 'tie'} |")
    counts = {w: sum(m["nearer"] == w for m in found) for w in ("distractor", "key", None)}
    print(f"\n{len(found)} misses: {counts['distractor']} nearer another needle's code, {counts['key']} nearer "
          f"the asked key, {counts[None]} ties or no number")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

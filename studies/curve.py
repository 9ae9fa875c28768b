"""Accuracy versus budget (docs/benchmarks.md, issue 17): reads the `kvpot bench niah` JSON files of
docs/bench/curve/ (one per model, task, length and budget, named MODEL-TASK-LENGTH-BUDGET.json, BUDGET
a number of cells or "full"), prints a Markdown table and writes the plot.

    .venv/bin/python -m studies.curve [--dir docs/bench/curve] [--png docs/bench/accuracy-vs-budget.png]

(the last step of `make bench-curve`, which runs the grid).

Reading speed is given as a ratio to full attention on the same model and length, from the same run
(the figures were taken on a shared machine, so only ratios are meaningful)."""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

NAME = re.compile(r"^(?P<model>.+)-(?P<task>multikey|prose|passkey)-(?P<length>\d+)-(?P<budget>\d+|full)\.json$")


def load(folder: Path) -> dict:
    """{(model, task, length): {budget or "full": [cases]}}"""
    runs: dict = defaultdict(dict)
    for f in sorted(folder.glob("*.json")):
        m = NAME.match(f.name)
        if not m:
            continue
        b = m["budget"] if m["budget"] == "full" else int(m["budget"])
        runs[(m["model"], m["task"], int(m["length"]))][b] = json.loads(f.read_text())
    return runs


def summary(cases: list[dict]) -> dict:
    read = sum(c["read_seconds"] for c in cases)
    return {"n": len(cases), "right": sum(c["correct"] for c in cases),
            "distractor": sum(c.get("distractor", False) for c in cases),
            "tok_s": sum(c["tokens"] for c in cases) / read if read else float("nan"),
            "distill": sum(c["distill_seconds"] for c in cases) / read if read else float("nan"),
            "compactions": max(c["compactions"] for c in cases),
            "depths": sorted({c["depth"] for c in cases}), "seeds": sorted({c["seed"] for c in cases})}


def table(runs: dict) -> str:
    lines = ["| model | task | tokens | reading | right | other key | read speed vs full | distill % | "
             "distillations | answers (depth: answer) |",
             "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for (model, task, length), by_budget in sorted(runs.items()):
        full = summary(by_budget["full"]) if "full" in by_budget else None
        for b in sorted(by_budget, key=lambda x: (x != "full", x if x != "full" else 0)):
            s = summary(by_budget[b])
            ratio = f"{s['tok_s'] / full['tok_s']:.2f}" if full else "-"
            what = "full attention" if b == "full" else f"InfiniPot {b}"
            answers = "; ".join(f"{c['depth']:g}: {c['answer'][:14]!r}" for c in
                                sorted(by_budget[b], key=lambda c: (c["seed"], c["depth"])))
            lines.append(f"| {model} | {task} | {length:,} | {what} | {s['right']}/{s['n']} | {s['distractor']} | "
                         f"{ratio} | {100 * s['distill']:.0f} | {s['compactions']} | {answers} |")
    return "\n".join(lines)


def common(by_budget: dict) -> dict:
    """The cases of every budget restricted to the (depth, seed) pairs that all budgets ran, so the
    points of one line compare the same needles."""
    shared = set.intersection(*({(c["depth"], c["seed"]) for c in cases} for cases in by_budget.values()))
    return {b: [c for c in cases if (c["depth"], c["seed"]) in shared] for b, cases in by_budget.items()}


def plot(runs: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_speed) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, ((model, task, length), by_budget) in enumerate(sorted(runs.items())):
        color = f"C{i}"
        by_budget = common(by_budget)
        n = len(next(iter(by_budget.values())))
        label = f"{model}, {task}, {length / 1000:.0f}K ({n} case{'s' if n > 1 else ''})"
        pots = sorted(b for b in by_budget if b != "full")
        acc = [summary(by_budget[b]) for b in pots]
        if pots:
            ax_acc.plot(pots, [s["right"] / s["n"] for s in acc], "o-", color=color, label=f"{label}: InfiniPot")
        if "full" in by_budget:
            f = summary(by_budget["full"])
            ax_acc.axhline(f["right"] / f["n"], color=color, ls="--", lw=1, label=f"{label}: full attention")
            if pots:
                ax_speed.plot(pots, [s["tok_s"] / f["tok_s"] for s in acc], "o-", color=color, label=label)
    for ax in (ax_acc, ax_speed):
        ax.set_xscale("log", base=2)
        ax.set_xticks([1024, 2048, 4096, 8192], ["1024", "2048", "4096", "8192"])
        ax.set_xlabel("InfiniPot budget |M| (cells)")
    ax_acc.set_ylabel("share of needles found")
    ax_acc.set_ylim(-0.05, 1.05)
    ax_acc.set_title("needles found, on the cases every budget ran (dashed: full attention)", fontsize=9)
    ax_acc.legend(fontsize=6, loc="center left")
    ax_speed.axhline(1.0, color="grey", ls=":", lw=1)
    ax_speed.set_ylabel("reading speed / full attention's")
    ax_speed.set_title("reading speed / full attention's (measured under shared load)", fontsize=9)
    ax_speed.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("docs/bench/curve"))
    ap.add_argument("--png", type=Path, default=Path("docs/bench/accuracy-vs-budget.png"))
    return ap


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    runs = load(a.dir)
    print(table(runs))
    plot(runs, a.png)


if __name__ == "__main__":
    main()

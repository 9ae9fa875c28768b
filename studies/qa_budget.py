"""Accuracy, reading speed and peak RSS against budget, per method, from `kvpot bench qa` JSON files
(which method and budget to read with past the window). A line is one method (the
policy as it read, and whether the question was known first) for one model and input length; its points
are the budgets it read at. Closed book (`-P none`) is a dashed level in the accuracy panel.

    .venv/bin/python -m studies.qa_budget docs/bench/beyond/qa-qwen15-48k-*.json --png PNG

(the last step of `make bench-beyond`). Accuracy counts the document questions (the multi-key case is
its own column in the table); speed is tokens read over seconds read, every reading of the line; peak RSS
is the largest a reading recorded (`peak_rss_mib`, the process's resident peak from the model's load to
the end of the read, weights included; readings made before bench qa recorded it have none, and a line
with none has no point in that panel)."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from kvpot.bench.qa import CLOSED
from kvpot.bench.qa_report import readings


def method(r: dict) -> str:
    """The line a case belongs to: the policy as it read (`-P default` under what it resolved to)."""
    return r["resolved_policy"] + (", question first" if r.get("per_question") else "")


def load(files: list[Path]) -> list[dict]:
    """The cases of every file, skipped ones left out; ValueError names a file that is not bench qa's JSON."""
    cases: list[dict] = []
    for f in files:
        try:
            rows = json.loads(f.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{f}: cannot read it as JSON ({e})") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) and ("resolved_policy" in r or "skipped" in r)
                                                 for r in rows):
            raise ValueError(f"{f}: not the JSON `kvpot bench qa --json` writes (a list of cases)")
        cases += [r for r in rows if "skipped" not in r]
    return cases


def points(cases: list[dict]) -> dict:
    """{(model, length): {method: {budget: point}}}, a point being the cases' right/asked, multi-key
    right/asked, read tok/s and peak RSS. A reading shared by two specs (`same_reading_as`, or `-P default`
    beside the policy it resolved to) counts once."""
    groups: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in cases:
        # one case per question and reading: the same reading named by two specs is the same answers
        groups[(r["model"], r["length"])][method(r)][r["budget"]][(r["input"], r["id"])] = r
    out: dict = defaultdict(dict)
    for key, by_method in groups.items():
        for m, by_budget in by_method.items():
            out[key][m] = {b: _point(list(rows.values())) for b, rows in sorted(by_budget.items())}
    return out


def _point(rows: list[dict]) -> dict:
    qa = [r for r in rows if r["task"] == "qa"]
    mk = [r for r in rows if r["task"] == "multikey"]
    reads = readings(rows)
    secs = sum(r["read_seconds"] for r in reads)
    peaks = [r["peak_rss_mib"] for r in reads if r.get("peak_rss_mib")]
    return {"right": sum(r["correct"] for r in qa), "asked": len(qa),
            "multikey": sum(r["correct"] for r in mk), "multikey_asked": len(mk),
            "tok_s": sum(r["tokens"] for r in reads) / secs if secs and rows[0]["resolved_policy"] != CLOSED else None,
            "peak_rss_mib": max(peaks) if peaks else None, "reads": len(reads)}


def table(pts: dict) -> str:
    lines = ["| model | length | method | cells | right | multi-key | read tok/s | peak RSS MiB |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for (model, length), by_method in sorted(pts.items()):
        for m, by_budget in sorted(by_method.items()):
            for b, p in by_budget.items():
                cells = "-" if m == CLOSED else f"{b:,}"
                speed = f"{p['tok_s']:.0f}" if p["tok_s"] else "-"
                rss = f"{p['peak_rss_mib']:,.0f}" if p["peak_rss_mib"] else "-"
                lines.append(f"| {model} | {length:,} | {m} | {cells} | {p['right']}/{p['asked']} | "
                             f"{p['multikey']}/{p['multikey_asked']} | {speed} | {rss} |")
    return "\n".join(lines)


def plot(pts: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 5.4), sharex=True)
    ax_acc, ax_speed, ax_rss = axes
    budgets: set[int] = set()
    colors = [f"C{i}" for i in range(10) if i != 7]  # C7 is grey, the closed book's
    n = 0
    for (model, length), by_method in sorted(pts.items()):
        where = f"{model}, {length / 1024:.0f}K"
        for m, by_budget in sorted(by_method.items()):
            if m == CLOSED:
                p = next(iter(by_budget.values()))
                ax_acc.axhline(p["right"] / p["asked"], color="grey", ls="--", lw=1, label=f"{where}: closed book")
                continue
            xs = list(by_budget)
            budgets.update(xs)
            style = dict(marker="o", color=colors[n % len(colors)], label=f"{where}: {m}")
            n += 1
            ax_acc.plot(xs, [p["right"] / p["asked"] for p in by_budget.values()], **style)
            for x, p in by_budget.items():  # the counts: a line still running has fewer questions asked
                ax_acc.annotate(f"{p['right']}/{p['asked']}", (x, p["right"] / p["asked"]), fontsize=6,
                                xytext=(4, 3), textcoords="offset points", color=style["color"])
            speed = [(x, p["tok_s"]) for x, p in by_budget.items() if p["tok_s"]]
            if speed:
                ax_speed.plot(*zip(*speed), **style)
            rss = [(x, p["peak_rss_mib"]) for x, p in by_budget.items() if p["peak_rss_mib"]]
            if rss:
                ax_rss.plot(*zip(*rss), **style)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ticks = sorted(budgets)
        ax.set_xticks(ticks, [f"{b:,}" for b in ticks])
        ax.set_xlabel("budget (cells in the pot)")
    ax_acc.set_ylim(-0.05, 1.05)
    ax_acc.set_ylabel("share of questions answered")
    ax_acc.set_title("questions answered, right/asked beside each point (dashed: closed book)", fontsize=9)
    ax_speed.set_ylabel("tokens read per second")
    ax_speed.set_title("reading speed", fontsize=9)
    ax_rss.set_ylabel("MiB")
    ax_rss.set_title("peak RSS of a reading, weights included (where recorded)", fontsize=9)
    if not ax_rss.lines:
        ax_rss.text(0.5, 0.5, "not recorded by these readings", ha="center", va="center", transform=ax_rss.transAxes)
    handles, labels = ax_acc.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(labels) + 3) // 4), 1, 1))
    fig.savefig(png, dpi=110)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="bench qa JSON files")
    ap.add_argument("--png", type=Path, required=True, help="where to write the plot")
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    a = ap.parse_args(argv)
    try:
        pts = points(load(a.files))
    except ValueError as e:
        ap.error(str(e))  # one line and exit status 2
    print(table(pts))
    plot(pts, a.png)


if __name__ == "__main__":
    main()

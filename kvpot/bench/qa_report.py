"""The table `kvpot bench qa` prints: accuracy per model x policy x length, held-out questions apart."""

from __future__ import annotations

from rich.table import Table

from kvpot.bench.qa import CLOSED


def _share(rows: list[dict], key: str = "correct") -> str:
    return f"{sum(bool(r[key]) for r in rows) / len(rows):.0%} ({sum(bool(r[key]) for r in rows)}/{len(rows)})" \
        if rows else "-"


def readings(rows: list[dict]) -> list[dict]:
    """One case per reading: an input, or an input and a question where each question was read for
    (--per-question); every case of a reading carries its tokens, seconds and peak."""
    return list({(r["input"], r["id"] if r.get("per_question") else None): r for r in rows}.values())


def summary(results: list[dict]) -> list[dict]:
    """One line per (model, policy, length, read per question or not), in the order the cases were run."""
    def key(r: dict) -> tuple:
        return r["model"], r["policy"], r["length"], bool(r.get("per_question", False))

    keys: list[tuple] = []
    for r in results:
        if key(r) not in keys:
            keys.append(key(r))
    out = []
    for k in keys:
        model, policy, length, per_question = k
        rows = [r for r in results if key(r) == k]
        ran = [r for r in rows if "skipped" not in r]
        qa = [r for r in ran if r["task"] == "qa"]
        reads = readings(ran)
        # closed book reads one line, not the input: no reading speed to show
        secs = sum(r["read_seconds"] for r in reads) if policy != CLOSED else 0
        out.append({"model": model, "policy": policy, "length": length, "per_question": per_question,
                    "resolved": sorted({r["resolved_policy"].split(":")[0] for r in ran}),
                    "tuning": [r for r in qa if not r["heldout"]], "heldout": [r for r in qa if r["heldout"]],
                    "multikey": [r for r in ran if r["task"] == "multikey"],
                    "tok_s": sum(r["tokens"] for r in reads) / secs if secs else None,
                    # the largest of its readings' peaks (recorded since bench qa measures each reading)
                    "peak_rss_mib": max((r["peak_rss_mib"] for r in ran if r.get("peak_rss_mib")), default=None),
                    "skipped": len(rows) - len(ran)})
    return out


def qa_table(results: list[dict]) -> Table:
    t = Table(title="answer quality on real documents (kvpot bench qa): share answered correctly")
    for col in ("model", "policy", "length", "not held out", "held out", "all", "exact", "multi-key", "read tok/s",
                "peak RSS MiB"):
        t.add_column(col, justify="left" if col in ("model", "policy") else "right")
    for s in summary(results):
        qa = s["tuning"] + s["heldout"]
        policy = s["policy"] + (f" ({', '.join(s['resolved'])})" if s["resolved"] != [s["policy"]] else "")
        if s["per_question"]:  # one read per question, the question known first (as `kvpot ask` reads)
            policy += ", question first"
        if s["skipped"]:
            policy += f", {s['skipped']} skipped"
        t.add_row(s["model"], policy, f"{s['length']:,}", _share(s["tuning"]), _share(s["heldout"]), _share(qa),
                  _share(qa, "exact"), _share(s["multikey"]), f"{s['tok_s']:.0f}" if s["tok_s"] else "-",
                  f"{s['peak_rss_mib']:,.0f}" if s["peak_rss_mib"] else "-")
    return t

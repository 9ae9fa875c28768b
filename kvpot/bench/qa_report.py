"""The table `kvpot bench qa` prints: accuracy per model x policy x length, held-out questions apart, each
with its n and 95 % Wilson interval, and the same questions' closed-book accuracy beside it."""

from __future__ import annotations

import math

from rich.table import Table

from kvpot.bench.qa import CLOSED

KINDS = ("lexical", "paraphrase", "two-passage", "whole", "absent")  # the set's kinds (kvpot.bench.qa_questions)
Z95 = 1.959964  # the normal quantile of a two-sided 95 % interval


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (0..1); (0, 1) when n is 0. Unlike p ± z·se it
    stays inside 0..1 and is not zero-width at 0/n or n/n, which small question sets hit."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def share(k: int, n: int) -> str:
    """"62 % (8/13, 36–86 %)": the accuracy, its n and its 95 % Wilson interval ("-" when nothing was asked)."""
    if not n:
        return "-"
    lo, hi = wilson(k, n)
    return f"{k / n:.0%} ({k}/{n}, {lo:.0%}–{hi:.0%})"


def _share(rows: list[dict], key: str = "correct") -> str:
    return share(sum(bool(r[key]) for r in rows), len(rows))


def closed_book(rows: list[dict]) -> str:
    """The closed-book accuracy of the questions of `rows` that were asked closed book (closed_book_correct),
    with the count of those that were not."""
    known = [r for r in rows if r.get("closed_book_correct") is not None]
    text = share(sum(bool(r["closed_book_correct"]) for r in known), len(known))
    return text + (f", {len(rows) - len(known)} not asked" if known and len(known) < len(rows) else "") \
        if known else ("not asked" if rows else "-")


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
                    "kinds": {kind: [r for r in qa if r.get("kind") == kind] for kind in KINDS},
                    "tok_s": sum(r["tokens"] for r in reads) / secs if secs else None,
                    # the largest of its readings' peaks (recorded since bench qa measures each reading)
                    "peak_rss_mib": max((r["peak_rss_mib"] for r in ran if r.get("peak_rss_mib")), default=None),
                    "skipped": len(rows) - len(ran)})
    return out


def qa_table(results: list[dict]) -> Table:
    t = Table(title="answer quality on real documents (kvpot bench qa): share answered right (strict), n and 95 % "
                    "interval; closed book: the same questions asked with no document")
    for col in ("model", "policy", "length", "not held out", "held out", "all", "closed book", "exact", "multi-key",
                "read tok/s", "peak RSS MiB"):
        t.add_column(col, justify="left" if col in ("model", "policy") else "right")
    for s in summary(results):
        qa = s["tuning"] + s["heldout"]
        policy = s["policy"] + (f" ({', '.join(s['resolved'])})" if s["resolved"] != [s["policy"]] else "")
        if s["per_question"]:  # one read per question, the question known first (as `kvpot ask` reads)
            policy += ", question first"
        if s["skipped"]:
            policy += f", {s['skipped']} skipped"
        t.add_row(s["model"], policy, f"{s['length']:,}", _share(s["tuning"]), _share(s["heldout"]), _share(qa),
                  closed_book(qa) if s["policy"] != CLOSED else "-", _share(qa, "exact"), _share(s["multikey"]),
                  f"{s['tok_s']:.0f}" if s["tok_s"] else "-",
                  f"{s['peak_rss_mib']:,.0f}" if s["peak_rss_mib"] else "-")
    return t


def kinds_table(results: list[dict]) -> Table | None:
    """Accuracy per kind of question (lexical, paraphrase, two-passage, whole, absent), each with its n and
    interval: a locator that wins where the question repeats the passage's words may lose where it
    paraphrases them. None when no case records its kind (JSON written before kinds existed)."""
    rows = summary(results)
    if not any(s["kinds"][k] for s in rows for k in KINDS):
        return None
    t = Table(title="by kind of question (strict, n and 95 % interval)")
    for col in ("model", "policy", "length", *KINDS):
        t.add_column(col, justify="left" if col in ("model", "policy") else "right")
    for s in rows:
        t.add_row(s["model"], s["policy"], f"{s['length']:,}", *(_share(s["kinds"][k]) for k in KINDS))
    return t

"""`kvpot bench route`: which questions the lexical locators send to the pot rather than to a focused read
(kvpot.session.locating.route: BM25's best passage under lexical.FLAT times the mean of those holding a word of
the question, or no word held).

Asked of `kvpot bench qa`'s joined inputs (kvpot.bench.qa_inputs, multi-key needles included) at each length:
every question of the set asked inside a haystack (each should go to a focused read: its answer is in one or two
passages, or, for `absent`, nowhere), and the WHOLE_INPUT questions below asked of every input (each should go to
the pot: it is about all of what was read). Only the tokenizer is loaded: routing needs the text, not a reading,
so the counts are exact and take seconds. Per length and kind: n and how many went to the pot, at FLAT and at
the thresholds around it (`sweep`), so the choice can be checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# questions about the whole input, none naming anything in it: a user's first question over a file they have
# not read ("what is this about?"), in the forms people ask it
WHOLE_INPUT = (
    "What is this file about?", "Summarize this document.", "What kind of text is this?",
    "What are the main topics of these files?", "Give me an overview of the input.", "What is this about?",
    "Describe the contents in a few sentences.", "Which files are here and what do they do?",
    "What is the overall purpose of this text?", "Tell me what this document covers.",
)
SWEEP = (1.2, 1.4, 1.6, 1.8, 2.0, 2.5)


def _tally(rows: list[dict], flat: float) -> dict:
    out: dict[str, dict] = {}
    for r in rows:
        k = out.setdefault(r["kind"], {"n": 0, "to_pot": 0})
        k["n"] += 1
        k["to_pot"] += int(r["peak"] < flat)   # peak 0.0: no word held
    return out


def run(model: str, lengths: list[int], seed: int, json_out: Path | None, say=lambda m: None) -> dict:
    from kvpot.bench.qa_inputs import build_inputs
    from kvpot.bench.qa_questions import load_set
    from kvpot.bench.throughput import run_meta
    from kvpot.locator.lexical import FLAT, LexicalIndex
    from kvpot.models.resolve import resolve_model
    from kvpot.runtime.llama import LlamaModel
    from kvpot.safe_write import write_text_file

    meta = run_meta()
    facts, known = resolve_model(model)
    questions = load_set().questions
    vocab = LlamaModel(str(facts.path))
    try:
        count = lambda t: len(vocab.tokenize(t))  # noqa: E731
        inputs = {n: build_inputs(questions, count, n, seed, multikey=True) for n in lengths}
    finally:
        vocab.close()
    rows: list[dict] = []
    for n in lengths:
        for joined in inputs[n]:
            idx = LexicalIndex.build(joined.text, None)
            asked = [(a.kind if a.task == "qa" else "multikey", a.question, a.id) for a in joined.asks]
            asked += [("whole-input", q, f"whole-input-{i}") for i, q in enumerate(WHOLE_INPUT)]
            for kind, q, qid in asked:
                rows.append({"length": n, "input": joined.index, "id": qid, "kind": kind,
                             "peak": round(idx.peak(q), 4)})
        say(f"{n:,} tokens: {len(inputs[n])} inputs")
    summary = {str(n): {"flat": FLAT, "by_kind": _tally([r for r in rows if r["length"] == n], FLAT),
                        "sweep": {str(t): _tally([r for r in rows if r["length"] == n], t) for t in SWEEP}}
               for n in lengths}
    out = meta | {"model": known.name if known else facts.name, "lengths": lengths, "seed": seed,
                  "flat": FLAT, "whole_input_questions": list(WHOLE_INPUT), "n": len(rows),
                  "summary": summary, "rows": rows}
    if json_out is not None:
        write_text_file(json_out, json.dumps(out, indent=1) + "\n", "benchmark JSON")
    return out


def lines(out: dict) -> list[str]:
    """The table: per length, each kind's share sent to the pot."""
    text = []
    for n, s in out["summary"].items():
        cells = [f"{k} {v['to_pot']}/{v['n']}" for k, v in sorted(s["by_kind"].items())]
        text.append(f"{int(n):,} tokens, to the pot at peak < {s['flat']}: " + ", ".join(cells))
    return text


def peaks_by_kind(out: dict) -> dict[str, float]:
    """The median peak of each kind over all lengths (for the docs' sentence on what separates them)."""
    by: dict[str, list[float]] = {}
    for r in out["rows"]:
        by.setdefault(r["kind"], []).append(r["peak"])
    return {k: float(np.median(v)) for k, v in by.items()}

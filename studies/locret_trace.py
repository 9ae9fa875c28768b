"""Which of a prose needle's digits Locret keeps, and where its retaining heads rank them (issue 31:
Locret off its training distribution). Reads one `kvpot bench niah` prose haystack with Locret and, at
every compaction that holds the asked code, records per digit in how many (layer, KV head) pairs it is
held and kept, and the median over those pairs of the digit's score percentile within its pair (the
share of the pair's cells the heads score lower). `--keep-digits` is the oracle: the digits' scores are
raised above every other cell's, so the read keeps them everywhere; if the answer is then right, what
Locret lacked was the digits, not the text around them.

    .venv/bin/python -m studies.locret_trace -m gemma3-270m -n 7900 -d 0.5 --budget 2048 \
        --json docs/bench/locret/trace-gemma3-prose-7900-2048.json

(`make bench-locret-trace` runs the traces docs/benchmarks.md quotes).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from kvpot.bench.grid import FLASH_ATTN
from kvpot.bench.haystack import make_prose_haystack
from kvpot.engine import Engine, EngineConfig
from kvpot.models.resolve import resolve_model
from kvpot.policies import make_policy
from kvpot.safe_write import write_text_file
from studies.needle_trace import needle_digits

ORACLE_SCORE = np.float32(1e30)  # above any score the heads give (they are pre-softmax logits)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="gemma3-270m")
    ap.add_argument("-n", "--length", type=int, default=7900)
    ap.add_argument("-d", "--depth", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("-P", "--policy", default="locret")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--keep-digits", action="store_true", help="the oracle: force the code's digits to be kept")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json")
    return ap


def percentile_in_pair(score: np.ndarray, held: np.ndarray) -> np.ndarray:
    """score [L, H, N], held [L, H, N] bool (one cell per pair at most): per pair holding the cell, the
    share of that pair's cells scored below it."""
    cell = np.argmax(held, axis=2)
    mine = np.take_along_axis(score, cell[..., None], axis=2)
    below = (score < mine).mean(axis=2)
    return below[held.any(axis=2)]


def main(argv: list[str] | None = None) -> dict:
    a = parser().parse_args(argv)
    facts, _ = resolve_model(a.model)
    policy = make_policy(a.policy)
    if policy.name != "locret":
        raise SystemExit(f"locret_trace traces Locret, not {policy.name}")
    eng = Engine(str(facts.path), policy, EngineConfig(budget=a.budget, chunk=a.chunk, n_threads=a.threads,
                                                                   flash_attn=FLASH_ATTN))
    hay = make_prose_haystack(lambda t: len(eng.model.tokenize(t)), a.length, a.depth, a.seed, n_keys=1)
    doc = eng.model.tokenize(hay.text)
    first = len(eng.model.bos())  # the stream position of the document's first token
    digits = [first + i for i in needle_digits(eng.model, hay.text, hay.needles[0].text, hay.key)]
    events: list[dict] = []
    after_chunk, select = policy.after_chunk, policy.select

    def traced_after_chunk(view):
        after_chunk(view)
        if a.keep_digits:
            policy._score[np.isin(view.positions, digits)] = ORACLE_SCORE

    def traced_select(view, budget):
        keep = select(view, budget)
        pos = view.positions
        held = [pos == p for p in digits]
        if keep is None or not any(h.any() for h in held):
            return keep
        kept_pos = np.take_along_axis(pos, keep, axis=2)
        events.append({"tokens_seen": int(view.tokens_seen), "cells": int(view.n_cells), "digits": [
            {"stream_pos": int(p), "held": int(h.any(axis=2).sum()), "kept": int((kept_pos == p).any(axis=2).sum()),
             "score_percentile": (float(np.median(percentile_in_pair(policy._score, h))) if h.any() else None)}
            for p, h in zip(digits, held)]})
        return keep

    policy.after_chunk, policy.select = traced_after_chunk, traced_select
    eng.reset()
    eng.set_question(hay.question)
    eng.feed(doc)
    answer = "".join(eng.answer(hay.answer_prefix, max_tokens=10)).strip()
    pos = eng.positions
    out = {"model": facts.name, "policy": a.policy, "budget": a.budget, "length": a.length, "depth": a.depth,
           "seed": a.seed, "keep_digits": a.keep_digits, "key": hay.key, "answer": answer,
           "correct": hay.key in answer, "pairs": int(pos.shape[0] * pos.shape[1]),
           "kept_fraction": a.budget / len(doc),
           "digits_held_at_end": [int((pos == p).any(axis=2).sum()) for p in digits],
           "bos_held_at_end": int((pos == 0).any(axis=2).sum()) if first else None, "compactions": events}
    eng.close()
    for e in events:
        print(f"compaction at {e['tokens_seen']} tokens ({e['cells']} cells -> {a.budget}): "
              + ", ".join(f"held {d['held']} kept {d['kept']} pct {d['score_percentile']:.2f}" for d in e["digits"]))
    print(f"answer {answer!r} (key {hay.key}); digits held at the end in {out['digits_held_at_end']} of "
          f"{out['pairs']} pairs; a compaction keeps {out['kept_fraction']:.0%} of the document")
    if a.json:
        write_text_file(a.json, json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

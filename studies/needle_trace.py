"""Which of the needle's digits InfiniPot keeps, and by which of its rules (docs/benchmarks.md,
"What loses the digits", issue 17). Reads one `kvpot bench niah` haystack with InfiniPot and, at
every distillation that holds the asked needle, records per (layer, KV head) for each of the code's
digits: held before, kept after, and why (an attention sink, one of NuC's T slots, or CaP's top
|C| - T), with the digit's NuC beside the T-th highest NuC of that head.

    .venv/bin/python -m studies.needle_trace -m smollm2-135m -n 2500 -d 0.5 --budget 1024 -t 1 \
        --json docs/bench/curve/trace-smollm2-2500-1024.json

(`make bench-trace` runs the traces docs/benchmarks.md quotes).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from kvpot.bench.grid import FLASH_ATTN
from kvpot.bench.haystack import make_prose_haystack
from kvpot.bench.niah import TASKS
from kvpot.engine import Engine, EngineConfig
from kvpot.models.resolve import resolve_model
from kvpot.policies import make_policy
from kvpot.safe_write import write_text_file


def needle_digits(model, text: str, needle: str, key: str) -> list[int]:
    """Token indices (in the document's tokens) of the key's digits, found by the pieces' text."""
    toks = model.tokenize(text)
    start = text.index(needle)
    end = start + len(needle)
    out, at = [], 0
    for i, t in enumerate(toks):
        piece = model.piece(t).decode("utf-8", "replace")
        if start <= at < end and any(c.isdigit() for c in piece):
            out.append(i)
        at += len(piece)
    if "".join(model.piece(toks[i]).decode().strip() for i in out) != key:
        raise SystemExit(f"could not place the key {key} in the tokens (found {out})")
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-n", "--length", type=int, default=7900)
    ap.add_argument("-d", "--depth", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--task", default="multikey", choices=[t for t in TASKS if t != "passkey"])
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("-P", "--policy", default="infinipot")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json")
    return ap


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)

    facts, _ = resolve_model(a.model)
    policy = make_policy(a.policy)
    eng = Engine(str(facts.path), policy, EngineConfig(budget=a.budget, chunk=a.chunk, n_threads=a.threads,
                                                                   flash_attn=FLASH_ATTN))
    hay = make_prose_haystack(lambda t: len(eng.model.tokenize(t)), a.length, a.depth, a.seed, n_keys=TASKS[a.task])
    doc = eng.model.tokenize(hay.text)
    digits_doc = needle_digits(eng.model, hay.text, hay.needles[0].text, hay.key)
    events: list[dict] = []
    orig_select = policy.select

    def traced(view, budget):
        keep = orig_select(view, budget)
        pos = view.positions                                   # [L, H, cells] stream positions, -1 catalyst
        digits = [stream_offset[0] + i for i in digits_doc]
        held = np.stack([(pos == p).any(axis=2) for p in digits])            # [digit, L, H]
        if not held.any():
            return keep
        kept_pos = np.take_along_axis(pos, keep, axis=2)
        kept = np.stack([(kept_pos == p).any(axis=2) for p in digits])
        C, T = policy.keep, round(policy.nuc_ratio * policy.keep)
        real = pos >= 0
        nuc = np.where(real & (pos >= policy.n_sink), policy._padded_nuc(view.n_cells), -np.inf)
        nuc_t = -np.sort(-nuc, axis=2)[:, :, T - 1] if T else np.full(pos.shape[:2], np.inf)   # [L, H]
        cap = np.where(real, view.scores, -np.inf) if view.scores is not None else None
        rows = []
        for j, p in enumerate(digits):
            cell = np.argmax(pos == p, axis=2)                                  # [L, H] (valid where held)
            d_nuc = np.take_along_axis(nuc, cell[..., None], axis=2)[..., 0]
            by_nuc = held[j] & (d_nuc >= nuc_t)
            cap_rank = None
            if cap is not None:
                d_cap = np.take_along_axis(cap, cell[..., None], axis=2)[..., 0]
                cap_rank = (cap > d_cap[..., None]).sum(axis=2)                 # cells above it, per head
            rows.append({
                "digit": doc_piece(doc[digits_doc[j]]), "stream_pos": int(p),
                "held": int(held[j].sum()), "kept": int(kept[j].sum()),
                "kept_by_nuc": int((kept[j] & by_nuc).sum()), "kept_by_cap": int((kept[j] & ~by_nuc).sum()),
                "nuc": float(np.median(d_nuc[held[j]])) if held[j].any() else None,
                "nuc_T_median": float(np.median(nuc_t)),
                "cap_rank_median": float(np.median(cap_rank[held[j]])) if cap_rank is not None and held[j].any() else None,
            })
        events.append({"tokens_seen": int(view.tokens_seen), "cells": int(view.n_cells), "keep": C, "T": T,
                       "pairs": int(pos.shape[0] * pos.shape[1]), "digits": rows})
        return keep

    def doc_piece(t: int) -> str:
        return eng.model.piece(t).decode("utf-8", "replace")

    stream_offset = [0]
    policy.select = traced
    eng.reset()
    eng.set_question(hay.question)
    stream_offset[0] = len(eng.model.bos())  # the stream position of the document's first token (after BOS)
    eng.feed(doc)
    assert eng.tokens_seen == stream_offset[0] + len(doc)
    answer = "".join(eng.answer(hay.answer_prefix, max_tokens=8))
    pos = eng.positions
    final = [int((pos == stream_offset[0] + i).any(axis=2).sum()) for i in digits_doc]
    out = {"model": facts.name, "policy": a.policy, "budget": a.budget, "length": a.length, "depth": a.depth,
           "seed": a.seed, "task": a.task, "key": hay.key, "answer": answer.strip(), "correct": hay.key in answer,
           "pairs": int(pos.shape[0] * pos.shape[1]), "digits_held_at_end": final, "distillations": events}
    eng.close()
    for e in events:
        print(f"distillation at {e['tokens_seen']} tokens ({e['cells']} cells -> {e['keep']}, T={e['T']}):")
        for r in e["digits"]:
            print(f"  {r['digit']!r} held {r['held']:3d} kept {r['kept']:3d} (NuC {r['kept_by_nuc']:3d}, CaP "
                  f"{r['kept_by_cap']:3d}); NuC {r['nuc']} vs T-th {r['nuc_T_median']:.2f}; CaP rank {r['cap_rank_median']}")
    print(f"answer {out['answer']!r} (key {hay.key}); digits held at the end in {final} of {out['pairs']} pairs")
    if a.json:
        write_text_file(a.json, json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""What InfiniPot's NuC costs in a chunk's time: one chunk decoded with log p(next token) of every row
(the output head on every row, in blocks of rows as kvpot runs it), against the same chunk without them
(the head on the last row only, as stock llama.cpp prefills) and against the model's own head on every
row (every row marked for logits, which the blocks then view: the cost the blocks replace). The three run
in turn, each in a fresh context, rounds times, in one process; medians are quoted and their ratios are
what to read (a shared machine slows all three alike).

    python -m studies.nuc_head -m gemma3-270m -m qwen2.5-coder-0.5b --json docs/bench/nuc/head-share.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from kvpot.bench.logbook import logbook
from kvpot.models.resolve import resolve_model
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel
from kvpot.runtime.pot import Pot
from kvpot.safe_write import write_text_file

MODES = ("no log-probs", "log-probs, head in blocks", "log-probs, model's head on every row")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies.nuc_head", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", action="append", default=None, help="known model names (repeatable)")
    p.add_argument("--chunk", type=int, default=512, help="tokens in the chunk (kvpot's default step)")
    p.add_argument("--rounds", type=int, default=5, help="times each mode runs, in turn")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p


def time_chunk(model: LlamaModel, toks: list[int], mode: str, chunk: int, threads: int) -> float:
    ctx = LlamaContext(model, ContextParams(n_ctx=2 * chunk, n_batch=chunk, n_threads=threads))
    try:
        if mode != MODES[0]:
            Pot(ctx).logprobs_request(0, toks[1:chunk + 1])
        t0 = time.perf_counter()
        ctx.decode(toks[:chunk], 0, logits="all" if mode == MODES[2] else "last")
        return time.perf_counter() - t0
    finally:
        ctx.close()


def measure(name: str, chunk: int, rounds: int, threads: int) -> dict:
    facts, _ = resolve_model(name)
    model = LlamaModel(str(facts.path))
    try:
        toks = model.bos() + model.tokenize(logbook(n_entries=chunk // 8, seed=0)[0])
        if len(toks) < chunk + 1:
            raise SystemExit(f"the logbook gave {len(toks)} tokens, fewer than {chunk + 1}")
        times: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(rounds):
            for mode in MODES:
                times[mode].append(time_chunk(model, toks, mode, chunk, threads))
        med = {m: statistics.median(v) for m, v in times.items()}
        return dict(model=name, n_vocab=model.n_vocab, n_embd=facts.n_embd, chunk=chunk, rounds=rounds,
                    seconds=times, median=med,
                    nuc_share=(med[MODES[1]] - med[MODES[0]]) / med[MODES[1]],
                    blocks_vs_model_head=med[MODES[1]] / med[MODES[2]])
    finally:
        model.close()


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    rows = []
    for name in a.model or ["gemma3-270m"]:
        r = measure(name, a.chunk, a.rounds, a.threads)
        rows.append(r)
        print(f"{name:20s} " + "  ".join(f"{m}: {r['median'][m]:.2f} s" for m in MODES)
              + f"  NuC's share {r['nuc_share']:.0%}  blocks/model head {r['blocks_vs_model_head']:.2f}")
    if a.json:
        write_text_file(a.json, json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

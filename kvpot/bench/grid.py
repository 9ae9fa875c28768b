"""Grids of niah cases and perplexity runs; results as dicts ready for JSON, tables and heatmaps."""

from __future__ import annotations

import math
import time
from dataclasses import asdict

from kvpot.api.engine_plan import EnginePlan, plan_engines
from kvpot.bench.niah import read_and_ask

# the grids read as `kvpot ask` does on a device that holds the model's window (flash_attn = auto: off)
FLASH_ATTN = False

# cells a full-attention case holds past the haystack's nominal length: the tokenizer's overshoot
# (a haystack may come out a few tokens longer than asked), the question and the answer
FULL_ROOM = 256


def niah_plans(model: str, specs: list[str], budget: int, chunk: int, threads: int, longest: int) -> list[EnginePlan]:
    """The engines niah_grid reads with, one per spec, every refusal said before any haystack is made
    (kvpot.api.engine_plan; `longest`: the longest haystack, for a policy whose smallest step shrinks as the
    input grows)."""
    return plan_engines(model, specs, budget, chunk, threads, flash_attn=FLASH_ATTN, expected_tokens=longest)


def niah_grid(plans: list[EnginePlan], model_name: str, lengths: list[int], depths: list[float], seeds: list[int],
              on_case=lambda r: None, done: list[dict] = (), task: str = "passkey", sources: bool = False,
              say=lambda m: None, on_read=lambda m: None) -> list[dict]:
    """Every policy (`plans`: niah_plans) x length x depth x seed; one engine per (policy, length), reset between
    cases. Cases already in `done` (same task, policy, length, depth, seed) are kept and not run again.
    `sources`: each case also records where its answer's attention went (niah.source_check).
    `say` is told each case as it starts (a case reads the whole haystack: minutes on a large model),
    `on_read` how far its read is after every chunk (niah.read_and_ask).
    `full` gets a context of the haystack's length (stock llama.cpp's whole-prompt prefill)."""
    results = list(done)
    have = {case_key(r) for r in results}
    for plan in plans:
        spec = plan.spec
        for n in lengths:
            todo = [(d, s) for d in depths for s in seeds if (task, spec, n, d, s) not in have]
            if not todo:
                continue
            eng = plan.again(budget=n + FULL_ROOM if spec.strip() == "full" else None).open()
            try:
                for depth, seed in todo:
                    say(f"{spec} {n:,} @ {depth}, seed {seed}")
                    r = asdict(read_and_ask(eng, spec, model_name, n, depth, seed, task=task, sources=sources,
                                                on_read=on_read))
                    results.append(r)
                    on_case(r)
            finally:
                eng.close()
    return results


def case_key(r: dict) -> tuple:
    return (r.get("task", "passkey"), r["policy"], r["length"], r["depth"], r["seed"])


def ppl_plans(model: str, specs: list[str], budget: int, chunk: int, threads: int) -> list[EnginePlan]:
    """The engines ppl_run reads with, one per spec, every refusal said before any reads (kvpot.api.engine_plan)."""
    return plan_engines(model, specs, budget, chunk, threads, flash_attn=FLASH_ATTN, measure_nll=True)


def ppl_run(plan: EnginePlan, tokens: list[int]) -> dict:
    """Perplexity of `tokens` read by the planned engine (ppl_plans), every token scored given the kept past."""
    spec = plan.spec
    eng = plan.open()
    try:
        t0 = time.perf_counter()
        eng.feed(tokens)
        dt = time.perf_counter() - t0
        nll = eng.nll_sum / max(1, eng.nll_count)
        return {"policy": spec, "tokens": eng.tokens_seen, "scored_tokens": eng.nll_count, "nll": nll,
                "ppl": math.exp(nll), "seconds": dt, "tok_s": eng.tokens_seen / dt,
                "distill_seconds": eng.compact_seconds, "compactions": eng.n_compactions}
    finally:
        eng.close()

"""`kvpot bench throughput`: how fast the pot ingests generated text, and what memory it holds, beside
stock llama.cpp's prefill of the same text measured in the same run.

`run_plan` (the parent) starts one worker process per case; `kvpot_ingest` and `stock_prefill` are
the cases (kvpot.bench.worker calls them)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from kvpot.bench.process import peak_rss_mb, rss_mb, run_worker


@dataclass(frozen=True)
class ThroughputPlan:
    model: str
    policy: str
    budget: int
    chunk: int
    threads: int
    flash_attn: bool
    pot_tokens: tuple[int, ...]
    stock_tokens: int


def run_plan(plan: ThroughputPlan, say=lambda msg: None) -> dict:
    common = ["--chunk", str(plan.chunk), "--threads", str(plan.threads)] + (["--flash-attn"] if plan.flash_attn else [])
    say(f"stock llama.cpp prefill of {plan.stock_tokens} tokens")
    stock = run_worker(["stock-prefill", plan.model, str(plan.stock_tokens), *common])
    cases = []
    for n in plan.pot_tokens:
        say(f"{plan.policy} at {plan.budget} cells over {n} tokens")
        r = run_worker(["kvpot-ingest", plan.model, str(n), "--policy", plan.policy, "--budget", str(plan.budget),
                        *common])
        r["ratio_vs_stock"] = r["tok_s"] / stock["tok_s"]
        cases.append(r)
    return {"plan": plan.__dict__, "stock": stock, "pot": cases}


def stock_prefill(model_path: str, n_tokens: int, chunk: int, threads: int, flash_attn: bool) -> dict:
    """Stock llama.cpp: the whole input in one context, prefilled in n_batch pieces; no kvpot call at all."""
    from kvpot.bench.logbook import generated_tokens
    from kvpot.bench.stock import prefill, stock_context
    from kvpot.runtime.llama import LlamaModel

    model = LlamaModel(model_path)
    bos = model.bos()  # some models (SmolLM2) add none
    tokens = bos + generated_tokens(model, n_tokens - len(bos))
    ctx = stock_context(model, n_tokens + 16, chunk, threads, flash_attn)
    t0 = time.perf_counter()
    prefill(ctx, tokens, chunk)
    dt = time.perf_counter() - t0
    return {"mode": "stock", "tokens": len(tokens), "seconds": dt, "tok_s": len(tokens) / dt,
            "peak_rss_mb": peak_rss_mb(), "kv_bytes": None, "compactions": 0, "flash_attn": flash_attn}


def kvpot_ingest(model_path: str, n_tokens: int, policy: str, budget: int, chunk: int, threads: int,
                 flash_attn: bool) -> dict:
    """The pot reading the same generated text under `policy` at `budget` cells."""
    from kvpot.bench.logbook import generated_tokens
    from kvpot.engine import Engine, EngineConfig
    from kvpot.policies import make_policy

    eng = Engine(model_path, make_policy(policy), EngineConfig(budget=budget, chunk=chunk, n_threads=threads,
                                                                flash_attn=flash_attn))
    tokens = generated_tokens(eng.model, n_tokens - len(eng.model.bos()))  # the engine adds the BOS
    peak_bytes = [0]

    def on_chunk(ev):
        peak_bytes[0] = max(peak_bytes[0], ev.stats.bytes_used)

    with eng:  # closing deletes what the policy kept on disk (InfLLM's block store)
        # RSS before and after the read: the peak also counts the input held in Python (a 1M-token list
        # is ~40 MiB), which grows with the input while the pot does not
        rss_start = rss_mb()
        t0 = time.perf_counter()
        eng.feed(tokens, on_chunk)
        dt = time.perf_counter() - t0
        st = eng.stats()
        return {"mode": "pot", "policy": policy, "budget": budget, "tokens": eng.tokens_seen, "seconds": dt,
                "tok_s": eng.tokens_seen / dt, "peak_rss_mb": peak_rss_mb(), "rss_start_mb": rss_start,
                "rss_end_mb": rss_mb(), "kv_bytes": peak_bytes[0],
                "kv_bytes_allocated": st.bytes_total, "disk_bytes": eng.policy.disk_bytes(),
                "compactions": st.n_compactions, "compact_seconds": eng.compact_seconds, "flash_attn": flash_attn}

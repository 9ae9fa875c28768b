"""One benchmark case in a fresh process (so peak RSS is its own); prints one JSON line.

python -m kvpot.bench.worker pot   MODEL TOKENS --policy streaming --budget 1024 --chunk 512 --threads 2
python -m kvpot.bench.worker stock MODEL TOKENS --chunk 512 --threads 2
python -m kvpot.bench.worker context MODEL TOKENS --out DIR --threads 2         (kvpot.bench.context)
python -m kvpot.bench.worker context-stock MODEL TOKENS --out DIR --threads 2
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time


def peak_rss_mb() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / (1024 * 1024)


def run_stock(model_path: str, n_tokens: int, chunk: int, threads: int, flash_attn: bool) -> dict:
    """Stock llama.cpp: the whole input in one context, prefilled in n_batch pieces; no kvpot call at all."""
    from kvpot.bench.logbook import generated_tokens
    from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel

    model = LlamaModel(model_path)
    bos = model.bos()  # some models (SmolLM2) add none
    tokens = bos + generated_tokens(model, n_tokens - len(bos))
    ctx = LlamaContext(model, ContextParams(n_ctx=n_tokens + 16, n_batch=chunk, n_threads=threads, flash_attn=flash_attn))
    t0 = time.perf_counter()
    for s in range(0, len(tokens), chunk):
        ctx.decode(tokens[s:s + chunk], s, logits="last")
    dt = time.perf_counter() - t0
    return {"mode": "stock", "tokens": len(tokens), "seconds": dt, "tok_s": len(tokens) / dt,
            "peak_rss_mb": peak_rss_mb(), "kv_bytes": None, "compactions": 0}


def run_pot(model_path: str, n_tokens: int, policy: str, budget: int, chunk: int, threads: int, flash_attn: bool) -> dict:
    from kvpot.bench.logbook import generated_tokens
    from kvpot.engine import Engine, EngineConfig
    from kvpot.policies import make_policy

    eng = Engine(model_path, make_policy(policy), EngineConfig(budget=budget, chunk=chunk, n_threads=threads,
                                                                flash_attn=flash_attn))
    tokens = generated_tokens(eng.model, n_tokens - len(eng.model.bos()))  # the engine adds the BOS
    peak_bytes = [0]

    def on_chunk(ev):
        peak_bytes[0] = max(peak_bytes[0], ev.stats.bytes_used)

    t0 = time.perf_counter()
    eng.feed(tokens, on_chunk)
    dt = time.perf_counter() - t0
    st = eng.stats()
    return {"mode": "pot", "policy": policy, "budget": budget, "tokens": eng.tokens_seen, "seconds": dt,
            "tok_s": eng.tokens_seen / dt, "peak_rss_mb": peak_rss_mb(), "kv_bytes": peak_bytes[0],
            "kv_bytes_allocated": st.bytes_total, "compactions": st.n_compactions, "compact_seconds": eng.compact_seconds}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["pot", "stock", "context", "context-stock"])
    ap.add_argument("model")
    ap.add_argument("tokens", type=int)
    ap.add_argument("--policy", default=None, help="default: streaming (pot), the model's defaults (context)")
    ap.add_argument("--budget", type=int, default=None, help="default: 1024 (pot), the model's defaults (context)")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--out", default=".", help="folder for the generated document and saved contexts")
    a = ap.parse_args()
    if a.mode.startswith("context"):
        from kvpot.bench import context

        run = context.run_kvpot if a.mode == "context" else context.run_stock
        print(json.dumps(run(a.model, a.tokens, a.out, a.threads, policy=a.policy, budget=a.budget)))
        return 0
    if a.mode == "stock":
        res = run_stock(a.model, a.tokens, a.chunk, a.threads, a.flash_attn)
    else:
        res = run_pot(a.model, a.tokens, a.policy or "streaming", a.budget or 1024, a.chunk, a.threads, a.flash_attn)
    res["flash_attn"] = a.flash_attn
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""InfLLM's block cache by eviction rule, the paper's Figure 4 (appendix D) on a kvpot model: the same text read
with InfLLM once per rule (infllm:cache=freq, the paper's frequency score, beside fifo, random and lru), each
read's hits and misses per pot layer, its speed, and the question's logits after it, which must be the same
for every rule (the cache changes which reads come from the file, never what a lookup fetches).

    python -m kvpot.bench.infllm_cache -m qwen2.5-coder-0.5b --text manual --tokens 12288 --budget 2048 \\
        --repeats 2 --json docs/bench/infllm/cache-rules-qwen05-manual-12k.json

A first read of 2,048 tokens, not counted, loads the model's pages before any read is timed. Rounds alternate
the order of the rules (a round in order, the next reversed), so a machine that slows down over the run weighs
on every rule alike; the speed reported is each rule's median over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from kvpot.runtime.blocks import CACHE_RULES

QUESTION = "\n\nQuestion: What does this document describe? Answer:"
RULES = ("freq", "fifo", "random", "lru")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvpot.bench.infllm_cache", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default="qwen2.5-coder-0.5b", help="a known model name or a .gguf path")
    p.add_argument("--text", default="manual", help="a text of kvpot.bench.texts (manual, code-32k, logbook, ...) "
                   "or a file's path")
    p.add_argument("--tokens", type=int, default=12288, help="tokens read (the text's first)")
    p.add_argument("--budget", type=int, default=2048, help="cells of the pot (InfLLM's defaults fill it)")
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--policy", default="infllm", help="the InfLLM spec each rule is added to")
    p.add_argument("--rule", action="append", choices=sorted(CACHE_RULES), help=f"rules read (default {', '.join(RULES)})")
    p.add_argument("--repeats", type=int, default=1, help="rounds of reads, one per rule each")
    p.add_argument("--answer", type=int, default=8, help="greedy answer tokens compared across the rules")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p


def text_of(spec: str) -> str:
    from kvpot.bench.texts import KINDS

    if spec in KINDS:
        return KINDS[spec]()
    path = Path(spec)
    if not path.is_file():
        raise SystemExit(f"--text {spec}: neither a text of kvpot.bench.texts ({', '.join(KINDS)}) nor a file")
    return path.read_text(encoding="utf-8", errors="replace")


def read_once(model_path: str, spec: str, tokens: list[int], ns) -> dict:
    """One read of `tokens` with policy `spec`: its speed, cache counts per layer, question logits and answer."""
    from kvpot.api.engine_plan import plan_engine

    with plan_engine(model_path, spec, ns.budget, ns.chunk, ns.threads).open() as eng:
        t0 = time.perf_counter()
        eng.feed(tokens)
        seconds = time.perf_counter() - t0
        stats = eng.policy.cache_stats()
        if stats is None:
            raise SystemExit(f"{spec} stored no block in {len(tokens)} tokens: read more (--tokens) or a smaller --budget")
        logits = eng.prompt(eng.model.tokenize(QUESTION))
        answer = list(eng.generate(logits, ns.answer, lambda lg, chosen: int(np.argmax(lg))))
    hits, misses = np.array(stats["hits"]), np.array(stats["misses"])
    return {"seconds": round(seconds, 3), "tok_s": round(len(tokens) / seconds, 2), "size": stats["size"],
            "per_layer": stats["per_layer"], "cache_rule_run": stats["rule"],
            "hits": hits.tolist(), "misses": misses.tolist(),
            "miss_rate": [round(m / max(h + m, 1), 4) for h, m in zip(hits, misses)],
            "miss_rate_all": round(int(misses.sum()) / max(int(hits.sum() + misses.sum()), 1), 4),
            "answer": "".join(answer), "_logits": np.asarray(logits, dtype=np.float32)}


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    from kvpot.api.engine_plan import plan_engine
    from kvpot.bench.throughput import run_meta
    from kvpot.runtime.llama import LlamaModel

    rules = ns.rule or list(RULES)
    # the policy, the budget and the model checked before the text is tokenized; each rule's read is planned alike
    warming = plan_engine(ns.model, ns.policy, ns.budget, ns.chunk, ns.threads)
    facts = warming.facts
    vocab = LlamaModel(str(facts.path))
    try:
        tokens = vocab.tokenize(text_of(ns.text))
    finally:
        vocab.close()
    if len(tokens) < ns.tokens:
        raise SystemExit(f"--text {ns.text} holds {len(tokens)} tokens, fewer than --tokens {ns.tokens}")
    tokens = tokens[:ns.tokens]
    with warming.open() as warm:
        warm.feed(tokens[:2048])
    runs: list[dict] = []
    first_logits = None
    for r in range(ns.repeats):
        for rule in (rules if r % 2 == 0 else rules[::-1]):
            spec = f"{ns.policy}{',' if ':' in ns.policy else ':'}cache={rule}"
            got = read_once(str(facts.path), spec, tokens, ns)
            logits = got.pop("_logits")
            if first_logits is None:
                first_logits = logits
            got = {"rule": rule, "round": r, "policy": spec,
                   "logits_max_abs_diff_to_first": float(np.max(np.abs(logits - first_logits)))} | got
            runs.append(got)
            print(json.dumps({k: got[k] for k in ("rule", "round", "tok_s", "miss_rate_all", "answer")}), file=sys.stderr,
                  flush=True)
    summary = {}
    for rule in rules:
        mine = [x for x in runs if x["rule"] == rule]
        summary[rule] = {"median_tok_s": round(statistics.median(x["tok_s"] for x in mine), 2),
                         "miss_rate_all": mine[0]["miss_rate_all"], "miss_rate": mine[0]["miss_rate"],
                         "same_counts_every_round": all(x["hits"] == mine[0]["hits"] for x in mine)}
    base = summary[rules[0]]["median_tok_s"]
    for rule in rules:
        summary[rule]["speed_ratio_to_" + rules[0]] = round(summary[rule]["median_tok_s"] / base, 3)
    out = run_meta() | {
        "command": "python -m kvpot.bench.infllm_cache " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": warming.model_name, "text": ns.text, "tokens": ns.tokens, "budget": ns.budget,
        "chunk": ns.chunk, "threads": ns.threads, "repeats": ns.repeats, "n": ns.repeats,
        "question": QUESTION.strip(), "same_logits_every_rule": all(x["logits_max_abs_diff_to_first"] == 0 for x in runs),
        "same_answer_every_rule": len({x["answer"] for x in runs}) == 1, "summary": summary, "runs": runs}
    print(json.dumps({k: out[k] for k in ("same_logits_every_rule", "same_answer_every_rule")}
                     | {r: {k: v for k, v in s.items() if k != "miss_rate"} for r, s in summary.items()}))
    if ns.json is not None:
        from kvpot.safe_write import write_text_file

        write_text_file(ns.json, json.dumps(out, indent=1) + "\n", "benchmark JSON")
    return 0


if __name__ == "__main__":
    sys.exit(main())

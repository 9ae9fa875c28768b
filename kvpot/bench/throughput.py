"""`kvpot bench throughput`: pot ingestion speed and memory beside stock llama.cpp prefill, same run."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from kvpot.errors import KvpotError


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


def run_case(args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "kvpot.bench.worker", *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise KvpotError(f"benchmark case {' '.join(args)} failed: {last}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_plan(plan: ThroughputPlan, say=lambda msg: None) -> dict:
    common = ["--chunk", str(plan.chunk), "--threads", str(plan.threads)] + (["--flash-attn"] if plan.flash_attn else [])
    say(f"stock llama.cpp prefill of {plan.stock_tokens} tokens")
    stock = run_case(["stock", plan.model, str(plan.stock_tokens), *common])
    cases = []
    for n in plan.pot_tokens:
        say(f"{plan.policy} at {plan.budget} cells over {n} tokens")
        r = run_case(["pot", plan.model, str(n), "--policy", plan.policy, "--budget", str(plan.budget), *common])
        r["ratio_vs_stock"] = r["tok_s"] / stock["tok_s"]
        cases.append(r)
    return {"plan": plan.__dict__, "stock": stock, "pot": cases}

"""`kvpot bench ...`: measurements beside stock llama.cpp in the same run."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from kvpot.bench.throughput import ThroughputPlan, run_plan
from kvpot.errors import KvpotError
from kvpot.model_ref import resolve_model
from kvpot.models.registry import DEFAULT_MODEL
from kvpot.policies import make_policy

from ._common import err, user_errors

app = typer.Typer(help="Benchmarks, each reported as a ratio to stock llama.cpp measured in the same run.",
                  no_args_is_help=True)


@app.command()
@user_errors
def throughput(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="a known model name or a path to a .gguf file"),
    policy: str = typer.Option("streaming", "--policy", "-P", help="policy spec, e.g. streaming, snapkv:window=32"),
    budget: int = typer.Option(1024, "--budget", "-b", min=1, help="cells the pot keeps"),
    chunk: int = typer.Option(512, "--chunk", min=16, help="tokens per decode step (also stock's n_batch)"),
    tokens: list[int] = typer.Option([32768], "--tokens", "-n", min=64, help="input lengths to ingest (repeatable)"),
    stock_tokens: int = typer.Option(None, "--stock-tokens", min=64,
                                     help="stock prefill length (default: the longest input that fits the model's context)"),
    threads: int = typer.Option(2, "--threads", "-t", min=1, help="CPU threads"),
    flash_attn: bool = typer.Option(False, "--flash-attn", help="flash attention for both sides"),
    json_out: Path = typer.Option(None, "--json", help="also write the results here as JSON"),
) -> None:
    """Ingest N tokens of generated text with a policy; report tokens/s, peak RSS and pot bytes beside stock prefill."""
    facts, _ = resolve_model(model)
    make_policy(policy)  # refuse a bad spec before any process starts
    if budget + chunk > 1 << 20:
        raise KvpotError(f"budget {budget} + chunk {chunk} is larger than any context kvpot can allocate")
    fits = min(max(tokens), facts.n_ctx_train or max(tokens))
    plan = ThroughputPlan(model=str(facts.path), policy=policy, budget=budget, chunk=chunk, threads=threads,
                          flash_attn=flash_attn, pot_tokens=tuple(tokens), stock_tokens=stock_tokens or fits)
    with err.status("benchmarking") as status:
        result = run_plan(plan, say=lambda msg: status.update(msg))
    stock = result["stock"]
    table = Table(title=f"ingestion throughput: {facts.name}, {policy} at {budget} cells, chunk {chunk}, {threads} threads")
    for col in ("run", "tokens", "tok/s", "vs stock", "peak RSS MiB", "KV bytes held"):
        table.add_column(col, justify="right" if col != "run" else "left")
    table.add_row("stock llama.cpp", str(stock["tokens"]), f"{stock['tok_s']:.1f}", "1.00", f"{stock['peak_rss_mb']:.0f}", "-")
    for r in result["pot"]:
        table.add_row(f"kvpot {policy}", str(r["tokens"]), f"{r['tok_s']:.1f}", f"{r['ratio_vs_stock']:.2f}",
                      f"{r['peak_rss_mb']:.0f}", f"{r['kv_bytes'] / 2**20:.1f} MiB")
    err.print(table)
    if json_out:
        json_out.write_text(json.dumps(result, indent=2))
        err.print(f"results written to {json_out}")

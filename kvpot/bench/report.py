"""Every table and figure the `kvpot bench` commands print or write, from their results (dicts, as in
the JSON files), so a saved result can be shown again without running anything."""

from __future__ import annotations

from rich.table import Table


def throughput_table(result: dict, model_name: str) -> Table:
    plan, stock = result["plan"], result["stock"]
    n_decode = plan.get("decode") or 0  # results from before the decode measurement have none
    table = Table(title=f"ingestion throughput: {model_name}, {plan['policy']} at {plan['budget']} cells, "
                        f"chunk {plan['chunk']}, {plan['threads']} threads"
                        + (f"; then {n_decode} answer tokens" if n_decode else ""))
    # a policy that keeps blocks on disk (InfLLM) gets the store's size; results from before it had none
    disk = any(r.get("disk_bytes") for r in result["pot"])
    decode = any("decode_tokens" in r for r in [stock, *result["pot"]])
    shortest = next((r["decode_shortest_tokens"] for r in result["pot"] if r.get("decode_shortest_tokens")), None)
    # unpatched llama.cpp at its defaults (kvpot.bench.stock_upstream), the reference, where the run has it
    up = result.get("upstream")
    cols = (("run", "tokens", "tok/s") + (("vs unpatched", "RSS vs unpatched") if up else ())
            + ("vs stock", "peak RSS MiB", "KV bytes held") + (("on disk",) if disk else ())
            + (("decode tok/s", f"decode vs {_short(shortest)}" if shortest else "decode vs shortest") if decode else ()))
    for col in cols:
        table.add_column(col, justify="right" if col != "run" else "left")

    def vs_up(r: dict) -> tuple[str, ...]:
        return ((f"{r['ratio_vs_upstream']:.2f}", f"{r['rss_vs_upstream']:.2f}" if r.get("rss_vs_upstream") else "-")
                if up else ())
    if up:
        table.add_row("stock llama.cpp, unpatched, its defaults", str(up["tokens"]), f"{up['tok_s']:.1f}", "1.00", "1.00",
                      "-", f"{up['peak_rss_mb']:.0f}", "-", *(("-",) if disk else ()),
                      *((f"{up['decode_tok_s']:.1f}" if up.get("decode_tok_s") else "-", "-") if decode else ()))
    table.add_row("stock llama.cpp" + (": kvpot's runtime, no pot" if up else ""), str(stock["tokens"]),
                  f"{stock['tok_s']:.1f}", *vs_up(stock), "1.00", f"{stock['peak_rss_mb']:.0f}", "-",
                  *(("-",) if disk else ()), *((_decode_cell(stock), "-") if decode else ()))
    for r in result["pot"]:
        ratio = r.get("decode_ratio_vs_shortest")
        table.add_row(f"kvpot {plan['policy']}", str(r["tokens"]), f"{r['tok_s']:.1f}", *vs_up(r), f"{r['ratio_vs_stock']:.2f}",
                      f"{r['peak_rss_mb']:.0f}", f"{r['kv_bytes'] / 2**20:.1f} MiB",
                      *((f"{r.get('disk_bytes', 0) / 2**20:.1f} MiB",) if disk else ()),
                      *((_decode_cell(r), f"{ratio:.2f}" if ratio is not None else "-") if decode else ()))
    return table


def _decode_cell(r: dict) -> str:
    """Answer tokens/s after a read; the tokens decoded, where fewer than asked (no room left)."""
    if "decode_tokens" not in r:
        return "-"
    tps = f"{r['decode_tok_s']:.1f}" if r.get("decode_tok_s") else "-"
    if r["decode_tokens"] < r["decode_tokens_asked"]:
        tps += f" ({r['decode_tokens']} tok)"
    return tps


def _short(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def niah_table(results: list[dict], model_name: str, task: str, policies: list[str], lengths: list[int],
               depths: list[float], sources: bool = False) -> Table:
    """Accuracy per depth for each policy and length; with `sources`, also the share of the cases whose
    answer's top source (`kvpot ask --sources`' first passage) is the needle, and that share among the
    correct answers (cases run without --sources count in neither)."""
    table = Table(title=f"needle retrieval ({task}), {model_name} (accuracy per depth)")
    table.add_column("policy")
    table.add_column("length", justify="right")
    for d in depths:
        table.add_column(f"{d:g}", justify="right")
    table.add_column("mean", justify="right")
    table.add_column("tok/s", justify="right")
    table.add_column("distill %", justify="right")
    if sources:
        table.add_column("source@1", justify="right")
        table.add_column("source@1 | correct", justify="right")
    multikey = task == "multikey"
    if multikey:
        table.add_column("misses nearer another code", justify="right")
    acc = accuracy_table(results)
    for spec in policies:
        for n in lengths:
            rows = [r for r in results if r["policy"] == spec and r["length"] == n]
            cells = [acc[spec][n].get(d, float("nan")) for d in depths]
            read = sum(r["read_seconds"] for r in rows)
            extra = [_share([r for r in rows if r.get("source_hit") is not None]),
                     _share([r for r in rows if r.get("source_hit") is not None and r["correct"]])] if sources else []
            if multikey:
                extra.append(_nearer_other(rows))
            table.add_row(spec, str(n), *[f"{c:.0%}" for c in cells], f"{sum(cells) / len(cells):.0%}",
                          f"{sum(r['tokens'] for r in rows) / read:.0f}",
                          f"{100 * sum(r['distill_seconds'] for r in rows) / read:.1f}", *extra)
    return table


def _nearer_other(rows: list[dict]) -> str:
    """Of the misses, those whose answer is nearer another needle's code than the asked one (kvpot.bench.niah.
    nearest_code), as "2/3"; "-" where no miss has the field (a JSON written before it)."""
    misses = [r for r in rows if not r["correct"] and "nearer" in r]
    return f"{sum(r['nearer'] == 'distractor' for r in misses)}/{len(misses)}" if misses else "-"


def _share(rows: list[dict]) -> str:
    """Source hits among rows, as "67% (2/3)"; "-" when there are none."""
    if not rows:
        return "-"
    hits = sum(1 for r in rows if r["source_hit"])
    return f"{hits / len(rows):.0%} ({hits}/{len(rows)})"


def ppl_table(results: list[dict], model_name: str, n_tokens: int, file_name: str) -> Table:
    table = Table(title=f"perplexity, {model_name}, {n_tokens} tokens of {file_name}")
    for col in ("policy", "ppl", "tok/s", "vs first", "distill %"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    base = results[0]["tok_s"]
    for r in results:
        table.add_row(r["policy"], f"{r['ppl']:.3f}", f"{r['tok_s']:.1f}", f"{r['tok_s'] / base:.2f}",
                      f"{100 * r['distill_seconds'] / r['seconds']:.1f}")
    return table


def context_table(results: list[dict], model_name: str) -> Table:
    t = Table(title=f"reading, first answer token and reopening: {model_name}")
    for col in ("run", "tokens", "read tok/s", "first token s", "re-read s", "reopen s", "reopen speedup",
                "saved MiB", "peak RSS MiB", "answer"):
        t.add_column(col, justify="left" if col in ("run", "answer") else "right")
    for r in results:
        run = f"kvpot {r['policy']}" if r["mode"] == "kvpot" else "stock llama.cpp"
        if r.get("refused"):
            t.add_row(run, f"{r['tokens']:,}", *["-"] * 7, f"refused: {r['refused']}")
            continue
        answer = (f"{r['answer'][:24]!r} {'ok' if r['correct'] else 'wrong'}" if r["mode"] == "kvpot"
                  else f"first token {r['first_token']!r}")
        t.add_row(run, f"{r['tokens']:,}", f"{r['tok_s']:.0f}", f"{r['first_token_seconds']:.2f}",
                  f"{r['reread_seconds']:.1f}", f"{r['reopen_seconds']:.2f}", f"{r['reopen_speedup']:.0f}x",
                  f"{r['context_bytes'] / 2**20:.1f}", f"{r['peak_rss_mb']:.0f}", answer)
    return t


def accuracy_table(results: list[dict]) -> dict:
    """{policy: {length: {depth: accuracy}}}"""
    acc: dict = {}
    for r in results:
        cell = acc.setdefault(r["policy"], {}).setdefault(r["length"], {}).setdefault(r["depth"], [])
        cell.append(1.0 if r["correct"] else 0.0)
    return {p: {n: {d: sum(v) / len(v) for d, v in sorted(ds.items())} for n, ds in sorted(ns.items())}
            for p, ns in acc.items()}


def heatmap_png(results: list[dict], path) -> None:
    """One panel per policy: accuracy by input length (rows) and needle depth (columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    table = accuracy_table(results)
    policies = list(table)
    fig, axes = plt.subplots(1, len(policies), figsize=(3.2 * len(policies) + 1, 2.8), squeeze=False)
    for ax, pol in zip(axes[0], policies):
        lengths = sorted(table[pol])
        depths = sorted({d for n in lengths for d in table[pol][n]})
        grid = np.array([[table[pol][n].get(d, np.nan) for d in depths] for n in lengths])
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_title(pol, fontsize=8)
        ax.set_xticks(range(len(depths)), [f"{d:.1f}" for d in depths], fontsize=7)
        ax.set_yticks(range(len(lengths)), [f"{n // 1024}K" if n >= 1024 else str(n) for n in lengths], fontsize=7)
        ax.set_xlabel("depth", fontsize=7)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="accuracy")
    from kvpot.safe_write import atomic_write

    with atomic_write(path, "heatmap") as f:  # a file there is replaced only by a whole image
        fig.savefig(f, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)

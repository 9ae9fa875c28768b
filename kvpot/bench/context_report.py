"""The table `kvpot bench context` prints."""

from __future__ import annotations

from rich.table import Table


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

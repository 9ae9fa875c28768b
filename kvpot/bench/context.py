"""`kvpot bench context`: what a user of `kvpot ask` waits for, beside stock llama.cpp in the same run.

For each length: a generated logbook (kvpot.bench.logbook, one code to find) is read by a Session exactly as
`kvpot ask FILE QUESTION --save-context P` reads it, then reopened as `kvpot ask --context P QUESTION`
does. Reported: time to the first answer token after reading, re-read time (model load + reading + first
token) against reopen time (model load + saved context + first token), context file size, peak RSS.
Stock llama.cpp does the same job where the document fits its context: one prefill of the whole text,
the question, the first token; its own sequence state (llama_state_seq_get_data) saved and loaded.
Each case runs in a fresh process (kvpot.bench.worker) so peak RSS is its own; `run_lengths` (the
parent) starts them.
"""

from __future__ import annotations

import time
from pathlib import Path

from kvpot.bench.logbook import logbook
from kvpot.bench.process import peak_rss_mb, run_worker

SEED = 11


def write_document(model, n_tokens: int, out_dir: Path) -> tuple[Path, str, str]:
    """A logbook of about n_tokens (the code sits at depth 0.5); returns (file, question, answer)."""
    sample, _, _ = logbook(n_entries=100, seed=SEED)
    per_entry = len(model.tokenize(sample)) / 100
    text, question, answer = logbook(n_entries=max(2, round(n_tokens / per_entry)), seed=SEED)
    path = out_dir / f"logbook-{n_tokens}.txt"
    path.write_text(text)
    return path, question, answer


def run_lengths(model: str, lengths: list[int], out: Path, threads: int, policy: str | None, budget: int | None,
                stock: bool, say=lambda msg: None) -> list[dict]:
    """For each length (shortest first): kvpot as `ask` reads it, then stock llama.cpp where it fits."""
    pot_opts = (["--policy", policy] if policy else []) + (["--budget", str(budget)] if budget else [])
    results = []
    for n in sorted(lengths):
        common = [model, str(n), "--out", str(out), "--threads", str(threads)]
        say(f"kvpot: reading {n:,} tokens, answering, saving, reopening")
        results.append(run_worker(["kvpot-read-answer-reopen", *common, *pot_opts]))
        if stock:
            say(f"stock llama.cpp: {n:,} tokens in one context")
            results.append(run_worker(["stock-read-answer-reload", *common]))
    return results


def kvpot_read_answer_reopen(model_spec: str, n_tokens: int, out_dir: str, threads: int, policy: str | None = None,
                             budget: int | None = None) -> dict:
    """kvpot: read the logbook as `kvpot ask --save-context` does, answer, save, reopen, answer again: planned and
    reopened through kvpot.api (the settings, the budget `ask` resolves and its checks), as `ask` plans it."""
    from kvpot.api.plan import plan_read, reopen
    from kvpot.models.resolve import resolve_model
    from kvpot.runtime.llama import LlamaModel

    facts, _ = resolve_model(model_spec)
    vocab = LlamaModel(str(facts.path))
    doc, question, code = write_document(vocab, n_tokens, Path(out_dir))
    vocab.close()
    # the question known before reading, the pot answering (as `ask --no-focus`: a focused read would time
    # another session's reading); the budget as `ask` resolves it (auto: full attention where the document fits)
    plan = plan_read([str(doc)], model_spec, question, threads=threads, policy=policy, budget=budget)
    name = plan.model_name

    t0 = time.perf_counter()
    s = plan.open()  # it sets the question first
    s.read(plan.sources)
    t_read = time.perf_counter()
    # saved after reading and before the answer, as `kvpot ask --save-context` saves: the reopened context
    # then answers from the same state (saved after the answer, it would hold the first answer's turn)
    ctx_path = Path(out_dir) / f"logbook-{n_tokens}.kvpotctx"
    size = s.save(ctx_path)
    t_ask = time.perf_counter()
    save_seconds = t_ask - t_read
    pieces = s.ask(question)
    first = next(pieces, "")
    t_first = time.perf_counter()
    answer = first + "".join(pieces)
    rss_read = peak_rss_mb()
    stats = s.stats()
    s.engine.close()

    t1 = time.perf_counter()
    r = reopen(ctx_path, model_spec, threads)
    pieces = r.ask(question)
    first_again = next(pieces, "")
    t_reopen = time.perf_counter()
    answer_again = first_again + "".join(pieces)
    r.engine.close()
    reread = (t_read - t0) + (t_first - t_ask)  # reading and the first answer token, the save left out
    reopen = t_reopen - t1
    return {"mode": "kvpot", "model": name, "policy": s.policy_spec, "length": n_tokens,
            "tokens": stats["document tokens"], "read_seconds": t_read - t0, "tok_s": stats.get("read tok/s"),
            "first_token_seconds": t_first - t_ask, "reread_seconds": reread, "reopen_seconds": reopen,
            "reopen_speedup": reread / reopen, "context_bytes": size, "save_seconds": save_seconds,
            "peak_rss_mb": rss_read, "pot_cells": stats["tokens in pot"], "compactions": stats["compactions"],
            "distill_seconds": s.engine.compact_seconds, "read_only_seconds": s.read_seconds,
            "answer": answer.strip(), "correct": code in answer, "answer_after_reopen": answer_again.strip(),
            "same_answer_after_reopen": answer_again == answer}


def stock_read_answer_reload(model_spec: str, n_tokens: int, out_dir: str, threads: int, chunk: int = 512,
                             **_pot_settings) -> dict:
    """Stock llama.cpp only: the whole document in one context, the first answer token, its own sequence
    state saved and loaded into a fresh context; no kvpot call."""
    from kvpot.bench.stock import prefill, stock_context
    from kvpot.models.resolve import resolve_model
    from kvpot.runtime.llama import LlamaModel

    facts, _ = resolve_model(model_spec)
    vocab = LlamaModel(str(facts.path))
    doc, question, code = write_document(vocab, n_tokens, Path(out_dir))
    doc_tokens = vocab.bos() + vocab.tokenize(doc.read_text())
    q_tokens = vocab.tokenize(f"\nQuestion: {question}\nAnswer:")
    vocab.close()
    n_ctx = len(doc_tokens) + len(q_tokens) + 64
    if facts.n_ctx_train and n_ctx > facts.n_ctx_train:
        return {"mode": "stock", "length": n_tokens, "tokens": len(doc_tokens), "refused":
                f"{len(doc_tokens)} tokens do not fit the model's context of {facts.n_ctx_train}"}
    def first_token(ctx) -> int:
        ctx.decode(q_tokens, len(doc_tokens))
        return int(ctx.logits_last().argmax())

    # like kvpot's figures, both timings include loading the model
    t0 = time.perf_counter()
    model = LlamaModel(str(facts.path))
    ctx = stock_context(model, n_ctx, chunk, threads)
    prefill(ctx, doc_tokens, chunk)
    t_read = time.perf_counter()
    tok = first_token(ctx)
    t_first = time.perf_counter()
    rss_read = peak_rss_mb()
    piece = model.piece(tok).decode("utf-8", "replace")
    ctx.remove_from(len(doc_tokens))  # the saved state holds the document only, as kvpot's does
    state_path = Path(out_dir) / f"logbook-{n_tokens}.stock-state"
    state_path.write_bytes(ctx.seq_state())
    ctx.close()
    model.close()

    t1 = time.perf_counter()
    model = LlamaModel(str(facts.path))
    ctx = stock_context(model, n_ctx, chunk, threads)
    ctx.set_seq_state(state_path.read_bytes())
    tok_again = first_token(ctx)
    t_reopen = time.perf_counter()
    ctx.close()
    model.close()
    return {"mode": "stock", "length": n_tokens, "tokens": len(doc_tokens), "read_seconds": t_read - t0,
            "tok_s": len(doc_tokens) / (t_read - t0), "first_token_seconds": t_first - t_read,
            "reread_seconds": t_first - t0, "reopen_seconds": t_reopen - t1,
            "reopen_speedup": (t_first - t0) / (t_reopen - t1), "context_bytes": state_path.stat().st_size,
            "peak_rss_mb": rss_read, "first_token": piece,
            "same_first_token_after_reopen": tok == tok_again}

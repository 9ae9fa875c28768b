"""`kvpot bench throughput`: how fast the pot ingests generated text, and what memory it holds, beside
stock llama.cpp's prefill of the same text measured in the same run; then, with `decode`, how fast
each side generates answer tokens after its read (a short question, then greedy tokens).

Three sides, each in its own process:
- "upstream": unpatched llama.cpp of the same commit at its defaults (flash attention auto, the model
  file memory-mapped), kvpot.bench.stock_upstream: stock as users run it, the reference every ratio
  (`ratio_vs_upstream`, `rss_vs_upstream`) is taken against;
- "stock": kvpot's patched runtime with no kvpot call (flash attention as the plan says, off unless
  --flash-attn), shown beside it (`ratio_vs_stock`);
- "pot": kvpot reading with its policy.
The result records the unpatched build's identity, the CPU, the command, kvpot's commit and the load
average at the start and the end (the machine a figure came from may be shared).

`run_plan` (the parent) starts one process per case; `kvpot_ingest` and `stock_prefill` are the kvpot
cases (kvpot.bench.worker calls them)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kvpot.bench.process import peak_rss_mb, rss_mb, run_worker
from kvpot.bench.stock_upstream import memory_status
from kvpot.runtime.cpu import describe_host

# asked after each read before the answer tokens are generated (kvpot: through Engine.prompt, as
# `kvpot ask` asks, so a policy's lookup for the question, InfLLM's, is timed with it)
DECODE_QUESTION = "\n\nQuestion: On which day did Hilde take soundings?\nAnswer:"


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
    decode: int = 0  # answer tokens generated after each read (0: no decode measurement)
    upstream: bool = True  # also read with unpatched llama.cpp at its defaults (the ratios' reference)


def run_plan(plan: ThroughputPlan, say=lambda msg: None, done: dict | None = None, on_part=None,
             checkpoints: Path | None = None, save_every: float = 600.0, on_progress=None) -> dict:
    """Stock's prefill, then the pot's read of each length, each in a worker process.

    `done`: a result of this plan written before (stock's part and the lengths in it are kept, not run
    again, but for those measured on another CPU while a read is still to do); `on_part(result)`: called
    with the result so far as each part ends (to write it down).
    `checkpoints`: a folder each read is saved in as it goes (every `save_every` seconds of reading), and
    gone on from when its file is there; `on_progress` hears where a read is at each save."""
    common = (["--chunk", str(plan.chunk), "--threads", str(plan.threads), "--decode", str(plan.decode)]
              + (["--flash-attn"] if plan.flash_attn else []))
    parts = {r["tokens"]: r for r in (done or {}).get("pot", []) if r["tokens"] in plan.pot_tokens}
    stock = (done or {}).get("stock")
    host = describe_host()
    if stock is not None and len(parts) < len(plan.pot_tokens):
        # a ratio compares figures of one CPU: with a read still to do here, what was measured on another
        # CPU (or on one not recorded) is measured again; a read in parts goes on (read_cpus lists them)
        if stock.get("cpu") != host:
            stock = None
        parts = {n: r for n, r in parts.items() if r.get("read_cpus") == [host]}
    meta = (done or {}).get("meta") or run_meta()
    upstream = (done or {}).get("upstream") if stock is not None else None
    if plan.upstream and upstream is None:
        upstream = measure_upstream(plan, say) | {"cpu": host}
        if on_progress:  # said as it ends: the results file is written once kvpot's stock part is there too
            on_progress(f"unpatched llama.cpp at its defaults: {upstream['tokens']} tokens at {upstream['tok_s']:.1f} "
                        f"tok/s, peak RSS {upstream['peak_rss_mb']:.0f} MiB")
    if stock is None:
        say(f"kvpot's runtime with no pot: prefill of {plan.stock_tokens} tokens")
        stock = run_worker(["stock-prefill", plan.model, str(plan.stock_tokens), *common]) | {"cpu": host}

    def result() -> dict:  # every part done, the ones kept from `done` included, in the plan's order
        out = {"plan": asdict(plan), "meta": meta | {"loadavg_end": _loadavg()}, "stock": stock,
               "pot": [parts[n] for n in plan.pot_tokens if n in parts]}
        if upstream is not None:
            out["upstream"] = upstream
            upstream_ratios(upstream, [stock, *out["pot"]])
        return out

    if on_part:
        on_part(result())
    for n in plan.pot_tokens:
        if n in parts:
            continue
        say(f"{plan.policy} at {plan.budget} cells over {n} tokens")
        saving = []
        if checkpoints is not None:
            saving = ["--checkpoint", str(read_checkpoint_path(checkpoints, plan, n)), "--save-every", str(save_every)]
        r = run_worker(["kvpot-ingest", plan.model, str(n), "--policy", plan.policy, "--budget", str(plan.budget),
                        *common, *saving], on_progress=on_progress)
        r["ratio_vs_stock"] = r["tok_s"] / stock["tok_s"]
        parts[n] = r
        if on_part:
            on_part(result())
        if saving:  # the read's figures are kept: its save has done its job
            from kvpot.bench.read_checkpoint import drop

            drop(read_checkpoint_path(checkpoints, plan, n))
    done_result = result()
    for r in done_result["pot"]:  # against the stock part kept beside it (a kept read's may be measured again)
        r["ratio_vs_stock"] = r["tok_s"] / stock["tok_s"]
    decode_ratios(stock, done_result["pot"])
    return done_result


def measure_upstream(plan: ThroughputPlan, say=lambda msg: None) -> dict:
    """Unpatched llama.cpp at its defaults reading the stock part's tokens, in its own process (built first
    where the cache has no build for this machine: several minutes)."""
    from kvpot.bench.stock_upstream import DEFAULT_QUESTION, measure
    from kvpot.build.upstream import build_upstream

    build = build_upstream(say=say)
    say(f"unpatched llama.cpp at its defaults: prefill of {plan.stock_tokens} tokens")
    # room for the document, the question and its answer (as stock_prefill sizes kvpot's stock context)
    n_ctx = plan.stock_tokens + 16 + (64 + plan.decode if plan.decode else 0)
    return measure(build, plan.model, generated=plan.stock_tokens, n_ctx=n_ctx, chunk=plan.chunk,
                   threads=plan.threads, decode=plan.decode, question=DEFAULT_QUESTION)


def upstream_ratios(upstream: dict, cases: list[dict]) -> None:
    """Each case's tokens/s and peak RSS over unpatched llama.cpp's at its defaults (and its decode tok/s
    over upstream's, where both decoded)."""
    for r in cases:
        r["ratio_vs_upstream"] = r["tok_s"] / upstream["tok_s"]
        if r.get("peak_rss_mb") and upstream.get("peak_rss_mb"):
            r["rss_vs_upstream"] = r["peak_rss_mb"] / upstream["peak_rss_mb"]
        if r.get("decode_tok_s") and upstream.get("decode_tok_s"):
            r["decode_ratio_vs_upstream"] = r["decode_tok_s"] / upstream["decode_tok_s"]


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in __import__("os").getloadavg()]
    except (OSError, AttributeError):
        return None


def run_meta() -> dict:
    """What a result file records of the run: the command, kvpot's commit, the CPU, the load average at the
    start (`loadavg_end` is added as each part ends) and that the machine may be shared."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"command": " ".join(["kvpot" if Path(sys.argv[0]).name == "kvpot" else sys.argv[0], *sys.argv[1:]]),
            "commit": commit, "tree_dirty": dirty, "cpu": describe_host(), "loadavg_start": _loadavg(),
            "machine": "a 2-core machine shared with other jobs unless a run says otherwise: see the load average"}


def read_checkpoint_path(folder: Path, plan: ThroughputPlan, n_tokens: int) -> Path:
    """Where the read of `n_tokens` under `plan` is saved as it goes: one file per read, named by what it
    reads with (so a read goes on only from its own save)."""
    import hashlib
    import json

    what = asdict(plan) | {"pot_tokens": None, "stock_tokens": None, "tokens": n_tokens}
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"read-{digest}.kvstate"


def decode_ratios(stock: dict, cases: list[dict]) -> None:
    """Each case's decode tok/s over the shortest input's (`--tokens 2048 --tokens 32768`: decode after
    32K against after 2K) and over stock's; None where a side decoded nothing."""
    timed = [r for r in cases if r.get("decode_tok_s")]
    if not timed:
        return
    base = min(timed, key=lambda r: r["tokens"])
    for r in cases:
        tps = r.get("decode_tok_s")
        r["decode_ratio_vs_shortest"] = tps / base["decode_tok_s"] if tps else None
        r["decode_shortest_tokens"] = base["tokens"]
        r["decode_ratio_vs_stock"] = tps / stock["decode_tok_s"] if tps and stock.get("decode_tok_s") else None


class _NoEnd:
    """Greedy, except that an end-of-generation token is never chosen (the next most likely is): every
    read times the same number of answer tokens, also where the model would end its answer at once.
    Counts how often it stepped in and at which answer token first."""

    def __init__(self, model):
        self.model, self.masked, self.first = model, 0, None

    def pick(self, logits, chosen: list[int]) -> int:
        import numpy as np

        while True:
            tok = int(np.argmax(logits))
            if not self.model.is_eog(tok):
                return tok
            self.masked += 1
            self.first = len(chosen) if self.first is None else self.first
            logits[tok] = -np.inf


def _decode_result(asked: int, question_tokens: int, question_seconds: float, decoded: int, seconds: float,
                   stop: str, text: str, greedy: _NoEnd) -> dict:
    """The decode figures of one side: `decoded` tokens went through a one-token decode in `seconds`
    (the question before them is timed apart); fewer than asked only when `stop` came first (the room
    left in the context). `decode_eog`: the greedy choice was an end-of-generation token, the answer
    would have ended at answer token `decode_eog_first`; the next most likely token was taken instead."""
    return {"decode_tokens_asked": asked, "decode_tokens": decoded, "decode_seconds": seconds,
            "decode_tok_s": decoded / seconds if decoded and seconds > 0 else None,
            "decode_stop": stop, "decode_eog": greedy.masked > 0, "decode_eog_masked": greedy.masked,
            "decode_eog_first": greedy.first, "decode_question_tokens": question_tokens,
            "decode_question_seconds": question_seconds, "decode_text": text}


def stock_prefill(model_path: str, n_tokens: int, chunk: int, threads: int, flash_attn: bool,
                  decode: int = 0) -> dict:
    """Stock llama.cpp: the whole input in one context, prefilled in n_batch pieces; no kvpot call at all.
    With `decode`: then the question and `decode` greedy tokens, one llama_decode each."""
    from kvpot.bench.logbook import generated_tokens
    from kvpot.bench.stock import prefill, stock_context
    from kvpot.runtime.llama import LlamaModel

    # loaded as llama.cpp loads it: the file's pages of copied weights stay resident beside their copies
    model = LlamaModel(model_path, release_copied=False, release_while_loading=False)
    bos = model.bos()  # some models (SmolLM2) add none
    tokens = bos + generated_tokens(model, n_tokens - len(bos))
    question = model.tokenize(DECODE_QUESTION) if decode else []
    ctx = stock_context(model, n_tokens + 16 + (len(question) + decode if decode else 0), chunk, threads, flash_attn)
    t0 = time.perf_counter()
    prefill(ctx, tokens, chunk)
    dt = time.perf_counter() - t0
    res = {"mode": "stock", "tokens": len(tokens), "seconds": dt, "tok_s": len(tokens) / dt,
           "peak_rss_mb": peak_rss_mb(), "kv_bytes": None, "compactions": 0, "flash_attn": flash_attn,
           **_end_of_read(memory_status())}
    if decode:
        res |= _stock_decode(model, ctx, question, len(tokens), decode, chunk)
    return res


def _end_of_read(mem: dict) -> dict:
    """Resident memory at the end of the read, all of it and its anonymous (not file-backed) part: the
    mapped weights a process keeps resident are file pages, which kvpot gives back and stock keeps."""
    return {f"end_{k}": mem[k] for k in ("rss_mb", "rss_anon_mb", "rss_file_mb") if k in mem}


def _stock_decode(model, ctx, question: list[int], pos: int, n: int, chunk: int) -> dict:
    """The question, then n greedy tokens each decoded alone (as Engine.generate decodes them)."""
    from kvpot.bench.stock import prefill

    t0 = time.perf_counter()
    prefill(ctx, question, chunk, start=pos)
    logits = ctx.logits_last()
    tq = time.perf_counter() - t0
    pos += len(question)
    greedy, out, chosen = _NoEnd(model), b"", []
    t0 = time.perf_counter()
    for _ in range(n):
        tok = greedy.pick(logits, chosen)
        chosen.append(tok)
        out += model.piece(tok)
        ctx.decode([tok], pos, logits="last")
        pos += 1
        logits = ctx.logits_last()
    td = time.perf_counter() - t0
    return _decode_result(n, len(question), tq, len(chosen), td, f"the {n}-token limit", out.decode("utf-8", "replace"),
                          greedy)


def kvpot_ingest(model_path: str, n_tokens: int, policy: str, budget: int, chunk: int, threads: int,
                 flash_attn: bool, decode: int = 0, checkpoint: str | None = None, save_every: float = 600.0,
                 say=lambda msg: None) -> dict:
    """The pot reading the same generated text under `policy` at `budget` cells; with `decode`, then
    the question and `decode` greedy answer tokens through the engine's answer path (Engine.prompt,
    Engine.generate: what `kvpot ask` runs, the policy's work while answering included). The engine is planned and
    opened through kvpot.api.engine_plan: the budget, chunk and threads exactly as given, no session around it.

    `checkpoint`: a file the read is saved to every `save_every` seconds and goes on from when it is
    there (kvpot.bench.read_checkpoint); `say` hears where the read is at each save."""
    from kvpot.api.engine_plan import DEFAULT_ANSWER_RESERVE, beside_the_pot, plan_engine
    from kvpot.bench.read_checkpoint import timed_read

    # room for the question, the answer and the next turn's start (the default reserve holds 32 tokens)
    reserve = max(DEFAULT_ANSWER_RESERVE, decode + 192)
    eng = plan_engine(model_path, policy, budget, chunk, threads, flash_attn=flash_attn, answer_reserve=reserve).open()
    # what a saved part must have been read with to be gone on from
    key = {"model": model_path, "model_bytes": Path(model_path).stat().st_size, "policy": policy, "budget": budget,
           "chunk": chunk, "threads": threads, "flash_attn": flash_attn, "tokens": n_tokens, "decode": decode}
    with eng:  # closing deletes what the policy kept on disk (InfLLM's block store)
        # The input is generated and tokenized a part at a time as the engine reads it (the same tokens
        # stock_prefill reads whole), so the peak is the reading's, not a list that grows with the input
        # (a 1M-token one is ~40 MiB)
        read = timed_read(eng, n_tokens, key, Path(checkpoint) if checkpoint else None, save_every, say)
        st = eng.stats()
        disk_bytes, block_cache = beside_the_pot(eng)
        res = {"mode": "pot", "policy": policy, "budget": budget, "tokens": eng.tokens_seen, "seconds": read.seconds,
               "tok_s": eng.tokens_seen / read.seconds, "peak_rss_mb": read.peak_rss_mb,
               "rss_start_mb": read.rss_start_mb, "rss_end_mb": rss_mb(), "kv_bytes": read.kv_bytes,
               "kv_bytes_allocated": st.bytes_total, "disk_bytes": disk_bytes, "block_cache": block_cache,
               "compactions": st.n_compactions, "compact_seconds": eng.compact_seconds, "flash_attn": flash_attn,
               "read_parts": read.parts, "read_saves": read.saves, "read_cpus": read.cpus,
               **_end_of_read(memory_status())}
        if decode:  # after the read's figures, so they are the read's alone
            res |= _pot_decode(eng, decode)
        return res


def _pot_decode(eng, n: int) -> dict:
    question = eng.model.tokenize(DECODE_QUESTION)
    t0 = time.perf_counter()
    logits = eng.prompt(question)
    tq = time.perf_counter() - t0
    seen, greedy = eng.tokens_seen, _NoEnd(eng.model)
    t0 = time.perf_counter()
    text = "".join(eng.generate(logits, n, greedy.pick))
    td = time.perf_counter() - t0
    # every token generate decodes is booked in tokens_seen
    return _decode_result(n, len(question), tq, eng.tokens_seen - seen, td, eng.stop_reason, text, greedy)

"""`kvpot serve` over one long document with several clients asking at once (issue 93's goal: the `openai`
client's streamed chat over a 128K-token document, 4 clients at once, peak RSS at the budget's plan, each answer
right and as `kvpot ask` gives it).

One joined input of the question set (kvpot.bench.qa_inputs, no multi-key needles) is served with `kvpot serve
--document` (`--budget` as given, auto by default; the default locator, bm25). Once it is read, one client asks
alone, then `--clients` threads each send one answerable question of that input at the same moment, streamed
through the real `openai` client. The server's peak RSS (VmHWM, /proc) is taken for the read and, reset after
each, for the one client's answer and for all the clients' answers together.

Beside it, the memory the planner counts (`_planned`), on top of a Python process holding the server's modules
and the llama.cpp library but no model (measured in the run). After the server stops, each question is asked
again with `kvpot ask --context` on the context the server saved (the same read): with the server's locator
(the answers must be equal) and at ask's own default. Answers are scored strictly (kvpot.bench.qa_score.strict).

    python -m studies.serve_clients -m qwen2.5-coder-0.5b --length 131072 --clients 4 --budget 2048 \\
        --json docs/bench/serve/serve-4-clients-0.5b-128k.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from kvpot.bench.process import reset_peak_rss
from kvpot.bench.qa_inputs import build_inputs
from kvpot.bench.qa_questions import load_set
from kvpot.bench.qa_score import question_facts, strict
from kvpot.runtime.cpu import describe_host
from kvpot.safe_write import write_text_file
from studies.answer_taps_speed import commit

KVPOT = [sys.executable, "-c", "from kvpot.cli.main import main; main()"]
MIB = 1 << 20


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies.serve_clients", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default="qwen2.5-coder-0.5b", help="a known model name or a .gguf path")
    p.add_argument("--length", type=int, default=131072, help="tokens of the joined input")
    p.add_argument("--clients", type=int, default=4, help="clients asking at once, one question each")
    p.add_argument("--budget", default="auto", help="the server's --budget (auto: the largest pot the device holds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--keep", action="store_true", help="keep the document, the server's log and its saved context")
    p.add_argument("--json", type=Path, default=None, help="write the figures and the answers here")
    return p


@contextmanager
def _workdir(keep: bool):
    if keep:
        yield tempfile.mkdtemp(prefix="kvpot-serve-clients-")
    else:
        with tempfile.TemporaryDirectory(prefix="kvpot-serve-clients-") as tmp:
            yield tmp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid`, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0]) * 1024
    return out


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"kvpot serve exited {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(2)
    raise SystemExit(f"kvpot serve did not finish reading in {timeout:.0f} s")


def _ask_streamed(client, model: str, question: str, start: threading.Barrier, out: dict) -> None:
    start.wait()
    t0 = time.perf_counter()
    pieces: list[str] = []
    first = None
    finish = None
    stream = client.chat.completions.create(model=model, stream=True, temperature=0,
                                            messages=[{"role": "user", "content": question}])
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta.content or ""
        if delta and first is None:
            first = time.perf_counter() - t0
        pieces.append(delta)
        finish = chunk.choices[0].finish_reason or finish
    out.update(answer="".join(pieces).strip(), seconds=round(time.perf_counter() - t0, 1),
               first_piece_seconds=round(first, 1) if first is not None else None, finish_reason=finish)


BASELINE = """
import kvpot.cli.main, kvpot.serve.app, kvpot.serve.backend, uvicorn, starlette
from kvpot.runtime.library import load
load()
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print(int(line.split()[1]) * 1024)
"""


def _baseline_bytes() -> int:
    """Peak RSS of a Python process holding what the server holds before any model: the interpreter, kvpot's
    CLI and server modules, the ASGI stack and the llama.cpp library. The plan's figures (weights and the
    context's buffers) are on top of it."""
    out = subprocess.run([sys.executable, "-c", BASELINE], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def _planned(facts, context: Path, focused_tokens: int) -> dict:
    """The memory the planner counts: the model file (mapped) and the larger of two contexts' needs, the saved
    pot's (its cells) and the largest focused read's (its passages' tokens and the session's reserve for the
    question, the answer and a turn, kvpot.session.checks.answer_reserve), with the pot's state beside the
    latter: the pot's session is suspended while a focused read runs, its model and context freed and its
    state (the saved context's size) held in memory to resume from. Flash attention as the reads had it: the
    pot's as saved; the focused read's `auto`, off where the device holds its cells without it (this machine)."""
    from kvpot.session.checks import MIN_TURN_ROOM, QUESTION_ROOM, memory_need
    from kvpot.session.context_file import read_context

    header = read_context(context, seq_in_file=True).header
    settings = header["settings"]
    pot = memory_need(facts, header["n_ctx"], min(settings["chunk"], header["n_ctx"]),
                      flash_attn=settings.get("flash_attn") == "on").total
    focus_cells = focused_tokens + settings["max_tokens"] + MIN_TURN_ROOM + QUESTION_ROOM
    focus = memory_need(facts, focus_cells, min(settings["chunk"], focus_cells)).total
    state = context.stat().st_size
    model_bytes = facts.path.stat().st_size
    return {"n_ctx": header["n_ctx"], "budget": settings.get("budget"), "policy": header.get("policy"),
            "model_file_mib": round(model_bytes / MIB, 1), "pot_context_need_mib": round(pot / MIB, 1),
            "focused_cells": focus_cells, "focused_context_need_mib": round(focus / MIB, 1),
            "pot_state_mib": round(state / MIB, 1),
            "planned_mib": round((model_bytes + max(pot, focus + state)) / MIB, 1)}


def one_input(model_path: Path, length: int, seed: int, questions: int, tag: str):
    """One joined input of the question set (no multi-key needles) sized by the model's tokenizer, and a seeded
    sample of `questions` of its answerable questions: (the input, its asks, the set's questions by id)."""
    from kvpot.runtime.llama import LlamaModel

    qs = [q for q in load_set().questions if q.passage and q.answer]
    by_id = {q.id: q for q in qs}
    vocab = LlamaModel(str(model_path))
    try:
        inputs = build_inputs(qs, lambda t: len(vocab.tokenize(t)), length, seed, multikey=False)
    finally:
        vocab.close()
    joined = random.Random(f"{tag}-{seed}").choice(inputs)
    asks = [a for a in joined.asks if a.id in by_id]
    return joined, random.Random(f"{tag}-asks-{seed}").sample(asks, min(questions, len(asks))), by_id


def _ask(context: Path, question: str, threads: int, env: dict, *opts: str) -> dict:
    """`kvpot ask --context` on the server's saved context: the answer and where its focused read went."""
    ref = subprocess.run([*KVPOT, "ask", "--context", str(context), question, "--json", "-q", "-t", str(threads), *opts],
                         capture_output=True, text=True, env=env)
    if ref.returncode != 0:
        raise SystemExit(f"kvpot ask --context failed: {ref.stderr[-2000:]}")
    got = json.loads(ref.stdout.strip().splitlines()[-1])
    focus = got.get("focus") or {}
    return {"answer": got["answer"].strip(), "focus": {"tokens_read": focus.get("tokens_read"),
                                                      "passages": len(focus.get("passages") or [])}}


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    import openai

    from kvpot.models.resolve import resolve_model

    facts, known = resolve_model(ns.model)
    name = known.name if known else facts.name
    joined, asks, by_id = one_input(facts.path, ns.length, ns.seed, ns.clients, "serve-clients")
    out: dict = {"command": "python -m studies.serve_clients " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "commit": commit(), "cpu": describe_host(), "model": name, "length": ns.length,
                 "input": joined.index, "clients": len(asks)}
    with _workdir(ns.keep) as tmp:
        home, doc, log = Path(tmp) / "home", Path(tmp) / f"qa-{ns.length}-{joined.index}.txt", Path(tmp) / "serve.log"
        doc.write_text(joined.text, encoding="utf-8")
        home.mkdir()
        env = dict(os.environ, KVPOT_HOME=str(home), KVPOT_PROGRESS_EVERY="30")
        env.pop("KVPOT_API_KEY", None)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        t0 = time.perf_counter()
        with open(log, "w") as f:
            proc = subprocess.Popen([*KVPOT, "serve", "--port", str(port), "-d", f"doc={doc}", "-m", str(facts.path),
                                     "-t", str(ns.threads), "--budget", ns.budget], stdout=subprocess.DEVNULL, stderr=f, env=env)
        try:
            _wait_healthy(proc, url, log, timeout=6 * 3600)
            out["read_seconds"] = round(time.perf_counter() - t0, 1)
            after_read = _status(proc.pid)
            out["read_peak_rss_mib"] = round(after_read["VmHWM"] / MIB, 1)
            out["peak_reset"] = reset_peak_rss(proc.pid)
            # one client alone first, its peak beside the peak of all of them at once: memory is the budget's,
            # not the number of requests
            alone: dict = {}
            _ask_streamed(openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600), "kvpot:doc",
                          asks[0].question, threading.Barrier(1), alone)
            out["one_client_peak_rss_mib"] = round(_status(proc.pid)["VmHWM"] / MIB, 1)
            out["one_client"] = alone
            reset_peak_rss(proc.pid)
            clients = [openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
                       for _ in asks]
            results: list[dict] = [{} for _ in asks]
            barrier = threading.Barrier(len(asks))
            threads = [threading.Thread(target=_ask_streamed, args=(c, "kvpot:doc", a.question, barrier, r))
                       for c, a, r in zip(clients, asks, results)]
            t1 = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            out["answer_wall_seconds"] = round(time.perf_counter() - t1, 1)
            out["answer_peak_rss_mib"] = round(_status(proc.pid)["VmHWM"] / MIB, 1)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        served_log = log.read_text(errors="replace")
        out["server_log_focus"] = [ln for ln in served_log.splitlines() if "focused read" in ln or "pot answers" in ln]
        contexts = sorted((home / "serve").glob("*.kvctx"))
        if len(contexts) != 1:
            raise SystemExit(f"expected one saved context under {home / 'serve'}, found {len(contexts)}")
        focused = [int(m.group(1).replace(",", "")) for m in re.finditer(r"focused read of \d+ passages \(([\d,]+) tokens\)", served_log)]
        out["plan"] = _planned(facts, contexts[0], max(focused, default=0))
        cases = []
        for a, r in zip(asks, results):
            q = by_id[a.id]
            # ask with the server's locator (the same path: the answers must be equal), and at ask's own default
            # (locating by the pot's answer to the question)
            same = _ask(contexts[0], a.question, ns.threads, env, "--locator", "bm25")
            default = _ask(contexts[0], a.question, ns.threads, env)
            score = lambda text: strict(text or "", list(a.refs), a.question, **question_facts(q))  # noqa: E731
            cases.append({"id": a.id, "kind": q.kind, "question": a.question, "refs": list(a.refs),
                          "served": r.get("answer"), "correct": score(r.get("answer")),
                          "ask_bm25": same["answer"], "same_as_ask": r.get("answer") == same["answer"],
                          "ask_bm25_focus": same["focus"],
                          "ask_default": default["answer"], "ask_default_correct": score(default["answer"]),
                          "ask_default_focus": default["focus"],
                          "seconds": r.get("seconds"), "first_piece_seconds": r.get("first_piece_seconds"),
                          "finish_reason": r.get("finish_reason")})
            print(json.dumps({k: cases[-1][k] for k in ("id", "correct", "same_as_ask", "ask_default_correct",
                                                        "seconds")}), file=sys.stderr)
    out["cases"] = cases
    out["right"] = sum(c["correct"] for c in cases)
    out["ask_default_right"] = sum(c["ask_default_correct"] for c in cases)
    out["same_as_ask"] = sum(c["same_as_ask"] for c in cases)
    out["process_baseline_mib"] = round(_baseline_bytes() / MIB, 1)
    out["planned_with_baseline_mib"] = round(out["plan"]["planned_mib"] + out["process_baseline_mib"], 1)
    out["within_plan"] = max(out["read_peak_rss_mib"], out["answer_peak_rss_mib"]) <= out["planned_with_baseline_mib"]
    print(json.dumps({k: out[k] for k in ("clients", "right", "same_as_ask", "ask_default_right", "read_seconds", "answer_wall_seconds",
                                          "read_peak_rss_mib", "one_client_peak_rss_mib", "answer_peak_rss_mib", "plan", "process_baseline_mib",
                                          "planned_with_baseline_mib", "within_plan")}))
    if ns.json is not None:
        write_text_file(ns.json, json.dumps(out, indent=1) + "\n", "benchmark JSON")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What tracking an answer's sources costs its decoding: one session reads a document with full attention, then
answers the same question again and again (the conversation reset between), its end-of-generation token
passed over so every answer is as long; in turn without tracking, with tracking (Engine.track_answer_attention:
the runtime sums each answer row's attention per cell, read back once per answer), and with the sums read back
after every token (what the tracking cost when each row was read back and mapped to stream positions on its
own). The decode rate of each, and each one's ratio to the answer without tracking measured beside it.

    python -m studies.answer_taps_speed -m qwen2.5-coder-0.5b --tokens 8000 --answer 200 --repeats 3 \\
        --json docs/bench/sources/answer-taps-speed-0.5b-8k.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kvpot.runtime.cpu import describe_host
from kvpot.safe_write import write_text_file

DOCUMENT = "/usr/share/common-licenses/GPL-3"
QUESTION = "Explain, section by section, what this document says."
ARMS = ("off", "on", "per-token")  # --arms picks some


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies.answer_taps_speed", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default="qwen2.5-coder-0.5b", help="a known model name or a .gguf path")
    p.add_argument("--document", default=DOCUMENT, help="the text read (repeated until it holds --tokens tokens)")
    p.add_argument("--tokens", type=int, default=8000, help="tokens of the document read")
    p.add_argument("--answer", type=int, default=200, help="answer tokens decoded per run")
    p.add_argument("--repeats", type=int, default=3, help="rounds of the three arms, alternating")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="which ways to answer (off first)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    return p


class _NoEnd:
    """Greedy, passing over end-of-generation, so every answer decodes the same number of tokens."""

    def __init__(self, model):
        self.model = model

    def pick(self, logits: np.ndarray, chosen: list[int]) -> int:
        for tok in np.argsort(logits)[::-1][:8].tolist():
            if not self.model.is_eog(tok):
                return int(tok)
        return int(np.argmax(logits))


def _document(path: str, n_tokens: int, tokenize) -> str:
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    while len(tokenize(text)) < n_tokens:
        text += "\n\n" + text
    lo, hi = 0, len(text)
    while lo < hi:  # the longest prefix within n_tokens
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(tokenize(text[:mid])) <= n_tokens else (lo, mid - 1)
    return text[:lo]


def _one(session, arm: str, answer: int, pick: _NoEnd) -> dict:
    eng = session.engine
    session.reset_conversation()
    eng.track_answer_attention(arm != "off")
    first = None
    n = 0
    for _ in session.ask(QUESTION, max_tokens=answer + 1, sampler=pick):
        if first is None:
            first = time.perf_counter()  # the prompt is decoded: from here on, answer tokens only
        elif arm == "per-token":
            _ = eng.answer_mass
        n += 1
    seconds = time.perf_counter() - first
    decoded = eng.answer_tokens - 1  # the first token came from the prompt's logits
    positions = len(eng.answer_mass or {})
    eng.track_answer_attention(False)
    return {"arm": arm, "decoded": decoded, "seconds": round(seconds, 4), "tok_s": round(decoded / seconds, 3),
            "positions_tracked": positions, "pieces": n}


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    from kvpot.ingest import collect_sources
    from kvpot.models.resolve import resolve_model
    from kvpot.session.reading_plan import plan_reading
    from kvpot.session.session import Session, answer_reserve
    from kvpot.session.settings import resolve_settings

    facts, known = resolve_model(ns.model)
    name = known.name if known else facts.name
    cli = {"threads": ns.threads, "policy": "full", "max_tokens": ns.answer + 1}
    settings = resolve_settings(name if known else None, known.defaults if known else {}, cli)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kvpot-taps-") as tmp:
        from kvpot.runtime.llama import LlamaModel

        vocab = LlamaModel(str(facts.path))
        try:
            text = _document(ns.document, ns.tokens, lambda t: vocab.tokenize(t))
        finally:
            vocab.close()
        path = Path(tmp) / "document.txt"
        path.write_text(text, encoding="utf-8")
        sources = collect_sources([str(path)])
        settings = plan_reading(settings, facts, sources, True, answer_reserve(settings)).settings
        with Session(facts, name, settings, resettable=True) as s:
            s.read(collect_sources([str(path)]))
            pick = _NoEnd(s.engine.model)
            _one(s, "off", 16, pick)  # warm up
            for r in range(ns.repeats):
                order = ns.arms if r % 2 == 0 else ns.arms[::-1]
                for arm in order:
                    got = _one(s, arm, ns.answer, pick) | {"round": r}
                    runs.append(got)
                    print(json.dumps(got), file=sys.stderr, flush=True)
            doc_tokens = s.doc_tokens
    rate = {arm: statistics.median(x["tok_s"] for x in runs if x["arm"] == arm) for arm in ns.arms}
    ratio = {arm: [round(b["tok_s"] / a["tok_s"], 4) for a, b in zip([x for x in runs if x["arm"] == "off"],
                                                                       [x for x in runs if x["arm"] == arm])]
             for arm in ns.arms if arm != "off"}
    out = {"command": "python -m studies.answer_taps_speed " + " ".join(argv if argv is not None else sys.argv[1:]),
           "commit": commit(), "cpu": describe_host(), "model": name, "document_tokens": doc_tokens,
           "answer_tokens": ns.answer, "repeats": ns.repeats, "threads": ns.threads,
           "median_tok_s": rate, "ratio_to_off_per_round": ratio,
           "median_ratio_to_off": {arm: round(statistics.median(v), 4) for arm, v in ratio.items()}, "runs": runs}
    print(json.dumps({k: out[k] for k in ("median_tok_s", "ratio_to_off_per_round", "median_ratio_to_off")}))
    if ns.json is not None:
        write_text_file(ns.json, json.dumps(out, indent=1) + "\n", "benchmark JSON")
    return 0


def commit() -> str:
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "kvpot", "ggml_ext", "patches"], capture_output=True,
                           text=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    return run.stdout.strip() + ("+changes" if dirty else "")


if __name__ == "__main__":
    sys.exit(main())

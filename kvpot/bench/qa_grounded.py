"""Answers grounded in the input: the question set's inputs that hold a question whose answer the input does
not hold (kind "absent"), each read once with full attention as `kvpot bench qa -P full` reads it (the same
joined inputs, settings and strict scoring), and every question of it asked twice on that one reading (the
conversation reset between): once with the prompt format's instruction to answer from the document
(kvpot.session.prompting.GROUNDING) and once without it. The two arms differ only in the tokens after the
document, so each question's pair of answers is a paired comparison. Every question is asked closed book
too (a one-line document, as bench qa's `-P none`), both ways.

    python -m kvpot.bench.qa_grounded -m qwen2.5-coder-1.5b --length 8192 --inputs 14 \\
        --json docs/bench/qa/grounded-1.5b-8k.json

The inputs are the ones holding an absent question, in a seeded order (--inputs N: the first N of it); the
JSON is rewritten after each input and `--resume` goes on after the inputs it holds. `--rescore` judges the
answers a JSON holds again with the current scorer (kvpot.bench.qa_score), as `kvpot bench qa-rescore` does
for bench qa's files, and records the commit that did.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from kvpot.bench.qa import MAX_TOKENS, NO_DOCUMENT, Plan, _scored, _settings, questions_for
from kvpot.bench.qa_inputs import build_inputs
from kvpot.bench.qa_questions import load_set
from kvpot.bench.qa_report import wilson
from kvpot.bench.qa_score import declines, question_facts
from kvpot.session.prompting import GROUNDING, CompletionFormat, choose_format, question_frame

ARMS = {"plain": "", "grounded": GROUNDING}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvpot.bench.qa_grounded", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default="qwen2.5-coder-1.5b", help="a known model name or a .gguf path")
    p.add_argument("--length", type=int, default=8192, help="tokens of each joined input")
    p.add_argument("--inputs", type=int, default=None, help="the first N inputs of the seeded order (all without it)")
    p.add_argument("--seed", type=int, default=0, help="draws the inputs, as bench qa's --seed")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write the cases and the figures here")
    p.add_argument("--resume", action="store_true", help="keep the inputs --json holds, read only the others")
    p.add_argument("--rescore", action="store_true", help="judge the answers --json holds again; read nothing")
    return p


def arm_format(model, choice: str, grounding: str):
    """The format `kvpot ask` chooses for `model`, with `grounding` before each question (a base model's
    completion format too, which gets none by default)."""
    fmt = choose_format(model, choice, grounding)
    return CompletionFormat(grounding) if fmt.name == "completion" else fmt


def answerable(c: dict) -> bool:
    return c["task"] == "qa" and c["kind"] != "absent"


def summary(cases: list[dict]) -> dict:
    """Per arm: right / n with the 95 % Wilson interval for the absent questions, the answerable ones (the
    set's other kinds), multi-key and closed book; held-out apart; and the answerable questions whose
    verdict the instruction turned (paired)."""
    def share(sel: list[dict], key: str = "correct") -> dict:
        k = sum(bool(c[key]) for c in sel)
        return {"right": k, "n": len(sel), "share": round(k / len(sel), 4) if sel else None,
                "interval_95": [round(x, 4) for x in wilson(k, len(sel))]}

    out: dict = {}
    for arm in ARMS:
        mine = [c for c in cases if c["arm"] == arm]
        groups = {"absent": [c for c in mine if c["kind"] == "absent"], "answerable": [c for c in mine if answerable(c)],
                  "multikey": [c for c in mine if c["task"] == "multikey"]}
        out[arm] = {g: share(sel) | {"held_out": share([c for c in sel if c["heldout"]]),
                                     "not_held_out": share([c for c in sel if not c["heldout"]])}
                    for g, sel in groups.items()}
        for g in ("absent", "answerable"):
            closed = [c for c in groups[g] if "closed_book_correct" in c]
            out[arm][g]["closed_book"] = share(closed, "closed_book_correct")
        out[arm]["absent"]["declines"] = sum(c["declines"] for c in groups["absent"])
    by = {(c["input"], c["id"]): {} for c in cases}
    for c in cases:
        by[(c["input"], c["id"])][c["arm"]] = c
    pairs = [p for p in by.values() if len(p) == 2 and answerable(p["plain"])]
    out["answerable_paired"] = {"n": len(pairs),
                                "lost": sorted(p["plain"]["id"] for p in pairs if p["plain"]["correct"] and not p["grounded"]["correct"]),
                                "gained": sorted(p["plain"]["id"] for p in pairs if p["grounded"]["correct"] and not p["plain"]["correct"])}
    return out


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    from kvpot.bench.throughput import run_meta
    from kvpot.models.resolve import resolve_model
    from kvpot.runtime.llama import LlamaModel
    from kvpot.safe_write import write_text_file

    command = "python -m kvpot.bench.qa_grounded " + " ".join(argv if argv is not None else sys.argv[1:])
    if ns.rescore:
        if ns.json is None or not ns.json.exists():
            raise SystemExit("--rescore needs --json FILE, a file this benchmark wrote")
        rescore(ns.json, command)
        return 0
    meta = run_meta() | {"command": command}
    facts, known = resolve_model(ns.model)
    name = known.name if known else facts.name
    questions = load_set().questions
    plan = Plan(model=ns.model, policies=["full"], lengths=[ns.length], seed=ns.seed, threads=ns.threads)
    vocab = LlamaModel(str(facts.path))
    try:
        inputs = build_inputs(questions_for(questions, ns.length, plan), lambda t: len(vocab.tokenize(t)),
                              ns.length, ns.seed)
    finally:
        vocab.close()
    inputs = [j for j in inputs if any(a.kind == "absent" for a in j.asks)]
    random.Random(f"qa-grounded-{ns.seed}").shuffle(inputs)
    inputs = inputs[:ns.inputs] if ns.inputs is not None else inputs
    facts_of = {q.id: question_facts(q) for q in questions}
    cases: list[dict] = []
    if ns.resume and ns.json is not None and ns.json.exists():
        cases = json.loads(ns.json.read_text())["cases"]
    done = {c["input"] for c in cases}

    def write() -> None:
        out = meta | {"loadavg_end": run_meta()["loadavg_start"], "model": name, "policy": "full",
                      "length": ns.length, "seed": ns.seed, "grounding": GROUNDING, "frames": frames,
                      "inputs": [j.index for j in inputs], "inputs_read": sorted(done),
                      "n_absent": sum(c["arm"] == "plain" and c["kind"] == "absent" for c in cases),
                      "n_answerable": sum(c["arm"] == "plain" and answerable(c) for c in cases),
                      "summary": summary(cases), "cases": cases}
        if ns.json is not None:
            write_text_file(ns.json, json.dumps(out, indent=1) + "\n", "benchmark JSON")
        print(json.dumps({k: out[k] for k in ("inputs_read", "n_absent", "n_answerable")}), file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="kvpot-grounded-") as tmp:
        closed_path = Path(tmp) / "no-document.txt"
        closed_path.write_text(NO_DOCUMENT, encoding="utf-8")
        reading, _ = _settings(plan, facts, known, "full", closed_path)
        closed = reading.again(resettable=True).open()
        closed.read(reading.sources)
        formats = {arm: arm_format(closed.engine.model, closed.settings.prompt, g) for arm, g in ARMS.items()}
        frames = {arm: question_frame(f) for arm, f in formats.items()}
        try:
            for joined in inputs:
                if joined.index in done:
                    continue
                path = Path(tmp) / f"qa-{ns.length}-{joined.index}.txt"
                path.write_text(joined.text, encoding="utf-8")
                reading, full = _settings(plan, facts, known, "full", path)
                if not full:
                    raise SystemExit(f"input {joined.index} does not fit full attention on this machine")
                with reading.again(resettable=True).open() as s:
                    s.read(reading.sources, _reading_line(joined.index))
                    read = {"tokens": s.doc_tokens, "read_seconds": round(s.read_seconds, 2)}
                    for arm, fmt in formats.items():
                        for a in joined.asks:
                            case = {"input": joined.index, "arm": arm, "id": a.id, "task": a.task, "kind": a.kind,
                                    "heldout": a.heldout, "question": a.question,
                                    "reference": a.refs[0] if a.refs else "", **read}
                            case |= _asked(s, fmt, a, facts_of)
                            if a.task == "qa":
                                case["closed_book_correct"] = _asked(closed, fmt, a, facts_of)["correct"]
                            cases.append(case)
                            print(json.dumps({k: case[k] for k in ("input", "arm", "id", "kind", "correct", "answer")}),
                                  file=sys.stderr)
                done.add(joined.index)
                write()
        finally:
            closed.close()
    write()
    return 0


def rescore(path: Path, command: str) -> None:
    """The question set's answers in `path` judged again (multi-key cases keep their verdicts: their needles are
    not in the set), the summary computed again."""
    from types import SimpleNamespace

    from kvpot.bench.throughput import run_meta
    from kvpot.safe_write import write_text_file

    out = json.loads(path.read_text())
    questions = {q.id: q for q in load_set().questions}
    facts_of = {i: question_facts(q) for i, q in questions.items()}
    for c in out["cases"]:
        q = questions.get(c["id"])
        if c["task"] != "qa" or q is None:
            continue
        a = SimpleNamespace(id=q.id, task="qa", refs=tuple(q.refs), question=c["question"], distractors=())
        c.update(_scored(c["answer"], a, facts_of) | {"declines": declines(c["answer"])})
    meta = run_meta()
    out |= {"summary": summary(out["cases"]), "rescored": {"commit": meta["commit"], "tree_dirty": meta["tree_dirty"],
                                                           "command": command}}
    write_text_file(path, json.dumps(out, indent=1) + "\n", "benchmark JSON")
    print(json.dumps(out["summary"], indent=1))


def _reading_line(index: int, every: float = 60.0):
    """A Session.read progress callback: how far input `index` is, on stderr at most once a minute."""
    last = [-every]

    def line(p) -> None:
        if time.monotonic() - last[0] >= every:
            last[0] = time.monotonic()
            total = f"{p.est_total:,}" if p.est_total else "?"
            print(f"input {index}: read {p.tokens:,} of ~{total} tokens", file=sys.stderr, flush=True)
    return line


def _asked(s, fmt, a, facts_of: dict[str, dict]) -> dict:
    """The answer of session `s`, back at its reading, to ask `a` put by `fmt`, scored as bench qa scores."""
    if s.turns:
        s.reset_conversation()
    s.format = fmt
    t0 = time.perf_counter()
    answer = "".join(s.ask(a.question, max_tokens=MAX_TOKENS)).strip()
    return _scored(answer, a, facts_of) | {"declines": declines(answer),
                                            "answer_seconds": round(time.perf_counter() - t0, 2)}


__all__ = ["ARMS", "answerable", "arm_format", "main", "rescore", "summary"]

if __name__ == "__main__":
    sys.exit(main())

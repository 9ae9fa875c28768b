"""source@1 on the question set (kvpot/bench/qa_set.json): whether the first passage `--sources` names holds the
question's passage, over the questions a model answers right. The inputs are `kvpot bench qa`'s joined inputs
(kvpot.bench.qa_inputs, no multi-key needles), each read once with full attention in the model's chat format
as `kvpot ask` reads it, its questions asked in turn (the conversation reset between), every answer tracked
(Engine.track_answer_attention) and ranked as `--sources` ranks it (kvpot.locator.sources.ranked_passages).
A passage is the question's when their characters overlap in the joined input.

    python -m studies.qa_source_at1 -m qwen2.5-coder-0.5b --length 8192 --inputs 24 \\
        --json docs/bench/sources/qa-source-at1-0.5b-8k.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from kvpot.bench.qa import MAX_TOKENS
from kvpot.bench.qa_inputs import build_inputs
from kvpot.bench.qa_questions import load_set
from kvpot.bench.qa_report import wilson
from kvpot.bench.qa_score import question_facts, strict
from kvpot.bench.qa_sources import find_passage
from kvpot.runtime.cpu import describe_host
from kvpot.safe_write import write_text_file
from studies.answer_taps_speed import commit


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m studies.qa_source_at1", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default="qwen2.5-coder-0.5b", help="a known model name or a .gguf path")
    p.add_argument("--length", type=int, default=8192, help="tokens of each joined input")
    p.add_argument("--inputs", type=int, default=None, help="a seeded sample of this many inputs (all without it)")
    p.add_argument("--resume", action="store_true",
                   help="keep the cases of the --json file and read only inputs it does not have, up to --inputs in all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write the cases and the figure here")
    return p


def _summary(ns, argv, name: str, inputs, cases: list[dict], seconds: float) -> dict:
    right = [c for c in cases if c["correct"]]
    k = sum(c["source_at1"] for c in right)
    done = len({c["input"] for c in cases})
    command = "python -m studies.qa_source_at1 " + " ".join(argv if argv is not None else sys.argv[1:])
    return {"command": command, "runs": [*ns.earlier_runs, {"command": command, "commit": commit()}],
            "commit": commit(), "cpu": describe_host(), "model": name, "policy": "full", "length": ns.length,
            "scoring": "strict (kvpot.bench.qa_score.strict)", "inputs": [j.index for j in inputs],
            "inputs_read": done, "questions_asked": len(cases), "answered_right": len(right),
            "n": len(right), "source_at1": k, "source_at1_share": round(k / len(right), 4) if right else None,
            "interval_95": [round(x, 4) for x in wilson(k, len(right))] if right else None,
            "source_at1_all_answers": sum(c["source_at1"] for c in cases), "seconds": round(seconds, 1),
            "cases": cases}


def _earlier(ns) -> dict:
    """The run --resume goes on from: the --json file's figures and cases, for the same model and length."""
    if not ns.resume or ns.json is None or not ns.json.is_file():
        return {}
    old = json.loads(ns.json.read_text())
    if (old.get("model"), old.get("length")) != (ns.model, ns.length):
        raise SystemExit(f"{ns.json} holds {old.get('model')} at {old.get('length')}, not {ns.model} at {ns.length}")
    return old


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    from kvpot.ingest import collect_sources
    from kvpot.locator.sources import ranked_passages
    from kvpot.models.resolve import resolve_model
    from kvpot.runtime.llama import LlamaModel
    from kvpot.session.reading_plan import plan_reading
    from kvpot.session.session import Session, answer_reserve
    from kvpot.session.settings import resolve_settings

    facts, known = resolve_model(ns.model)
    name = known.name if known else facts.name
    qs = [q for q in load_set().questions if q.passage and q.answer]
    vocab = LlamaModel(str(facts.path))
    try:
        inputs = build_inputs(qs, lambda t: len(vocab.tokenize(t)), ns.length, ns.seed, multikey=False)
    finally:
        vocab.close()
    earlier = _earlier(ns)
    done = {c["input"] for c in earlier.get("cases", [])}
    ns.earlier_runs = earlier.get("runs") or ([{"command": earlier["command"], "commit": earlier["commit"]}]
                                              if earlier else [])
    if ns.inputs is not None and ns.inputs < len(inputs):
        if done:  # the inputs already read, then more of a seeded order until --inputs in all
            order = list(inputs)
            random.Random(f"source-at1-order-{ns.seed}").shuffle(order)
            more = [j for j in order if j.index not in done][:max(0, ns.inputs - len(done))]
            inputs = sorted([j for j in inputs if j.index in done] + more, key=lambda j: j.index)
        else:
            inputs = sorted(random.Random(f"source-at1-{ns.seed}").sample(inputs, ns.inputs), key=lambda j: j.index)
    by_id = {q.id: q for q in qs}
    cli = {"threads": ns.threads, "policy": "full", "max_tokens": MAX_TOKENS}
    settings0 = resolve_settings(name if known else None, known.defaults if known else {}, cli)
    cases: list[dict] = list(earlier.get("cases", []))
    t_all = time.perf_counter() - earlier.get("seconds", 0.0)
    with tempfile.TemporaryDirectory(prefix="kvpot-source-at1-") as tmp:
        for joined in inputs:
            if joined.index in done:
                continue
            path = Path(tmp) / f"qa-{ns.length}-{joined.index}.txt"
            path.write_text(joined.text, encoding="utf-8")
            settings = plan_reading(settings0, facts, collect_sources([str(path)]), True,
                                    answer_reserve(settings0)).settings
            with Session(facts, name, settings, resettable=True) as s:
                s.read(collect_sources([str(path)]))
                for i, a in enumerate(joined.asks):
                    q = by_id.get(a.id)
                    span = find_passage(joined.text, q.passage) if q is not None else None
                    if span is None:
                        continue
                    if i:
                        s.reset_conversation()
                    s.engine.track_answer_attention(True)
                    try:
                        answer = "".join(s.ask(a.question, max_tokens=MAX_TOKENS)).strip()
                        ranked = ranked_passages(s.engine.answer_mass or {}, s, top=3)
                    finally:
                        s.engine.track_answer_attention(False)
                    hits = [r for r, p in enumerate(ranked, 1) if p.start < span[1] and span[0] < p.end]
                    case = {"input": joined.index, "id": a.id, "question": a.question, "answer": answer,
                            "correct": strict(answer, list(a.refs), a.question, **question_facts(q)), "passage": list(span),
                            "top": [[p.start, p.end, round(p.share, 4)] for p in ranked],
                            "source_at1": bool(hits) and hits[0] == 1, "source_rank": hits[0] if hits else None}
                    cases.append(case)
                    print(json.dumps({k: case[k] for k in ("id", "correct", "source_at1", "source_rank")}),
                          file=sys.stderr)
            if ns.json is not None:  # after every input, so a stopped run keeps what it measured
                partial = _summary(ns, argv, name, inputs, cases, time.perf_counter() - t_all)
                write_text_file(ns.json, json.dumps(partial, indent=1) + "\n", "benchmark JSON")
    out = _summary(ns, argv, name, inputs, cases, time.perf_counter() - t_all)
    print(json.dumps({x: out[x] for x in ("questions_asked", "n", "source_at1", "source_at1_share", "interval_95")}))
    if ns.json is not None:
        write_text_file(ns.json, json.dumps(out, indent=1) + "\n", "benchmark JSON")
    return 0


if __name__ == "__main__":
    sys.exit(main())

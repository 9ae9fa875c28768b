"""`kvpot bench ruler`: the RULER tasks (kvpot.bench.ruler) read and asked as `kvpot chat` asks, per model,
policy, length and task, scored with RULER's metric, and the JSON that holds them.

Each sample's document is read once per policy and budget (kvpot.bench.qa's reading: a Session, the model's
chat template, settings resolved as `kvpot ask` resolves them) and all of its questions are asked after the
read, the conversation reset between them (Session.reset_conversation). A pot reads without knowing the
question, as `kvpot chat` does. Two policy specs that resolve to the same policy and budget for a document
(`default` is full attention wherever the document fits) read it identically, so the second one's cases are
copies of the first's, marked `same_reading_as`. The QA task's questions are also asked closed book (policy
"none", after an empty document) once per model: the score a reading must beat before its right answers can
be credited to the document.

The JSON: {"runs": [run_record of each run that wrote it], "cases": [one per question asked],
"summary": summarize(cases)}: per model, policy, length and task the mean RULER score, its n and a 95 %
Wilson interval, and per model, policy and length the mean over the tasks (the paper's average)."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvpot.bench import qa
from kvpot.bench.qa import CLOSED, DEFAULT, NO_DOCUMENT
from kvpot.bench.qa_report import wilson
from kvpot.bench.ruler import CATEGORY, TASKS, Sample, samples, score
from kvpot.errors import KvpotError
from kvpot.safe_write import write_text_file

SCORE_DIGITS = 4


@dataclass(frozen=True)
class RulerPlan:
    model: str                       # a known name or a .gguf path
    policies: list[str]
    lengths: list[int]
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    samples: int = 10                # samples per task and length
    seed: int = 0
    budget: int | None = None        # cells for pot policies (None: as `kvpot ask` resolves it)
    threads: int = 2
    closed_book: bool = True         # the QA questions asked with no document too


def check_plan(plan: RulerPlan) -> None:
    """Refuse a bad task or policy spec before any model loads."""
    from kvpot.api.plan import check_policy

    bad = [t for t in plan.tasks if t not in TASKS]
    if bad:
        raise KvpotError(f"--task: no task {', '.join(bad)} (tasks: {', '.join(TASKS)})")
    for spec in plan.policies:
        if spec == DEFAULT:
            continue
        try:
            check_policy(spec)
        except KvpotError as e:
            raise KvpotError(f"{e}; bench ruler also takes {DEFAULT} (as `kvpot ask` reads)") from None
        if plan.budget:
            check_policy(spec, plan.budget)


def case_key(r: dict) -> tuple:
    return r["model"], r["policy"], r["length"], r["seed"], r["task"], r["sample"], r["id"]


def _reading_key(r: dict) -> tuple:
    return r["model"], r["length"], r["seed"], r["task"], r["sample"], r["resolved_policy"], r["budget"]


def run(plan: RulerPlan, done: list[dict] = (), on_case: Callable[[dict], None] = lambda r: None,
        say: Callable[[str], None] = lambda m: None, on_read: Callable[[str], None] = lambda m: None) -> list[dict]:
    """Every case of `plan` not in `done`; returns done + the new cases (each passed to on_case as it ends).
    Samples go in order of their index, every task's first sample before any task's second, so a run cut
    short has asked every task."""
    from kvpot.models.resolve import resolve_model
    from kvpot.runtime.llama import LlamaModel
    from kvpot.session.prompting import choose_format, question_frame

    check_plan(plan)
    facts, known = resolve_model(plan.model)
    name = known.name if known else facts.name
    vocab = LlamaModel(str(facts.path))
    try:
        frame = question_frame(choose_format(vocab, qa._settings_prompt(known)))
        count = lambda t: len(vocab.tokenize(t))  # noqa: E731
        say("generating the samples")
        made: dict[tuple[int, str], list[Sample]] = {}
        unmade: dict[tuple[int, str], str] = {}
        for n in plan.lengths:
            for t in plan.tasks:
                try:
                    made[(n, t)] = samples(t, plan.seed, count, n, plan.samples)
                except ValueError as e:  # a length this machine's texts cannot fill for the task: said, not run
                    made[(n, t)], unmade[(n, t)] = [], str(e)
                    say(f"{t} at {n:,}: {e}")
    finally:
        vocab.close()
    # cases asked with another prompt (an older kvpot's) are asked again, not mixed in
    results = [r for r in done if r.get("model") != name or r.get("frame") == frame]
    have = {case_key(r) for r in results}
    readings: dict[tuple, dict[str, dict]] = {}
    for r in results:
        if "resolved_policy" in r:
            readings.setdefault(_reading_key(r), {})[r["id"]] = r
    for (n, t), why in unmade.items():
        for spec in plan.policies:
            if (name, spec, n, plan.seed, t, 0, f"{t}-0") not in have:
                r = {"model": name, "policy": spec, "length": n, "seed": plan.seed, "task": t, "sample": 0,
                     "id": f"{t}-0", "frame": frame, "skipped": why}
                results.append(r)
                have.add(case_key(r))
                on_case(r)
    specs = ([CLOSED] if plan.closed_book and "qa" in plan.tasks else []) + [p for p in plan.policies if p != CLOSED]
    closed = {(r["length"], r["id"]): r["score"] for r in results if r["policy"] == CLOSED}
    with tempfile.TemporaryDirectory(prefix="kvpot-ruler-") as tmp:
        for n in plan.lengths:
            for i in range(plan.samples):
                for task in plan.tasks:
                    got = made[(n, task)]
                    if i >= len(got):
                        continue
                    sample = got[i]
                    for spec in specs:
                        if spec == CLOSED and task != "qa":
                            continue
                        todo = [a for a in sample.asks
                                if (name, spec, n, plan.seed, task, i, a.id) not in have]
                        if not todo:
                            continue
                        say(f"{spec} {n:,}: {task} sample {i + 1}/{plan.samples}")
                        # each document written once: a file read is never written again (kvpot.safe_write)
                        path = Path(tmp) / ("no-document.txt" if spec == CLOSED else f"{task}-{n}-{i}.txt")
                        if not path.exists():
                            write_text_file(path, NO_DOCUMENT if spec == CLOSED else sample.text, "a sample")
                        for r in _sample_cases(plan, facts, known, name, spec, sample, todo, path, readings, frame,
                                               on_read):
                            if spec == CLOSED:
                                closed[(n, r["id"])] = r["score"]
                            elif task == "qa" and (n, r["id"]) in closed:
                                r["closed_book_score"] = closed[(n, r["id"])]
                            if "resolved_policy" in r:
                                readings.setdefault(_reading_key(r), {}).setdefault(r["id"], r)
                            results.append(r)
                            have.add(case_key(r))
                            on_case(r)
    return results


def _settings(plan: RulerPlan, facts, known, spec: str, path: Path, max_tokens: int):
    """The reading `kvpot chat` would plan for this document (kvpot.api.plan; the question unknown while reading),
    with room for `max_tokens` of answer."""
    from kvpot.api.plan import plan_read

    chosen = spec != DEFAULT
    return plan_read([str(path)], known.name if known else str(facts.path), None, resettable=False,
                     threads=plan.threads, max_tokens=max_tokens, policy=spec if chosen else None,
                     question_before="off",
                     budget=plan.budget if chosen and spec.partition(":")[0].strip() != "full" else None)


def _sample_cases(plan: RulerPlan, facts, known, name: str, spec: str, sample: Sample, todo, path: Path,
                  readings: dict, frame: str, on_read: Callable[[str], None]):
    base = {"model": name, "policy": spec, "length": sample.length, "seed": plan.seed, "task": sample.task,
            "category": CATEGORY[sample.task], "sample": sample.index, "frame": frame}
    closed = spec == CLOSED
    max_tokens = max(a.max_tokens for a in todo)
    try:
        reading = _settings(plan, facts, known, "full" if closed else spec, path, max_tokens)
    except KvpotError as e:  # full attention past the window or the memory: recorded, not retried
        for a in todo:
            yield {**base, **_ask_fields(a), "skipped": str(e)}
        return
    settings = reading.settings
    resolved = CLOSED if closed else settings.policy
    copies, todo = qa.same_reading(base, todo, readings, resolved, settings.budget, _reading_key)
    yield from copies
    if not todo:
        return
    qa_plan = qa.Plan(model=plan.model, policies=plan.policies, lengths=plan.lengths, threads=plan.threads)
    what = f"{spec} {sample.length:,}, {sample.task} {sample.index + 1}"
    s, part, peak = qa._read(qa_plan, facts, name, reading, todo, path, what, None,
                             qa._Reading(None, lambda: False, lambda m: None), on_read)
    with s:
        seconds = part.seconds + s.read_seconds
        read = {"resolved_policy": resolved if closed else s.policy_spec, "budget": settings.budget,
                "tokens": s.doc_tokens, "read_seconds": round(seconds, 2),
                "read_tok_s": round(s.doc_tokens / seconds, 1) if seconds else None,
                "compactions": s.stats()["compactions"], "peak_rss_mib": None if peak is None else round(peak, 1)}
        for k, a in enumerate(todo):
            if k:
                s.reset_conversation()
            t0 = time.perf_counter()
            answer = "".join(s.ask(a.question, max_tokens=a.max_tokens)).strip()
            yield {**base, **_ask_fields(a), **read, "answer": answer,
                   "score": round(score(answer, a.refs, a.metric), SCORE_DIGITS),
                   "distractor": bool(a.distractors) and score(answer, a.distractors, "part") > 0,
                   "answer_seconds": round(time.perf_counter() - t0, 2)}


def _ask_fields(a) -> dict:
    return {"id": a.id, "question": a.question, "references": list(a.refs), "metric": a.metric,
            "heldout": a.heldout}


def summarize(cases: list[dict]) -> list[dict]:
    """Per model, policy, length and task: n (questions scored), the mean RULER score in percent and its 95 %
    Wilson interval (taken on the mean score as a share of n: exact for tasks scored 0 or 1, an approximation
    where a question earns part of its references), closed-book beside QA; then per model, policy and
    length the mean of the task means ("average", over the tasks that have cases)."""
    groups: dict[tuple, list[dict]] = {}
    for r in cases:
        if "score" in r:
            groups.setdefault((r["model"], r["policy"], r["length"], r["task"]), []).append(r)
    out = []
    for (model, policy, length, task), rows in sorted(groups.items(), key=lambda kv: _order(kv[0])):
        n = len(rows)
        mean = sum(r["score"] for r in rows) / n
        lo, hi = wilson(mean * n, n)
        row = {"model": model, "policy": policy, "length": length, "task": task, "n": n,
               "score": round(100 * mean, 1), "low": round(100 * lo, 1), "high": round(100 * hi, 1),
               "samples": len({r["sample"] for r in rows})}
        book = [r["closed_book_score"] for r in rows if "closed_book_score" in r]
        if book:
            row["closed_book"] = round(100 * sum(book) / len(book), 1)
            row["closed_book_n"] = len(book)
        out.append(row)
    averages: dict[tuple, list[float]] = {}
    for row in out:
        averages.setdefault((row["model"], row["policy"], row["length"]), []).append(row["score"])
    for (model, policy, length), scores in averages.items():
        out.append({"model": model, "policy": policy, "length": length, "task": "average",
                    "tasks": len(scores), "score": round(sum(scores) / len(scores), 1)})
    return out


def _order(key: tuple) -> tuple:
    model, policy, length, task = key
    return model, policy != CLOSED, policy, length, TASKS.index(task) if task in TASKS else len(TASKS)


def lines(summary: list[dict]) -> list[str]:
    """The summary as text: a line per model, policy, length and task."""
    out = []
    for r in summary:
        head = f"{r['model']} {r['policy']} {r['length']:,} {r['task']}"
        if r["task"] == "average":
            out.append(f"{head}: {r['score']:.1f} (mean of {r['tasks']} tasks)")
            continue
        book = f"; closed book {r['closed_book']:.1f}" if "closed_book" in r else ""
        out.append(f"{head}: {r['score']:.1f} (n={r['n']}, 95 % {r['low']:.1f}-{r['high']:.1f}){book}")
    return out


def run_record(plan: RulerPlan) -> dict:
    """What the JSON records of one run that wrote cases into it: run_meta (command, commit, CPU, load) and
    its plan (a file resumed with other options holds the cases of each run)."""
    from kvpot.bench.throughput import run_meta

    return {**run_meta(), "plan": asdict(plan)}


def document(runs: list[dict], cases: list[dict]) -> dict:
    return {"runs": runs, "cases": cases, "summary": summarize(cases)}


def load(path: Path) -> tuple[list[dict], list[dict]]:
    """(runs, cases) of a `bench ruler` JSON, for --resume ([] and [] where it does not exist yet)."""
    if not path.exists():
        return [], []
    try:
        data = json.loads(path.read_text())
        assert isinstance(data, dict) and isinstance(data["cases"], list) and isinstance(data["runs"], list)
        assert all(isinstance(c, dict) and {"model", "policy", "length", "seed", "task", "sample", "id"} <= set(c)
                   for c in data["cases"])
    except (ValueError, AssertionError, KeyError):
        raise KvpotError(f"{path} is not a `bench ruler` results file; remove it or drop --resume") from None
    return data["runs"], data["cases"]

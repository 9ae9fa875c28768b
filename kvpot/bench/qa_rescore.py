"""`kvpot bench qa-rescore`: score the answers a benchmark JSON already holds again, strictly
(kvpot.bench.qa_score.strict), and write the strict verdict beside the old one.

It reads the cases of `kvpot bench qa` (a reference and a question id) and of `kvpot bench niah` (a key and
the haystack's seed and depth), one list of cases per file or one case alone (a trace). Each case gets
`correct` (strict), `contains` (the verdict it held before, the whole-word check), `named` (the competing
answers it names, where it names one) and `scoring: "strict"`; a focused case's `pot_correct` the same
way (`pot_contains`). A question's candidates, passages and kind come from the question set by id (cases
asked before the set had candidates have none of their own); a multi-key needle's other codes are drawn
again from the case's seed (kvpot.bench.haystack.draw_needles draws the codes from the seed alone), and
checked against the case's own code before they are used. A qa case also gets `closed_book_correct`: the
strict verdict of the same model on the same question asked with no document (`-P none`), from any of the
files rescored together, where one of them holds it.

Rescoring twice gives the same file: the old verdict is taken from `contains` once a case has been
rescored."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvpot.bench.haystack import draw_needles
from kvpot.bench.haystack import question as needle_question
from kvpot.bench.qa import CLOSED, with_closed_book
from kvpot.bench.qa_questions import Question, parse_set
from kvpot.bench.qa_score import judge, question_facts
from kvpot.errors import KvpotError
from kvpot.safe_write import atomic_write

NIAH_KEYS = {"passkey": 0, "prose": 1, "multikey": 4}  # kvpot.bench.niah.TASKS: needles in the haystack
PASSKEY_QUESTION = "What is the pass key?"              # kvpot.bench.niah.QUESTION


@dataclass(frozen=True)
class Scoring:
    """What a case is judged against."""
    refs: list[str]
    question: str
    candidates: tuple[str, ...] = ()
    passages: tuple[str, ...] = ()
    absent: bool = False


def multikey_codes(seed: int, n_keys: int, key: str) -> tuple[str, ...]:
    """The other needles' codes of a haystack drawn from `seed` whose asked code is `key` (none when the
    seed draws another asked code: the case was made another way)."""
    codes = [n.key for n in draw_needles(seed, 0.5, n_keys)]
    return tuple(codes[1:]) if codes[0] == key else ()


def scoring(r: dict, by_id: dict[str, Question]) -> Scoring | None:
    """How case `r` is judged (None: it holds no reference to judge against)."""
    if "reference" in r and "id" in r:  # bench qa
        if r.get("task") == "multikey":
            seed = r["seed"] * 100_003 + r["length"] + r["input"]  # kvpot.bench.qa_inputs._join
            return Scoring([r["reference"]], r["question"], multikey_codes(seed, 4, r["reference"]))
        q = by_id.get(r["id"])
        if q is None:
            return Scoring([r["reference"]], r["question"], absent=not r["reference"])
        refs = list(dict.fromkeys([r["reference"], *q.refs])) if r["reference"] else []
        return Scoring(refs, r["question"], **question_facts(q))
    if "key" in r:  # bench niah
        task = r.get("task", "passkey")
        if NIAH_KEYS.get(task, 0) == 0:
            return Scoring([r["key"]], PASSKEY_QUESTION)
        needles = draw_needles(r["seed"], r["depth"], NIAH_KEYS[task])
        if needles[0].key != r["key"]:
            return Scoring([r["key"]], "")
        return Scoring([r["key"]], needle_question(needles[0].place), tuple(n.key for n in needles[1:]))
    return None


def _judged(answer: str, s: Scoring):
    return judge(answer, s.refs, s.question, s.candidates, s.passages, s.absent)


def rescore_case(r: dict, s: Scoring) -> dict:
    """`r` with the strict verdict in `correct` and the old one in `contains` (module docstring)."""
    out = dict(r)
    old = r["contains"] if r.get("scoring") == "strict" else r["correct"]
    v = _judged(r["answer"], s)
    out |= {"contains": bool(old), "correct": v.right, "scoring": "strict"}
    out.pop("named", None)
    if v.named:
        out["named"] = list(v.named)
    if "pot_answer" in r:
        pot_old = r["pot_contains"] if r.get("scoring") == "strict" else r["pot_correct"]
        out |= {"pot_contains": bool(pot_old), "pot_correct": _judged(r["pot_answer"], s).right}
    return out


@dataclass
class Rescored:
    path: Path
    data: object          # the file's JSON, its cases rescored
    cases: list[dict]     # the rescored cases (the same dicts as in data)
    before: list[dict]    # the cases as they were, in the same order
    skipped: int          # cases with nothing to judge against (no reference, or skipped runs)


def _cases(data) -> list[dict]:
    rows = data if isinstance(data, list) else [data]
    return [r for r in rows if isinstance(r, dict)]


def read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise KvpotError(f"{path}: cannot read it as JSON ({e})") from None


def rescore(paths: list[Path], set_path: Path | None = None) -> list[Rescored]:
    """Every file's cases scored again (nothing written); closed-book verdicts pooled over all the files."""
    by_id = {q.id: q for q in (parse_set(set_path) if set_path else parse_set())}
    out: list[Rescored] = []
    for path in paths:
        data = read_json(path)
        if not isinstance(data, (list, dict)):
            raise KvpotError(f"{path}: not a benchmark JSON (a list of cases, or one case)")
        rows = data if isinstance(data, list) else [data]
        new_rows, cases, before, skipped = [], [], [], 0
        for r in rows:
            s = scoring(r, by_id) if isinstance(r, dict) and "answer" in r and "correct" in r else None
            if s is None:
                skipped += isinstance(r, dict)
                new_rows.append(r)
                continue
            new = rescore_case(r, s)
            new_rows.append(new)
            cases.append(new)
            before.append(r)
        out.append(Rescored(path, new_rows if isinstance(data, list) else new_rows[0], cases, before, skipped))
    every = [r for f in out for r in f.cases]
    for r in every:
        r.pop("closed_book_correct", None)
    with_closed_book(every)  # the closed-book cases of any of the files
    return out


def write(f: Rescored) -> None:
    text = f.path.read_text(encoding="utf-8")
    body = json.dumps(f.data, indent=1, ensure_ascii=text.isascii())
    with atomic_write(f.path, "results") as out:
        out.write((body + ("\n" if text.endswith("\n") else "")).encode("utf-8"))


def changes(f: Rescored) -> list[str]:
    """One line per case whose verdict moved: what was asked, the two verdicts, and why."""
    lines = []
    for old, new in zip(f.before, f.cases):
        if bool(new["contains"]) != bool(new["correct"]):
            what = new.get("id") or f"{new.get('task', 'passkey')} seed {new.get('seed')} @ {new.get('depth')}"
            why = f"names {', '.join(new['named'])}" if new.get("named") else "no reference given as whole words"
            lines.append(f"  {new.get('policy', '?')} {new.get('length', '?')} {what}: "
                         f"{'right' if new['contains'] else 'wrong'} -> {'right' if new['correct'] else 'wrong'} "
                         f"({why}): {_short(new['answer'])}")
    return lines


def _short(answer: str, n: int = 110) -> str:
    one = " ".join(answer.split())
    return one if len(one) <= n else one[: n - 1] + "…"


def _line_key(r: dict) -> tuple:
    return (r.get("model", "?"), r.get("policy", "?"), r.get("length", "?"), r.get("task", "passkey"),
            bool(r.get("per_question")), bool(r.get("focus")))


def summary_lines(f: Rescored) -> list[str]:
    """Old against strict for one file: a line per model, policy, length and task, then the cases that moved."""
    from kvpot.bench.qa_report import share

    head = f"{f.path}: {len(f.cases)} cases rescored" + (f", {f.skipped} with nothing to judge" if f.skipped else "")
    lines = [head]
    groups: dict[tuple, list[dict]] = {}
    for r in f.cases:
        groups.setdefault(_line_key(r), []).append(r)
    for (model, policy, length, task, per_question, focus), rows in groups.items():
        how = ", question first" * per_question + ", focused" * focus
        closed = [r["closed_book_correct"] for r in rows if "closed_book_correct" in r]
        lines.append(f"  {model} {policy}{how} {length} {task}: old {share(sum(r['contains'] for r in rows), len(rows))}"
                     f"  strict {share(sum(r['correct'] for r in rows), len(rows))}"
                     + (f"  closed book {share(sum(closed), len(closed))}" if closed and policy != CLOSED else ""))
    return lines + changes(f)

"""Strict scoring of `kvpot bench qa` (kvpot.bench.qa_score) on real questions of the set, and
`kvpot bench qa-rescore` on a JSON written here from them.

A question's competing answers are its `candidates` where the set gives them; where it does not, they are
computed here from its source the way the scorer's number rule sees them: the other numbers of the
reference's shape that the source file holds."""

from __future__ import annotations

import json

import pytest

from kvpot.bench.haystack import draw_needles
from kvpot.bench.qa_questions import Question, load_set
from kvpot.bench.qa_score import contains, declines, judge, normalize, numbers, question_facts, shape, strict
from kvpot.bench.qa_sources import read_source

QUESTIONS = load_set().questions
BY_ID = {q.id: q for q in QUESTIONS}


def verdict(answer: str, q: Question) -> bool:
    return strict(answer, q.refs, q.question, **question_facts(q))


def rivals(q: Question) -> list[str]:
    """The question's candidates; else the other numbers of its reference's shape in its source."""
    if getattr(q, "candidates", ()):
        return [c for c in q.candidates if f" {normalize(c)} " not in f" {normalize(q.question)} "]
    ref_numbers = [n for r in q.refs for n in numbers(r)]
    shapes = {shape(n) for n in ref_numbers}
    own = set(ref_numbers) | set(numbers(q.question))
    return list(dict.fromkeys(n for n in numbers(read_source(q.source) or "") if shape(n) in shapes and n not in own))


ANSWERED = [q for q in QUESTIONS if q.answer and getattr(q, "kind", "") != "absent"]
WITH_RIVALS = [q for q in ANSWERED if rivals(q)]
ABSENT = [q for q in QUESTIONS if getattr(q, "kind", "") == "absent"]


def test_the_set_gives_questions_with_competing_answers():
    assert len(WITH_RIVALS) >= 10, [q.id for q in WITH_RIVALS]


@pytest.mark.parametrize("q", ANSWERED, ids=lambda q: q.id)
def test_the_reference_alone_is_right(q):
    assert verdict(q.answer, q)
    assert verdict(f"According to the text, it is {q.answer}.", q)


@pytest.mark.parametrize("q", WITH_RIVALS, ids=lambda q: q.id)
def test_the_reference_with_a_competing_answer_is_wrong(q):
    other = rivals(q)[0]
    both = f"It is {q.answer}, or possibly {other}."
    assert contains(both, q.refs, q.question)  # the old whole-word check calls it right
    assert not verdict(both, q)
    v = judge(both, q.refs, q.question, **question_facts(q))
    assert v.gives and other in v.named


@pytest.mark.parametrize("q", [q for q in WITH_RIVALS if len(rivals(q)) >= 2], ids=lambda q: q.id)
def test_a_list_of_candidates_is_wrong(q):
    one, two = rivals(q)[:2]
    assert not verdict(f"{one}, {q.answer}, {two}", q)
    assert not verdict(f"- {q.answer}\n- {one}\n- {two}", q)


NUMERIC = [q for q in ANSWERED if any(numbers(r) for r in q.refs)]


@pytest.mark.parametrize("q", NUMERIC, ids=lambda q: q.id)
def test_a_bare_other_number_of_the_reference_shape_is_wrong(q):
    n = next(n for r in q.refs for n in numbers(r))
    taken = {m for t in (*q.refs, q.question, *question_facts(q)["passages"]) for m in numbers(t)}
    # the same shape, another value: each digit moved on until the number is one nothing else holds
    other = next(o for d in range(1, 10) if (o := "".join(str((int(c) + d) % 10) if c.isdigit() else c for c in n))
                 not in taken)
    answer = f"It is {q.answer}. Some versions say {other}."
    assert contains(answer, q.refs, q.question) and not verdict(answer, q)
    assert not verdict(other, q)


QUESTION_NUMBERS = [q for q in ANSWERED if numbers(q.question)]


def test_some_questions_hold_numbers_of_their_own():
    assert len(QUESTION_NUMBERS) >= 5, [q.id for q in QUESTION_NUMBERS]


@pytest.mark.parametrize("q", QUESTION_NUMBERS, ids=lambda q: q.id)
def test_the_questions_own_numbers_are_ignored(q):
    # an answer that says the question back, numbers and all, then gives the reference
    assert verdict(f"{q.question} {q.answer}.", q)


def absent_cases() -> list[tuple[Question, dict]]:
    """The set's absent questions; where it has none yet, real questions judged as absent (a reading
    whose input lacks their passage), their reference then the invented answer to refuse."""
    if ABSENT:
        return [(q, question_facts(q)) for q in ABSENT]
    return [(q, {**question_facts(q), "absent": True, "candidates": (q.answer, *rivals(q))}) for q in WITH_RIVALS[:5]]


@pytest.mark.parametrize("q,facts", absent_cases(), ids=lambda x: getattr(x, "id", ""))
def test_absent_declined_is_right_with_a_candidate_or_invented_wrong(q, facts):
    refs = q.refs if ABSENT else []
    for decline in ("The document does not mention it.", "There is no information about that in the text.",
                    "The text doesn't say.", "It is not specified in the document."):
        assert declines(decline) and strict(decline, refs, q.question, **facts), decline
    q_words = f" {normalize(q.question)} "
    cand = next((c for c in facts["candidates"] if f" {normalize(c)} " not in q_words), None)
    if cand:
        assert not strict(f"The document does not say, but it is probably {cand}.", refs, q.question, **facts)
        assert not strict(f"It is {cand}.", refs, q.question, **facts)  # invented
    assert not strict("It is given in section 2 of the file.", refs, q.question, **facts)  # invented, no decline


# an answer a model gave (docs/bench/beyond/qa-qwen05-48k-8192.json): the right street, a wrong address
WRONG_ADDRESS = ("The Free Software Foundation's address on in the GPL-2 text is:  ``` 1971 Franklin St, Fifth Floor, "
                 "Boston, MA 02211, USA ```")


@pytest.mark.parametrize("q", [BY_ID[i] for i in ("gpl2-address",) if i in BY_ID], ids=lambda q: q.id)
def test_a_wrong_address_on_the_right_street_is_wrong(q):
    assert contains(WRONG_ADDRESS, q.refs, q.question)
    v = judge(WRONG_ADDRESS, q.refs, q.question, **question_facts(q))
    assert not v.right and {"1971", "02211"} <= set(v.named)
    passage = question_facts(q)["passages"][0]
    assert verdict(f"The address given is {passage}.", q)  # the address the text gives is right


def test_rescoring_a_json_gives_the_strict_verdicts(tmp_path):
    """A JSON of bench qa and bench niah cases from real questions (answers written here), rescored
    through the command: each verdict is the one the case was built to have, the old one is kept in
    `contains`, closed book is attached, and rescoring again changes nothing."""
    from conftest import run_cli

    q1, q2 = WITH_RIVALS[:2]
    other = rivals(q2)[0]
    base = {"model": "m", "policy": "full", "length": 8192, "seed": 0, "input": 0, "task": "qa", "heldout": False}

    def qa_case(q: Question, answer: str, policy: str = "full", **more) -> dict:
        return {**base, "policy": policy, "id": q.id, "question": q.question, "reference": q.answer, "answer": answer,
                "exact": False, "correct": contains(answer, q.refs, q.question), **more}

    codes = [n.key for n in draw_needles(0 * 100_003 + 8192 + 0, 0.5, 4)]  # kvpot.bench.qa_inputs's draw
    needles = draw_needles(7, 0.3, 4)                                      # kvpot.bench.niah's multikey haystack
    cases = [
        qa_case(q1, q1.answer),                                   # right, right
        qa_case(q2, f"{q2.answer} or {other}"),                   # right -> wrong
        qa_case(q1, f"I think {q1.answer}.", policy="none"),      # closed book: right
        qa_case(q2, "I do not know.", policy="none"),             # closed book: wrong
        {**base, "id": "multikey-0", "task": "multikey", "question": "What is the access code for the x?",
         "reference": codes[0], "answer": f"It is {codes[0]} (or {codes[1]}).", "exact": False, "correct": True},
        {"model": "m", "policy": "full", "length": 8192, "tokens": 8000, "depth": 0.3, "seed": 7, "task": "multikey",
         "key": needles[0].key, "answer": f"{needles[0].key}, {needles[2].key}", "correct": True},
        {"model": "m", "policy": "full", "length": 8192, "tokens": 8000, "depth": 0.5, "seed": 1, "key": "12345",
         "answer": "12345.", "correct": True},
        {**base, "id": q1.id, "skipped": "too long"},
    ]
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(cases, indent=1))
    res = run_cli("bench", "qa-rescore", str(path))
    assert res.returncode == 0, res.stderr
    out = json.loads(path.read_text())
    assert [r.get("correct") for r in out] == [True, False, True, False, False, False, True, None]
    assert [r.get("contains") for r in out[:7]] == [c["correct"] for c in cases[:7]]
    assert all(r["scoring"] == "strict" for r in out[:7]) and "scoring" not in out[7]
    assert out[1]["named"] == [other] and out[4]["named"] == [codes[1]] and out[5]["named"] == [needles[2].key]
    assert out[0]["closed_book_correct"] is True and out[1]["closed_book_correct"] is False
    assert "closed_book_correct" not in out[4]  # its question was not asked closed book
    assert f"{path}: 7 cases rescored, 1 with nothing to judge" in res.stdout
    assert f"{q2.id}: right -> wrong (names {other})" in res.stdout
    again = run_cli("bench", "qa-rescore", str(path))
    assert again.returncode == 0, again.stderr
    assert json.loads(path.read_text()) == out


def test_rescore_refuses_a_file_that_is_not_json(tmp_path):
    from conftest import assert_one_line_error, run_cli

    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    res = run_cli("bench", "qa-rescore", str(bad))
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "cannot read it as JSON")


def test_a_grid_records_each_cases_closed_book_verdict(smollm2_cut_path):
    """Plan.closed_book asks every question with no document first; each case read of an input then
    carries the strict verdict of its question's closed-book case, and the cases are scored strictly."""
    from kvpot.bench.qa import CLOSED, Plan, run

    qs = QUESTIONS[:2]
    plan = Plan(model=str(smollm2_cut_path), policies=["full"], lengths=[512], group=2, multikey=False,
                closed_book=True)
    results = run(plan, qs)
    assert [r["policy"] for r in results] == [CLOSED, CLOSED, "full", "full"]
    closed = {r["id"]: r for r in results if r["policy"] == CLOSED}
    for r in results:
        q = BY_ID[r["id"]]
        assert r["correct"] == verdict(r["answer"], q) and r["contains"] == contains(r["answer"], q.refs, q.question)
        if r["policy"] == "full":
            assert r["closed_book_correct"] == closed[r["id"]]["correct"]
        else:
            assert "closed_book_correct" not in r

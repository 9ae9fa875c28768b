"""bench qa asks the whole-document questions: each source alone, at the smallest grid length that holds
it, with input indices after that length's haystack inputs; a sample never drops them silently into a
haystack; the report splits accuracy by kind."""

from __future__ import annotations

import pytest

from kvpot.bench.qa import Plan, questions_for, whole_for
from kvpot.bench.qa_inputs import build_inputs, display_name, doc_tokens
from kvpot.bench.qa_questions import load_set
from kvpot.bench.qa_report import KINDS, kinds_table, summary
from kvpot.bench.qa_sources import read_source


def _count(text: str) -> int:  # about 3.5 characters a token, as the builder assumes
    return len(text) * 2 // 7


@pytest.fixture(scope="module")
def questions():
    qs = load_set().questions
    if not any(q.whole_input for q in qs):
        pytest.skip("no whole-document question's file is on this machine")
    return qs


def test_each_whole_document_is_asked_once_at_the_smallest_length_that_holds_it(questions):
    lengths = (4096, 8192, 32768)
    first = {4096: 5, 8192: 7, 32768: 11}
    got = whole_for(questions, lengths, _count, first)
    whole = [q for q in questions if q.whole_input]
    asked = [a.id for n in lengths for w in got[n] for a in w.asks]
    fits = {q.source: _count(f"===== {display_name(q.source)} =====\n\n{read_source(q.source).strip(chr(10))}\n")
            for q in whole}
    expect = sorted(q.id for q in whole if fits[q.source] <= doc_tokens(32768))
    assert sorted(asked) == expect and len(set(asked)) == len(asked)
    for n in lengths:
        smaller = [m for m in lengths if m < n]
        for i, w in enumerate(got[n]):
            assert w.index == first[n] + i
            assert w.tokens <= doc_tokens(n)
            assert not smaller or w.tokens > doc_tokens(max(smaller))
            assert {a.kind for a in w.asks} == {"whole"}
            assert len({q.source for q in whole if q.id in {a.id for a in w.asks}}) == 1


def test_a_sample_draws_from_the_haystack_questions_only(questions):
    plan = Plan(model="x", policies=("full",), lengths=(8192,), limit=10)
    picked = questions_for(questions, 8192, plan)
    assert len(picked) == 10 and not any(q.whole_input for q in picked)
    assert any(q.whole_input for q in questions_for(questions, 8192, Plan(model="x", policies=("full",),
                                                                         lengths=(8192,))))


def test_haystack_inputs_keep_each_question_kind(questions):
    qs = [q for q in questions if not q.whole_input][:12]
    inputs = build_inputs(qs, _count, 8192, 1, multikey=True)
    kinds = {a.id: a.kind for j in inputs for a in j.asks}
    assert all(kinds[q.id] == q.kind for q in qs)
    assert {k for i, k in kinds.items() if i.startswith("multikey")} == {"multikey"}


def test_kinds_table_splits_accuracy_by_kind():
    rows = [{"model": "m", "policy": "full", "length": 8192, "input": i, "id": f"q{i}", "task": "qa",
             "heldout": False, "kind": k, "correct": ok, "resolved_policy": "full", "tokens": 10,
             "read_seconds": 1.0}
            for i, (k, ok) in enumerate([("lexical", True), ("lexical", False), ("absent", True)])]
    s = summary(rows)[0]["kinds"]
    assert [len(s[k]) for k in KINDS] == [2, 0, 0, 0, 1]
    assert kinds_table(rows) is not None
    assert kinds_table([{**r, "kind": None} for r in rows]) is None

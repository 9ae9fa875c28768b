"""The question set of `kvpot bench qa` (kvpot/bench/qa_set.json): its size and kinds on this machine,
the held-out third per kind, passages, references, candidates, absent things really absent, kinds by the
shared-word rule, and the generated questions regenerated from unchanged files."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

import pytest

from kvpot.bench.qa_changelog import parse
from kvpot.bench.qa_generate import KINDS, heldout_ids, pick_candidates, regenerate, shape_pattern
from kvpot.bench.qa_inputs import build_inputs, whole_inputs
from kvpot.bench.qa_questions import SET_PATH, Question, load_set, parse_set, source_sha256
from kvpot.bench.qa_score import normalize
from kvpot.bench.qa_sources import find_passage, passage_pattern, read_source
from kvpot.bench.qa_words import content_words, lexical_or_paraphrase, shared_words, subject_words

RAW = json.loads(SET_PATH.read_text(encoding="utf-8"))["questions"]
QS = parse_set()


def words(text: str) -> int:
    return len(text.split())


def _whole_words(haystack: str, needle: str) -> bool:
    n = normalize(needle)
    return bool(n) and f" {n} " in f" {normalize(haystack)} "


def test_set_holds_enough_of_each_kind_on_this_machine():
    loaded = load_set()
    assert loaded.notice() is None, loaded.notice()
    kinds = Counter(q.kind for q in loaded.questions)
    assert len(loaded.questions) >= 200
    assert kinds["whole"] >= 20 and kinds["absent"] >= 20
    assert set(kinds) == set(KINDS)
    assert len({q.id for q in QS}) == len(QS)


def test_a_third_of_each_kind_is_held_out_by_the_rule():
    for kind in KINDS:
        qs = [q for q in QS if q.kind == kind]
        share = sum(q.heldout for q in qs) / len(qs)
        assert 0.30 <= share <= 0.37, (kind, share)
    # the stored flags are the rule's: hand-written ones as marked, generated ones ranked by their id's hash
    assert {q["id"] for q in RAW if q["heldout"]} == heldout_ids(RAW)


def test_the_rule_keeps_hand_marked_questions_held_out_and_fills_with_generated_ones():
    qs = [{"id": f"h{i}", "kind": "lexical", "heldout": i == 0} for i in range(3)] + \
         [{"id": f"g{i}", "kind": "lexical", "sha256": "x"} for i in range(6)]
    held = heldout_ids(qs)
    assert "h0" in held and "h1" not in held and len(held) == 3
    assert held == heldout_ids(list(reversed(qs)))  # not the order: the ids


@pytest.mark.parametrize("q", QS, ids=lambda q: q.id)
def test_passages_references_and_candidates(q):
    text = read_source(q.source)
    assert text is not None
    for p in q.passages:
        assert find_passage(text, p) is not None, p
    if q.kind == "two-passage":
        assert len(q.passages) == 2 and q.passage == q.passages[0]
    elif q.kind == "whole":
        assert q.passages == () and q.answer
    else:
        assert len(q.passages) == 1
    if q.kind not in ("whole", "absent"):
        # the answer or an alias is in the first passage, and not merely in the question
        assert any(_whole_words(q.passage, r) and not _whole_words(q.question, r) for r in q.refs), q.refs
    for c in q.candidates:
        for r in q.refs:
            assert not _whole_words(c, r) and not _whole_words(r, c), (c, r)
    assert len(q.candidates) == len(set(q.candidates)) <= 50


@pytest.mark.parametrize("q", [q for q in QS if q.kind == "absent"], ids=lambda q: q.id)
def test_an_absent_question_asks_for_what_its_source_never_holds(q):
    text = read_source(q.source)
    assert q.answer == "" and q.aliases == ()
    assert q.absent and q.absent in q.question
    assert q.absent not in text
    if q.absent.isdigit():  # a bug number: never named as "#N" nor as a number anywhere
        assert not re.search(rf"(?<!\d){q.absent}(?!\d)", text)
    # while the things it is asked beside are there: its candidates are the source's own
    assert q.candidates and all(c in text for c in q.candidates)


def test_kinds_agree_with_the_shared_word_rule():
    for q in QS:
        if q.kind in ("lexical", "paraphrase"):
            assert q.kind == lexical_or_paraphrase(q.question, q.passages, q.source), \
                (q.id, shared_words(q.question, q.passages, q.source))
    kinds = Counter(q.kind for q in QS)
    assert kinds["paraphrase"] >= 20


def test_shared_word_rule():
    src = "{stdlib}/poplib.py"
    assert subject_words(src) == {"poplib"}
    assert shared_words("Who originally wrote poplib?", ["# Author: David Ascher"], src) == set()
    assert shared_words("Who is the poplib author?", ["# Author: David Ascher"], src) == {"author"}
    assert content_words("closes the bugs") == content_words("closed bug")  # an inflection is the same word
    deb = "/usr/share/doc/coreutils/changelog.Debian.gz"
    assert subject_words(deb) == {"coreutil"}
    assert lexical_or_paraphrase("Which coreutils upload went to unstable?", ["coreutils (9.1-1) unstable"], deb) == "lexical"
    assert lexical_or_paraphrase("Which coreutils upload?", ["coreutils (9.1-1) unstable"], deb) == "paraphrase"


def test_generated_questions_come_back_from_their_unchanged_files():
    by_source = defaultdict(list)
    for q in RAW:
        if "sha256" in q:
            by_source[q["source"]].append({k: v for k, v in q.items() if k != "heldout"})
    assert len(by_source) >= 20
    same = [s for s in by_source if source_sha256(s) == by_source[s][0]["sha256"]]
    if not same:
        pytest.skip("no generated question's file is the one it was generated from on this machine")
    for s in same:
        assert regenerate(s) == by_source[s], s


def test_whole_document_answers_match_a_plain_reading_of_the_file():
    # the changelog parser's counts against a plain count of header and trailer lines
    for q in QS:
        if q.kind != "whole" or source_sha256(q.source) != q.sha256:
            continue
        text = read_source(q.source)
        heads = re.findall(r"^\S+ \(([^)]+)\)", text, re.M)
        trailers = re.findall(r"^ -- (.+?) <", text, re.M)
        if q.id.endswith("-uploads"):
            assert q.answer == str(len(heads)) == str(len(parse(text)))
        elif q.id.endswith("-newest-version"):
            assert q.answer == heads[0]
        elif q.id.endswith("-oldest-version"):
            assert q.answer == heads[-1]
        elif q.id.endswith("-top-signer"):
            (top, n), (_, second) = Counter(t.strip() for t in trailers).most_common(2)
            assert q.answer == top and n > second


def test_a_changed_source_or_a_named_absent_thing_skips_the_question(tmp_path):
    data = json.loads(SET_PATH.read_text())
    whole = next(q for q in data["questions"] if q["kind"] == "whole")
    absent = next(q for q in data["questions"] if q["kind"] == "absent")
    whole["sha256"] = "0" * 64
    absent["absent"] = "Closes"  # a word every changelog holds
    path = tmp_path / "set.json"
    path.write_text(json.dumps(data))
    loaded = load_set(path)
    assert sorted(loaded.changed) == sorted([whole["id"], absent["id"]])
    assert "2 skipped" in loaded.notice()
    assert len(loaded.questions) == len(data["questions"]) - 2


def test_inputs_hold_both_passages_and_whole_documents_stand_alone():
    qs = load_set().questions
    inputs = build_inputs(qs, words, 8192, seed=1)
    by_id = {q.id: q for q in qs}
    asked = {a.id: j for j in inputs for a in j.asks if a.task == "qa"}
    assert not any(by_id[i].kind == "whole" for i in asked)
    for q in qs:
        if q.kind == "two-passage":
            for p in q.passages:
                assert passage_pattern(p).search(asked[q.id].text), (q.id, p)
        elif q.kind == "absent":
            assert q.absent not in asked[q.id].text.split(f"===== {q.source.replace('{stdlib}', 'Lib')} =====")[1]
    whole = whole_inputs(qs, words)
    sources = {q.source for q in qs if q.kind == "whole"}
    assert len(whole) == len(sources)
    for j in whole:
        src = next(by_id[a.id].source for a in j.asks)
        assert read_source(src).strip("\n") in j.text
        assert {a.id for a in j.asks} == {q.id for q in qs if q.kind == "whole" and q.source == src}
        assert all(a.depth == 0.0 for a in j.asks)


def test_a_question_made_as_before_keeps_working():
    q = Question("x", "/usr/share/common-licenses/GPL-3", "q?", "a", (), "Version 3", False)
    assert q.kind == "lexical" and q.passages == ("Version 3",) and q.candidates == () and not q.whole_input


def test_candidates_of_the_reference_shape():
    assert shape_pattern("San Francisco") is None  # a name: no computed candidates
    pat = shape_pattern("29 June 2007")
    assert pat.search("Version 3, 12 March 1999") and not pat.search("12 Foo 1999")
    assert [m.group(0) for m in shape_pattern("2.0.9").finditer("1.2.3 and 10.0.11, not 1.2")] == ["1.2.3", "10.0.11"]
    import random
    got = pick_candidates(["1.2", "1.2-3+b1", "1.3", "1.3"], ["1.2-3"], random.Random(0))
    assert got == ["1.3"]  # "1.2" is held by the reference, "1.2-3+b1" holds it

"""`kvpot bench qa`: the question set holds on this machine, scoring, the inputs' depths, a tiny real run."""

from __future__ import annotations

import json

import pytest

from kvpot.bench.process import peak_rss_since_reset_mb, reset_peak_rss
from kvpot.bench.qa_inputs import build_inputs, doc_tokens
from kvpot.bench.qa_questions import SET_PATH, load_set, parse_set
from kvpot.bench.qa_score import contains, exact, normalize
from kvpot.bench.qa_sources import find_passage, passage_pattern, strip_roff
from kvpot.errors import KvpotError


def words(text: str) -> int:  # a tokenizer stand-in: depth arithmetic is the builder's, not the model's
    return len(text.split())


def test_set_is_large_enough_with_a_third_held_out():
    qs = parse_set()
    assert len(qs) >= 60
    assert len({q.id for q in qs}) == len(qs)
    held = sum(q.heldout for q in qs)
    assert abs(held - len(qs) / 3) <= 1


def test_every_passage_is_in_its_file_on_this_machine():
    loaded = load_set()
    assert loaded.notice() is None, loaded.notice()
    assert len(loaded.questions) == len(parse_set())


@pytest.mark.parametrize("q", [q for q in parse_set() if q.kind not in ("whole", "absent")], ids=lambda q: q.id)
def test_each_answer_can_be_read_off_its_passage(q):
    # the answer, or one alias, appears in the quoted passage: a reference no one could derive is a bug
    assert any(contains(q.passage, [ref]) for ref in q.refs), (q.answer, q.passage)
    # and one that the question does not hold itself, which alone scores an answer (qa_score.contains)
    assert any(contains(q.passage, [ref], q.question) for ref in q.refs), (q.answer, q.question)


def test_a_question_whose_passage_is_gone_is_skipped_and_counted(tmp_path):
    data = json.loads(SET_PATH.read_text())
    data["questions"][0]["passage"] = "words no licence has ever held together"
    data["questions"][1]["source"] = "/nonexistent/kvpot-qa-source"
    path = tmp_path / "set.json"
    path.write_text(json.dumps(data))
    loaded = load_set(path)
    assert loaded.missing_passage == [data["questions"][0]["id"]]
    assert loaded.missing_file == [data["questions"][1]["id"]]
    assert len(loaded.questions) == len(data["questions"]) - 2
    assert "2 skipped" not in loaded.notice() and "1 skipped" in loaded.notice()


def test_normalize_and_scores():
    assert normalize("  Version 2.0.9!\n") == "version 2 0 9"
    assert exact("Mozilla Foundation.", ["Mozilla Foundation"])
    assert not exact("It is the Mozilla Foundation.", ["Mozilla Foundation"])
    assert contains("It is the Mozilla Foundation.", ["Mozilla Foundation"])
    assert contains("See section 13.", ["13"])
    assert not contains("It is 130.", ["13"])       # whole words: 13 is not in 130
    assert not contains("2.0.98", ["2.0.9"])
    assert contains("HIGHEST_PROTOCOL is 5", ["5", "five"])
    assert not contains("", ["5"]) and not contains("anything", [""])


def test_a_reference_the_question_holds_does_not_score_an_echo():
    q = "In GPL-3, for how many years at least must a written offer be valid?"
    echo = "According to the GPL-3, a written offer must be valid for at least 10 years."
    assert contains(echo, ["three", "3"])                 # without the question: "3" of "GPL-3" matches
    assert not contains(echo, ["three", "3"], q)
    assert contains("It must be valid for 3 years.", ["three", "3", "3 years"], q)  # "3 years" is not in q
    assert contains("For three years.", ["three", "3"], q)


def test_roff_stripper_keeps_the_words_in_order():
    src = '.\\" a comment\n.SH NAME\ngzip \\- compress\n.B gzip\nuses \\fBLZ77\\fR coding.\n.BR "\\&.gz" ,\n'
    text = strip_roff(src)
    assert "comment" not in text
    assert find_passage(text, "NAME gzip - compress gzip uses LZ77 coding. .gz,")


@pytest.mark.parametrize("length", [8192, 32768])
def test_builder_puts_each_passage_at_its_depth(length):
    qs = load_set().questions
    inputs = build_inputs(qs, words, length, seed=3)
    asked = [a.id for j in inputs for a in j.asks if a.task == "qa"]
    assert sorted(asked) == sorted(q.id for q in qs if not q.whole_input)  # every question once (whole: alone)
    passages = {q.id: q.passage for q in qs}
    for j in inputs:
        assert abs(j.tokens - doc_tokens(length)) <= doc_tokens(length) * 0.05
        for a in j.asks:
            # the recorded depth is where the passage really starts (computed from the text)
            needle = passages[a.id] if a.task == "qa" else a.question.split("for the ")[1].rstrip("?")
            starts = [m.start() for m in passage_pattern(needle).finditer(j.text)]
            assert starts
            # (two questions on one file may share an excerpt: then one of the copies is there)
            assert min(abs(words(j.text[:at]) / j.tokens - a.depth) for at in starts) < 0.02
            # and near the depth asked for: within a distractor piece or two (~400 words at most)
            assert abs(a.depth - a.target_depth) <= 2 * 400 / j.tokens + 0.01, (a.id, a.depth, a.target_depth)
    depths = [a.depth for j in inputs for a in j.asks]
    assert min(depths) < 0.2 and max(depths) > 0.8  # varied depths
    sources = [[q.source for q in qs if q.id in {a.id for a in j.asks}] for j in inputs]
    assert all(len(set(s)) == len(s) for s in sources)  # one excerpt per file in an input
    again = build_inputs(qs, words, length, seed=3)
    assert [j.text for j in again] == [j.text for j in inputs]  # deterministic from the seed
    assert build_inputs(qs, words, length, seed=4)[0].text != inputs[0].text


def test_multikey_needles_and_distractors_are_in_each_input():
    inputs = build_inputs(load_set().questions[:6], words, 8192, seed=0)
    for j in inputs:
        mk = [a for a in j.asks if a.task == "multikey"]
        assert len(mk) == 1 and len(mk[0].distractors) == 3
        for key in (*mk[0].refs, *mk[0].distractors):
            assert key in j.text


def test_tiny_run_writes_every_case_and_resume_skips_them(smollm2_cut_path, tmp_path):
    from kvpot.bench.qa import Plan, case_key, run

    qs = load_set().questions[:2]
    plan = Plan(model=str(smollm2_cut_path), policies=["full"], lengths=[512], group=2, multikey=False)
    seen: list[dict] = []
    lines: list[str] = []
    results = run(plan, qs, on_case=seen.append, on_read=lines.append)
    assert len(results) == len(seen) == 2 and {r["id"] for r in results} == {q.id for q in qs}
    # how far the one reading got, after each chunk, up to every token it read
    assert lines and all(line.startswith("full 512, input 1: read ") for line in lines), lines
    assert f"read {results[0]['tokens']:,} of ~" in lines[-1] and "tok/s, 0 compactions" in lines[-1], lines
    for r in results:
        for key in ("id", "length", "depth", "policy", "answer", "correct", "exact", "read_tok_s", "read_seconds",
                    "answer_seconds", "heldout"):
            assert key in r, key
        assert r["resolved_policy"] == "full" and r["tokens"] > 200 and r["input"] == 0
        assert isinstance(r["answer"], str) and isinstance(r["correct"], bool)
    json.dumps(results)  # the JSON the command writes
    assert len({r["read_seconds"] for r in results}) == 1  # one read, both questions asked of it
    if reset_peak_rss():  # the reading's own peak: at least the weights it read through (tied head: all of them)
        assert all(r["peak_rss_mib"] >= 0.8 * smollm2_cut_path.stat().st_size / 2**20 for r in results), results
    again: list[dict] = []
    assert run(plan, qs, done=results, on_case=again.append) == results and again == []
    # a case missing from the file is the only one run again
    rerun: list[dict] = []
    out = run(plan, qs, done=results[:1], on_case=rerun.append)
    assert [r["id"] for r in rerun] == [results[1]["id"]]
    assert {case_key(r) for r in out} == {case_key(r) for r in results}


def test_question_before_reads_full_attention_per_question_with_it_before(smol, smollm2_cut_path):
    """`--per-question --question-before` reads as `kvpot ask --question-before on`: full attention too is
    read once per question, each with its question before the document (its tokens on top of the plain
    read's); `--only` asks the questions named, of the inputs the whole set builds, and refuses an id none holds."""
    from kvpot.bench.qa import Plan, run
    from kvpot.session.prompting import question_before

    qs = load_set().questions[:2]
    # question first without it: full attention reads the input once and asks both questions of it
    plain = run(Plan(model=str(smollm2_cut_path), policies=["full"], lengths=[512], group=2, multikey=False,
                     per_question=True), qs)
    assert len({r["read_seconds"] for r in plain}) == 1 and all(r["question_before"] is False for r in plain)
    plan = Plan(model=str(smollm2_cut_path), policies=["full"], lengths=[512], group=2, multikey=False,
                per_question=True, only=(qs[1].id,), question_before=True)
    out = run(plan, qs, done=plain)  # the same file: its plain reading is not this one, so nothing is copied
    first = [r for r in out if r["question_before"]]
    assert [r["id"] for r in first] == [qs[1].id] and "same_reading_as" not in first[0]
    extra = sum(len(smol.tokenize(seg.text)) for seg in question_before(qs[1].question))
    assert first[0]["tokens"] == plain[0]["tokens"] + extra
    with pytest.raises(KvpotError, match="--only: no question nope in these inputs"):
        run(Plan(model=str(smollm2_cut_path), policies=["full"], lengths=[512], group=2, multikey=False, only=("nope",)), qs)


def test_a_case_asked_with_another_prompt_is_asked_again(smol, smollm2_cut_path):
    """--resume never mixes answers to another prompt (an older kvpot's framing) into a table."""
    from kvpot.bench.qa import Plan, case_key, run
    from kvpot.session.prompting import choose_format, question_frame

    qs = load_set().questions[:2]
    plan = Plan(model=str(smollm2_cut_path), policies=["full"], lengths=[512], group=2, multikey=False)
    results = run(plan, qs)
    frame = question_frame(choose_format(smol))
    assert "Question: {question}" in frame and all(r["frame"] == frame for r in results)
    older = [{**results[0], "frame": "\n\n{question}", "answer": "old"}, results[1]]
    redo: list[dict] = []
    out = run(plan, qs, done=older, on_case=redo.append)
    assert [case_key(r) for r in redo] == [case_key(results[0])]
    assert redo[0]["frame"] == frame and redo[0]["answer"] == results[0]["answer"]  # greedy: the same answer
    assert sorted(case_key(r) for r in out) == sorted(case_key(r) for r in results)
    assert all(r["frame"] == frame for r in out)


def test_a_spec_that_resolves_to_a_reading_already_made_copies_its_answers(smollm2_cut_path, monkeypatch):
    """`-P full -P default` on an input that fits: default is full attention too, so the input is read
    once and default's cases are full's answers, marked as such; a pot spec still reads on its own."""
    from kvpot.bench.qa import Plan, run
    from kvpot.session.session import Session

    reads = []
    real_read = Session.read
    monkeypatch.setattr(Session, "read", lambda self, *a, **k: (reads.append(self.policy_spec), real_read(self, *a, **k))[1])
    qs = load_set().questions[:2]
    plan = Plan(model=str(smollm2_cut_path), policies=["full", "default", "streaming"], lengths=[512], group=2,
                multikey=False, budget=256)
    results = run(plan, qs)
    by = {p: {r["id"]: r for r in results if r["policy"] == p} for p in plan.policies}
    assert reads == ["full", "streaming"]
    assert set(by["default"]) == set(by["full"]) == {q.id for q in qs}
    for qid, r in by["default"].items():
        assert r["same_reading_as"] == "full" and r["resolved_policy"] == "full"
        assert r["answer"] == by["full"][qid]["answer"] and r["correct"] == by["full"][qid]["correct"]
    assert all("same_reading_as" not in r for r in (*by["full"].values(), *by["streaming"].values()))


def test_cli_refuses_resume_without_a_results_file(smollm2_cut_path, tmp_path):
    from conftest import assert_one_line_error, run_cli

    res = run_cli("bench", "qa", "-m", str(smollm2_cut_path), "-P", "full", "--resume")
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "--resume needs --json")
    niah = tmp_path / "niah.json"
    niah.write_text(json.dumps([{"policy": "full", "length": 8192, "depth": 0.5, "seed": 0}]))
    res = run_cli("bench", "qa", "-m", str(smollm2_cut_path), "-P", "full", "--resume", "--json", str(niah))
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "is not a `bench qa` results file")


def test_cli_unknown_policy_names_the_specs_only_bench_qa_takes(smollm2_cut_path):
    from conftest import assert_one_line_error, run_cli

    from kvpot.bench.qa import CLOSED, DEFAULT

    res = run_cli("bench", "qa", "-m", str(smollm2_cut_path), "-P", "nonsense")
    assert res.returncode != 0
    assert_one_line_error(res.stderr, "unknown policy 'nonsense'")
    assert f"also takes {DEFAULT}" in res.stderr and f"and {CLOSED} (closed book)" in res.stderr


def test_cli_resume_replaces_a_case_asked_with_another_prompt(smollm2_cut_path, tmp_path):
    from conftest import run_cli

    out = tmp_path / "qa.json"
    args = ("bench", "qa", "-m", str(smollm2_cut_path), "-P", "full", "--length", "512", "--limit", "1", "--no-multikey",
            "--no-closed-book", "--json", str(out), "--resume")
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    first = json.loads(out.read_text())
    assert "full 512, input 1: read " in res.stderr and " tok/s, " in res.stderr  # a line in a log: the first at once
    assert len(first) == 1
    # each case says how it was made: the command, kvpot's commit and the CPU (docs/benchmarks.md cites them)
    made = first[0]["recorded"]
    assert made["command"].split()[-1] == "--resume" and made["commit"] and made["cpu"], made
    out.write_text(json.dumps([{**first[0], "frame": "\n\n{question}", "answer": "old"}]))
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    again = json.loads(out.read_text())
    assert len(again) == 1 and again[0]["frame"] == first[0]["frame"] and again[0]["answer"] == first[0]["answer"]


def test_closed_book_asks_each_question_after_a_document_that_holds_nothing(smollm2_cut_path, tmp_path):
    """`-P none`: the same questions and frame with no input read; its answers are what a Session that
    read only the no-document line answers, computed here apart."""
    from kvpot.bench.qa import CLOSED, MAX_TOKENS, NO_DOCUMENT, Plan, _settings, run
    from kvpot.ingest import collect_sources
    from kvpot.models.resolve import resolve_model
    from kvpot.session.session import Session

    qs = load_set().questions[:2]
    plan = Plan(model=str(smollm2_cut_path), policies=[CLOSED, "full"], lengths=[512], group=2, multikey=False)
    results = run(plan, qs)
    closed = {r["id"]: r for r in results if r["policy"] == CLOSED}
    full = {r["id"]: r for r in results if r["policy"] == "full"}
    assert set(closed) == set(full) == {q.id for q in qs}
    assert all(r["resolved_policy"] == CLOSED and "same_reading_as" not in r for r in closed.values())
    assert all(r["tokens"] < 16 < 200 < full[i]["tokens"] for i, r in closed.items())
    facts, known = resolve_model(str(smollm2_cut_path))
    nodoc = tmp_path / "nodoc.txt"
    nodoc.write_text(NO_DOCUMENT, encoding="utf-8")
    settings = _settings(plan, facts, known, "full", nodoc)[0].settings  # the reference's session is built apart
    for q in qs:
        with Session(facts, facts.name, settings, resettable=False) as s:
            s.read(collect_sources([str(nodoc)]))
            answer = "".join(s.ask(q.question, max_tokens=MAX_TOKENS)).strip()
        assert closed[q.id]["answer"] == answer


def test_table_keeps_reads_per_question_and_closed_book_apart():
    """A policy read once per input and the same policy read per question are two lines; closed book reads
    no input, so it shows no reading speed."""
    from kvpot.bench.qa import CLOSED
    from kvpot.bench.qa_report import summary

    def case(policy, per_question, correct, qid):
        return {"model": "m", "policy": policy, "length": 49152, "per_question": per_question, "input": 0,
                "task": "qa", "heldout": False, "id": qid, "correct": correct, "exact": False,
                "resolved_policy": "full" if policy == CLOSED else policy, "tokens": 48000, "read_seconds": 400.0}

    rows = [case("infinipot", False, False, "a"), case("infinipot", False, True, "b"),
            case("infinipot", True, True, "a"), case("infinipot", True, True, "b"), case(CLOSED, False, True, "a")]
    lines = summary(rows)
    assert [(s["policy"], s["per_question"]) for s in lines] == [("infinipot", False), ("infinipot", True), (CLOSED, False)]
    assert [sum(r["correct"] for r in s["tuning"]) for s in lines] == [1, 2, 1]
    assert lines[0]["tok_s"] == 120.0 and lines[2]["tok_s"] is None


def test_peak_rss_resets_to_what_the_process_holds_now():
    """bench qa measures each reading in one process: the peak after a reset is the peak since it."""
    import numpy as np

    if not reset_peak_rss():
        pytest.skip("this system cannot reset a process's peak RSS (/proc/self/clear_refs)")
    before = peak_rss_since_reset_mb()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB, every page written
    assert peak_rss_since_reset_mb() >= before + 60
    del block
    assert reset_peak_rss() and peak_rss_since_reset_mb() < before + 32


def test_budget_lines_count_a_shared_reading_once():
    """studies.qa_budget: one line per method as it read, one point per budget; `-P default` resolved to
    a policy joins that policy's line, a reading two specs share counts once, and a reading per question
    is a reading each."""
    from kvpot.bench.qa import CLOSED
    from studies.qa_budget import points, table

    def case(policy, resolved, budget, qid, correct, per_question=False, secs=100.0, peak=None, task="qa"):
        return {"model": "m", "policy": policy, "resolved_policy": resolved, "budget": budget, "length": 49152,
                "input": 0, "id": qid, "task": task, "correct": correct, "per_question": per_question,
                "tokens": 10_000, "read_seconds": secs, "peak_rss_mib": peak}

    cases = [case("infinipot", "infinipot", 2048, "a", True, peak=900.0),
             case("infinipot", "infinipot", 2048, "k", False, task="multikey", peak=900.0),
             case("default", "infinipot", 2048, "a", True, peak=900.0),  # the same reading, named twice
             case("default", "infinipot", 8192, "a", False, secs=200.0),
             case("infinipot", "infinipot", 2048, "a", True, per_question=True, secs=50.0, peak=950.0),
             case("infinipot", "infinipot", 2048, "b", False, per_question=True, secs=150.0, peak=1000.0),
             case(CLOSED, CLOSED, 7, "a", False, secs=0.1)]
    lines = points(cases)[("m", 49152)]
    assert set(lines) == {CLOSED, "infinipot", "infinipot, question first"}
    assert lines["infinipot"][2048] == {"right": 1, "asked": 1, "multikey": 0, "multikey_asked": 1,
                                        "tok_s": 100.0, "peak_rss_mib": 900.0, "reads": 1}
    assert lines["infinipot"][8192]["tok_s"] == 50.0 and lines["infinipot"][8192]["peak_rss_mib"] is None
    first = lines["infinipot, question first"][2048]
    assert (first["reads"], first["right"], first["asked"], first["tok_s"], first["peak_rss_mib"]) == (2, 1, 2, 100.0, 1000.0)
    assert lines[CLOSED][7]["tok_s"] is None
    assert "| m | 49,152 | infinipot | 8,192 | 0/1 | 0/0 | 50 | - |" in table(points(cases)).splitlines()


def test_budget_plot_refuses_what_is_not_bench_qa_json_in_one_line(tmp_path, capsys):
    from studies.qa_budget import main

    bad = tmp_path / "bad.json"
    for text in ("{}", "not json", '[{"answer": "x"}]'):
        bad.write_text(text)
        with pytest.raises(SystemExit) as e:
            main([str(bad), "--png", str(tmp_path / "p.png")])
        assert e.value.code == 2 and str(bad) in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


def test_reading_lines_in_a_log_come_at_most_once_a_minute(monkeypatch):
    """`bench qa` hears every chunk of a reading; in a log it says one line a minute (the first at once)."""
    from cli import _common

    now = [0.0]
    monkeypatch.setattr(_common.time, "monotonic", lambda: now[0])
    said: list[str] = []
    update = _common.at_most_every(60.0, said.append)
    for t in (1000.0, 1030.0, 1059.9, 1060.0, 1119.0, 1125.0):
        now[0] = t
        update(f"at {t}")
    assert said == ["at 1000.0", "at 1060.0", "at 1125.0"]


def test_locator_reads_once_and_answers_each_question_from_its_own_focused_read(smollm2_cut_path):
    """`--locator keys` (as `kvpot chat` past the pot): one read of each input, then per question the passages the
    locator found, read again with full attention; the windows read are the ones the locator's mass ranks into
    (recomputed here from the same session), and nothing of an earlier question stays for the next."""
    from kvpot.bench.qa import Plan, run

    qs = load_set().questions[:3]
    plan = Plan(model=str(smollm2_cut_path), policies=["infinipot"], lengths=[2048], group=3, multikey=False,
                budget=256, focus=True, locator="keys")
    out = run(plan, qs)
    assert {r["id"] for r in out} == {q.id for q in qs}
    assert len({r["read_seconds"] for r in out}) == 1  # one read asked every question
    for r in out:
        assert r["locator"] == "keys" and r["focus"] is True and r["compactions"] > 0, r
        assert r["focus_spans"] and r["focus_tokens"] > 0 and r["locate_seconds"] >= 0, r
        assert all(0 <= a < b <= 1 for a, b in r["focus_spans"]), r
    # a different question ranks the passages differently: the locator is not one fixed ranking
    assert len({tuple(tuple(p["at"]) for p in r["focus_ranked"]) for r in out}) > 1, [r["focus_ranked"] for r in out]

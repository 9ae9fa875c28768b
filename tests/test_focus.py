"""The focused read (kvpot.session.focus): the passages the pot's answer drew on, read again with full attention.

The pieces without a model (spans, windows, the focused text's offsets), then `kvpot ask` on the cut SmolLM2
against references from the same run: the focused answer is the answer a full-attention read of the same
passages gives, and the pot's own answer is the one `--no-focus` prints."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app
from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources
from kvpot.locator.sources import SourceMap
from kvpot.session.beyond_window import Asking
from kvpot.session.focus import LINE_REACH, FocusText, Window, spans, windows

runner = CliRunner()


def one_char_map(sources) -> SourceMap:
    """A source map of the sources' text with one token per character (what Session.read records, at the
    resolution of its offsets), its marks the ones reading recorded."""
    text = "".join(sources.pieces())
    smap = SourceMap()
    smap.add(0, 0, len(text), [0] * len(text), lambda t: b"x")
    smap.marks = list(sources.marks)
    return smap, text


@pytest.fixture
def numbered(tmp_path):
    path = tmp_path / "numbered.txt"
    path.write_text("".join(f"line number {i:04d} of the test file\n" for i in range(1, 2001)))
    return path


def test_spans_cover_the_mass_widened_merged_and_in_order(numbered):
    smap, text = one_char_map(collect_sources([str(numbered)]))
    mass = {p: 1.0 for p in (30_000, 30_005, 30_010)} | {p: 0.5 for p in (5_000, 5_003)} | {30_150: 0.2}
    got = spans(mass, smap, sinks=4, passages=3, reach=100)
    assert got == sorted(got) and all(a < b <= c for (a, b), (c, _) in zip(got, got[1:]))  # ordered, disjoint
    for p in mass:  # each position with mass lies in a span, at least `reach` from its ends
        assert any(lo + 100 <= p < hi - 100 + 24 for lo, hi in got), (p, got)
    # 30,000-30,010 and 30,150 are within two reaches of each other: one span
    assert len(got) == 2


def test_windows_are_the_inputs_text_to_whole_lines_with_their_line(numbered):
    sources = collect_sources([str(numbered)])
    smap, _ = one_char_map(sources)
    text = numbered.read_text()
    wanted = [(1_000, 1_500), (40_013, 41_000)]
    got = windows(collect_sources([str(numbered)]), smap, wanted)
    for (lo, hi), w in zip(wanted, got):
        assert w.text == text[w.start:w.end]
        assert w.start <= lo and hi <= w.end <= hi + LINE_REACH
        assert w.start == 0 or text[w.start - 1] == "\n"  # whole lines
        assert text[w.end] == "\n"
        assert w.where == f"line {text.count(chr(10), 0, w.start) + 1:,}" and w.source == str(numbered)


def test_windows_inside_a_long_line_say_the_column_they_start_at(tmp_path):
    """A one-line log or a minified file: every passage is in one line spanning many pieces, so the line
    alone would name them all alike; the column is counted from the line's start, pieces earlier, and
    each file's lines from the file's own start (the first file does not end with a newline)."""
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_text("header\n" + "".join(f"event {i:06d} ok; " for i in range(40_000)))  # line 2: ~700K chars
    second.write_text("".join(f"row {i:06d}, " for i in range(40_000)))  # line 1 of its file: ~480K chars
    sources = collect_sources([str(first), str(second)])
    smap, text = one_char_map(sources)
    assert sources.marks[-1].offset > 0  # the two files' text is joined: the second's columns start after the first
    line2 = text.index("header\n") + len("header\n")
    into_second = text.index("row 000000")
    head = text.index("header")
    wanted = [(head + 2, head + 4), (line2 + 123_457, line2 + 124_000), (into_second + 301_233, into_second + 302_000)]
    got = windows(collect_sources([str(first), str(second)]), smap, wanted)
    # a window near a line's start is widened to it and needs no column
    assert [w.where for w in got] == ["line 1", "line 2 col 123,458", "line 1 col 301,234"]
    assert [w.source for w in got] == [str(first), str(first), str(second)]
    assert all(w.text == text[w.start:w.end] for w in got)


def test_windows_of_a_changed_file_are_refused(numbered, tmp_path):
    smap, _ = one_char_map(collect_sources([str(numbered)]))
    numbered.write_text("shorter\n" * 30_000)  # other lines: the places recorded are not this text's
    with pytest.raises(KvpotError, match="changed since they were read"):
        windows(collect_sources([str(numbered)]), smap, [(100_000, 100_400)])


def test_windows_of_a_file_rewritten_at_the_same_length_are_refused(numbered):
    """The places match, the text does not: the map's digests of what was read catch it, so the focused
    read never reads text the model did not read as if it had."""
    sources = collect_sources([str(numbered)])
    text = "".join(sources.pieces())
    smap = SourceMap()
    smap.add(0, 0, len(text), [0] * len(text), lambda t: b"x", text=text)
    smap.marks = list(sources.marks)
    assert windows(collect_sources([str(numbered)]), smap, [(40_013, 41_000)])  # unchanged: read again
    changed = numbered.read_text().replace("line number 1177 ", "line NUMBER 1177 ")
    numbered.write_text(changed)
    far = windows(collect_sources([str(numbered)]), smap, [(100, 400)])  # a passage away from the change
    assert far[0].text == changed[far[0].start:far[0].end]
    with pytest.raises(KvpotError, match="changed since it was read"):
        windows(collect_sources([str(numbered)]), smap, [(40_013, 41_000)])


def test_focused_text_maps_back_to_the_inputs_offsets(numbered):
    text = numbered.read_text()
    wins = [Window(a, b, str(numbered), "line ?", text[a:b]) for a, b in ((0, 500), (9_000, 9_800), (50_000, 50_100))]
    ft = FocusText.of(wins, [str(numbered)])
    joined = "".join(ft.pieces())
    assert ft.sources[0].size == len(joined.encode()) and "".join(ft.counter().pieces()) == joined
    assert [m.offset for m in ft.marks] == [joined.index(w.text) for w in wins]
    for off in range(0, len(joined), 37):
        if ft.in_heading(off):
            assert joined[off] in "\n= " or joined[off].isalnum() or joined[off] in "/.,_-?"
        else:
            assert joined[off] == text[ft.input_offset(off)]
    assert not ft.in_heading(0)  # the first passage has no heading
    assert ft.in_heading(len(wins[0].text) + 3)


def test_the_focus_line_counts_the_passages_located_and_says_where_they_were_joined(numbered):
    from kvpot.api.focusing import Focus, focus_line
    from kvpot.session.focus import Located

    text = numbered.read_text()
    wins = [Window(a, b, str(numbered), f"line {a // 37 + 1}", text[a:b]) for a, b in ((0, 500), (9_000, 9_800))]
    located = Located("", {}, 0, locator="bm25")
    passages = [{"source": str(numbered), "where": w} for w in ("line 3", "line 5", "line 250")]
    line = focus_line(Focus(FocusText.of(wins, [str(numbered)]), None, located, {}, passages))
    # three passages, best first as --sources numbers them, held by two stretches of text
    assert line.startswith("3 passages found (") and "2 stretches of text" in line, line
    assert line.endswith(f"{numbered} line 3, line 5, line 250"), line
    one = focus_line(Focus(FocusText.of(wins, [str(numbered)]), None, located, {}, passages[:2]))
    assert "joined" not in one, one  # as many stretches as passages: nothing to explain
    # the focused read's own input names no count that could contradict the line
    assert FocusText.of(wins, [str(numbered)]).sources[0].name == f"passages of {numbered}"


# -- kvpot ask, the cut SmolLM2 ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fast(smollm2_cut_path):
    return ["--model", str(smollm2_cut_path), "--chunk", "128", "-n", "12", "--prompt-format", "completion",
            "--threads", "2", "--json"]


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    text, question, _ = logbook(n_entries=40)
    path = tmp_path_factory.mktemp("doc") / "logbook.txt"
    path.write_text(text)
    return path, question


def _ask(*args: str, input: str | None = None) -> tuple[dict, str]:
    res = runner.invoke(app, ["ask", *args], input=input)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), res.stderr


def test_the_focused_answer_is_a_full_read_of_its_passages_and_the_pot_answer_is_no_focus(doc, fast, tmp_path):
    path, question = doc
    out, err = _ask(str(path), question, "-P", "infinipot", "--budget", "512", *fast)
    focus = out["focus"]
    assert "focus:" in err and out["policy"] == "infinipot" and out["compactions"] > 0
    assert out["inputs"]["read"] == [str(path)] and focus["passages"] and focus["tokens_read"] < out["tokens_read"]
    # the same passages, headed the same way, in a file read with full attention: the same answer
    text = path.read_text()
    wins = [Window(p["start"], p["end"], p["source"], p["where"], text[p["start"]:p["end"]]) for p in focus["passages"]]
    same = tmp_path / "passages.txt"
    same.write_text("".join(FocusText.of(wins, [str(path)]).pieces()))
    full, _ = _ask(str(same), question, "-P", "full", *fast)
    assert full["tokens_read"] == focus["tokens_read"]
    assert out["answer"] == full["answer"]
    # the pot's own answer (48 tokens) goes on from --no-focus's (12)
    plain, err = _ask(str(path), question, "-P", "infinipot", "--budget", "512", "--no-focus", *fast)
    assert "focus" not in plain and "focus:" not in err
    assert focus["pot_answer"].startswith(plain["answer"])


def test_no_focus_where_nothing_was_left_out_or_the_input_was_a_pipe(doc, fast):
    path, question = doc
    out, err = _ask(str(path), question, *fast)  # fits: full attention
    assert "focus" not in out and out["policy"].startswith("full") and "focus:" not in err
    out, err = _ask("-", question, "-P", "infinipot", "--budget", "512", *fast, input=path.read_text())
    assert "focus" not in out and "cannot be read again" in err


def test_bench_qa_focus_records_the_pot_answer_as_the_unfocused_run_gives_it(smollm2_cut_path):
    from kvpot.bench.qa import Plan, run
    from kvpot.bench.qa_questions import load_set

    qs = load_set().questions
    common = dict(model=str(smollm2_cut_path), policies=["infinipot"], lengths=[2048], group=2, limit=2,
                  per_question=True, budget=512, multikey=False)
    plain = {r["id"]: r for r in run(Plan(**common), qs)}
    focused = run(Plan(**common, focus=True), qs)
    assert focused and all(r["focus"] for r in focused)
    for r in focused:
        assert r["pot_answer"] == plain[r["id"]]["answer"] and r["compactions"] == plain[r["id"]]["compactions"]
        assert 0 < r["focus_tokens"] <= r["tokens"] and r["focus_passages"] >= 1
        spans_read = r["focus_spans"]  # shares of the input, one per passage, in order and apart
        assert len(spans_read) == r["focus_passages"] and all(0 <= a < b <= 1 for a, b in spans_read)
        assert all(b <= c for (_, b), (c, _) in zip(spans_read, spans_read[1:]))
        # the ranked passages, best first, are what the spans read merge (widened to lines: within 1 %)
        ranked = r["focus_ranked"]
        shares = [p["share"] for p in ranked]
        assert ranked and shares == sorted(shares, reverse=True) and sum(shares) <= 1.0001
        assert all(any(a - 0.01 <= lo and hi <= b + 0.01 for a, b in spans_read) for lo, hi in (p["at"] for p in ranked))
        refs = {q.id: set(q.refs) for q in qs}[r["id"]]
        assert all(set(p["refs"]) <= refs and not p["distractors"] for p in ranked)


def test_bench_qa_records_the_pot_answer_where_the_focused_read_is_refused(smollm2_cut_path, monkeypatch):
    from kvpot.bench import qa
    from kvpot.bench.qa_questions import load_set

    def refused(session, located):
        raise KvpotError("the answer from memory drew on no passage of the input")

    monkeypatch.setattr(qa, "focus_for", refused)
    common = dict(model=str(smollm2_cut_path), policies=["infinipot"], lengths=[2048], group=2, limit=1,
                  per_question=True, budget=512, multikey=False)
    plain = {r["id"]: r for r in qa.run(qa.Plan(**common), load_set().questions)}
    for r in qa.run(qa.Plan(**common, focus=True), load_set().questions):
        assert r["focus_refused"].startswith("the answer from memory") and r["answer"] == plain[r["id"]]["answer"]
        assert "focus_tokens" not in r


def test_ask_sizes_its_pot_for_the_focused_read_only_where_one_can_happen(doc, fast, monkeypatch):
    """`kvpot ask` plans its reading knowing whether the focused read will answer (files, --focus): the pot a
    model measured that way is for that case alone (kvpot.session.beyond_window); a pipe or --no-focus plans as
    the pot answering. The plan itself is tested in test_auto_budget."""
    from kvpot.api import plan as _plan

    planned: list[dict] = []

    def plan_reading(*args, **kw):
        planned.append(kw)
        raise KvpotError("planned")  # said as any refusal is: one line, nothing read

    monkeypatch.setattr(_plan, "plan_reading", plan_reading)
    path, question = doc
    for args, input in (([str(path)], None), ([str(path), "--no-focus"], None), (["-"], path.read_text())):
        res = runner.invoke(app, ["ask", *args[:1], question, *args[1:], *fast], input=input)
        assert res.exit_code == 1 and "planned" in res.output
    assert [p["asking"] for p in planned] == [Asking.FOCUSED, Asking.FIRST, Asking.FIRST]

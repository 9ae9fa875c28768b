"""`--sources` and `--json`: the passage an answer drew on, mapped back to its file and line, through
every policy that keeps the passage, and through a saved context."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app
from kvpot.ingest.sources import Mark
from kvpot.locator.sources import GROUP, PASSAGE_TOKENS, SINK_TOKENS, SPIKE, SourceMap, rank

runner = CliRunner()
QUESTION = "What is the code of the strongbox?"
FAST = ["--model", "smollm2-135m", "--chunk", "128", "-n", "12", "--prompt-format", "completion", "--threads", "2"]
# budgets that keep the fact (about 1,800 tokens are read): full attention keeps all; InfiniPot keeps 1024
# ranked by the question (CaP-Q); InfLLM fetches the fact's blocks by the question's queries; Locret
# keeps 1024 by trained importance; SnapKV ranks by each chunk's last rows, which never see the question,
# so at 1024 it drops the fact (measured) and keeps it at 1536. StreamingLLM and truncation keep the
# ends only: the fact halfway is evicted, so no source can be found.
POLICIES = [("full", "4096"), ("infinipot", "1024"), ("snapkv", "1536"), ("infllm", "1024"), ("locret", "1024")]


# -- the map, without a model -----------------------------------------------------------------------

def test_offsets_are_exact_at_every_group_and_between_them_interpolated():
    smap = SourceMap()
    tokens = list(range(3 * GROUP + 5))
    width = {t: 1 + t % 3 for t in tokens}  # characters each token spells
    smap.add(10, 100, sum(width.values()), tokens, lambda t: b"x" * width[t])
    starts = 100 + np.concatenate([[0], np.cumsum([width[t] for t in tokens])])
    for i in range(0, len(tokens), GROUP):
        assert smap.offset(10 + i) == starts[i]
    assert smap.offset(9) is None and smap.offset(10 + len(tokens)) is None
    assert abs(smap.offset(10 + GROUP + 7) - starts[GROUP + 7]) <= 2 * 7


def test_utf8_tokens_count_characters_not_bytes():
    smap = SourceMap()
    smap.add(0, 0, 2 * GROUP, [1] * GROUP + [2] * GROUP, {1: "é".encode(), 2: b"a"}.get)
    assert smap.offset(GROUP) == GROUP


def test_rank_skips_sinks_and_finds_the_heaviest_run():
    smap = SourceMap()
    smap.add(0, 0, 1000, list(range(1000)), lambda t: b"x")
    mass = {p: 0.01 for p in range(1000)}
    mass[0] = mass[1] = 50.0                       # sinks
    for p in range(500, 510):
        mass[p] = 1.0                              # the passage
    mass[2000] = 99.0                              # not a document token (the question)
    (p0, p1, share), *_ = rank(mass, smap)
    assert p0 <= 500 and 510 <= p1 and p1 - p0 == PASSAGE_TOKENS
    doc = sum(m for p, m in mass.items() if SINK_TOKENS <= p < 1000)
    assert share == pytest.approx(sum(mass[p] for p in range(p0, p1)) / doc)
    # a policy's own sinks (InfLLM's initial tokens) are left out too
    for p in range(10, 30):
        mass[p] = 5.0
    assert rank(mass, smap)[0][0] < 30
    (p0, p1, _), *_ = rank(mass, smap, sinks=32)
    assert p0 <= 500 and 510 <= p1


def test_a_saved_map_reads_back_and_a_broken_one_is_refused():
    smap = SourceMap()
    smap.add(3, 0, 500, list(range(200)), lambda t: b"abc")
    smap.marks = [Mark(0, "a.txt", "line 1")]
    again = SourceMap.from_header(json.loads(json.dumps(smap.to_header())))
    assert [again.offset(p) for p in range(250)] == [smap.offset(p) for p in range(250)]
    assert again.marks == smap.marks
    bad = smap.to_header() | {"pos": list(reversed(smap.to_header()["pos"]))}
    from kvpot.errors import KvpotError
    with pytest.raises(KvpotError):
        SourceMap.from_header(bad)


def test_a_passage_across_many_short_pages_is_quoted(tmp_path):
    """A passage that crosses three or more pieces (short PDF pages) is found and quoted whole."""
    from docmaker import write_pdf

    from kvpot.ingest import collect_sources
    from kvpot.locator.sources import Passage, quote

    pages = [[f"page{i} alpha{i} beta{i}"] for i in range(1, 13)]
    path = write_pdf(tmp_path / "short.pdf", pages)
    text = collect_sources([str(path)])
    joined = "".join(text.pieces())
    smap = SourceMap(end_char=len(joined), marks=list(text.marks))
    assert [m.where for m in text.marks] == [f"p. {i}" for i in range(1, 13)]   # one piece a page
    start, end = joined.index("alpha4"), joined.index("beta8") + len("beta8")  # pages 4 to 8
    assert sum(start <= m.offset < end for m in text.marks) >= 3
    early = joined.index("alpha2"), joined.index("page3") + len("page3")       # two pages, as before
    got, two = quote([Passage(str(path), "p. 4", start, end, 0.5), Passage(str(path), "p. 2", *early, 0.3)],
                     text, smap)
    assert got.quote == " ".join(joined[start:end].split())
    assert got.quote.startswith("alpha4") and got.quote.endswith("beta8")
    assert two.quote == "alpha2 beta2 page3"


# -- through the CLI, with a model -------------------------------------------------------------------

@pytest.fixture(scope="module")
def doc(tmp_path_factory, smollm2_path):
    text, question, code = logbook(n_entries=40)
    assert question == QUESTION
    path = tmp_path_factory.mktemp("doc") / "logbook.txt"
    path.write_text(text)
    start = text.index("The captain set the code")
    end = text.index("\n", start)
    return path, code, start, end, text[:start].count("\n") + 1


def _ask(*args: str) -> dict:
    res = runner.invoke(app, ["ask", *args, "--json", "--sources"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize("policy,budget", POLICIES)
def test_the_top_source_is_the_passage_that_holds_the_fact(doc, policy, budget, tmp_path):
    path, code, start, end, line = doc
    ctx = tmp_path / "saved.kvctx"
    # InfLLM's store beside the context: a saved context keeps its store (read-only), which in kvpot's
    # home would outlive the test
    spec = f"infllm:store={tmp_path / 'blocks.kvblk'}" if policy == "infllm" else policy
    out = _ask(str(path), QUESTION, "-P", spec, "--budget", budget, "--save-context", str(ctx), *FAST)
    top = out["sources"][0]
    assert top["source"] == str(path)
    assert top["start"] < end and top["end"] > start, (out["answer"], out["sources"])
    assert top["where"] == f"line {line:,}"
    assert top["quote"] and top["quote"].rstrip("…") in " ".join(path.read_text()[top["start"] - 60:top["end"] + 60].split())
    assert out["policy"].startswith(policy) and out["inputs"]["read"] == [str(path)] and out["tokens_read"] > 1024
    # the same context reopened attends the same way, and maps it the same way
    again = _ask("--context", str(ctx), QUESTION)
    assert again["sources"][0] == top and again["answer"] == out["answer"]


def test_chat_sources_after_each_answer_and_on_request(doc):
    """chat --sources prints the sources after each answer, as ask does; /sources prints the last
    answer's again."""
    path, code, start, end, line = doc
    opts = [str(path), "-P", "full", "--budget", "4096", *FAST]
    res = runner.invoke(app, ["chat", *opts, "--sources"], input=f"/sources\n{QUESTION}\n/sources\n/quit\n")
    assert res.exit_code == 0, res.output
    assert "no answer yet" in res.stderr
    listed = res.stdout.split("\nsources:\n")
    assert len(listed) == 3, res.stdout  # after the answer, and /sources: the same list
    assert listed[1] == listed[2] and f"1. {path} line {line} (" in listed[1], res.stdout


# past the pot, chat answers from a focused read unless the pot itself answers (--locator pot)
@pytest.mark.parametrize("policy,budget,more", [("full", "4096", []), ("infinipot", "1024", ["--locator", "pot"])])
def test_sources_after_an_answer_given_without_them_are_the_tracked_ones(doc, policy, budget, more):
    """Without --sources, /sources after an answer decodes the conversation again from the read state with the
    last answer's rows tapped (Session.answer_sources): the passages a chat with --sources lists for the same
    answer, after an earlier turn too, in a pot the read compacted as with full attention; the conversation
    then goes on as it was."""
    path, code, start, end, line = doc
    opts = [str(path), "-P", policy, "--budget", budget, *more, *FAST]
    first = "Who kept the log?"
    tracked = runner.invoke(app, ["chat", *opts, "--sources"], input=f"{first}\n{QUESTION}\n{QUESTION}\n/quit\n")
    assert tracked.exit_code == 0, tracked.output
    res = runner.invoke(app, ["chat", *opts], input=f"{first}\n{QUESTION}\n/sources\n{QUESTION}\n/sources\n/quit\n")
    assert res.exit_code == 0, res.output
    assert "cannot be found again" not in res.stderr, res.stderr
    want = tracked.stdout.split("\nsources:\n")  # answer 1, its list + answer 2, its list + answer 3, its list
    got = res.stdout.split("\nsources:\n")       # answers 1 and 2, the list + answer 3, the list
    assert len(want) == 4 and len(got) == 3, (tracked.stdout, res.stdout)
    assert want[0] == got[0].rsplit("\n", 2)[0] or got[0].startswith(want[0]), (want[0], got[0])
    assert want[2].startswith(got[1].split("\n\n")[0]), (want[2], got[1])  # the second answer's list, as tracked
    assert "code of the strongbox" in got[1].split("\n")[0], res.stdout  # the fact's passage first
    assert want[3] == got[2], (want[3], got[2])  # the third answer and its list: the replay left the state as it was


def test_sources_cannot_be_found_again_in_a_context_reopened_mid_conversation(doc, tmp_path):
    """A context saved after a turn keeps no state from before the conversation to decode it again from:
    /sources says so in one line, tracks from the next answer on, and the chat goes on."""
    path, *_ = doc
    saved = tmp_path / "mid.kvctx"
    opts = ["-P", "full", "--budget", "4096", *FAST]
    res = runner.invoke(app, ["chat", str(path), *opts], input=f"{QUESTION}\n/save {saved}\n/quit\n")
    assert res.exit_code == 0 and saved.is_file(), res.output
    res = runner.invoke(app, ["chat", "--context", str(saved), "--model", "smollm2-135m", "-n", "12", "--threads", "2"],
                        input=f"{QUESTION}\n/sources\n{QUESTION}\n/sources\n/quit\n")
    assert res.exit_code == 0, res.output
    assert "cannot be found again" in " ".join(res.stderr.split()), res.stderr
    assert res.stdout.count("\nsources:\n") == 1, res.stdout  # tracked from the next answer: its list


def test_json_errors_are_json_with_the_exit_code_unchanged(tmp_path):
    res = runner.invoke(app, ["ask", str(tmp_path / "missing.txt"), QUESTION, "--json", *FAST])
    plain = runner.invoke(app, ["ask", str(tmp_path / "missing.txt"), QUESTION, *FAST])
    assert res.exit_code == plain.exit_code != 0
    err = json.loads(res.stderr)
    assert err["exit_code"] == res.exit_code and "missing.txt" in err["error"]
    assert res.stdout == ""


def test_a_lone_sink_token_near_the_start_does_not_outrank_the_passage_read():
    """Qwen2.5 parks attention on the document's first full stop whatever the question (measured: 2 % of an
    answer's attention on that one token, 20 times its neighbours'). A lone token that heavy outweighs a
    passage deep in the document whose many tokens the answer read; the passage is ranked first, the sink's
    neighbourhood counts as its neighbours do."""
    smap = SourceMap()
    smap.add(3, 0, 4000, list(range(4000)), lambda t: b"x")
    mass = {p: 0.001 for p in range(3, 4003)}
    mass[17] = 0.30                              # the sink: one token, past the stream's first SINK_TOKENS
    deep = range(3000, 3012)
    for p in deep:
        mass[p] = 0.02                           # the passage the answer read: 0.24 over 12 tokens
    (p0, p1, share), *_ = rank(mass, smap)
    assert p0 <= deep[0] and deep[-1] < p1, (p0, p1)
    # its share: of the document's mass with the sink counted at SPIKE times its neighbours' level
    doc = sum(m for p, m in mass.items() if p >= SINK_TOKENS) - mass[17] + SPIKE * 0.001
    assert share == pytest.approx(sum(mass[p] for p in range(p0, p1)) / doc)

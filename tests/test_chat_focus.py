"""`kvpot chat` past what the pot keeps, on files: each question finds its passages in the whole input (the
session's locator: BM25 by default, the keys kept while reading with --locator keys), reads them again with full attention in a session of its own with the
conversation so far, and answers there; the pot's session is suspended meanwhile and gets the exchange after.

References are computed in the same run: a session never suspended, the tokens a turn is made of."""

from __future__ import annotations

import re

import numpy as np
import pytest
from typer.testing import CliRunner

from cli._session import FOCUS_EACH_QUESTION, READ_BEFORE_THE_QUESTION
from kvpot.cli.main import app
from kvpot.ingest.sources import collect_sources
from kvpot.models.gguf_file import read_model_facts
from kvpot.session.context_file import read_context
from kvpot.session.locating import HOW
from kvpot.session.prompting import Segment
from kvpot.session.session import Session
from kvpot.session.settings import RunSettings

SMALL = RunSettings(budget=256, chunk=64, threads=2, prompt="completion", max_tokens=8, policy="infinipot", locator="keys")
Q1, Q2 = "Who kept the log?", "What was the code of the strongbox?"


def _squash(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def _chat(args: list[str], smollm2_path, lines: str):
    opts = ["-m", str(smollm2_path), "--threads", "2", "--chunk", "64", "-n", "8", "--prompt-format", "completion"]
    res = CliRunner().invoke(app, ["chat", *args, *opts], input=lines)
    assert res.exit_code == 0, (res.stdout, res.stderr)
    return res.stdout, _squash(res.stderr)


def test_chat_answers_each_question_from_a_focused_read_and_keeps_the_conversation(logbook_doc, smollm2_path, tmp_path):
    saved = tmp_path / "c.kvctx"
    out, err = _chat([str(logbook_doc), "-P", "infinipot", "-b", "256", "--locator", "keys"], smollm2_path,
                     f"{Q1}\n{Q2}\n/save {saved}\n/quit\n")
    assert _squash(FOCUS_EACH_QUESTION.format(how=HOW["keys"])) in err, err
    assert _squash(READ_BEFORE_THE_QUESTION)[:60] not in err, err
    assert err.count("focus: ") == 2 and f"found ({HOW['keys']})" in err, err
    assert err.count("reading it whole") == 2, err  # each focused read is full attention over its passages
    # and says their exact length (counted when the focused read was planned), as the pot's read of a named size does
    assert len(re.findall(r"passages? of \S+ · [\d,]+ tokens · fits the 8K window: reading it whole", err)) == 2, err
    assert re.search(r"· [\d,]+ tokens · (within|past) the 8K window", err), err
    assert not re.search(r"about [\d,]+ tokens", err), err
    assert out.strip(), out
    h = read_context(saved).header
    assert h["turns"] == 2 and h["settings"]["locator"] == "keys"


def test_chat_locates_by_keywords_by_default(logbook_doc, smollm2_path):
    out, err = _chat([str(logbook_doc), "-P", "infinipot", "-b", "256"], smollm2_path, f"{Q2}\n/sources\n/quit\n")
    assert _squash(FOCUS_EACH_QUESTION.format(how=HOW["bm25"])) in err and f"found ({HOW['bm25']})" in err, err
    # /sources without --sources: the passages the focused read was given, as its focus line names them
    assert "the last answer was read from these passages" in err, err
    first = re.search(r"read again with full attention(?: \([^)]*\))?: \S+ (line [\d,]+)", err)[1]   # the best passage's place
    assert f"{first} (" in out.split("sources:", 1)[1], (first, out)


def test_chat_with_the_pot_locator_answers_from_the_pot(logbook_doc, smollm2_path):
    _, err = _chat([str(logbook_doc), "-P", "infinipot", "-b", "256", "--locator", "pot"], smollm2_path, f"{Q1}\n/quit\n")
    assert "focus: " not in err and _squash(READ_BEFORE_THE_QUESTION)[:60] in err, err


def test_a_bad_locator_is_one_line(logbook_doc, smollm2_path):
    res = CliRunner().invoke(app, ["chat", str(logbook_doc), "-m", str(smollm2_path), "--locator", "magic"], input="/quit\n")
    assert res.exit_code != 0 and "locator" in res.stderr and "keys, pot, bm25, mix" in res.stderr, res.stderr


@pytest.fixture(scope="module")
def read_session(smollm2_path, logbook_doc):
    def make() -> Session:
        s = Session(read_model_facts(smollm2_path), "smollm2-135m", SMALL.check())
        s.read(collect_sources([str(logbook_doc)]))
        return s
    return make


def test_a_suspended_session_answers_as_one_never_suspended(read_session):
    plain = read_session()
    want = "".join(plain.ask(Q2))
    want_state = bytes(plain.engine.ctx.seq_state())
    plain.close()
    s = read_session()
    s.suspend()
    s.suspend()  # a second suspend keeps the first's state
    s.resume()
    assert s.engine.block_keys is not None and s.engine.block_keys.n_blocks > 0
    assert "".join(s.ask(Q2)) == want
    assert bytes(s.engine.ctx.seq_state()) == want_state
    s.close()


def test_a_suspended_session_closes_without_resuming(read_session):
    s = read_session()
    s.suspend()
    s.close()  # nothing left open: the model and context were freed by suspend


def test_an_exchange_added_is_the_turn_and_answer_tokens(read_session):
    s = read_session()
    cells, seen = s.engine.n_cells, s.engine.tokens_seen
    s.add_exchange(Q1, "the first mate")
    want = s._tokens(s.format.first_question(Q1) + [Segment(" the first mate")])
    assert s.turns == 1 and s.engine.tokens_seen == seen + len(want) and s.engine.n_cells == cells + len(want)
    s.add_exchange(Q2, "")
    assert s.turns == 2 and s.engine.tokens_seen == seen + len(want) + len(s._tokens(s.format.follow_up(Q2)))
    assert "".join(s.ask("And the ship's name?")).strip() != "" or s.engine.stop_kind
    s.close()
    np.testing.assert_equal(s.turns, 3)


def test_a_file_changed_since_the_read_is_said_and_the_pot_answers(smollm2_path, logbook_doc, tmp_path, capsys):
    """The passages are read again from the files: a file rewritten since is said in one line, and none of its
    text is read as if it were what the model read."""
    from cli._focus import find_passages

    doc = tmp_path / "log.txt"
    doc.write_text(logbook_doc.read_text())
    s = Session(read_model_facts(smollm2_path), "smollm2-135m", SMALL.check(), resettable=False)
    s.read(collect_sources([str(doc)]))
    assert find_passages(s, Q2) is not None
    doc.write_text(logbook_doc.read_text().replace("a", "o"))
    assert find_passages(s, Q2) is None
    err = _squash(capsys.readouterr().err)
    assert "the answer comes from the pot:" in err and "changed since it was read" in err, err
    s.close()


def test_a_question_no_passage_answers_is_answered_by_the_pot(logbook_doc, smollm2_path):
    """No word of the question in the input: bm25 finds no passage, said in one line, and the pot answers (the
    chat goes on; no error)."""
    out, err = _chat([str(logbook_doc), "-P", "infinipot", "-b", "256"], smollm2_path, f"Zyzzyva quokka?\n{Q2}\n/quit\n")
    assert "the answer comes from the pot: no word of the question is in the input" in err, err
    assert "error" not in err and err.count("focus: ") == 1, err

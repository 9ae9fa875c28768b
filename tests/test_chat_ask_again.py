"""`/ask QUESTION` in `kvpot chat` reads the chat's files again with the question first (cli/_reread.py).

The reference for each case is computed in the same run: `kvpot ask` with the same files, options and
question (what /ask must reproduce), and a plain chat question (what a stopped /ask must fall back to).
Every case compares two paths through one model, so SmolLM2 cut to 4 blocks (conftest.py) serves."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

import kvpot.cli.ask as ask_cli
from kvpot.cli._reread import NOT_STEERED, WHOLE_INPUT_HELD
from kvpot.cli.main import app

QUESTION = "Who kept the log?"
READ_AGAIN = "read again with the question first"
POT = re.compile(r"read (\d+) tokens in [^;]*; pot (\d+) cells, (\d+) compactions")


@pytest.fixture
def doc(logbook_doc):
    return logbook_doc


@pytest.fixture
def home(tmp_path, monkeypatch, smollm2_cut_path):
    monkeypatch.setenv("KVPOT_HOME", str(tmp_path / "home"))  # where /ask keeps the chat's reading aside
    return tmp_path / "home"


def _run(args: list[str], smollm2_cut_path, lines: str = "") -> tuple[str, str]:
    opts = ["-m", str(smollm2_cut_path), "--threads", "2", "-n", "8"]
    if "--context" not in args:  # a saved context keeps the options it was read with
        opts += ["--chunk", "128", "--prompt-format", "completion"]
    res = CliRunner().invoke(app, [*args, *opts], input=lines)
    assert res.exit_code == 0, (res.stdout, res.stderr)
    return res.stdout, " ".join(res.stderr.split())  # rich wraps long lines


def _nothing_aside(home) -> bool:
    return not any((home / "tmp").glob("*")) if (home / "tmp").exists() else True


def test_ask_in_chat_answers_as_kvpot_ask_reads(doc, smollm2_cut_path, home):
    """Past the pot, /ask gives kvpot ask's answer (the same reading: the question as the catalyst),
    the chat goes on from that reading, and nothing is left aside."""
    pot = ["-P", "infinipot", "-b", "256"]
    # --no-focus: /ask answers from the pot it reads (a focused read is kvpot ask's alone, tests/test_focus.py)
    want, ask_err = _run(["ask", str(doc), QUESTION, *pot, "--no-focus"], smollm2_cut_path)
    _, chat_err = _run(["chat", str(doc), *pot], smollm2_cut_path, "/quit\n")
    got, err = _run(["chat", str(doc), *pot], smollm2_cut_path, f"/ask {QUESTION}\n/reset\n/quit\n")
    assert got.strip() == want.strip(), (got, want)
    assert READ_AGAIN in err, err
    # the chat's reading, then /ask's, which ends with the pot kvpot ask's reading ends with
    readings = POT.findall(err)
    assert readings == [*POT.findall(chat_err), *POT.findall(ask_err)], err
    # a case where the question changes the pot (here its size: the catalyst holds the question);
    # otherwise the comparison would prove little
    assert readings[0] != readings[1], err
    assert "conversation forgotten" in err, err  # /reset goes back to the new reading
    assert _nothing_aside(home)


@pytest.mark.parametrize("policy, budget, why", [
    ("streaming", "256", NOT_STEERED.format(spec="streaming")[:40]),  # the same cells whatever the question
    ("infinipot", "2048", WHOLE_INPUT_HELD),                         # the input fits: nothing was left out
])
def test_ask_in_chat_answers_as_usual_when_reading_again_keeps_the_same(doc, smollm2_cut_path, home, policy, budget, why):
    plain, _ = _run(["chat", str(doc), "-P", policy, "-b", budget], smollm2_cut_path, f"{QUESTION}\n/quit\n")
    got, err = _run(["chat", str(doc), "-P", policy, "-b", budget], smollm2_cut_path, f"/ask {QUESTION}\n/quit\n")
    assert " ".join(why.split()) in err, err
    assert READ_AGAIN not in err and len(POT.findall(err)) == 1, err
    assert got == plain


def test_a_stopped_ask_goes_back_to_the_chats_reading(doc, smollm2_cut_path, home, monkeypatch):
    """Ctrl-C while /ask reads: the chat's own reading is reopened from where it was kept aside, and
    answers as the chat would have without /ask."""
    real = ask_cli._open_session

    def stopped_when_asked(inputs, question, *args, **kw):
        if question is not None:
            raise KeyboardInterrupt
        return real(inputs, question, *args, **kw)

    pot = ["-P", "infinipot", "-b", "256"]
    plain, _ = _run(["chat", str(doc), *pot], smollm2_cut_path, f"{QUESTION}\n/quit\n")
    monkeypatch.setattr(ask_cli, "_open_session", stopped_when_asked)
    got, err = _run(["chat", str(doc), *pot], smollm2_cut_path, f"/ask {QUESTION}\n/quit\n")
    assert "reading again stopped; back to the chat's reading" in err, err
    assert got == plain
    assert _nothing_aside(home)


def test_ask_in_a_reopened_chat_says_there_are_no_files(doc, smollm2_cut_path, home, tmp_path):
    saved = tmp_path / "log.kvctx"
    _run(["chat", str(doc), "-P", "infinipot", "-b", "256", "--save-context", str(saved)], smollm2_cut_path, "/quit\n")
    plain, _ = _run(["chat", "--context", str(saved)], smollm2_cut_path, f"{QUESTION}\n/quit\n")
    got, err = _run(["chat", "--context", str(saved)], smollm2_cut_path, f"/ask {QUESTION}\n/quit\n")
    assert "this chat reopened a saved context" in err, err
    assert got == plain

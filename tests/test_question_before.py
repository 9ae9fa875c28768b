"""`--question-before`: where `kvpot ask` puts the question before the document as well as after it, what the
count of the input holds, what a saved context records, and the refusals. The prompt it builds is checked
against the model's own template in tests/test_prompting.py, and `kvpot run`'s answer with it against stock
llama.cpp on the same tokens in tests/test_cli.py."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error
from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app
from kvpot.ingest import collect_sources
from kvpot.models.gguf_file import read_model_facts
from kvpot.session.context_file import read_context
from kvpot.session.reading_plan import count_tokens

runner = CliRunner()
OPTS = ["--model", "smollm2-135m", "-n", "8", "--threads", "2", "--json"]  # the registry's prompt: completion


@pytest.fixture(scope="module")
def doc(tmp_path_factory, smollm2_path):
    text, question, _ = logbook(n_entries=16)  # about 700 tokens
    path = tmp_path_factory.mktemp("qb") / "logbook.txt"
    path.write_text(text)
    return path, question


def ask(doc, *extra: str) -> dict:
    path, question = doc
    prompt = [] if "--prompt-format" in extra else ["--prompt-format", "chat"]
    res = runner.invoke(app, ["ask", str(path), question, *OPTS, *prompt, *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_auto_puts_it_before_where_it_was_measured(doc, smollm2_path):
    """auto: on for an input read with full attention through the chat template, and counted in the
    input (the context is sized from that count: `--policy full` holds it exactly); off through a pot,
    off for plain completion prompts; `on` puts it before the document through a pot too."""
    full = ask(doc, "--policy", "full")
    assert full["question_before"] is True and full["compactions"] == 0
    path, question = doc
    facts = read_model_facts(smollm2_path)
    sources = collect_sources([str(path)])
    with_it = count_tokens(facts, "auto", sources, 10**6, question)
    without = count_tokens(facts, "auto", collect_sources([str(path)]), 10**6)
    assert full["tokens_read"] == with_it > without
    assert ask(doc)["question_before"] is True  # --budget auto: the input fits, full attention
    assert ask(doc, "--prompt-format", "completion")["question_before"] is False
    pot = ask(doc, "--policy", "infinipot", "--budget", "256", "--chunk", "128")
    assert pot["question_before"] is False and pot["compactions"] > 0
    on = ask(doc, "--policy", "infinipot", "--budget", "256", "--chunk", "128", "--question-before", "on")
    assert on["question_before"] is True and on["tokens_read"] == pot["tokens_read"] + with_it - without
    assert ask(doc, "--question-before", "off")["question_before"] is False


def test_a_saved_context_is_read_without_it_unless_asked(doc, tmp_path):
    """A saved context answers other questions later, so auto reads it without this one before it; `on`
    is kept, and the header says what the document was read with."""
    plain, asked = tmp_path / "plain.kvctx", tmp_path / "asked.kvctx"
    assert ask(doc, "--save-context", str(plain))["question_before"] is False
    assert read_context(plain).header["settings"]["question_before"] == "off"
    assert ask(doc, "--save-context", str(asked), "--question-before", "on")["question_before"] is True
    assert read_context(asked).header["settings"]["question_before"] == "on"
    path, question = doc
    reopened = runner.invoke(app, ["ask", "--context", str(asked), question, "-n", "8", "--json"])
    assert reopened.exit_code == 0, reopened.output
    assert json.loads(reopened.stdout)["question_before"] is True
    res = runner.invoke(app, ["ask", "--context", str(plain), question, "--question-before", "on"])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, "--question-before cannot change a saved context")


def test_a_bad_value_is_one_line(doc):
    path, question = doc
    res = runner.invoke(app, ["ask", str(path), question, "--model", "smollm2-135m", "--question-before", "yes"])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, "--question-before must be one of auto, on, off, got 'yes'")

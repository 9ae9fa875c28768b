"""`--question-before on`: `kvpot ask` puts the question before the document as well as after it; what the
count of the input holds, what a saved context records, and the refusals. The prompt it builds is checked
against the model's own template in tests/test_prompting.py."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error
from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app
from kvpot.ingest import collect_sources
from kvpot.models.gguf_file import read_model_facts
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel
from kvpot.session.context_file import read_context
from kvpot.session.prompting import Segment, choose_format
from kvpot.session.reading_plan import count_tokens

runner = CliRunner()
OPTS = ["--model", "smollm2-135m", "-n", "8", "--threads", "2", "--json", "--prompt-format", "chat"]


@pytest.fixture(scope="module")
def doc(tmp_path_factory, smollm2_path):
    text, question, _ = logbook(n_entries=16)  # about 700 tokens
    path = tmp_path_factory.mktemp("qb") / "logbook.txt"
    path.write_text(text)
    return path, text, question


def ask(doc, *extra: str) -> dict:
    path, _, question = doc
    res = runner.invoke(app, ["ask", str(path), question, *OPTS, *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def stock_first_token(model_path, text: str, question: str) -> str:
    """Stock llama.cpp in this process (no kvpot call): the chat template's opening, the question, the
    document, the question again, one context, greedy: the answer's first token."""
    model = LlamaModel(str(model_path))
    fmt = choose_format(model, "chat")
    segs = [*fmt.document_open(question), Segment(text), *fmt.first_question(question)]
    toks = model.bos() + [t for s in segs for t in model.tokenize(s.text, special=s.special)]
    ctx = LlamaContext(model, ContextParams(n_ctx=len(toks) + 16, n_batch=512, n_threads=2))
    for s in range(0, len(toks), 512):
        ctx.decode(toks[s:s + 512], s, logits="last")
    first = model.piece(int(ctx.logits_last().argmax())).decode("utf-8", errors="replace")
    ctx.close()
    model.close()
    return first


def test_off_by_default_and_on_when_asked(doc, smollm2_path):
    """Off: the document as before. On: the question's tokens are read before it, counted in the input
    (`--policy full` sizes its context from that count and reads it without a compaction), and the answer
    starts as stock llama.cpp's does on the same tokens; through a pot too."""
    path, text, question = doc
    facts = read_model_facts(smollm2_path)
    without = count_tokens(facts, "chat", collect_sources([str(path)]), 10**6)
    with_it = count_tokens(facts, "chat", collect_sources([str(path)]), 10**6, question)
    assert with_it > without
    plain = ask(doc, "--policy", "full")
    assert plain["question_before"] is False and plain["tokens_read"] == without
    on = ask(doc, "--policy", "full", "--question-before", "on")
    assert on["question_before"] is True and on["tokens_read"] == with_it and on["compactions"] == 0
    first = stock_first_token(smollm2_path, text, question)
    assert first.strip() and on["answer"].startswith(first.strip())
    pot = ask(doc, "--policy", "infinipot", "--budget", "256", "--chunk", "128", "--question-before", "on")
    assert pot["question_before"] is True and pot["compactions"] > 0 and pot["tokens_read"] == with_it


def test_a_saved_context_records_it(doc, tmp_path):
    """The header says what the document was read with, and a reopened context reports it; the option
    cannot change a saved context."""
    plain, asked = tmp_path / "plain.kvctx", tmp_path / "asked.kvctx"
    assert ask(doc, "--save-context", str(plain))["question_before"] is False
    assert read_context(plain).header["settings"]["question_before"] == "off"
    assert ask(doc, "--save-context", str(asked), "--question-before", "on")["question_before"] is True
    assert read_context(asked).header["settings"]["question_before"] == "on"
    _, _, question = doc
    reopened = runner.invoke(app, ["ask", "--context", str(asked), question, "-n", "8", "--json"])
    assert reopened.exit_code == 0, reopened.output
    assert json.loads(reopened.stdout)["question_before"] is True
    res = runner.invoke(app, ["ask", "--context", str(plain), question, "--question-before", "on"])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, "--question-before cannot change a saved context")


def test_a_bad_value_is_one_line(doc):
    path, _, question = doc
    res = runner.invoke(app, ["ask", str(path), question, "--model", "smollm2-135m", "--question-before", "yes"])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, "--question-before must be one of on, off, got 'yes'")

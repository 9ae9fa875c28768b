"""`kvpot ask` and `kvpot chat` through Typer's CliRunner: the flows and the refusals."""

from __future__ import annotations

import pytest
from conftest import assert_one_line_error
from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app

runner = CliRunner()
FAST = ["--model", "smollm2-135m", "--budget", "512", "--chunk", "128", "-n", "12", "--prompt-format", "completion",
        "--threads", "2"]


@pytest.fixture(scope="module")
def fast(smollm2_cut_path) -> list[str]:
    """FAST with SmolLM2 cut to 4 blocks: for the flows that read a document and compare the answer with
    another path's (reopened, flash attention, stdin), not with what the document says."""
    return ["--model", str(smollm2_cut_path), *FAST[2:]]


@pytest.fixture(scope="module")
def doc(tmp_path_factory, smollm2_path):
    text, question, answer = logbook()
    path = tmp_path_factory.mktemp("doc") / "logbook.txt"
    path.write_text(text)
    return path, question, answer


@pytest.fixture(scope="module")
def saved(doc, fast, tmp_path_factory):
    path, question, _ = doc
    ctx = tmp_path_factory.mktemp("ctx") / "logbook.kvctx"
    res = runner.invoke(app, ["ask", str(path), question, "--save-context", str(ctx), *fast])
    assert res.exit_code == 0, res.output
    return ctx, res.stdout


def test_ask_reads_answers_and_saves(saved, doc):
    ctx, answer = saved
    assert ctx.stat().st_size > 0 and answer.strip()


def test_ask_on_a_saved_context_answers_the_same(saved, doc):
    ctx, first = saved
    _, question, _ = doc
    res = runner.invoke(app, ["ask", "--context", str(ctx), question])
    assert res.exit_code == 0, res.output
    assert "reopened" in res.stderr
    assert res.stdout == first


def test_a_context_saved_before_flash_attention_was_a_setting_reopens_without_it(doc, fast, tmp_path):
    """Contexts saved before kvpot read with flash attention hold V transposed (llama.cpp's layout
    without it) and no flash_attn setting: they must reopen as they were read, and answer the same. One
    read with --flash-attn off, its header rewritten as such a kvpot wrote it, reopens; the same file
    saved with flash attention on answers after reopening as it did before saving."""
    from kvpot.session.context_file import read_context, write_context

    path, question, _ = doc
    answers = {}
    for fa in ("off", "on"):
        ctx = tmp_path / f"fa-{fa}.kvctx"
        res = runner.invoke(app, ["ask", str(path), question, "--save-context", str(ctx), "--flash-attn", fa, *fast])
        assert res.exit_code == 0, res.output
        saved = read_context(ctx)
        assert saved.header["settings"]["flash_attn"] == fa
        answers[fa] = res.stdout
        if fa == "off":
            del saved.header["settings"]["flash_attn"]
            write_context(ctx, saved)
            assert "flash_attn" not in ctx.read_bytes()[:4096].decode("latin-1")
        again = runner.invoke(app, ["ask", "--context", str(ctx), question])
        assert again.exit_code == 0, again.output
        assert again.stdout == res.stdout
    assert answers["on"].strip() and answers["off"].strip()


def test_a_bad_flash_attention_value_is_one_line(doc):
    path, question, _ = doc
    res = runner.invoke(app, ["ask", str(path), question, "--flash-attn", "yes", *FAST])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, "--flash-attn must be one of auto, on, off, got 'yes'")


def test_a_long_question_shows_progress(doc, fast):
    """A question longer than the free cells is read through the pot like a document, and says so."""
    path, question, _ = doc
    small = [a if a != "512" else "256" for a in fast]
    res = runner.invoke(app, ["ask", str(path), "Tell me about the voyage. " * 100 + question, "-P", "snapkv", "--no-focus",
                                 *small])
    assert res.exit_code in (0, 5), res.output  # 5: the model answered nothing (said on stderr), not this test's concern
    lines = res.stderr.splitlines()
    start = [ln for ln in lines if ln.startswith("reading the question (")]
    done = [ln for ln in lines if ln.startswith("read the question's ")]
    assert len(start) == 1 and len(done) == 1, res.stderr
    assert "through the pot" in start[0] and "compaction" in done[0]
    assert start[0].index("reading the question") < res.stderr.index("read the question's")


def test_a_short_question_shows_no_question_progress(saved, doc):
    ctx, _ = saved
    _, question, _ = doc
    res = runner.invoke(app, ["ask", "--context", str(ctx), question])
    assert res.exit_code == 0, res.output
    assert "the question" not in res.stderr, res.stderr


def test_a_question_too_long_for_a_reopened_pot_is_one_line_before_reading(saved, doc):
    """InfiniPot's catalyst holds the question (CaP-Q): one that leaves the pot no room to read is
    refused as the question being too long, not as a pot that "keeps every token" after reading."""
    ctx, _ = saved
    _, question, _ = doc
    res = runner.invoke(app, ["ask", "--context", str(ctx), "Tell me about the voyage. " * 250 + question])
    assert res.exit_code == 1
    said = res.stderr[res.stderr.index(" cells\n") + len(" cells\n"):]  # after the "reopened ..." line
    assert_one_line_error(said, "the question is too long for the budget")
    assert "raise the --budget the files are read with to at least" in said


def test_chat_commands(doc, fast, tmp_path):
    path, question, _ = doc
    ctx = tmp_path / "chat.kvctx"
    script = f"{question}\n/stats\n/bogus\n/save {ctx}\nWho mended the foresail?\n/reset\n/help\n/quit\n"
    res = runner.invoke(app, ["chat", str(path), *fast], input=script)
    assert res.exit_code == 0, res.output
    assert "tokens in pot" in res.stderr and "unknown command /bogus" in res.stderr
    assert "conversation forgotten" in res.stderr and "/save PATH" in res.stderr
    assert ctx.exists() and len(res.stdout.strip().splitlines()) >= 2
    # saved after one turn: /reset cannot separate that turn from the document, says so, and the chat goes on
    again = runner.invoke(app, ["chat", "--context", str(ctx)], input="/reset\nWho mended the foresail?\n/quit\n")
    assert again.exit_code == 0, again.output
    assert "saved after 1 turn" in again.stderr
    assert again.stdout.strip()


def test_context_from_another_model_is_refused(saved, doc):
    ctx, _ = saved
    res = runner.invoke(app, ["ask", "--context", str(ctx), "-m", "gemma3-270m", "q?"])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, "was saved with model ")  # the cut SmolLM2's name from its metadata
    assert "not gemma3-270m" in res.stderr


def test_truncated_context_is_refused(saved, tmp_path):
    ctx, _ = saved
    bad = tmp_path / "bad.kvctx"
    bad.write_bytes(ctx.read_bytes()[:4096])
    res = runner.invoke(app, ["chat", "--context", str(bad)])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, "truncated or corrupted")


@pytest.mark.parametrize("make, needle", [
    (lambda d: d.mkdir() or [str(d)], "has no text files"),
    (lambda d: (d.write_bytes(b"\x00\x01" * 64), [str(d)])[1], "every input is binary"),
    (lambda d: (d.write_text(""), [str(d)])[1], "the input is empty"),
    (lambda d: [str(d / "missing.txt")], "does not exist"),
])
def test_bad_inputs_are_one_line(tmp_path, make, needle):
    args = make(tmp_path / "in")
    res = runner.invoke(app, ["ask", *args, "q?", *FAST])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, needle)


def test_stdin_closed_early_is_refused():
    res = runner.invoke(app, ["ask", "-", "q?", *FAST], input="")
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, "stdin was empty")


def test_stdin_is_read(doc, fast):
    path, question, _ = doc
    res = runner.invoke(app, ["ask", "-", question, *fast], input=path.read_text())
    assert res.exit_code == 0, res.output
    assert res.stdout.strip()


@pytest.mark.parametrize("args, needle", [
    (["chat", "-"], "chat reads your questions from stdin"),
    (["ask", "  "], "the question is empty"),
    (["ask", "q?"], "pass the files to read"),
    (["ask", "x.txt", "q?", "--policy", "nope"], "unknown policy"),
])
def test_usage_mistakes_are_one_line(args, needle, tmp_path):
    res = runner.invoke(app, [*args, *FAST])
    assert res.exit_code == 1
    assert_one_line_error(res.stderr, needle)

"""An empty answer is never printed silently: `ask` says on stderr that the model produced no answer
and why the answer ended, and exits 5; a stop string at once is named as the reason."""

from __future__ import annotations

from typer.testing import CliRunner

from kvpot.cli._common import NO_ANSWER_EXIT
from kvpot.cli.main import app
from kvpot.session.session import Session

runner = CliRunner()
OPTS = ["--model", "smollm2-135m", "--budget", "256", "--chunk", "64", "-n", "6", "--prompt-format", "completion",
        "--threads", "2"]


def test_a_stop_string_at_once_is_no_answer_and_says_so(tmp_path, smollm2_path, monkeypatch):
    doc = tmp_path / "note.txt"
    doc.write_text("The gate code is 4411. The bridge code is 7302.\n")

    # the model's first pieces begin the next exchange: the session cuts them, nothing is left
    def starts_next_exchange(self, logits, max_tokens=64, pick=None):
        self.stop_reason = "the 6-token limit"
        yield from ["\n", "Question", ":", " what"]

    monkeypatch.setattr("kvpot.engine.Engine.generate", starts_next_exchange)
    res = runner.invoke(app, ["ask", str(doc), "What is the gate code?", *OPTS])
    assert res.exit_code == NO_ANSWER_EXIT, res.output
    assert res.stdout.strip() == ""
    assert "the model produced no answer (it ended at the stop string '\\nQuestion:')" in res.stderr


def test_end_of_generation_at_once_is_no_answer(tmp_path, smollm2_path, monkeypatch):
    doc = tmp_path / "note.txt"
    doc.write_text("The gate code is 4411.\n")
    real_ask = Session.ask

    def eog_first(self, question, max_tokens=None, **kw):
        self.engine.generate = lambda logits, n, pick=None: _eog(self.engine)
        return real_ask(self, question, max_tokens, **kw)

    def _eog(engine):
        engine.stop_reason = "end-of-generation (<|im_end|>)"
        return iter(())

    monkeypatch.setattr(Session, "ask", eog_first)
    res = runner.invoke(app, ["ask", str(doc), "What is the gate code?", *OPTS])
    assert res.exit_code == NO_ANSWER_EXIT, res.output
    assert "the model produced no answer (it ended at end-of-generation (<|im_end|>))" in res.stderr
    # an answer that is there exits 0 and says nothing of the kind
    monkeypatch.setattr(Session, "ask", real_ask)
    res = runner.invoke(app, ["ask", str(doc), "What is the gate code?", *OPTS])
    assert res.stdout.strip() and res.exit_code == 0, res.output
    assert "no answer" not in res.stderr

"""Chat never dead-ends: under full attention a conversation that fills the context makes way for the
next turn (the first tokens and the most recent stay, StreamingLLM-style) and says so, instead of
cutting answers at the room left and then answering nothing."""

from __future__ import annotations

from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app

# Each question carries a long lead-in so that the turns alone outgrow the context, however short the sampled
# answers are on this CPU (answers end at their line's end, and their lengths differ between machines).
LEAD = ("Reading the ship's log above from its first entry to its last, and keeping in mind every name, place "
        "and day it mentions, answer in one short sentence: ")
QUESTIONS = [LEAD + q for q in ["What did the crew do on day 3?", "Who mended the foresail?", "What was the weather like?",
             "Where did the ship anchor?", "What did the captain write?", "What happened next?",
             "Tell me about the voyage.", "Who kept the log?", "What did they eat?", "Where were they going?"]]


def test_chat_goes_on_past_a_full_context(smol, smollm2_path, tmp_path):
    text, _, _ = logbook(n_entries=4)  # ~200 tokens: the document fits, the conversation does not
    doc = tmp_path / "log.txt"
    doc.write_text(text)
    asked = sum(len(smol.tokenize(q)) for q in QUESTIONS)
    assert len(smol.tokenize(text)) + asked > 512  # document and questions alone outgrow the 512-cell context
    # full attention sized to the document plus one answer's room: a few turns fill it
    opts = ["-m", str(smollm2_path), "--policy", "full", "--budget", "512", "-n", "32", "--prompt-format",
            "completion", "--threads", "2", "--temp", "0.8", "--seed", "1"]
    res = CliRunner().invoke(app, ["chat", str(doc), *opts], input="\n".join(QUESTIONS) + "\n/stats\n/quit\n")
    assert res.exit_code == 0, res.output
    assert "the context is full" in res.stderr, res.stderr
    assert "the room left in the context" not in res.stderr  # no answer was cut for want of room
    assert "error" not in res.stderr.lower(), res.stderr
    answers = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(answers) >= len(QUESTIONS) - 2, res.stdout  # the chat answered on after the context filled

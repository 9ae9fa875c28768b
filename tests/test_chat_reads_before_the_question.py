"""`kvpot chat` reads before any question is asked. Past what the pot keeps, on files, each question then finds
its passages in the whole input and reads them again (kvpot.api.Document.turn), and chat says so. With the pot
as the locator (`--locator pot`) the pot answers: through a pot whose choice depends on the question
(InfiniPot's CaP-Q), that read keeps what no question chose, and chat says so and names `kvpot ask`, which
reads with the question first; a policy the question does not steer, an input that fits the pot, and
`kvpot ask` itself say nothing of it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli._session import FOCUS_EACH_QUESTION, READ_BEFORE_THE_QUESTION
from kvpot.cli.main import app

HINT = READ_BEFORE_THE_QUESTION[:60]
FOCUS = FOCUS_EACH_QUESTION[:40]


@pytest.fixture
def doc(logbook_doc):
    return logbook_doc


def _stderr(args: list[str], smollm2_path) -> str:
    opts = ["-m", str(smollm2_path), "--threads", "2", "--chunk", "128", "-n", "4", "--prompt-format", "completion"]
    res = CliRunner().invoke(app, [*args, *opts], input="/quit\n")
    assert res.exit_code == 0, res.output
    return " ".join(res.stderr.split())  # rich wraps long lines


@pytest.mark.parametrize("policy, budget, said", [
    ("infinipot", "256", True),     # CaP-G stands in for the question the read does not know
    ("streaming", "256", False),    # keeps the same cells whatever the question
    ("infinipot", "2048", False),   # the input fits: nothing is chosen
])
def test_chat_says_when_its_pot_chose_without_the_question(doc, smollm2_path, policy, budget, said):
    err = _stderr(["chat", str(doc), "-P", policy, "-b", budget, "--locator", "pot"], smollm2_path)
    assert (HINT in err) is said and FOCUS not in err, err


@pytest.mark.parametrize("policy, budget, said", [("infinipot", "256", True), ("streaming", "256", True),
                                                  ("infinipot", "2048", False)])
def test_chat_says_each_question_reads_its_passages_again(doc, smollm2_path, policy, budget, said):
    err = _stderr(["chat", str(doc), "-P", policy, "-b", budget], smollm2_path)
    assert (FOCUS in err) is said and HINT not in err, err


def test_ask_reads_with_the_question_and_says_nothing_of_it(doc, smollm2_path):
    err = _stderr(["ask", str(doc), "Who kept the log?", "-P", "infinipot", "-b", "256"], smollm2_path)
    assert HINT not in err, err

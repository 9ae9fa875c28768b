"""ask/run's sampling and stop options (llama.cpp's names): checked before reading, applied to the answer."""

from __future__ import annotations

import pytest
from conftest import assert_one_line_error
from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app

runner = CliRunner()
OPTS = ["--model", "smollm2-135m", "--chunk", "256", "-n", "16", "--prompt-format", "completion", "--threads", "2",
        "--policy", "full"]


@pytest.fixture(scope="module")
def doc(tmp_path_factory, smollm2_path):
    text, question, _ = logbook(n_entries=8)
    path = tmp_path_factory.mktemp("sampling") / "logbook.txt"
    path.write_text(text)
    return path, question


@pytest.mark.parametrize("opt,value,needle", [("--temp", "-0.5", "--temp must be >= 0"),
                                              ("--top-p", "1.5", "--top-p must be in (0, 1]"),
                                              ("--min-p", "1", "--min-p must be in [0, 1)"),
                                              ("--repeat-penalty", "0", "--repeat-penalty must be > 0"),
                                              ("--seed", "-7", "--seed must be in 0"),
                                              ("--temp", "inf", "--temp must be >= 0 and finite, got inf"),
                                              ("--repeat-penalty", "inf", "--repeat-penalty must be > 0 and finite"),
                                              ("--stop", "", "--stop takes the text that ends the answer")])
def test_bad_sampling_values_are_refused_before_reading(doc, opt, value, needle):
    path, question = doc
    res = runner.invoke(app, ["ask", str(path), question, *OPTS, opt, value])
    assert res.exit_code == 1
    assert "reading" not in res.stderr
    assert_one_line_error(res.stderr, needle)


def _ask(path, question, *extra) -> str:
    res = runner.invoke(app, ["ask", str(path), question, *OPTS, *extra])
    assert res.exit_code == 0, res.output
    return res.stdout.rstrip("\n")


def test_stop_ends_the_answer_where_its_text_appears(doc):
    path, question = doc
    greedy = _ask(path, question)
    # a stop string from inside the answer (its first appearance past the start, so something is left)
    stops = [greedy[i:i + 2] for i in range(1, len(greedy) - 1) if greedy[:greedy.index(greedy[i:i + 2])].strip()]
    assert stops, greedy
    stop = stops[len(stops) // 2]
    assert _ask(path, question, "--stop", "no such text", "--stop", stop) == greedy[:greedy.index(stop)].rstrip()


def test_a_seed_makes_sampling_repeatable(doc):
    path, question = doc
    first = _ask(path, question, "--temp", "1.5", "--seed", "11")
    assert _ask(path, question, "--temp", "1.5", "--seed", "11") == first

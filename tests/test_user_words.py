"""What ask and run say on stderr, in a user's words: one line before reading (model · input · length · how
it is held), progress with the exact total where the input was counted, no pot where nothing is bounded
(full attention), the answer's time; -v for the plan's details, -q for errors only; --json's stop reasons by
name, times and the answer's token count."""

from __future__ import annotations

import json
import re

import pytest
from conftest import run_cli

DOC = "The ship log says the cargo was oranges, loaded at the northern pier. " * 30
QUESTION = "What was the cargo?"
BASE = ["-m", "smollm2-135m", "-n", "6", "--prompt-format", "completion", "--threads", "1"]
RUN = ["-m", "smollm2-135m", "-n", "6", "--threads", "1"]  # run has no --prompt-format
POT = ["--budget", "256", "--chunk", "128"]
STOP_NAMES = {"end-of-generation", "max-tokens", "context-full", "stop-string", "end-of-line", "loop-guard",
              "interrupted"}


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("words") / "log.txt"
    path.write_text(DOC)
    return path


def test_full_attention_says_one_line_exact_progress_and_no_pot(doc):
    res = run_cli("ask", str(doc), QUESTION, *BASE, env={"KVPOT_PROGRESS_EVERY": "0"})
    assert res.returncode in (0, 5), res.stderr
    line = re.search(r"^smollm2-135m · (.*log\.txt) · ([\d,]+) tokens · fits the 8K window: reading it whole$",
                     res.stderr, re.M)
    assert line, res.stderr
    counted = line[2]
    # the plan's details and the old settings line are -v's
    assert "budget auto" not in res.stderr and "cells (context" not in res.stderr, res.stderr
    progress = [ln for ln in res.stderr.splitlines() if ln.startswith("read ") and " tok/s" in ln and " in " not in ln]
    assert progress, res.stderr  # a line after every chunk
    assert all(f" of {counted} tokens" in ln and "~" not in ln and "?" not in ln for ln in progress), progress
    summary = re.search(r"^read [\d,]+ tokens in .*$", res.stderr, re.M)[0]
    assert "pot" not in summary and "compaction" not in summary and all("pot" not in ln for ln in progress)
    if res.returncode == 0:
        assert re.search(r"^answered in \d+\.\d s \(\d+ tokens?\)$", res.stderr, re.M), res.stderr


def test_verbose_keeps_the_details(doc):
    res = run_cli("ask", str(doc), QUESTION, *BASE, *POT, "-v", env={"KVPOT_PROGRESS_EVERY": "0"})
    assert res.returncode in (0, 5), res.stderr
    # a pot of a named size: the input is counted all the same, so the line and the progress say one exact length
    line = re.search(r"^smollm2-135m · .*log\.txt · ([\d,]+) tokens · within the 8K window, through a 256-cell memory "
                     r"\(infinipot\)$", res.stderr, re.M)
    assert line, res.stderr
    progress = [ln for ln in res.stderr.splitlines() if ln.startswith("read ") and " tok/s" in ln and " in " not in ln]
    assert progress and all(f" of {line[1]} tokens" in ln and "~" not in ln for ln in progress), res.stderr
    assert progress[-1].startswith(f"read {line[1]} of "), progress  # the count is what was read
    assert re.search(r"^reading .*log\.txt, [\d.]+ KiB with infinipot.*, budget 256 cells \(context [\d,]+\), "
                     r"prompt: completion$", res.stderr, re.M), res.stderr
    assert re.search(r"; pot [\d,]+ cells, [\d,]+ compactions?", res.stderr), res.stderr  # a pot bounds: said


@pytest.mark.parametrize("command", ["ask", "run"])
def test_quiet_leaves_the_answer_alone(doc, command):
    args = (["ask", str(doc), QUESTION, "--prompt-format", "completion"] if command == "ask"
            else ["run", "-f", str(doc), "-p", QUESTION])
    loud = run_cli(*args, *RUN)
    quiet = run_cli(*args, *RUN, "-q")
    assert loud.returncode == quiet.returncode and loud.returncode in (0, 5), quiet.stderr
    assert loud.stderr.strip() and quiet.stderr == "", quiet.stderr
    assert quiet.stdout == loud.stdout


def test_quiet_still_says_errors(doc, tmp_path):
    res = run_cli("ask", str(tmp_path / "missing.txt"), QUESTION, *BASE, "-q")
    assert res.returncode == 1 and res.stderr.startswith("error: ") and "missing.txt" in res.stderr, res.stderr
    both = run_cli("ask", str(doc), QUESTION, *BASE, "-q", "-v")
    assert both.returncode == 1 and "not both" in both.stderr


def test_json_names_the_stop_and_says_times_and_tokens(doc):
    res = run_cli("ask", str(doc), QUESTION, *BASE, "--json", "--no-focus")
    assert res.returncode == 0, res.stderr
    obj = json.loads(res.stdout)
    assert obj["stop_reason"] in STOP_NAMES, obj["stop_reason"]
    seconds = obj["seconds"]
    assert 0 < seconds["answer"] <= seconds["total"] and seconds["read"] <= seconds["total"], seconds
    assert isinstance(obj["answer_tokens"], int) and 0 < obj["answer_tokens"] <= 6, obj
    # -n 1: the limit ends it, by name
    one = json.loads(run_cli("ask", str(doc), QUESTION, *BASE, "-n", "1", "--json", "--no-focus").stdout)
    if one["answer"]:
        assert one["stop_reason"] == "max-tokens" and one["answer_tokens"] == 1, one


def test_stop_kinds_from_the_answer_filter():
    from kvpot.session.answer import AnswerText

    text = AnswerText(stops=("END",))
    text.feed("oranges END more")
    assert text.kind == "stop-string"
    line = AnswerText(one_line=True)
    line.feed("oranges\nand more")
    assert line.kind == "end-of-line"

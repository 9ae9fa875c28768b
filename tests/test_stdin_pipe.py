"""`cat FILE | kvpot ask "QUESTION"`: a pipe on stdin is the document when only a question is given;
a terminal on stdin keeps the error, which names - as the way to read stdin."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import assert_one_line_error, run_cli

from kvpot.cli._common import NO_ANSWER_EXIT

KVPOT = [sys.executable, "-c", "from kvpot.cli.main import main; main()"]
FAST = ["--model", "smollm2-135m", "--budget", "512", "--chunk", "128", "-n", "8", "--prompt-format", "completion",
        "--threads", "1"]


def test_a_terminal_on_stdin_is_not_read_and_the_error_names_dash():
    leader, follower = os.openpty()
    try:
        res = subprocess.run([*KVPOT, "ask", "what is the code?", *FAST], stdin=follower, capture_output=True,
                             text=True, timeout=120)
    finally:
        os.close(leader)
        os.close(follower)
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "or - to read stdin")


def test_a_pipe_is_taken_as_the_input():
    # binary on the pipe is refused as stdin's: the pipe was taken as the document (before a model loads)
    res = subprocess.run([*KVPOT, "ask", "what is the code?", *FAST], input=b"\x00\x01" * 100,
                         capture_output=True, timeout=120)
    assert res.returncode == 1
    assert_one_line_error(res.stderr.decode(), "stdin looks binary")
    res = run_cli("ask", "what is the code?", *FAST, input="")
    assert_one_line_error(res.stderr, "stdin was empty")


def test_a_file_redirected_into_stdin_is_read_too(tmp_path):
    blob = tmp_path / "blob"
    blob.write_bytes(b"\x00" * 64)
    with open(blob, "rb") as f:
        res = subprocess.run([*KVPOT, "ask", "q?", *FAST], stdin=f, capture_output=True, text=True, timeout=120)
    assert_one_line_error(res.stderr, "stdin looks binary")


def test_piped_text_is_answered(smollm2_path):
    doc = "The strongbox code is 4417. The lighthouse keeper wrote it down on a Tuesday.\n" * 4
    res = run_cli("ask", "What is the strongbox code?", *FAST, input=doc)
    # the 135M test model may answer nothing (exit NO_ANSWER_EXIT): what is checked is that the pipe was read
    assert res.returncode in (0, NO_ANSWER_EXIT), res.stderr
    assert " · stdin · " in res.stderr
    read = re.search(r"read ([\d,]+) tokens", res.stderr)
    assert read and int(read.group(1).replace(",", "")) > 50, res.stderr

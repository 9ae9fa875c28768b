"""Ctrl-C while `kvpot ask` reads, in a real process: the reading stops in the chunk being decoded
(kvpot.runtime.abort; tests/test_abort_decode.py checks that the chunk leaves nothing behind) and says
how far it got (exit 130, no traceback); SIGTERM ends it as the signal would (exit 143) after one line;
a process that ignores SIGINT (started with `&` from a script, or under nohup) is not stopped by one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from kvpot.bench.logbook import logbook

OPTIONS = ["--budget", "512", "--chunk", "128", "-n", "4", "--prompt-format", "completion", "--threads", "2"]


@pytest.fixture(scope="module")
def doc(tmp_path_factory, smollm2_cut_path):
    """The document, the question and the options; SmolLM2 cut to 4 blocks reads it (the continued read's
    reference is the same model's uninterrupted read)."""
    text, question, _ = logbook(n_entries=120, seed=3)
    path = tmp_path_factory.mktemp("doc") / "logbook.txt"
    path.write_text(text)
    return path, question, ["--model", str(smollm2_cut_path), *OPTIONS]


def _signal_at(args: list[str], sig: int, line_start: str, ignore: bool = False) -> tuple[int, str]:
    """Run kvpot with `args`, send `sig` when a stderr line starts with `line_start`; exit status and stderr.
    `ignore`: SIGINT ignored, as the shell gives a background job (else the default). A progress line
    comes after every chunk (KVPOT_PROGRESS_EVERY=0), so that the first comes with 40 chunks still to
    read however fast the CPU reads (every 5 seconds, a fast one read the whole document before it)."""
    from conftest import sigint_disposition

    cmd = [sys.executable, "-c", "from kvpot.cli.main import main; main()", *args]
    env = {**os.environ, "KVPOT_PROGRESS_EVERY": "0"}
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_disposition(ignored=ignore), env=env)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith(line_start):
            break
    proc.send_signal(sig)
    _, rest = proc.communicate(timeout=600)
    return proc.returncode, "".join(lines) + rest


def _ask_and_interrupt(doc, ignore: bool, sig: int = signal.SIGINT) -> tuple[int, str]:
    """Stopped as reading starts (-v's "reading ..." line is printed once Ctrl-C is handled)."""
    path, question, args = doc
    return _signal_at(["ask", str(path), question, *args, "-v"], sig, "reading ", ignore)


def test_ctrl_c_stops_the_reading_at_a_chunk_and_says_how_far(doc):
    rc, stderr = _ask_and_interrupt(doc, ignore=False)
    assert rc == 130, stderr
    assert "Traceback" not in stderr
    stopped = [ln for ln in stderr.splitlines() if ln.startswith("stopped after ")]
    assert len(stopped) == 1, stderr
    assert "interrupted" in stderr
    assert "failed with error" not in stderr  # llama.cpp's error line for an aborted graph is kvpot's doing


def test_an_ignored_sigint_lets_the_reading_finish(doc):
    rc, stderr = _ask_and_interrupt(doc, ignore=True)
    assert rc in (0, 5), stderr  # 5: the model answered nothing (said on stderr)
    assert "stopped" not in stderr and "interrupted" not in stderr
    assert any(ln.startswith("read ") and " tokens in " in ln for ln in stderr.splitlines()), stderr


def test_sigterm_while_reading_ends_with_one_line(doc):
    rc, stderr = _ask_and_interrupt(doc, ignore=False, sig=signal.SIGTERM)
    assert rc == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr
    assert "kvpot: stopped by SIGTERM" in stderr
    assert "failed with error" not in stderr


def _run(args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", "from kvpot.cli.main import main; main()", *args]
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)


def _stop_once_reading(args: list[str], sig: int) -> tuple[int, str]:
    """Started, then stopped at its first progress line (some chunks read, more to come)."""
    return _signal_at(args, sig, "read ")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stopped_read_is_saved_and_continues_to_the_whole_reads_answer(doc, tmp_path, sig):
    """With --save-context, a read stopped by Ctrl-C or SIGTERM is saved before the process ends, and
    `--context PATH --continue` reads the rest and answers as the uninterrupted read does."""
    from kvpot.session.context_file import read_context

    path, question, args = doc
    ctx = tmp_path / "stopped.kvpot"
    rc, stderr = _stop_once_reading(["ask", str(path), question, *args, "--save-context", str(ctx)], sig)
    assert rc == (130 if sig == signal.SIGINT else 128 + sig), stderr
    assert "Traceback" not in stderr and f"context saved to {ctx}" in stderr
    assert f"kvpot ask --context {ctx} --continue" in stderr
    header = read_context(ctx).header
    assert 0 < header["tokens_read"] == header["read_point"]["pos"] + header["read_point"]["skip"]
    if sig != signal.SIGINT:
        return  # the same saved read: continued once, below
    whole = _run(["ask", str(path), question, *args])
    assert whole.returncode in (0, 5), whole.stderr
    more = _run(["ask", "--context", str(ctx), "--continue", question, "-n", "4"])
    assert more.returncode == whole.returncode, more.stderr
    assert "more tokens (" in more.stderr, more.stderr
    assert more.stdout == whole.stdout
    again = _run(["ask", "--context", str(ctx), question, "-n", "4"])  # without --continue: said, not read
    assert f"--continue reads the rest of {path}" in again.stderr and "more tokens" not in again.stderr


def test_a_stopped_read_without_a_save_says_how_to_keep_one(doc):
    path, question, args = doc
    rc, stderr = _stop_once_reading(["ask", str(path), question, *args], signal.SIGINT)
    assert rc == 130, stderr
    assert "with --save-context PATH a stopped read is saved, and `--context PATH --continue` reads the rest" in stderr
    assert "context saved" not in stderr

"""Saves respect the filesystem: only a regular file or a new name is replaced, a symlink is written
through, a failed save is one line (the answer is still printed, the chat goes on), and temporary
files do not outlive SIGTERM, SIGHUP or (at the next save) a kill -9."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import assert_one_line_error, run_cli
from typer.testing import CliRunner

from kvpot.bench.logbook import logbook
from kvpot.cli.main import app
from kvpot.errors import KvpotError
from kvpot.safe_write import atomic_write, remove_stale_temps, resolve_target, temp_pattern

runner = CliRunner()
FAST = ["--model", "smollm2-135m", "--budget", "512", "--chunk", "128", "-n", "8", "--prompt-format", "completion",
        "--threads", "1"]


def _temps(folder, name: str) -> list[str]:
    pat = temp_pattern(folder / name)
    return [p for p in os.listdir(folder) if pat.match(p)]


def test_symlink_is_written_through_and_stays_a_link(tmp_path):
    target = tmp_path / "real.kvctx"
    target.write_bytes(b"old")
    link = tmp_path / "link.kvctx"
    link.symlink_to(target)
    with atomic_write(link, "context") as f:
        f.write(b"new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == b"new"
    assert _temps(tmp_path, "real.kvctx") == [] and _temps(tmp_path, "link.kvctx") == []


def test_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.kvctx"
    link.symlink_to(tmp_path / "new.kvctx")
    with atomic_write(link, "context") as f:
        f.write(b"x")
    assert link.is_symlink() and (tmp_path / "new.kvctx").read_bytes() == b"x"


@pytest.mark.parametrize("make, needle", [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.symlink_to("/dev/null"), "not a regular file"),
])
def test_non_regular_targets_are_refused_and_left_alone(tmp_path, make, needle):
    path = tmp_path / "target"
    make(path)
    before = os.lstat(path)
    with pytest.raises(KvpotError, match=needle):
        resolve_target(path, "context")
    after = os.lstat(path)
    assert (before.st_mode, before.st_ino) == (after.st_mode, after.st_ino)


@pytest.mark.parametrize("path, needle", [("", "the path is empty"), ("/no/such/folder/x.kvctx", "does not exist")])
def test_bad_paths_are_one_line(path, needle):
    with pytest.raises(KvpotError, match=needle):
        resolve_target(path, "context")


def test_a_killed_writers_temp_is_removed_by_the_next_save(tmp_path):
    target = tmp_path / "a.kvctx"
    # a temporary file from a process that is gone (kill -9), one from older kvpot, one of a live writer
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".a.kvctx.{int(dead.stdout)}.ab12cd34.tmp"
    legacy = tmp_path / ".a.kvctx.k3j_9x2q.tmp"
    live = tmp_path / f".a.kvctx.{os.getppid()}.ab12cd34.tmp"
    other = tmp_path / ".b.kvctx.1.ab12cd34.tmp"
    for p in (stale, legacy, live, other):
        p.write_bytes(b"partial")
    with atomic_write(target, "context") as f:
        f.write(b"data")
    assert not stale.exists() and not legacy.exists()
    assert live.exists() and other.exists()  # a running writer's file, and another target's, stay
    assert target.read_bytes() == b"data"
    assert remove_stale_temps(target) == []


WRITER = textwrap.dedent("""
    import signal, sys, time
    from kvpot.safe_write import atomic_write
    # the disposition the test asks for, whatever the test runner inherited (nohup ignores SIGHUP)
    signal.signal(signal.SIGHUP, signal.SIG_IGN if sys.argv[2] == "ignore" else signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with atomic_write(sys.argv[1], "context") as f:
        f.write(b"x" * 65536)
        f.flush()
        print("writing", flush=True)
        sys.stdin.readline()  # the test signals us here, mid-write
        f.write(b"never")
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_while_saving_leaves_no_temp_and_no_target(tmp_path, sig):
    target = tmp_path / "ctx.kvctx"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target), "default"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    assert len(_temps(tmp_path, "ctx.kvctx")) == 1  # the bytes are in a temporary file now
    proc.send_signal(sig)
    proc.wait(timeout=60)
    proc.stdin.close()
    proc.stdout.close()
    assert proc.returncode == -sig  # it still ends as the signal says
    assert _temps(tmp_path, "ctx.kvctx") == [] and not target.exists()


def test_an_ignored_sighup_does_not_interrupt_saving(tmp_path):
    """Under nohup (SIGHUP ignored) a hangup mid-save changes nothing: the save completes."""
    target = tmp_path / "ctx.kvctx"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target), "ignore"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGHUP)
    proc.stdin.write("go on\n")
    proc.stdin.flush()
    proc.wait(timeout=60)
    proc.stdin.close()
    proc.stdout.close()
    assert proc.returncode == 0
    assert target.read_bytes() == b"x" * 65536 + b"never" and _temps(tmp_path, "ctx.kvctx") == []


@pytest.fixture(scope="module")
def doc(tmp_path_factory, smollm2_path):
    text, question, _ = logbook(n_entries=12)
    path = tmp_path_factory.mktemp("doc") / "logbook.txt"
    path.write_text(text)
    return path, question


def _limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # the context is several MiB


def test_ask_save_past_the_file_size_limit_still_answers(doc, tmp_path):
    path, question = doc
    out = tmp_path / "big.kvctx"
    cmd = [sys.executable, "-c", "from kvpot.cli.main import main; main()", "ask", str(path), question,
           "--save-context", str(out), *FAST]
    res = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=_limit_file_size, timeout=600)
    assert res.returncode == 1
    assert res.stdout.strip(), "the answer was not printed"
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "cannot save the context" in errors[0] and "file-size limit" in errors[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists() and _temps(tmp_path, "big.kvctx") == []


def test_ask_save_to_a_directory_is_refused_before_reading(doc, tmp_path):
    path, question = doc
    res = run_cli("ask", str(path), question, "--save-context", str(tmp_path), *FAST)
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "is a directory")


def test_chat_save_failure_is_one_line_and_the_chat_goes_on(doc, tmp_path):
    path, question = doc
    script = f"/save {tmp_path}\n/save {tmp_path / 'no' / 'x.kvctx'}\n{question}\n/save {tmp_path / 'ok.kvctx'}\n/quit\n"
    res = runner.invoke(app, ["chat", str(path), *FAST], input=script)
    assert res.exit_code == 0, res.output
    assert "is a directory" in res.stderr and "does not exist" in res.stderr
    assert res.stdout.strip(), "the question after the failed saves was not answered"
    assert (tmp_path / "ok.kvctx").stat().st_size > 0
    assert "Traceback" not in res.stderr

"""Inputs and outputs a user can get wrong, each one line and a non-zero exit, never a traceback:
stdin or stdout closed (stdout checked before reading), stdout that fails while the answer is
written (a full device, a reader that went away), and input paths that cannot be reached (a folder
without search permission, a symlink loop, a broken symlink, a file used as a folder).

Permission checks are bypassed for root (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH): as root, the
command runs in a child that drops those two capabilities first, so the cases run everywhere."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from conftest import as_a_user, assert_one_line_error

from kvpot.cli import _common
from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources

KVPOT = [sys.executable, "-c", "from kvpot.cli.main import main; main()"]
FAST = ["--budget", "512", "--chunk", "128", "-n", "4", "--prompt-format", "completion", "--threads", "1"]


def _kvpot(*args: str, preexec=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*KVPOT, *args], capture_output=kw.pop("capture_output", True), text=True, timeout=600,
                          preexec_fn=preexec, **kw)


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("The strongbox code is 4417. The lighthouse keeper wrote it down on a Tuesday.\n" * 4)
    return path


# -- stdin and stdout ------------------------------------------------------------------------------

def test_stdin_closed_is_one_line():
    res = _kvpot("ask", "-", "Q", *FAST, preexec=lambda: os.close(0))
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "stdin is closed")


def test_chat_with_stdin_closed_is_one_line(doc):
    res = _kvpot("chat", str(doc), *FAST, preexec=lambda: os.close(0))
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "stdin is closed")


@pytest.mark.parametrize("command", [["ask", "{doc}", "Q"], ["run", "-f", "{doc}", "-p", "Q"]])
def test_stdout_closed_is_refused_before_reading(doc, command):
    args = [a.format(doc=doc) for a in command]
    res = subprocess.run([*KVPOT, *args, "-m", "smollm2-135m"], stderr=subprocess.PIPE, text=True, timeout=600,
                         preexec_fn=lambda: os.close(1))
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "stdout is closed")  # one line: nothing was read ("reading ..." lines)


def test_stdout_open_for_reading_is_refused_before_reading(doc):
    with open(os.devnull) as readonly:
        res = subprocess.run([*KVPOT, "ask", str(doc), "Q", *FAST], stdout=readonly, stderr=subprocess.PIPE,
                             text=True, timeout=600)
    assert res.returncode == 1
    assert_one_line_error(res.stderr, "stdout is open for reading only")


def test_stdout_on_a_full_device_is_one_line(doc, smollm2_path):
    with open("/dev/full", "w") as full:
        res = subprocess.run([*KVPOT, "ask", str(doc), "What is the code?", "-m", str(smollm2_path), *FAST],
                             stdout=full, stderr=subprocess.PIPE, text=True, timeout=600)
    assert res.returncode == 1
    errors = [ln for ln in res.stderr.splitlines() if "error" in ln.lower() or "exception" in ln.lower()]
    assert errors == ["error: cannot write the answer to stdout: No space left on device"], res.stderr
    assert "Traceback" not in res.stderr


def test_a_reader_that_went_away_is_one_line(monkeypatch):
    """A pipe whose reader closed: the write fails (EPIPE), the error is one line, and fd 1 of the
    failed stream is pointed at /dev/null so Python's exit flush has nothing to complain about."""
    r, w = os.pipe()
    os.close(r)
    out = io.TextIOWrapper(io.BufferedWriter(io.FileIO(w, "w")), write_through=False)
    monkeypatch.setattr(sys, "stdout", out)
    with pytest.raises(KvpotError, match="cannot write the answer to stdout: Broken pipe"):
        _common.write_out("the answer")
    out.write("more")
    out.flush()  # what was buffered now goes to /dev/null: no second error at exit
    assert os.path.samestat(os.fstat(w), os.stat(os.devnull))
    out.close()


# -- input paths ---------------------------------------------------------------------------------

@pytest.fixture
def locked(tmp_path):
    """A folder with a text file in it, and a way to take its permissions away (restored after)."""
    folder = tmp_path / "locked"
    folder.mkdir()
    (folder / "f.txt").write_text("text that cannot be reached\n" * 8)
    yield folder
    folder.chmod(0o755)


@pytest.mark.parametrize("mode", [0o000, 0o444])  # nothing, or listable but not searchable
def test_a_file_in_a_folder_without_search_permission(locked, mode):
    locked.chmod(mode)
    for args in (["ask", str(locked / "f.txt"), "Q"], ["run", "-f", str(locked / "f.txt"), "-p", "Q"]):
        res = _kvpot(*args, "-m", "smollm2-135m", preexec=as_a_user)
        assert res.returncode == 1
        assert_one_line_error(res.stderr, "permission denied (a folder on its path is not searchable)")


@pytest.mark.parametrize("mode", [0o000, 0o444])
def test_a_folder_input_without_permission(locked, mode):
    locked.chmod(mode)
    res = _kvpot("ask", str(locked), "Q", *FAST, preexec=as_a_user)
    assert res.returncode == 1
    assert_one_line_error(res.stderr, f"cannot read directory {locked}: Permission denied")


def test_an_unreadable_folder_inside_an_input_is_skipped_with_a_notice(tmp_path, locked):
    (tmp_path / "top.txt").write_text("readable text\n" * 8)
    locked.chmod(0o000)
    code = ("from kvpot.ingest import collect_sources; import sys; "
            f"s = collect_sources([{str(tmp_path)!r}], notice=lambda m: print('notice:', m, file=sys.stderr)); "
            "print([x.name for x in s.sources])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         preexec_fn=as_a_user)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str([str(tmp_path / "top.txt")])
    # the folder's notice, then the one summary line of what the input's folders gave
    assert res.stderr.strip().splitlines() == [f"notice: skipping folder {locked}: Permission denied",
                                               "notice: reading 1 file"]


def _loop(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    return str(tmp_path / "a")


def _dangling(tmp_path):
    (tmp_path / "gone").symlink_to(tmp_path / "nothing-here.txt")
    return str(tmp_path / "gone")


def _under_a_file(tmp_path):
    (tmp_path / "plain.txt").write_text("text\n")
    return str(tmp_path / "plain.txt" / "x.txt")


@pytest.mark.parametrize("make, needle", [
    (_loop, "is a symlink loop"),
    (_dangling, "is a broken symlink (to "),
    (_under_a_file, "a part of its path is a file, not a folder"),
    (lambda tmp_path: str(tmp_path / "missing.txt"), "does not exist"),
])
def test_unreachable_paths_say_why(tmp_path, make, needle):
    item = make(tmp_path)
    with pytest.raises(KvpotError, match="^input ") as e:
        collect_sources([item])
    assert needle in str(e.value) and item in str(e.value)

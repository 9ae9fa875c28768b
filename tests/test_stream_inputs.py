"""Inputs that are not regular files (FIFOs, process substitution, /proc files, a terminal on stdin)
are read as streams: nothing is consumed twice, a read that blocks says it is waiting."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading

import pytest

from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources, looks_like_input


def _text(sources) -> str:
    return "".join(sources.pieces())


def test_fifo_is_read_whole(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    text = "line of the logbook\n" * 2000  # more than the sniffed head

    def writer():
        with open(fifo, "w") as f:
            f.write(text)

    t = threading.Thread(target=writer)
    t.start()
    notices: list[str] = []
    sources = collect_sources([str(fifo)], notice=notices.append)
    got = _text(sources)
    t.join()
    assert got == text
    assert sources.total_bytes is None  # a stream has no size to plan by


def test_fifo_without_a_writer_says_it_is_waiting(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    notices: list[str] = []
    said = threading.Event()

    def notice(msg: str) -> None:
        notices.append(msg)
        said.set()

    def writer():
        said.wait(60)  # write only once the reader has said it waits
        with open(fifo, "w") as f:
            f.write("late text\n")

    t = threading.Thread(target=writer)
    t.start()
    sources = collect_sources([str(fifo)], notice=notice)
    assert _text(sources) == "late text\n"
    t.join()
    assert notices == [f"waiting for input on {fifo}"]


def test_process_substitution_is_read(tmp_path):
    """`kvpot ask <(cat notes.txt) q` passes /dev/fd/N, a pipe."""
    notes = tmp_path / "notes.txt"
    notes.write_text("the captain is Ada\n" * 100)
    code = ("import sys; from kvpot.ingest import collect_sources; "
            "print(''.join(collect_sources([sys.argv[1]]).pieces()), end='')")
    res = subprocess.run(["bash", "-c", f'{sys.executable} -c "{code}" <(cat {notes})'], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout == notes.read_text()


def test_proc_file_is_read():
    path = f"/proc/{os.getpid()}/status"
    assert os.stat(path).st_size == 0  # what made it look empty
    got = _text(collect_sources([path]))
    assert got.startswith("Name:") and "Pid:" in got


def test_empty_fifo_is_refused(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    t = threading.Thread(target=lambda: open(fifo, "w").close())
    t.start()
    with pytest.raises(KvpotError, match="is empty"):
        collect_sources([str(fifo)])
    t.join()


class _Terminal(io.BytesIO):
    def isatty(self) -> bool:
        return True


def test_stdin_on_a_terminal_says_it_reads_stdin():
    notices: list[str] = []
    sources = collect_sources(["-"], notice=notices.append, stdin=_Terminal(b"typed text\n"))
    assert notices == ["reading the document from stdin (the terminal); end it with Ctrl-D"]
    assert sources.sources[0].head == b"typed text\n"


def test_a_lone_input_is_not_taken_for_the_question(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    assert looks_like_input(str(f)) and looks_like_input("-")
    assert not looks_like_input("Who is the captain?") and not looks_like_input("")

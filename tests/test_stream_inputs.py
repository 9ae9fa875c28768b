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


# -- reading ahead (--budget auto learns a stream's length when it ends within what could fit) --

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(4000))  # ~200 KB


@pytest.mark.parametrize("max_bytes", [10 * len(TEXT), len(TEXT) - 1, 1000])
def test_stdin_read_ahead_ends_or_stops_and_loses_nothing(max_bytes):
    stdin = io.BytesIO(TEXT.encode())
    sources = collect_sources(["-"], stdin=stdin)
    sources.read_ahead(max_bytes, stdin=stdin)
    src = sources.sources[0]
    ended = len(TEXT) <= max_bytes
    assert src.complete is ended
    assert sources.total_bytes == (len(TEXT) if ended else None)
    assert len(src.head) <= max_bytes + (1 << 16) + 4096  # held: the limit, one piece past it at most
    assert "".join(sources.pieces(stdin=stdin)) == TEXT  # what was read ahead is read once, in order


def test_fifo_read_ahead_holds_it_whole_and_closes_it(tmp_path):
    fifo = tmp_path / "doc.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(TEXT))
    writer.start()
    sources = collect_sources([str(fifo)])
    sources.read_ahead(10 * len(TEXT))
    writer.join()
    src = sources.sources[0]
    assert src.complete and src.stream is None and sources.total_bytes == len(TEXT)
    assert "".join(sources.pieces()) == TEXT
    assert "".join(sources.pieces()) == TEXT  # held in memory: read again, the same text


def test_two_streams_share_the_read_ahead_limit(tmp_path):
    fifo = tmp_path / "doc.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(TEXT))
    writer.start()
    stdin = io.BytesIO(TEXT.encode())
    sources = collect_sources([str(fifo), "-"], stdin=stdin)
    sources.read_ahead(len(TEXT) + 70_000, stdin=stdin)  # the first ends within it (heads count), the second cannot
    a, b = sources.sources
    assert a.complete and not b.complete and sources.total_bytes is None
    text = "".join(sources.pieces(stdin=stdin))
    writer.join()
    assert text.count(TEXT) == 2 and len(text) > 2 * len(TEXT)  # both, whole, with their headers

"""Compressed text on stdin (`cat app.log.gz | kvpot ask "..."`): told by its magic bytes, as a file is,
and decompressed as it is read; a truncated or corrupt stream, and a document that needs seeking (PDF,
EPUB), are refused with one line before a model loads."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import re
import subprocess
import sys
import threading

import pytest
import zstandard
from conftest import assert_one_line_error
from docmaker import write_epub, write_pdf

from kvpot.cli._common import NO_ANSWER_EXIT
from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources
from kvpot.ingest.formats import compressed

COMPRESS = {
    "gzip": gzip.compress,
    "xz": lzma.compress,
    "bzip2": bz2.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}
KVPOT = [sys.executable, "-c", "from kvpot.cli.main import main; main()"]
FAST = ["--budget", "512", "--chunk", "128", "-n", "8", "--prompt-format", "completion",
        "--threads", "1"]
SERVICES = ["auth", "billing", "search", "mailer", "cache", "gateway"]


def _log(n: int) -> str:
    """A service log of n lines, varied enough that it does not compress to a few bytes."""
    return "".join(f"2024-05-{1 + i % 28:02d}T{i % 24:02d}:{i * 7 % 60:02d}:{i * 13 % 60:02d} "
                   f"{SERVICES[i * 5 % len(SERVICES)]}: request {i * 7919 % 100003} took {i * 31 % 997} ms\n"
                   for i in range(n))


def _read_file(path):
    src = collect_sources([str(path)])
    return src, "".join(src.pieces())


def _read_stdin(data: bytes, **kw):
    stream = io.BytesIO(data)
    src = collect_sources(["-"], stdin=stream, **kw)
    return src, "".join(src.pieces(stdin=stream)), stream


def _lines_are_right(src, text: str) -> None:
    """Every mark's "line N" is the line its offset is on in the text read."""
    assert src.marks
    for m in src.marks:
        assert m.source == "-" and m.where == f"line {text[:m.offset].count(chr(10)) + 1}"


@pytest.mark.parametrize("codec", list(COMPRESS))
def test_compressed_stdin_reads_as_the_plain_file_does(tmp_path, codec):
    log = _log(3000)  # past one 64 KiB piece: read in several
    plain = tmp_path / "app.log"
    plain.write_text(log)
    _, want = _read_file(plain)
    src, got, _ = _read_stdin(COMPRESS[codec](log.encode()))
    assert got == want
    s = src.sources[0]
    assert s.kind.codec == codec and s.kind.kind == "text" and s.complete
    assert s.size == len(COMPRESS[codec](log.encode()))  # its size is the stream's, as a file's is its file's
    _lines_are_right(src, got)


def test_every_gzip_member_on_stdin(tmp_path):
    a, b = _log(40), _log(70)
    _, got, _ = _read_stdin(gzip.compress(a.encode()) + gzip.compress(b.encode()))
    assert got == a + b


def test_compressed_html_on_stdin_reads_as_the_file_does(tmp_path):
    page = ("<!DOCTYPE html><html><head><title>Incident</title><script>x = 1</script></head><body>"
            "<h1>Outage</h1><p>The billing service failed at noon.</p></body></html>")
    path = tmp_path / "report.html.gz"
    path.write_bytes(gzip.compress(page.encode()))
    _, want = _read_file(path)
    src, got, _ = _read_stdin(path.read_bytes())
    assert got == want and src.sources[0].kind.kind == "html"


def test_a_stream_longer_than_the_check_is_read_lazily(tmp_path, monkeypatch):
    monkeypatch.setattr(compressed, "VERIFY_BYTES", 4096)
    log = _log(2000)
    data = gzip.compress(log.encode())
    assert len(data) > 4096 * 4
    stream = io.BytesIO(data)
    src = collect_sources(["-"], stdin=stream)
    s = src.sources[0]
    assert not s.complete and s.size is None and 4096 < len(s.head) < len(data)  # only the check's bytes held
    assert "".join(src.pieces(stdin=stream)) == log
    # read ahead (--budget auto) to its end: the rest of the stream joins the held bytes
    stream = io.BytesIO(data)
    src = collect_sources(["-"], stdin=stream)
    src.read_ahead(len(data) * 2, stdin=stream)
    assert src.sources[0].complete and src.sources[0].size == len(data)
    assert "".join(src.pieces(stdin=io.BytesIO())) == log


def test_a_gzip_fifo_is_read_as_the_file(tmp_path):
    log = _log(500)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def write():
        with open(fifo, "wb") as f:
            f.write(gzip.compress(log.encode()))

    writer = threading.Thread(target=write)
    writer.start()
    try:
        src = collect_sources([str(fifo)])
    finally:
        writer.join(timeout=30)
    assert "".join(src.pieces()) == log and src.sources[0].kind.codec == "gzip"


# -- refusals ------------------------------------------------------------------------------------

def _one_line(e: pytest.ExceptionInfo, needle: str) -> None:
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("codec", list(COMPRESS))
def test_a_truncated_stream_is_one_line(codec):
    data = COMPRESS[codec](_log(2000).encode())
    with pytest.raises(KvpotError) as e:
        collect_sources(["-"], stdin=io.BytesIO(data[: len(data) // 2]))
    _one_line(e, f"stdin is a truncated or corrupt {codec} stream")


def test_a_corrupt_stream_past_the_check_is_one_line_while_reading(monkeypatch):
    monkeypatch.setattr(compressed, "VERIFY_BYTES", 4096)
    data = bytearray(gzip.compress(_log(2000).encode()))
    data[len(data) // 2: len(data) // 2 + 64] = bytes(64)  # damage far past the bytes checked
    stream = io.BytesIO(bytes(data))
    src = collect_sources(["-"], stdin=stream)
    with pytest.raises(KvpotError) as e:
        "".join(src.pieces(stdin=stream))
    _one_line(e, "stdin is a truncated or corrupt gzip stream")


def test_zstd_on_stdin_without_the_package_names_it(monkeypatch):
    import builtins

    data = COMPRESS["zstd"](_log(10).encode())
    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (
        (_ for _ in ()).throw(ImportError(name)) if name == "zstandard" else real(name, *a, **k)))
    with pytest.raises(KvpotError) as e:
        collect_sources(["-"], stdin=io.BytesIO(data))
    _one_line(e, "stdin is zstd-compressed: pip install zstandard")


def test_compressed_binary_and_empty_streams_are_refused():
    with pytest.raises(KvpotError) as e:
        collect_sources(["-"], stdin=io.BytesIO(gzip.compress(bytes(range(256)) * 40)))
    _one_line(e, "stdin looks binary once decompressed (gzip)")
    with pytest.raises(KvpotError) as e:
        collect_sources(["-"], stdin=io.BytesIO(xz := lzma.compress(b"")))
    assert xz  # an xz stream of nothing is still a stream
    _one_line(e, "stdin is empty once decompressed")


def test_documents_that_need_seeking_are_refused_on_stdin(tmp_path):
    pdf = write_pdf(tmp_path / "a.pdf", [["the billing service failed"]]).read_bytes()
    with pytest.raises(KvpotError) as e:
        collect_sources(["-"], stdin=io.BytesIO(pdf))
    _one_line(e, "stdin holds a PDF")
    assert "pass its path" in str(e.value)
    epub = write_epub(tmp_path / "a.epub", "t", [("c", ["p"])]).read_bytes()
    with pytest.raises(KvpotError) as e:
        collect_sources(["-"], stdin=io.BytesIO(epub))
    _one_line(e, "stdin holds a zip archive")
    assert "pass its path" in str(e.value)


# -- through the CLI -----------------------------------------------------------------------------

def _ask(data: bytes, *inputs: str, model: str = "smollm2-135m") -> subprocess.CompletedProcess:
    """`kvpot ask [INPUTS] "Which service failed?"` with `data` on stdin (no INPUTS: the pipe is the input)."""
    return subprocess.run([*KVPOT, "ask", *inputs, "Which service failed?", "--model", model, *FAST], input=data,
                          capture_output=True, timeout=600)


def test_cli_refuses_a_corrupt_stream_and_a_pdf_with_one_line(tmp_path):
    data = gzip.compress(_log(500).encode())
    res = _ask(data[:-40])
    assert res.returncode == 1
    assert_one_line_error(res.stderr.decode(), "stdin is a truncated or corrupt gzip stream")
    res = _ask(write_pdf(tmp_path / "a.pdf", [["the billing service failed"]]).read_bytes(), "-")
    assert res.returncode == 1
    assert_one_line_error(res.stderr.decode(), "stdin holds a PDF")


def _tokens_read(stderr: str) -> int:
    read = re.search(r"read ([\d,]+) tokens in ", stderr)  # the summary, not a progress line
    assert read, stderr
    return int(read.group(1).replace(",", ""))


def test_a_piped_gzip_log_is_answered_as_the_plain_log_is(smollm2_cut_path):
    log = _log(30) + "2024-05-30T12:00:00 billing: FAILED, the service stopped answering\n"
    # the answer of one path against the other's: SmolLM2 cut to 4 blocks (conftest.py) serves
    plain = _ask(log.encode(), model=str(smollm2_cut_path))
    piped = _ask(gzip.compress(log.encode()), model=str(smollm2_cut_path))
    # the model may answer nothing (exit NO_ANSWER_EXIT): what is checked is what was read
    for res in (plain, piped):
        assert res.returncode in (0, NO_ANSWER_EXIT), res.stderr.decode()
        assert " · stdin · " in res.stderr.decode()
    assert _tokens_read(piped.stderr.decode()) == _tokens_read(plain.stderr.decode()) > 300
    assert piped.stdout == plain.stdout

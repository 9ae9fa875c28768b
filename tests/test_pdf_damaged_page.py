"""A PDF page whose content stream pypdf cannot parse is said (one line naming the page) and skipped;
the other pages are read. Only a PDF none of whose pages yields text is refused."""

from __future__ import annotations

import json

import pytest
from docmaker import write_pdf
from typer.testing import CliRunner

from kvpot.cli.main import app
from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources

GOOD, BAD = b"(BROKEN) Tj", b"[(BROKEN Tj"  # the same length: the file's offsets stay right


def _pages(n: int) -> list[list[str]]:
    return [[f"page {p} line {i}: the keeper logged the tide" for i in range(3)] for p in range(1, n + 1)]


def _damaged_pdf(path, pages: list[list[str]], damaged: set[int]):
    """write_pdf's PDF with the content stream of each page in `damaged` (1-based) broken."""
    marked = [["BROKEN"] if i + 1 in damaged else lines for i, lines in enumerate(pages)]
    write_pdf(path, marked)
    path.write_bytes(path.read_bytes().replace(GOOD, BAD))
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    reader = PdfReader(path)
    for i in damaged:  # the page really is one pypdf cannot read
        with pytest.raises(PdfReadError):
            reader.pages[i - 1].extract_text()
    return path


def _page_text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n\n"


def test_a_damaged_page_is_said_and_skipped(tmp_path, capsys):
    pages = _pages(3)
    path = _damaged_pdf(tmp_path / "log.pdf", pages, {2})
    src = collect_sources([str(path)])
    text = "".join(src.pieces())
    assert text == _page_text(pages[0]) + _page_text(pages[2])
    assert [m.where for m in src.marks] == ["p. 1", "p. 3"]
    assert src.where(text.index(pages[2][0])).where == "p. 3"
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(said) == 1 and f"{path}: page 2 cannot be read" in said[0], said
    # read again (a budget counted first, quotes for --sources): said once
    assert "".join(src.pieces()) == text
    assert capsys.readouterr().err == ""


def test_the_warning_goes_where_the_source_set_says(tmp_path):
    pages = _pages(4)
    path = _damaged_pdf(tmp_path / "log.pdf", pages, {1, 3})
    src = collect_sources([str(path)])
    seen: list[str] = []
    src.warn = seen.append
    assert "".join(src.pieces()) == _page_text(pages[1]) + _page_text(pages[3])
    assert [m.where for m in src.marks] == ["p. 2", "p. 4"]
    assert [s.split(" cannot be read")[0] for s in seen] == [f"{path}: page 1", f"{path}: page 3"]


def test_a_pdf_with_no_readable_page_is_refused_in_one_line(tmp_path):
    path = _damaged_pdf(tmp_path / "log.pdf", _pages(2), {1, 2})
    with pytest.raises(KvpotError) as e:
        collect_sources([str(path)])
    assert "none of its 2 pages can be read" in str(e.value) and "\n" not in str(e.value)
    assert str(path) in str(e.value)


def test_what_pypdf_logs_while_reading_goes_where_the_source_set_says(tmp_path, capsys):
    """pypdf logs text it cannot decode (here a font encoding it does not know): told to `warn` once,
    naming the file and the page, never written raw to stderr (Python's last-resort log handler)."""
    pages = _pages(3)
    path = write_pdf(tmp_path / "odd.pdf", pages)
    path.write_bytes(path.read_bytes().replace(b"/WinAnsiEncoding", b"/XinAnsiEncoding"))  # same length
    src = collect_sources([str(path)])
    seen: list[str] = []
    src.warn = seen.append
    "".join(src.pieces())
    assert len(seen) == 1 and seen[0].startswith(f"{path}: page 1: Advanced encoding /XinAnsiEncoding"), seen
    assert src.warnings == seen
    assert capsys.readouterr().err == ""


# -- through the CLI: the damaged page is one notice line on stderr, and under --json also in the JSON

runner = CliRunner()
FAST = ["--model", "smollm2-135m", "--chunk", "128", "-n", "4", "--prompt-format", "completion", "--threads", "2",
        "-P", "full", "--budget", "2048"]


@pytest.mark.parametrize("as_json", [False, True])
def test_the_cli_says_a_damaged_page_once_as_a_notice(tmp_path, smollm2_path, as_json):
    path = _damaged_pdf(tmp_path / "log.pdf", _pages(3), {2})
    res = runner.invoke(app, ["ask", str(path), "What did the keeper log?", *FAST, *(["--json"] if as_json else [])])
    assert res.exit_code in (0, 5), res.output
    said = [ln for ln in res.stderr.splitlines() if "cannot be read" in ln]
    assert said == [f"{path}: page 2 cannot be read (Stream has ended unexpectedly); skipped, the other pages are "
                    "read"], res.stderr
    if as_json:
        out = json.loads(res.stdout)
        assert out["inputs"]["warnings"] == said and out["inputs"]["skipped"] == []
        assert out["inputs"]["read"] == [str(path)]
    else:
        assert "cannot be read" not in res.stdout

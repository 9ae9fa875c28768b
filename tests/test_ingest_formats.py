"""Documents beyond plain text, each made offline as a real file of its format: the text read back
equals the text put in, each piece says where it came from, and every refusal is one line."""

from __future__ import annotations

import bz2
import gzip
import lzma
import zipfile

import pytest
from docmaker import write_docx, write_epub, write_odt, write_pdf

from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources
from kvpot.ingest.formats import UnreadableInput

WORDS = "the lighthouse keeper wrote the strongbox code on a Tuesday in blue ink".split()


def _lines(n: int, seed: int) -> list[str]:
    return [" ".join(WORDS[(seed + i + k) % len(WORDS)] for k in range(6)) + f" {seed}-{i}" for i in range(n)]


def _read(path, **kw):
    src = collect_sources([str(path)], **kw)
    return src, "".join(src.pieces())


def test_pdf_text_page_by_page(tmp_path):
    pages = [_lines(5, p) for p in range(4)]
    src, text = _read(write_pdf(tmp_path / "book.pdf", pages))
    assert text == "".join("\n".join(lines) + "\n\n" for lines in pages)
    assert [m.where for m in src.marks] == [f"p. {i}" for i in range(1, 5)]
    # the first line of page 3 maps back to page 3
    assert src.where(text.index(pages[2][0])).where == "p. 3"


def test_pdf_with_owner_password_only_is_read(tmp_path):
    from pypdf import PdfReader, PdfWriter

    plain = write_pdf(tmp_path / "plain.pdf", [_lines(2, 1)])
    writer = PdfWriter(clone_from=PdfReader(plain))
    writer.encrypt(user_password="", owner_password="owner", algorithm="RC4-128")
    with open(tmp_path / "locked.pdf", "wb") as f:
        writer.write(f)
    assert _read(tmp_path / "locked.pdf")[1] == _read(plain)[1]


def test_epub_chapters_in_spine_order(tmp_path):
    chapters = [(f"Chapter {i}", _lines(3, i)) for i in range(3)]
    order = [2, 0, 1]
    src, text = _read(write_epub(tmp_path / "book.epub", "A Keeper's Book", chapters, spine_order=order))
    want = "A Keeper's Book\n\n" + "".join(
        f"# {chapters[i][0]}\n\n" + "\n\n".join(chapters[i][1]) + "\n\n" for i in order)
    assert text == want
    assert [m.where for m in src.marks] == ["title", "ch. 1", "ch. 2", "ch. 3"]


@pytest.mark.parametrize("writer", [write_docx, write_odt])
def test_word_processor_documents(tmp_path, writer):
    blocks = [(1, "The Keeper"), (0, "first  paragraph\twith a tab"), (2, "Codes"), *((0, ln) for ln in _lines(4, 7))]
    src, text = _read(writer(tmp_path / f"doc.{writer.__name__[6:]}", blocks))
    assert text == "".join(("#" * lv + " " if lv else "") + t + "\n\n" for lv, t in blocks)
    assert src.marks[0].where == "¶ 1"


def test_html_text_not_tags(tmp_path):
    title, heading, sub = "Keeper's Log", "Codes & Keys", "Tuesday"
    paras = _lines(3, 3)
    page = (f"<!DOCTYPE html><html><head><title>{title}</title><style>p {{color: red}}</style>"
            f"<script>var code = 9999;</script></head><body><h1>{heading.replace('&', '&amp;')}</h1>"
            f"<p>{paras[0]}</p><h2>{sub}</h2><div><p>{paras[1]}</p>\n  <p>{paras[2]}</p></div></body></html>")
    path = tmp_path / "log.txt"  # the name says text; the content says HTML
    path.write_text(page)
    _, text = _read(path)
    assert text == f"{title}\n\n# {heading}\n\n{paras[0]}\n\n## {sub}\n\n{paras[1]}\n\n{paras[2]}\n"


def test_markdown_is_read_as_written(tmp_path):
    md = "# Title\n\nSome *text* with <b>inline</b> markup.\n\n- a\n- b\n"
    (tmp_path / "notes.md").write_text(md)
    assert _read(tmp_path / "notes.md")[1] == md


@pytest.mark.parametrize("codec, compress", [
    ("gzip", gzip.compress), ("xz", lzma.compress), ("bzip2", bz2.compress),
])
def test_compressed_text_whatever_its_name(tmp_path, codec, compress):
    log = "".join(f"{ln}\n" for ln in _lines(200, 5))
    path = tmp_path / "syslog.txt"  # no .gz: content decides
    path.write_bytes(compress(log.encode()))
    src, text = _read(path)
    assert text == log
    assert src.sources[0].kind.codec == codec
    assert src.marks[0].where == "line 1"


def test_rotated_gzip_with_several_members(tmp_path):
    a, b = "".join(f"{x}\n" for x in _lines(5, 1)), "".join(f"{x}\n" for x in _lines(5, 2))
    (tmp_path / "app.log.gz").write_bytes(gzip.compress(a.encode()) + gzip.compress(b.encode()))
    assert _read(tmp_path / "app.log.gz")[1] == a + b


def test_zstd(tmp_path):
    import zstandard  # in the test extra: the .zst reader is checked on every machine
    log = "".join(f"{x}\n" for x in _lines(50, 9))
    (tmp_path / "a.log.zst").write_bytes(zstandard.ZstdCompressor().compress(log.encode()))
    assert _read(tmp_path / "a.log.zst")[1] == log


def test_zstd_without_the_package_names_it(tmp_path, monkeypatch):
    import builtins

    (tmp_path / "a.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 20)
    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (
        (_ for _ in ()).throw(ImportError(name)) if name == "zstandard" else real(name, *a, **k)))
    with pytest.raises(UnreadableInput, match="pip install zstandard"):
        collect_sources([str(tmp_path / "a.zst")])


def test_a_pdf_named_txt_and_a_text_named_pdf(tmp_path):
    pages = [_lines(2, 4)]
    write_pdf(tmp_path / "report.txt", pages)
    assert _read(tmp_path / "report.txt")[1] == "\n".join(pages[0]) + "\n\n"
    (tmp_path / "notes.pdf").write_text("just text, named as a PDF\n")
    src, text = _read(tmp_path / "notes.pdf")
    assert text == "just text, named as a PDF\n" and src.sources[0].kind.plain


# -- refusals: one line each --------------------------------------------------------------------

def _refusals(tmp_path):
    from pypdf import PdfReader, PdfWriter

    out = {}
    out["scanned"] = write_pdf(tmp_path / "scan.pdf", [[], []]), "no text layer"
    writer = PdfWriter(clone_from=PdfReader(write_pdf(tmp_path / "p.pdf", [["secret"]])))
    writer.encrypt(user_password="pw", owner_password="pw", algorithm="RC4-128")
    with open(tmp_path / "enc.pdf", "wb") as f:
        writer.write(f)
    out["encrypted"] = tmp_path / "enc.pdf", "needs a password"
    good = write_pdf(tmp_path / "g.pdf", [["x"]]).read_bytes()
    (tmp_path / "cut.pdf").write_bytes(good[: len(good) // 3])
    out["broken pdf"] = tmp_path / "cut.pdf", "not a readable PDF"
    gz = gzip.compress(("line of the log\n" * 5000).encode())
    (tmp_path / "cut.gz").write_bytes(gz[: len(gz) // 2])
    out["truncated gzip"] = tmp_path / "cut.gz", "truncated or corrupt gzip"
    epub = write_epub(tmp_path / "e.epub", "t", [("c", ["p"])]).read_bytes()
    (tmp_path / "cut.epub").write_bytes(epub[: len(epub) // 2])
    out["broken archive"] = tmp_path / "cut.epub", "broken zip archive"
    with zipfile.ZipFile(tmp_path / "nochap.epub", "w") as zf:
        zf.writestr("mimetype", "application/epub+zip")
        zf.writestr("META-INF/container.xml", "<container><rootfiles><rootfile full-path='x.opf'/></rootfiles></container>")
    out["epub without its package"] = tmp_path / "nochap.epub", "x.opf is missing"
    with zipfile.ZipFile(tmp_path / "bad.docx", "w") as zf:
        zf.writestr("word/document.xml", "<w:document><unclosed>")
    out["docx of bad xml"] = tmp_path / "bad.docx", "not XML"
    with zipfile.ZipFile(tmp_path / "photos.zip", "w") as zf:
        zf.writestr("a.jpg", b"\xff\xd8\xff")
    out["other zip"] = tmp_path / "photos.zip", "not a document kvpot reads"
    (tmp_path / "empty.gz").write_bytes(gzip.compress(b""))
    out["empty once decompressed"] = tmp_path / "empty.gz", "empty once decompressed"
    return out


REFUSALS = ["scanned", "encrypted", "broken pdf", "truncated gzip", "broken archive", "epub without its package",
            "docx of bad xml", "other zip", "empty once decompressed"]


@pytest.mark.parametrize("case", REFUSALS)
def test_each_refusal_is_one_line(tmp_path, case):
    path, needle = _refusals(tmp_path)[case]
    with pytest.raises(KvpotError, match=needle) as e:
        collect_sources([str(path)])
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("case", REFUSALS)
def test_a_bad_input_among_several_is_skipped_and_said(tmp_path, case):
    path, needle = _refusals(tmp_path)[case]
    good = tmp_path / "good.txt"
    good.write_text("the text that is read\n")
    seen = []
    src = collect_sources([str(path), str(good)], notice=seen.append)
    assert [s.name for s in src.sources] == [str(good)]
    assert str(path) in src.skipped
    assert any(needle in line and str(path) in line for line in seen), seen


def test_only_bad_inputs_is_an_error_naming_each(tmp_path):
    refusals = _refusals(tmp_path)
    (a, na), (b, nb) = refusals["scanned"], refusals["truncated gzip"]
    with pytest.raises(KvpotError, match="nothing left to read") as e:
        collect_sources([str(a), str(b)])
    assert na in str(e.value) and nb in str(e.value)


def test_compressed_binary_is_skipped_as_binary(tmp_path):
    (tmp_path / "blob.gz").write_bytes(gzip.compress(bytes(range(256)) * 40))
    (tmp_path / "a.txt").write_text("text\n")
    seen = []
    src = collect_sources([str(tmp_path / "blob.gz"), str(tmp_path / "a.txt")], notice=seen.append)
    assert src.skipped == [str(tmp_path / "blob.gz")] and "binary" in seen[0]

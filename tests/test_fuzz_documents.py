"""Property-based fuzzing (Hypothesis) of the document readers, with memory capped: word-processor
files (ODT, DOCX: kvpot.ingest.formats.office), EPUBs (epub.py, its chapters through the HTML reader)
and HTML (html.py), each read the way a file input is (identify, then pieces).

Property (tests/fuzzlib.py): every input is accepted or refused with one KvpotError line; and the
reader's peak of traced allocations (tracemalloc) stays within MEM_BOUND plus a small multiple of the
input file's bytes, whatever the file claims (spaces counts, heading levels, sizes, spine lengths) or
inflates to (deflated runs of up to 4 MiB), and no piece is larger than PIECE_BOUND. Inputs:
  * office, structured: paragraphs built from fuzzed parts (runs, spans nested up to thousands deep,
    `text:s` counts and heading levels as numbers, huge numbers and not numbers, styles, notes,
    deflated runs), the XML's bytes mutated in one input of four, the member stored, deflated,
    flagged encrypted or given an unknown compression method;
  * EPUB, structured: container and package files with fuzzed paths, items (with and without href or
    id), spine references and lengths, padding past the package-file limit, chapters of fuzzed HTML,
    members flagged as above;
  * HTML: fragments (comments, scripts, attributes and CDATA left open or closed, entities, headings,
    pre) in any order, with the reader's hold limit (STUCK_CHARS) and read size made small so the
    paths that skip an unclosed construct are reached by small inputs; and raw bytes;
  * mutated: valid DOCX, ODT and EPUB files flipped, cut, extended, overwritten.

`make test` runs KVPOT_FUZZ_EXAMPLES (default 300) per strategy; `make fuzz` 100,000.
"""

from __future__ import annotations

import io
import os
import struct
import tempfile
import tracemalloc
import zipfile
from contextlib import contextmanager
from pathlib import Path

from fuzzlib import FUZZ, MUTATIONS, batch, check, mutate, write_report
from hypothesis import given
from hypothesis import strategies as st

from kvpot.ingest.formats import html as html_mod
from kvpot.ingest.formats import identify, pieces

_DIR = Path(tempfile.mkdtemp(prefix="kvpot-fuzz-docs-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
MEM_BOUND = 6 << 20       # a few pieces (64 Ki characters each) and the parsers' buffers
PIECE_BOUND = 4 << 18     # characters: a piece plus what one read of the input can add to it
W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def teardown_module(module) -> None:
    write_report()
    for f in _DIR.iterdir():
        f.unlink()
    _DIR.rmdir()


def _read_bounded(path: Path) -> None:
    """The file read as a file input is (identify, then every piece), under tracemalloc."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        try:
            with open(path, "rb") as f:
                head = f.read(8192)
            kind = identify(path, head, path.name)
            if kind.kind in ("html", "epub", "docx", "odt"):
                for text, _ in pieces(kind, path, path.name):
                    assert len(text) <= PIECE_BOUND, f"a piece of {len(text):,} characters"
        finally:
            peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    bound = MEM_BOUND + 8 * path.stat().st_size
    assert peak <= bound, f"the reader peaked at {peak:,} bytes for a file of {path.stat().st_size:,}"


def _patch(data: bytes, member: str, how: str) -> bytes:
    """A member flagged encrypted, or given compression method 99, in its local and central headers."""
    if how not in ("encrypted", "method"):
        return data
    out = bytearray(data)
    name = member.encode()
    for sig, flag_at, method_at, len_at, name_at in ((b"PK\x03\x04", 6, 8, 26, 30), (b"PK\x01\x02", 8, 10, 28, 46)):
        at = out.find(sig)
        while at >= 0 and at + name_at <= len(out):
            n = struct.unpack_from("<H", out, at + len_at)[0]
            if out[at + name_at:at + name_at + n] == name:
                if how == "encrypted":
                    out[at + flag_at] |= 1
                else:
                    struct.pack_into("<H", out, at + method_at, 99)
            at = out.find(sig, at + 4)
    return bytes(out)


def _zip(members: list[tuple[str, bytes, bool]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data, deflate in members:
            zf.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED)
    return buf.getvalue()


def _run_file(data: bytes) -> None:
    path = _DIR / "input.bin"
    path.write_bytes(data)
    _read_bounded(path)


_HOW = st.sampled_from(("deflated", "deflated", "stored", "encrypted", "method"))
_NUMBERS = st.sampled_from(("1", "3", "0", "-1", "abc", "", " 2 ", "2000000000", "3000000000", "9" * 40, "\u0663",
                            "\u00b2", "1e3", "0x10", "7"))
_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<&\x00"), max_size=24)
# a deflated run: the same few characters repeated up to 1.5 MiB (a small file that inflates past a piece)
_RUN = st.tuples(st.sampled_from(("word ", " ", "\t", "x")), st.sampled_from((1, 100, 3000, 300_000)))


def _xml_text(t: str) -> str:
    # characters XML 1.0 cannot hold are left out (the mutations make broken XML enough)
    return "".join(c for c in t if c in "\t\n\r" or ord(c) >= 32).replace(">", "&gt;")


# -- office ---------------------------------------------------------------------------------------------------

_ODT_PART = st.one_of(
    st.builds(lambda t: ("text", t), _TEXT),
    st.builds(lambda c: ("s", c), _NUMBERS),
    st.just(("tab",)), st.just(("line-break",)),
    st.builds(lambda t: ("note", t), _TEXT),
    st.builds(lambda n, t: ("span", n, t), st.sampled_from((1, 2, 50, 3000)), _TEXT),
    st.builds(lambda r: ("run", r), _RUN),
    st.just(("inner-p",)),
)
_ODT_PARA = st.tuples(st.one_of(st.none(), _NUMBERS), st.lists(_ODT_PART, max_size=6))
_DOCX_STYLES = st.sampled_from(("Heading1", "Heading2", "Heading\u00b2", "Heading3000000000", "Heading", "Title",
                                "heading 2", "HeadingX", "Heading" + "9" * 5000, "Normal", ""))
_DOCX_PART = st.one_of(
    st.builds(lambda t: ("text", t), _TEXT),
    st.just(("tab",)), st.just(("br",)), st.just(("cr",)),
    st.builds(lambda n, t: ("nest", n, t), st.sampled_from((1, 3, 3000)), _TEXT),
    st.builds(lambda r: ("run", r), _RUN),
    st.just(("inner-p",)),
)
_DOCX_PARA = st.tuples(st.one_of(st.none(), _DOCX_STYLES), st.lists(_DOCX_PART, max_size=6))
_OFFICE = st.tuples(st.sampled_from(("odt", "docx")), st.lists(_ODT_PARA, max_size=5), st.lists(_DOCX_PARA, max_size=5),
                    st.one_of(st.none(), st.none(), st.none(), MUTATIONS), _HOW)


def _odt_xml(paras) -> str:
    out = []
    for level, parts in paras:
        body = []
        for part in parts:
            kind = part[0]
            if kind == "text":
                body.append(_xml_text(part[1]))
            elif kind == "s":
                body.append(f'<text:s text:c="{part[1]}"/>')
            elif kind in ("tab", "line-break"):
                body.append(f"<text:{kind}/>")
            elif kind == "note":
                body.append(f"<text:note><text:note-citation>1</text:note-citation><text:note-body><text:p>"
                            f"{_xml_text(part[1])}</text:p></text:note-body></text:note>")
            elif kind == "span":
                body.append("<text:span>" * part[1] + _xml_text(part[2]) + "</text:span>" * part[1])
            elif kind == "run":
                body.append(_xml_text(part[1][0]) * part[1][1])
            else:
                body.append("<text:p>inner</text:p>")
        tag = "text:p" if level is None else "text:h"
        attr = "" if level is None else f' text:outline-level="{level}"'
        out.append(f"<{tag}{attr}>{''.join(body)}</{tag}>")
    return ('<?xml version="1.0"?><office:document-content '
            'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
            'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"><office:body><office:text>'
            + "".join(out) + "</office:text></office:body></office:document-content>")


def _docx_xml(paras) -> str:
    out = []
    for style, parts in paras:
        body = [] if style is None else [f'<w:pPr><w:pStyle w:val="{style}"/><w:tabs><w:tab/></w:tabs></w:pPr>']
        for part in parts:
            kind = part[0]
            if kind == "text":
                body.append(f'<w:r><w:t xml:space="preserve">{_xml_text(part[1])}</w:t></w:r>')
            elif kind in ("tab", "br", "cr"):
                body.append(f"<w:r><w:{kind}/></w:r>")
            elif kind == "nest":
                body.append("<w:sdt><w:sdtContent>" * part[1] + f"<w:r><w:t>{_xml_text(part[2])}</w:t></w:r>"
                            + "</w:sdtContent></w:sdt>" * part[1])
            elif kind == "run":
                body.append(f"<w:r><w:t>{_xml_text(part[1][0]) * part[1][1]}</w:t></w:r>")
            else:
                body.append("<w:r><w:pict><w:txbxContent><w:p><w:r><w:t>inner</w:t></w:r></w:p></w:txbxContent>"
                            "</w:pict></w:r>")
        out.append(f"<w:p>{''.join(body)}</w:p>")
    return f'<?xml version="1.0"?><w:document xmlns:w="{W}"><w:body>' + "".join(out) + "</w:body></w:document>"


def _office_bytes(spec) -> bytes:
    kind, odt_paras, docx_paras, plan, how = spec
    xml = (_odt_xml(odt_paras) if kind == "odt" else _docx_xml(docx_paras)).encode()
    if plan:
        xml = mutate(xml, plan)
    member = "content.xml" if kind == "odt" else "word/document.xml"
    members = [("mimetype", b"application/vnd.oasis.opendocument.text", False)] if kind == "odt" else []
    return _patch(_zip(members + [(member, xml, how != "stored")]), member, how)


@FUZZ
@given(batch(_OFFICE))
def test_fuzz_office_structured(batch):
    for spec in batch:
        check("office, structured", _run_file, _office_bytes(spec))


# -- EPUB -----------------------------------------------------------------------------------------------------

_HTML_FRAGMENTS = st.sampled_from((
    "<p>", "</p>", "<!--", "-->", "<script>", "</script>", "<style>", "</style>", '<a href="', '"', "'", ">", "<",
    "&amp;", "&#x110000;", "&#99999999999;", "&", "<h1>", "</h1>", "<h7>", "<pre>", "</pre>", "<![CDATA[", "]]>",
    "<!DOCTYPE html>", "<?xml ", "?>", "\n", " ", "secret", "<li>", "<br/>", "<title>", "</title>", "<svg>", "</",
    "\ufeff", "<div", "=", "text words",
))
_HTML = st.tuples(st.lists(st.one_of(_HTML_FRAGMENTS, _TEXT), max_size=24),
                  st.one_of(st.none(), st.tuples(st.integers(0, 24), _HTML_FRAGMENTS, st.sampled_from((10, 100, 3000)))))


def _html_text(spec) -> str:
    parts, repeat = spec
    parts = list(parts)
    if repeat is not None:
        at, frag, n = repeat
        parts.insert(at % (len(parts) + 1), frag * n)
    return "".join(parts)


_PATHS = st.sampled_from(("content.opf", "OEBPS/content.opf", "missing.opf", "", "../up.opf", "/abs.opf"))
_HREFS = st.one_of(st.none(), st.sampled_from(("c.xhtml", "c.xhtml#frag", "c%2Exhtml", "../c.xhtml", "", "nope.xhtml",
                                               "content.opf", "META-INF/container.xml", "d.xhtml")))
_ITEM = st.tuples(st.one_of(st.none(), st.sampled_from(("c", "d", "x", ""))), _HREFS)
_EPUB = st.tuples(
    _PATHS, st.lists(_ITEM, max_size=4),
    st.lists(st.one_of(st.none(), st.sampled_from(("c", "d", "x", ""))), max_size=4),
    st.sampled_from((1, 1, 2, 1000)),                      # the spine repeated
    st.sampled_from((0,) * 7 + (5 << 20,)),                # padding of the package file (deflated)
    st.lists(_HTML, min_size=1, max_size=2),               # chapters c.xhtml, d.xhtml
    st.sampled_from(("", "", "META-INF/container.xml", "content.opf", "c.xhtml")), _HOW,
    st.one_of(st.none(), st.none(), st.none(), MUTATIONS),
    st.booleans(),                                         # an encryption.xml naming the chapter
)


def _epub_bytes(spec) -> bytes:
    rootfile, items, refs, repeat, pad, chapters, patched, how, plan, encryption = spec
    container = ('<?xml version="1.0"?><container xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
                 f'<rootfiles><rootfile full-path="{rootfile}"/></rootfiles></container>').encode()
    manifest = "".join("<item" + ("" if i is None else f' id="{i}"') + ("" if h is None else f' href="{h}"') + "/>"
                       for i, h in items)
    spine = "".join("<itemref" + ("" if r is None else f' idref="{r}"') + "/>" for r in refs) * repeat
    opf = (f'<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf">{" " * pad}'
           f'<metadata><title>T</title></metadata><manifest>{manifest}</manifest><spine>{spine}</spine></package>').encode()
    if plan:
        opf = mutate(opf, plan)
    members = [("mimetype", b"application/epub+zip", False), ("META-INF/container.xml", container, True)]
    base = rootfile.rpartition("/")[0]
    members.append((rootfile or "content.opf", opf, True))
    for name, chapter in zip(("c.xhtml", "d.xhtml"), chapters):
        members.append(((base + "/" if base else "") + name, _html_text(chapter).encode(), True))
    if encryption:
        members.append(("META-INF/encryption.xml", b"<encryption><CipherReference URI='c.xhtml'/></encryption>", True))
    data = _zip(members)
    return _patch(data, patched, how) if patched else data


@FUZZ
@given(batch(_EPUB))
def test_fuzz_epub_structured(batch):
    for spec in batch:
        check("EPUB, structured", _run_file, _epub_bytes(spec))


# -- HTML -----------------------------------------------------------------------------------------------------

@contextmanager
def _small_html_limits():
    """The HTML reader's hold limit and read size made small (restored after), so that a small input
    reaches the paths that skip an unclosed construct and split text across reads."""
    saved = html_mod.STUCK_CHARS, html_mod.PIECE_BYTES
    html_mod.STUCK_CHARS, html_mod.PIECE_BYTES = 64, 61
    try:
        yield
    finally:
        html_mod.STUCK_CHARS, html_mod.PIECE_BYTES = saved


def _run_html(data: bytes) -> None:
    with _small_html_limits():
        _run_file(b"<!DOCTYPE html>" + data)  # declared HTML, so it is read as HTML


@FUZZ
@given(batch(_HTML))
def test_fuzz_html_structured(batch):
    for spec in batch:
        check("HTML, structured", _run_html, _html_text(spec).encode("utf-8", errors="replace"))


@FUZZ
@given(batch(st.binary(max_size=512)))
def test_fuzz_html_raw(batch):
    for data in batch:
        check("HTML, raw bytes", _run_html, data)


# -- mutated bytes --------------------------------------------------------------------------------------------

VALID = {
    "odt": _office_bytes(("odt", [(None, [("text", "Body text"), ("s", "2")]), ("2", [("text", "Heading")])], [], None,
                          "deflated")),
    "docx": _office_bytes(("docx", [], [("Heading1", [("text", "Title")]), (None, [("text", "Body"), ("tab",)])], None,
                           "deflated")),
    "epub": _epub_bytes(("content.opf", [("c", "c.xhtml")], ["c"], 1, 0, [(["<p>", "chapter", "</p>"], None)], "",
                         "deflated", None, False)),
}
_MUTATED = st.tuples(st.sampled_from(sorted(VALID)), MUTATIONS)


@FUZZ
@given(batch(_MUTATED))
def test_fuzz_documents_mutated(batch):
    for kind, plan in batch:
        check("documents, mutated bytes", _run_file, mutate(VALID[kind], plan))


def test_inputs_start_from_readable_documents():
    """Every strategy reaches acceptance (else it would only test refusals): the valid files are read,
    and with their text."""
    for kind, data in VALID.items():
        path = _DIR / f"valid.{kind}"
        path.write_bytes(data)
        _read_bounded(path)
        text = "".join(t for t, _ in pieces(identify(path, data[:8192], kind), path, kind))
        assert ("Body" in text or "chapter" in text), (kind, text)
    _run_html(_html_text((["<p>", "words", "<!--", "x" * 200], None)).encode())

"""Real documents of each format, written offline for the tests: a PDF by hand (its objects, a
cross-reference table and Helvetica text), EPUB, DOCX and ODT as zips of their XML."""

from __future__ import annotations

import zipfile
from pathlib import Path
from xml.sax.saxutils import escape


def _pdf_string(text: str) -> str:
    return "(" + text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ")"


def write_pdf(path: Path, pages: list[list[str]]) -> Path:
    """A PDF with one page per entry, each line of it set in Helvetica; a page with no lines has
    only a drawn rectangle (what a scan's page looks like to a text extractor: no text)."""
    objs: list[bytes] = []
    n = len(pages)
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(n))
    objs.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objs.append(f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode())
    font = 3 + 2 * n
    for i, lines in enumerate(pages):
        if lines:
            ops = ["BT", "/F1 12 Tf", "14 TL", "72 720 Td"]
            for j, line in enumerate(lines):
                ops.append(f"{_pdf_string(line)} Tj" if j == 0 else f"T* {_pdf_string(line)} Tj")
            ops.append("ET")
        else:
            ops = ["0.5 g", "72 72 400 600 re", "f"]
        stream = "\n".join(ops).encode("latin-1")
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
                    f"/Resources << /Font << /F1 {font} 0 R >> >> >>".encode())
        objs.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objs.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for k, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % k + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    path.write_bytes(bytes(out))
    return path


def write_epub(path: Path, title: str, chapters: list[tuple[str, list[str]]], spine_order=None) -> Path:
    """An EPUB 3 with one XHTML file per chapter (a heading and paragraphs); the spine lists them
    in spine_order (default: as given), which is the order a reader reads them in."""
    order = spine_order or list(range(len(chapters)))
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        zf.writestr("META-INF/container.xml",
                    '<?xml version="1.0"?><container version="1.0" '
                    'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles>'
                    '<rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
                    "</rootfiles></container>")
        items = "".join(f'<item id="c{i}" href="text/ch{i}.xhtml" media-type="application/xhtml+xml"/>'
                        for i in range(len(chapters)))
        spine = "".join(f'<itemref idref="c{i}"/>' for i in order)
        zf.writestr("OEBPS/content.opf",
                    '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" '
                    'unique-identifier="id"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/">'
                    f'<dc:identifier id="id">urn:test</dc:identifier><dc:title>{escape(title)}</dc:title>'
                    f"</metadata><manifest>{items}</manifest><spine>{spine}</spine></package>")
        for i, (heading, paras) in enumerate(chapters):
            body = "".join(f"<p>{escape(p)}</p>" for p in paras)
            zf.writestr(f"OEBPS/text/ch{i}.xhtml",
                        '<?xml version="1.0" encoding="utf-8"?><!DOCTYPE html><html xmlns="http://www.w3.org/1999/xhtml">'
                        f"<head><title>{escape(heading)}</title><style>p {{ margin: 0 }}</style></head>"
                        f"<body><h1>{escape(heading)}</h1>{body}</body></html>")
    return path


def write_docx(path: Path, blocks: list[tuple[int, str]]) -> Path:
    """A DOCX of paragraphs: (0, text) is body text, (n, text) a heading of level n."""
    w = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    paras = []
    for level, text in blocks:
        style = f'<w:pPr><w:pStyle w:val="Heading{level}"/></w:pPr>' if level else ""
        # split into two runs: a paragraph's text is the join of its runs
        half = len(text) // 2
        runs = "".join(f'<w:r><w:t xml:space="preserve">{escape(part)}</w:t></w:r>' for part in (text[:half], text[half:]))
        paras.append(f"<w:p>{style}{runs}</w:p>")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("[Content_Types].xml",
                    '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
                    '<Default Extension="xml" ContentType="application/xml"/>'
                    '<Override PartName="/word/document.xml" ContentType="application/'
                    'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>')
        zf.writestr("word/document.xml", f'<?xml version="1.0"?><w:document xmlns:w="{w}"><w:body>'
                                         f'{"".join(paras)}</w:body></w:document>')
    return path


def write_odt(path: Path, blocks: list[tuple[int, str]]) -> Path:
    """An ODT of paragraphs: (0, text) is body text, (n, text) a heading of level n. Runs of spaces
    are written as <text:s text:c="N"/>, as office suites write them."""
    import re

    def body(text: str) -> str:
        return re.sub(r"  +", lambda m: f' <text:s text:c="{len(m.group()) - 1}"/>', escape(text))

    paras = "".join(f'<text:h text:outline-level="{lv}">{body(t)}</text:h>' if lv else f"<text:p>{body(t)}</text:p>"
                    for lv, t in blocks)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("mimetype", "application/vnd.oasis.opendocument.text", compress_type=zipfile.ZIP_STORED)
        zf.writestr("content.xml",
                    '<?xml version="1.0"?><office:document-content '
                    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
                    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" office:version="1.2">'
                    f"<office:body><office:text>{paras}</office:text></office:body></office:document-content>")
    return path

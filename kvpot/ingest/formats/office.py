"""Word-processor documents: DOCX (word/document.xml) and ODT (content.xml), parsed as a stream of
paragraphs so memory holds one paragraph at a time. Headings keep their level as Markdown `#` marks;
paragraphs are separated by a blank line."""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree

from kvpot.ingest.formats.detect import UnreadableInput

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"

MEMBER = {"docx": "word/document.xml", "odt": "content.xml"}
PARAGRAPHS = {"docx": {W + "p"}, "odt": {TEXT + "p", TEXT + "h"}}


def _docx_text(p: ElementTree.Element) -> str:
    out = []
    for el in p.iter():
        if el.tag == W + "t" and el.text:
            out.append(el.text)
        elif el.tag == W + "tab":
            out.append("\t")
        elif el.tag in (W + "br", W + "cr"):
            out.append("\n")
    return "".join(out)


def _docx_level(p: ElementTree.Element) -> int:
    """A heading's level from its paragraph style (Heading1..Heading9, or Title as level 1); 0: body text."""
    style = p.find(f"{W}pPr/{W}pStyle")
    val = (style.get(W + "val") or "") if style is not None else ""
    if val.lower().startswith("heading") and val[7:].isdigit():
        return int(val[7:])
    return 1 if val == "Title" else 0


def _odt_text(el: ElementTree.Element) -> str:
    out = [el.text or ""]
    for child in el:
        if child.tag == TEXT + "s":
            out.append(" " * int(child.get(TEXT + "c", "1")))
        elif child.tag == TEXT + "tab":
            out.append("\t")
        elif child.tag == TEXT + "line-break":
            out.append("\n")
        elif child.tag in (TEXT + "note-citation",):
            pass
        else:
            out.append(_odt_text(child))
        out.append(child.tail or "")
    return "".join(out)


def _odt_level(p: ElementTree.Element) -> int:
    return int(p.get(TEXT + "outline-level", "1")) if p.tag == TEXT + "h" else 0


def _zip(path: Path, name: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise UnreadableInput(f"{name} is a broken zip archive ({e})") from None


def paragraphs(kind: str, path: Path, name: str) -> Iterator[str]:
    """Each top-level paragraph's text, with a heading's `#` marks; a paragraph inside another (a
    text box, a footnote) is part of the outer one."""
    text_of, level_of = (_docx_text, _docx_level) if kind == "docx" else (_odt_text, _odt_level)
    wanted = PARAGRAPHS[kind]
    with _zip(path, name) as zf:
        try:
            f = zf.open(MEMBER[kind])
        except KeyError:
            raise UnreadableInput(f"{name} is a broken {kind.upper()}: {MEMBER[kind]} is missing") from None
        depth = 0
        try:
            with f:
                for event, el in ElementTree.iterparse(f, events=("start", "end")):
                    if el.tag not in wanted:
                        continue
                    if event == "start":
                        depth += 1
                        continue
                    depth -= 1
                    if depth:
                        continue
                    text, level = text_of(el), level_of(el)
                    el.clear()  # what is read is let go: memory holds one paragraph
                    yield ("#" * level + " " + text) if level and text.strip() else text
        except ElementTree.ParseError as e:
            raise UnreadableInput(f"{name} is a broken {kind.upper()}: {MEMBER[kind]} is not XML ({e})") from None
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:
            raise UnreadableInput(f"{name} is a broken zip archive ({e})") from None


def check_office(kind: str, path: Path, name: str) -> None:
    """Refuse a document whose text cannot be parsed, before a model loads (the XML is parsed
    through once; nothing is kept)."""
    for _ in paragraphs(kind, path, name):
        pass


def office_pieces(kind: str, path: Path, name: str, piece_chars: int = 1 << 16) -> Iterator[tuple[str, str]]:
    """(text, "¶ N") in pieces of about piece_chars; N is the first paragraph's number in the piece."""
    buf: list[str] = []
    size, first = 0, 1
    for n, text in enumerate(paragraphs(kind, path, name), 1):
        if not text.strip():
            continue
        if not buf:
            first = n
        buf.append(text + "\n\n")
        size += len(text) + 2
        if size >= piece_chars:
            yield "".join(buf), f"¶ {first}"
            buf, size = [], 0
    if buf:
        yield "".join(buf), f"¶ {first}"

"""Word-processor documents: DOCX (word/document.xml) and ODT (content.xml), parsed as a stream
(expat, fed 64 KiB at a time) and emitted in pieces of about 64 Ki characters, so memory is bounded by
the pieces, not by what the file holds or claims: a paragraph of any length streams through in pieces,
runs of spaces (`<text:s text:c="N"/>`) and heading levels are clamped, and nesting deeper than any
real document is refused. Headings keep their level as Markdown `#` marks; paragraphs are separated
by a blank line."""

from __future__ import annotations

import re
import zipfile
import zlib
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from xml.parsers import expat

from kvpot.ingest.formats.base import Doc, Format, UnreadableInput

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
SEP = "\x01"  # expat's namespace separator: tags arrive as "uri\x01local"

MEMBER = {"docx": "word/document.xml", "odt": "content.xml"}
PARAGRAPHS = {"docx": {W + SEP + "p"}, "odt": {TEXT + SEP + "p", TEXT + SEP + "h"}}

FEED_BYTES = 1 << 16     # XML read from the zip per parser call
PIECE_CHARS = 1 << 16    # characters per piece emitted (a longer paragraph is emitted in several)
MAX_SPACES = 64          # the most spaces one <text:s text:c="N"/> stands for
MAX_LEVEL = 6            # heading levels are Markdown's: 1 to 6
MAX_DEPTH = 2048         # element nesting: real documents nest a few dozen deep
_DIGITS = re.compile(r"\s*([0-9]+)\s*")
# what zipfile raises for a member it cannot give: broken, encrypted (RuntimeError), a compression
# method it does not know (NotImplementedError)
ZIP_ERRORS = (zipfile.BadZipFile, OSError, EOFError, zlib.error, RuntimeError, NotImplementedError, ValueError)


def number(value: str | None, default: int, lo: int, hi: int) -> int:
    """An attribute's non-negative number clamped to lo..hi; `default` for one that is missing or not
    a number of ASCII digits (a hostile `c="2000000000"` is `hi`, not two billion)."""
    m = _DIGITS.fullmatch(value or "")
    if m is None:
        return default
    digits = m.group(1).lstrip("0") or "0"
    return hi if len(digits) > 9 else max(lo, min(hi, int(digits)))


def docx_level(style: str) -> int:
    """A heading's level from its paragraph style (Heading1.., or Title as level 1); 0: body text."""
    if style.lower().startswith("heading"):
        return number(style[7:], 0, 1, MAX_LEVEL) if style[7:].strip() else 0
    return 1 if style == "Title" else 0


class _Reader:
    """expat handlers that turn a document's XML into pieces of text, collected in `ready`."""

    def __init__(self, kind: str, piece_chars: int):
        self.kind, self.piece_chars = kind, piece_chars
        self.wanted = PARAGRAPHS[kind]
        self.ready: list[tuple[str, str]] = []
        self.depth = 0          # elements open
        self.para = 0           # paragraph elements open (a paragraph inside another is part of it)
        self.para_at = 0        # depth of the top-level paragraph's element
        self.n = 0              # top-level paragraphs met
        self.level = 0          # the paragraph's heading level
        self.text_in = 0        # DOCX: w:t elements open (only their characters are text)
        self.hidden = 0         # elements open whose characters are not text (a note's citation, DOCX pPr)
        self.cur: list[str] = []
        self.cur_len = 0
        self.streamed = False   # part of the paragraph was emitted already (it is longer than a piece)
        self.buf: list[str] = []
        self.size = 0
        self.first = 1

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise UnreadableInput(f"nests elements more than {MAX_DEPTH:,} deep")
        if tag in self.wanted:
            self.para += 1
            if self.para == 1:
                self.n += 1
                self.para_at, self.cur, self.cur_len, self.streamed = self.depth, [], 0, False
                self.level = (number(attrs.get(TEXT + SEP + "outline-level"), 1, 1, MAX_LEVEL)
                              if tag == TEXT + SEP + "h" else 0)
            return
        if not self.para:
            return
        ns, _, local = tag.partition(SEP)
        if self.kind == "docx":
            if ns != W:
                return
            if local == "t":
                self.text_in += 1
            elif local == "pPr":
                self.hidden += 1
            elif local == "pStyle" and self.depth == self.para_at + 2:
                self.level = docx_level(attrs.get(W + SEP + "val", ""))
            elif local == "tab" and not self.hidden:
                self.text("\t")
            elif local in ("br", "cr") and not self.hidden:
                self.text("\n")
        elif ns == TEXT and not self.hidden:
            if local == "s":
                self.text(" " * number(attrs.get(TEXT + SEP + "c"), 1, 1, MAX_SPACES))
            elif local == "tab":
                self.text("\t")
            elif local == "line-break":
                self.text("\n")
            elif local == "note-citation":
                self.hidden += 1

    def end(self, tag: str) -> None:
        self.depth -= 1
        if tag in self.wanted:
            self.para -= 1
            if not self.para:
                self._paragraph_end()
            return
        if not self.para:
            return
        ns, _, local = tag.partition(SEP)
        if self.kind == "docx" and ns == W:
            if local == "t":
                self.text_in -= 1
            elif local == "pPr":
                self.hidden -= 1
        elif ns == TEXT and local == "note-citation":
            self.hidden -= 1

    def chars(self, data: str) -> None:
        if self.para and not self.hidden and (self.text_in or self.kind == "odt"):
            self.text(data)

    def text(self, data: str) -> None:
        self.cur.append(data)
        self.cur_len += len(data)
        if self.cur_len >= self.piece_chars:  # a long paragraph: emitted as it is read
            text = self._heading("".join(self.cur)) if not self.streamed else "".join(self.cur)
            self.cur, self.cur_len = [], 0
            if self.streamed or text.strip():
                self.streamed = True
                self._out(text)

    def _heading(self, text: str) -> str:
        return "#" * self.level + " " + text if self.level and text.strip() else text

    def _paragraph_end(self) -> None:
        text = "".join(self.cur)
        self.cur, self.cur_len = [], 0
        if self.streamed:
            self._out(text + "\n\n")
        elif text.strip():
            self._out(self._heading(text) + "\n\n")

    def _out(self, text: str) -> None:
        if not self.buf:
            self.first = self.n
        self.buf.append(text)
        self.size += len(text)
        if self.size >= self.piece_chars:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            self.ready.append(("".join(self.buf), f"¶ {self.first}"))
            self.buf, self.size = [], 0


def _no_dtd(*args) -> None:
    raise UnreadableInput("declares a DTD, which word-processor documents do not")


def _zip(path: Path, name: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise UnreadableInput(f"{name} is a broken zip archive ({e})") from None


def member_error(name: str, member: str, e: BaseException) -> UnreadableInput:
    """A zip member that cannot be read, said in one line: encrypted, compressed with a method
    Python's zipfile does not know, or broken."""
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, RuntimeError) and "encrypted" in why:
        return UnreadableInput(f"{name}: {member} is encrypted (password-protected); kvpot cannot read it")
    if isinstance(e, NotImplementedError):
        return UnreadableInput(f"{name}: {member} is compressed with a method kvpot cannot read ({why})")
    return UnreadableInput(f"{name} is a broken zip archive: {member} cannot be read ({why})")


def office_pieces(kind: str, path: Path, name: str, piece_chars: int = PIECE_CHARS) -> Iterator[tuple[str, str]]:
    """(text, "¶ N") in pieces of about piece_chars (a piece can exceed it by what one 64 KiB read of
    XML holds); N is the number of the paragraph the piece starts in."""
    reader = _Reader(kind, piece_chars)
    parser = expat.ParserCreate(namespace_separator=SEP)
    parser.buffer_text = True
    parser.StartElementHandler = reader.start
    parser.EndElementHandler = reader.end
    parser.CharacterDataHandler = reader.chars
    parser.StartDoctypeDeclHandler = _no_dtd
    parser.EntityDeclHandler = _no_dtd
    member = MEMBER[kind]
    what = f"{name} is a broken {kind.upper()}: {member}"
    with _zip(path, name) as zf:
        try:
            f = zf.open(member)
        except KeyError:
            raise UnreadableInput(f"{what} is missing") from None
        except ZIP_ERRORS as e:
            raise member_error(name, member, e) from None
        with f:
            while True:
                try:
                    raw = f.read(FEED_BYTES)
                except ZIP_ERRORS as e:
                    raise member_error(name, member, e) from None
                try:
                    parser.Parse(raw, not raw)
                except expat.ExpatError as e:
                    raise UnreadableInput(f"{what} is not XML ({e})") from None
                except UnreadableInput as e:
                    raise UnreadableInput(f"{what} {e}") from None
                except RecursionError:  # not expected (handlers keep counts, not a stack); still one line
                    raise UnreadableInput(f"{what} nests too deeply") from None
                if not raw:
                    reader.flush()
                yield from reader.ready
                reader.ready.clear()
                if not raw:
                    return


def check_office(kind: str, path: Path, name: str) -> None:
    """Refuse a document whose text cannot be parsed, before a model loads (the XML is parsed
    through once; nothing is kept)."""
    for _ in office_pieces(kind, path, name):
        pass


def _pieces(kind: str, doc: Doc) -> Iterator[tuple[str, str]]:
    return office_pieces(kind, doc.path, doc.name)


DOCX = Format("docx", "DOCX", partial(_pieces, "docx"), zip_member=MEMBER["docx"], check=partial(check_office, "docx"))
ODT = Format("odt", "ODT", partial(_pieces, "odt"), zip_mimetype="application/vnd.oasis.opendocument.text",
             check=partial(check_office, "odt"))

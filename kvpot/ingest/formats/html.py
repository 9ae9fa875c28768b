"""HTML (and XHTML) as text: the words a reader sees, with the title and headings kept and markup,
scripts and styles left out. Fed in pieces, so a large page streams in flat memory.

Block elements end lines (paragraphs are separated by a blank line) and headings keep their level
as Markdown's `#` marks, so the model still sees the document's structure.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import BinaryIO

from kvpot.ingest.formats.base import Doc, Format

# elements whose content is not text a reader sees
HIDDEN = {"script", "style", "noscript", "template", "svg", "math", "iframe", "object", "canvas"}
# elements that start and end a block: their text is a paragraph of its own
BLOCKS = {"p", "div", "section", "article", "header", "footer", "main", "nav", "aside", "blockquote", "pre",
          "table", "tr", "ul", "ol", "dl", "dt", "dd", "li", "figure", "figcaption", "form", "fieldset",
          "address", "details", "summary", "title", "body", "hr", "caption"}
HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
LINE_ENDS = {"br", "td", "th"}  # a line break, or a cell: kept apart from its neighbour
_SPACE = re.compile(r"\s+")
HTML_STARTS = ("<!doctype html", "<html")

PIECE_BYTES = 1 << 16
# unparsed text the parser may hold while it waits for a construct's end (a comment's `-->`, a tag's
# `>`, a script's `</script>`); past it the construct is unclosed as far as kvpot cares, and the rest
# of it is skipped as it streams by, so memory stays bounded and each byte is scanned a few times at most
STUCK_CHARS = 1 << 18


class HtmlText(HTMLParser):
    """Text of the HTML fed so far; `take()` hands over what is ready."""

    def __init__(self, title: bool = True):
        super().__init__(convert_charrefs=True)
        self._skip = HIDDEN if title else HIDDEN | {"title"}  # an EPUB chapter's <title> repeats its heading
        self._out: list[str] = []
        self._hidden = 0        # depth inside hidden elements
        self._pre = 0           # depth inside <pre>: whitespace kept as written
        self._breaks = 0        # newlines owed before the next text (2: a blank line)
        self._line_start = True
        self._started = False   # no blank lines before the first text
        self._skip_to: str | None = None  # the end of an unclosed construct being skipped
        self._keep_end = False  # the end is fed to the parser (a script's end tag ends its mode)
        self._tail = ""         # the skipped text's last characters (an end split across feeds)

    def feed_text(self, text: str) -> None:
        """feed(), bounded: a construct left open past STUCK_CHARS (a comment never closed, an
        attribute's quote never closed) is skipped, not held, and its content is not text."""
        if self._skip_to is not None:
            text = self._skip_past(text)
            if self._skip_to is not None:
                return
        self.feed(text)
        if len(self.rawdata) > STUCK_CHARS:
            self._unstick()

    def _unstick(self) -> None:
        raw = self.rawdata
        if self.cdata_elem:  # a script or style never closed: hidden content, skipped to its end tag
            end, keep = "</" + self.cdata_elem, True
        elif raw.startswith("<!--"):
            end, keep = "-->", False
        elif raw.startswith("<"):  # a tag, declaration or processing instruction never closed
            end, keep = ">", False
        else:
            return
        self.rawdata = ""
        self.lineno += raw.count("\n")
        self._skip_to, self._keep_end = end, keep
        self._tail = raw[-(len(end) - 1):] if len(end) > 1 else ""  # an end split across the feeds

    def _skip_past(self, text: str) -> str:
        """Skip `text` up to the end being looked for; what follows the end (for a script, from its end tag)."""
        end = self._skip_to
        buf = self._tail + text
        k = buf.lower().find(end) if self._keep_end else buf.find(end)
        if k < 0:
            keep = len(end) - 1
            self._tail = buf[-keep:] if keep else ""
            self.lineno += text.count("\n")
            return ""
        start = k if self._keep_end else k + len(end)
        self.lineno += buf[len(self._tail):start].count("\n")  # (the tail's were counted)
        self._skip_to, self._tail = None, ""
        return buf[start:]

    def take(self) -> str:
        out, self._out = "".join(self._out), []
        return out

    def _break(self, n: int) -> None:
        self._breaks = max(self._breaks, n)

    def handle_starttag(self, tag, attrs):
        if tag in self._skip:
            self._hidden += 1
        elif tag in HEADINGS:
            self._break(2)
            self._emit("#" * HEADINGS[tag] + " ")
        elif tag in BLOCKS:
            self._break(2 if tag in ("p", "pre", "table", "blockquote", "title", "figure") else 1)
            if tag == "pre":
                self._pre += 1
            elif tag == "li":
                self._emit("- ")
        elif tag in LINE_ENDS:
            self._break(1)

    def handle_startendtag(self, tag, attrs):
        if tag in ("br", "hr"):
            self._break(1)

    def handle_endtag(self, tag):
        if tag in self._skip:
            self._hidden = max(0, self._hidden - 1)
        elif tag in HEADINGS or tag in BLOCKS:
            if tag == "pre":
                self._pre = max(0, self._pre - 1)
            self._break(2 if tag in HEADINGS or tag in ("p", "pre", "table", "blockquote", "title", "figure") else 1)

    def handle_data(self, data):
        if self._hidden:
            return
        if not self._pre:
            data = _SPACE.sub(" ", data)
            if self._line_start or self._breaks:
                data = data.lstrip(" ")
        if data:
            self._emit(data)

    def _emit(self, text: str) -> None:
        if self._hidden:
            return
        if self._breaks and self._started:
            if self._out:
                self._out[-1] = self._out[-1].rstrip(" ")
            self._out.append("\n" * self._breaks)
            self._line_start = True
        self._breaks = 0
        self._out.append(text)
        self._started = True
        self._line_start = text.endswith("\n")

    def finish(self) -> str:
        raw = self.rawdata
        if self._skip_to is None and len(raw) > 1 and raw[0] == "<" and (raw[1].isalpha() or raw[1] in "!?/"):
            self.rawdata = ""  # a construct the file ends inside (a comment never closed): markup, not text
        self.close()
        return self.take().rstrip() + "\n"


def html_pieces(f: BinaryIO, title: bool = True) -> Iterator[tuple[str, str]]:
    """(text, location) from an HTML byte stream, a piece at a time; the location is the source line
    each piece starts at. UTF-8 (the web's encoding); invalid bytes become U+FFFD."""
    parser = HtmlText(title)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    first = True
    while True:
        raw = f.read(PIECE_BYTES)
        line = parser.getpos()[0]
        text = decoder.decode(raw, final=not raw)
        if first:
            text, first = text.lstrip("\ufeff"), False
        parser.feed_text(text)
        out = parser.take() if raw else parser.finish()
        if out.strip() or (out and not raw):  # the last piece's closing newline too
            yield out, f"line {line}"
        if not raw:
            return


def looks_like_html(head: bytes) -> bool:
    """A document that declares itself HTML (doctype or <html>), after a BOM, whitespace, an XML
    declaration or comments. A fragment of markup in a text file stays text."""
    text = head[:4096].decode("utf-8", errors="ignore").lstrip("\ufeff").lstrip().lower()
    if text.startswith("<?xml"):
        text = text[text.find("?>") + 2:].lstrip() if "?>" in text else ""
    while text.startswith("<!--") and "-->" in text:
        text = text[text.find("-->") + 3:].lstrip()
    return text.startswith(HTML_STARTS)


def _pieces(doc: Doc) -> Iterator[tuple[str, str]]:
    with doc.open() as f:
        yield from html_pieces(f)


FORMAT = Format("html", "HTML", _pieces, claims=looks_like_html, streams=True)

"""PDF text, page by page, with pypdf (BSD; docs/formats.md says why it over pdfminer.six).

Only the page being read is extracted at a time. A PDF is refused before reading with one line
when it needs a password, is broken, or has no text layer on its first pages (a scan: it needs OCR).
A damaged page (its content cannot be parsed) is said and skipped; the other pages are read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kvpot.ingest.formats.base import Doc, Format, UnreadableInput

PROBE_PAGES = 20  # pages looked at for a text layer before reading: a scan has none on any of them

# pypdf reports recoverable damage through logging. Its warnings are noise to a reader; its errors (text
# it could not decode, e.g. an encoding it does not implement) are told, while a page is read, to the
# reader's `warn` (pdf_pieces), never written raw to stderr by Python's last-resort handler
_PYPDF_LOG = logging.getLogger("pypdf")
_PYPDF_LOG.setLevel(logging.ERROR)
_PYPDF_LOG.propagate = False
_PYPDF_LOG.addHandler(logging.NullHandler())


def _open(path: Path, name: str):
    from pypdf import PdfReader
    from pypdf.errors import DependencyError

    # a parser of untrusted files can fail in any way: each is this input's one line, never a traceback
    try:
        reader = PdfReader(path, strict=False)
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")  # owner-password-only PDFs open with an empty user password
            except DependencyError:
                raise UnreadableInput(f"{name} is an AES-encrypted PDF: pip install cryptography to read it") from None
            if not opened:
                raise UnreadableInput(f"{name} is an encrypted PDF that needs a password; kvpot cannot read it "
                                      "(save a decrypted copy, e.g. qpdf --decrypt --password=... IN OUT)")
        n_pages = len(reader.pages)
    except UnreadableInput:
        raise
    except Exception as e:  # noqa: BLE001 - see above
        raise UnreadableInput(f"{name} is not a readable PDF ({_why(e)})") from None
    return reader, n_pages


def _why(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


class DamagedPage(Exception):
    """A page whose content pypdf cannot parse: skipped, the rest of the document read."""

    def __init__(self, page: int, why: str):
        super().__init__(f"page {page}: {why}")
        self.page, self.why = page, why


def _page_text(reader, i: int) -> str:
    try:
        return reader.pages[i].extract_text() or ""
    except Exception as e:  # noqa: BLE001 - a parser of untrusted files can fail in any way
        raise DamagedPage(i + 1, _why(e)) from None


def check_pdf(path: Path, name: str) -> None:
    """Refuse a PDF that cannot be read, before any model loads: one whose first pages (up to
    PROBE_PAGES) hold no text, damaged or blank."""
    reader, n_pages = _open(path, name)
    if n_pages == 0:
        raise UnreadableInput(f"{name} is a PDF with no pages")
    damaged: list[DamagedPage] = []
    for i in range(min(n_pages, PROBE_PAGES)):
        try:
            if _page_text(reader, i).strip():
                return
        except DamagedPage as e:
            damaged.append(e)
    pages = f"its {n_pages} pages" if n_pages <= PROBE_PAGES else f"its first {PROBE_PAGES} pages"
    if len(damaged) == min(n_pages, PROBE_PAGES):
        raise UnreadableInput(f"{name} is not a readable PDF: none of {pages} can be read ({damaged[0]})")
    also = f" ({len(damaged)} of them damaged)" if damaged else ""
    raise UnreadableInput(f"{name} has no text layer on {pages}{also} (a scanned PDF?): run OCR first, "
                          "e.g. ocrmypdf IN OUT")


def pdf_pieces(path: Path, name: str, warn: Callable[[str], None] = lambda msg: None) -> Iterator[tuple[str, str]]:
    """(text of one page, "p. N"), page by page; a damaged page is told to `warn` and skipped."""
    reader, n_pages = _open(path, name)
    told = _Told(name, warn)
    for i in range(n_pages):
        try:
            with told.page(i + 1):
                text = _page_text(reader, i)
        except DamagedPage as e:
            warn(f"{name}: page {e.page} cannot be read ({e.why}); skipped, the other pages are read")
            continue
        if text.strip():
            yield text.rstrip() + "\n\n", f"p. {i + 1}"


def _pieces(doc: Doc) -> Iterator[tuple[str, str]]:
    return pdf_pieces(doc.path, doc.name, doc.warn)


def _claims(head: bytes) -> bool:
    # the PDF header may follow some junk; readers accept it within the first 1024 bytes
    return b"%PDF-" in head[:1024]


FORMAT = Format("pdf", "PDF", _pieces, magic=(b"%PDF-",), claims=_claims, check=check_pdf)


class _Told(logging.Handler):
    """What pypdf logs while a page is read, told to `warn` as one line naming the file and the first
    page it was logged on; the same message from later pages is not said again."""

    def __init__(self, name: str, warn: Callable[[str], None]):
        super().__init__(logging.ERROR)
        self.name_, self.warn, self.seen, self.at = name, warn, set(), 0

    def emit(self, record: logging.LogRecord) -> None:
        msg = " ".join(record.getMessage().split())
        if msg and msg not in self.seen:
            self.seen.add(msg)
            self.warn(f"{self.name_}: page {self.at}: {msg} (its text may be incomplete)")

    @contextmanager
    def page(self, number: int) -> Iterator[None]:
        self.at = number
        _PYPDF_LOG.addHandler(self)
        try:
            yield
        finally:
            _PYPDF_LOG.removeHandler(self)

"""What a file holds, told by its first bytes (and, for zip files, by their members), never by its name.

A .pdf that is plain text is read as text and a .txt that is gzip is read decompressed: names are
often wrong (rotated logs, downloads saved under the wrong name); content is not.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from kvpot.errors import KvpotError

# what the first bytes of each compressed stream are (RFC 1952, the xz and bzip2 formats, RFC 8878)
COMPRESSED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\xfd7zXZ\x00": "xz",
    b"BZh": "bzip2",
    b"\x28\xb5\x2f\xfd": "zstd",
}

# the `mimetype` member an OpenDocument or EPUB zip starts with
ZIP_MIMETYPES = {
    "application/epub+zip": "epub",
    "application/vnd.oasis.opendocument.text": "odt",
}

HTML_STARTS = ("<!doctype html", "<html")


class UnreadableInput(KvpotError):
    """A file kvpot recognised but cannot read (broken, encrypted, no text): among several inputs it
    is left out with its reason; alone, its reason is the error."""


def detect(head: bytes) -> str:
    """pdf, zip, html, text, or a compression (gzip, xz, bzip2, zstd), from a file's first bytes.
    text includes binary: the caller tells them apart with looks_binary."""
    # the PDF header may follow some junk; readers accept it within the first 1024 bytes
    if b"%PDF-" in head[:1024]:
        return "pdf"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):  # a zip (or an empty one)
        return "zip"
    for magic, codec in COMPRESSED_MAGIC.items():
        if head.startswith(magic):
            return codec
    if looks_like_html(head):
        return "html"
    return "text"


def looks_like_html(head: bytes) -> bool:
    """A document that declares itself HTML (doctype or <html>), after a BOM, whitespace, an XML
    declaration or comments. A fragment of markup in a text file stays text."""
    text = head[:4096].decode("utf-8", errors="ignore").lstrip("\ufeff").lstrip().lower()
    if text.startswith("<?xml"):
        text = text[text.find("?>") + 2:].lstrip() if "?>" in text else ""
    while text.startswith("<!--") and "-->" in text:
        text = text[text.find("-->") + 3:].lstrip()
    return text.startswith(HTML_STARTS)


def zip_kind(path: Path, name: str) -> str:
    """epub, docx or odt for a zip, from its members; anything else is refused with what it is."""
    try:
        with zipfile.ZipFile(path) as zf:
            members = set(zf.namelist())
            if "mimetype" in members:
                try:
                    with zf.open("mimetype") as f:
                        mimetype = f.read(256).decode("ascii", errors="replace").strip()  # a few bytes, whatever it claims
                except (RuntimeError, NotImplementedError):
                    mimetype = ""  # encrypted or an unknown method: the members below tell the kind
                if mimetype in ZIP_MIMETYPES:
                    return ZIP_MIMETYPES[mimetype]
            if "word/document.xml" in members:
                return "docx"
            if "META-INF/container.xml" in members:  # an EPUB missing its mimetype member
                return "epub"
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise UnreadableInput(f"{name} is a broken zip archive ({e})") from None
    raise UnreadableInput(f"{name} is a zip archive, not a document kvpot reads (EPUB, DOCX, ODT); unpack it "
                          "and pass the folder")

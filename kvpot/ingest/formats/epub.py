"""EPUB: zipped XHTML chapters in the order of the book's spine (its OPF package file), read a
chapter at a time through the HTML reader. The book's title comes first."""

from __future__ import annotations

import posixpath
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote
from xml.etree import ElementTree

from kvpot.ingest.formats.base import Doc, Format, UnreadableInput
from kvpot.ingest.formats.html import PIECE_BYTES, html_pieces
from kvpot.ingest.formats.office import ZIP_ERRORS, member_error

# the package files (container.xml, the OPF, encryption.xml) are a few KiB in real books; a larger one
# is refused rather than held (they are parsed whole)
MAX_PACKAGE_BYTES = 4 << 20
# documents a spine may list: real books list a few hundred
MAX_SPINE = 50_000


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


@dataclass(frozen=True)
class Book:
    title: str
    chapters: list[str]   # zip member names, in reading order


def _xml(zf: zipfile.ZipFile, member: str, name: str) -> ElementTree.Element:
    """A package file parsed, refused with one line when it is missing, unreadable, larger than
    MAX_PACKAGE_BYTES (its size is checked as it is read, whatever the zip claims) or declares entities."""
    try:
        big = zf.getinfo(member).file_size > MAX_PACKAGE_BYTES  # a larger record is refused unread
        with zf.open(member) as f:  # (zipfile gives no more than the size the zip records)
            data = b"" if big else f.read(MAX_PACKAGE_BYTES + 1)
    except KeyError:
        raise UnreadableInput(f"{name} is a broken EPUB: {member} is missing") from None
    except ZIP_ERRORS as e:
        raise member_error(name, member, e) from None
    if big or len(data) > MAX_PACKAGE_BYTES:
        raise UnreadableInput(f"{name} is a broken EPUB: {member} is larger than {MAX_PACKAGE_BYTES >> 20} MiB "
                              "(a package file is a few KiB)")
    if b"<!ENTITY" in data:
        raise UnreadableInput(f"{name} is a broken EPUB: {member} declares XML entities, which EPUB does not allow")
    try:
        return ElementTree.fromstring(data)
    except ElementTree.ParseError as e:
        raise UnreadableInput(f"{name} is a broken EPUB: {member} is not XML ({e})") from None


def read_book(zf: zipfile.ZipFile, name: str) -> Book:
    container = _xml(zf, "META-INF/container.xml", name)
    rootfile = next((el.get("full-path") for el in container.iter() if _local(el.tag) == "rootfile"), None)
    if not rootfile:
        raise UnreadableInput(f"{name} is a broken EPUB: its container names no package file")
    opf = _xml(zf, rootfile, name)
    base = posixpath.dirname(rootfile)
    manifest = {el.get("id"): el.get("href") for el in opf.iter() if _local(el.tag) == "item"}
    title = next(("".join(el.itertext()).strip() for el in opf.iter() if _local(el.tag) == "title"), "")
    chapters = []
    for ref in (el for el in opf.iter() if _local(el.tag) == "itemref"):
        idref = ref.get("idref")
        if idref not in manifest:
            raise UnreadableInput(f"{name} is a broken EPUB: its spine names {idref!r}, not in its manifest")
        href = manifest[idref]
        if not href:
            raise UnreadableInput(f"{name} is a broken EPUB: its manifest item {idref!r} has no href "
                                  "(the spine names it, but not where it is)")
        if len(chapters) == MAX_SPINE:
            raise UnreadableInput(f"{name} is a broken EPUB: its spine lists more than {MAX_SPINE:,} documents")
        chapters.append(posixpath.normpath(posixpath.join(base, unquote(href.partition("#")[0]))))
    if not chapters:
        raise UnreadableInput(f"{name} is an EPUB with no chapters in its spine")
    infos = {i.filename: i for i in zf.infolist()}
    members = set(infos)
    missing = [c for c in chapters if c not in members]
    if missing:
        raise UnreadableInput(f"{name} is a broken EPUB: chapter {missing[0]} is missing")
    for c in dict.fromkeys(chapters):  # a chapter zipfile cannot open is refused now, not halfway through
        info = infos[c]
        if info.flag_bits & 1:
            raise member_error(name, c, RuntimeError("encrypted"))
        if info.compress_type not in _METHODS:
            raise member_error(name, c, NotImplementedError(f"zip method {info.compress_type}"))
    if "META-INF/encryption.xml" in members:
        encrypted = ElementTree.tostring(_xml(zf, "META-INF/encryption.xml", name), encoding="unicode")
        if any(posixpath.relpath(c, base) in encrypted or c in encrypted for c in chapters):
            raise UnreadableInput(f"{name} is an encrypted (DRM) EPUB; kvpot cannot read it")
    return Book(title, chapters)


# the compression methods Python's zipfile reads
_METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}


def _zip(path: Path, name: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise UnreadableInput(f"{name} is a broken zip archive ({e})") from None


def _why(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def check_epub(path: Path, name: str) -> None:
    with _zip(path, name) as zf:
        read_book(zf, name)


def epub_pieces(path: Path, name: str) -> Iterator[tuple[str, str]]:
    """(text, "ch. N") chapter by chapter; N counts the spine's documents from 1."""
    with _zip(path, name) as zf:
        book = read_book(zf, name)
        if book.title:
            yield book.title + "\n\n", "title"
        for i, member in enumerate(book.chapters, 1):
            try:
                # whitespace is joined to the piece before it, so a chapter ends with its text, not
                # with pieces of a character or two (a passage quoted by --sources spans few pieces)
                held = ""
                with zf.open(member) as f:
                    for text, _ in html_pieces(f, title=False):
                        if held and (text.strip() or len(held) >= PIECE_BYTES):  # whitespace is bounded too
                            yield held, f"ch. {i}"
                            held = ""
                        held += text
                yield held + "\n", f"ch. {i}"  # a chapter ends with a newline: a blank line before the next
            except ZIP_ERRORS as e:
                raise UnreadableInput(f"{name}: chapter {i} ({member}) cannot be read ({_why(e)})") from None


def _pieces(doc: Doc) -> Iterator[tuple[str, str]]:
    return epub_pieces(doc.path, doc.name)


# its `mimetype` member says so; an EPUB missing that member is known by its container
FORMAT = Format("epub", "EPUB", _pieces, zip_mimetype="application/epub+zip", zip_member="META-INF/container.xml",
                check=check_epub)

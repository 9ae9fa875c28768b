"""EPUB: zipped XHTML chapters in the order of the book's spine (its OPF package file), read a
chapter at a time through the HTML reader. The book's title comes first."""

from __future__ import annotations

import posixpath
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote
from xml.etree import ElementTree

from kvpot.ingest.formats.detect import UnreadableInput
from kvpot.ingest.formats.html import html_pieces


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


@dataclass(frozen=True)
class Book:
    title: str
    chapters: list[str]   # zip member names, in reading order


def _xml(zf: zipfile.ZipFile, member: str, name: str) -> ElementTree.Element:
    try:
        return ElementTree.fromstring(zf.read(member))
    except KeyError:
        raise UnreadableInput(f"{name} is a broken EPUB: {member} is missing") from None
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
        href = manifest.get(ref.get("idref"))
        if href is None:
            raise UnreadableInput(f"{name} is a broken EPUB: its spine names {ref.get('idref')!r}, not in its manifest")
        chapters.append(posixpath.normpath(posixpath.join(base, unquote(href.partition("#")[0]))))
    if not chapters:
        raise UnreadableInput(f"{name} is an EPUB with no chapters in its spine")
    members = set(zf.namelist())
    missing = [c for c in chapters if c not in members]
    if missing:
        raise UnreadableInput(f"{name} is a broken EPUB: chapter {missing[0]} is missing")
    if "META-INF/encryption.xml" in members:
        encrypted = ElementTree.tostring(_xml(zf, "META-INF/encryption.xml", name), encoding="unicode")
        if any(posixpath.relpath(c, base) in encrypted or c in encrypted for c in chapters):
            raise UnreadableInput(f"{name} is an encrypted (DRM) EPUB; kvpot cannot read it")
    return Book(title, chapters)


def _zip(path: Path, name: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise UnreadableInput(f"{name} is a broken zip archive ({e})") from None


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
                        if held and text.strip():
                            yield held, f"ch. {i}"
                            held = ""
                        held += text
                yield held + "\n", f"ch. {i}"  # a chapter ends with a newline: a blank line before the next
            except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:
                raise UnreadableInput(f"{name}: chapter {i} ({member}) cannot be read ({e})") from None

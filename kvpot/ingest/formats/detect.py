"""What a file holds, told by its first bytes (and, for zip files, by their members), never by its name.

A .pdf that is plain text is read as text and a .txt that is gzip is read decompressed: names are
often wrong (rotated logs, downloads saved under the wrong name); content is not. The formats are
asked in the registry's order (kvpot.ingest.formats.registry); zip archives and compressed streams
are the containers around them.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import kvpot.ingest.formats.registry as registry
from kvpot.ingest.formats.base import Format, UnreadableInput
from kvpot.ingest.formats.compressed import COMPRESSED_MAGIC

ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip (or an empty one)


def claimed(head: bytes, streams_only: bool = False) -> Format | None:
    """The first registered format that claims a file from its first bytes `head` (with
    `streams_only`, among those read in one pass), or None."""
    return next((f for f in registry.FORMATS if f.claimed(head) and (f.streams or not streams_only)), None)


def is_zip(head: bytes) -> bool:
    return head.startswith(ZIP_MAGIC)


def codec(head: bytes) -> str | None:
    """The compression (gzip, xz, bzip2, zstd) a file's first bytes say it is in, if any."""
    return next((c for magic, c in COMPRESSED_MAGIC.items() if head.startswith(magic)), None)


def compression(head: bytes) -> str | None:
    """The compression of a file whose first bytes are `head`, unless a format claims it first."""
    return None if claimed(head) is not None or is_zip(head) else codec(head)


def magics() -> tuple[bytes, ...]:
    """Every start of a file that tells its kind: a stream's head shorter than one is read on."""
    return (*COMPRESSED_MAGIC, *ZIP_MAGIC, *(m for f in registry.FORMATS for m in f.magic))


def named(name: str) -> Format | None:
    """The registered format whose kind is `name`."""
    return next((f for f in registry.FORMATS if f.name == name), None)


def listing(titles: list[str], last: str = ", ") -> str:
    """Names joined with commas, the last two with `last`: "EPUB, DOCX or ODT"."""
    return last.join([", ".join(titles[:-1]), titles[-1]]) if len(titles) > 1 else "".join(titles)


def zipped_titles(last: str = ", ") -> str:
    """The formats that are zip archives, as a person names them: "EPUB, DOCX, ODT"."""
    return listing([f.title for f in registry.FORMATS if f.in_zip], last)


def zip_format(path: Path, name: str) -> Format:
    """The registered format of a zip, from its members: the one its `mimetype` member names, else the
    first that holds its marking member; anything else is refused with what it is."""
    zipped = [f for f in registry.FORMATS if f.in_zip]
    try:
        with zipfile.ZipFile(path) as zf:
            members = set(zf.namelist())
            if "mimetype" in members:
                try:
                    with zf.open("mimetype") as f:
                        mimetype = f.read(256).decode("ascii", errors="replace").strip()  # a few bytes, whatever it claims
                except (RuntimeError, NotImplementedError):
                    mimetype = ""  # encrypted or an unknown method: the members below tell the kind
                found = next((f for f in zipped if f.zip_mimetype == mimetype), None)
                if found is not None:
                    return found
            found = next((f for f in zipped if f.zip_member in members), None)
            if found is not None:
                return found
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise UnreadableInput(f"{name} is a broken zip archive ({e})") from None
    raise UnreadableInput(f"{name} is a zip archive, not a document kvpot reads ({zipped_titles()}); unpack it "
                          "and pass the folder")

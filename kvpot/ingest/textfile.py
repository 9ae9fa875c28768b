"""Read a user's document, refusing what is not text with one clear line."""

from __future__ import annotations

from pathlib import Path

from kvpot.errors import KvpotError

# bytes looked at to decide whether a file is binary
SNIFF_BYTES = 8192


def looks_binary(head: bytes) -> bool:
    """NUL bytes, or mostly control bytes, mean binary; UTF-8 text never has NUL."""
    if b"\x00" in head:
        return True
    if not head:
        return False
    control = sum(1 for b in head if b < 32 and b not in (9, 10, 12, 13, 27))
    return control / len(head) > 0.10


def check_text_file(path: Path) -> None:
    if str(path) == "-":
        return
    if not path.exists():
        raise KvpotError(f"input file {path} does not exist")
    if path.is_dir():
        raise KvpotError(f"input path {path} is a directory; pass a file")
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as e:
        raise KvpotError(f"cannot read input file {path}: {e.strerror}") from None
    if not head:
        raise KvpotError(f"input file {path} is empty")
    if looks_binary(head):
        raise KvpotError(f"input file {path} looks binary (not text); kvpot reads text documents")


def read_document(path: Path) -> str:
    """Whole-file read for inputs that fit the context; invalid UTF-8 is replaced."""
    check_text_file(path)
    text = path.read_bytes().decode("utf-8", errors="replace")
    if not text.strip():
        raise KvpotError(f"input file {path} holds only whitespace")
    return text

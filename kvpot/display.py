"""Text from outside kvpot (file names, document quotes, a user's question) made safe to show on a terminal,
and text that cannot be tokenized refused before any work.

A file name or a document can hold control characters: an escape sequence that clears the screen or sets
the window's title, a carriage return that overwrites the line, a newline that forges a line of its own
("error: ..."). Shown through `printable` they read as escapes (`\\x1b`, `\\n`) and do nothing. The model's
answer is shown as it is: it is what was asked for, and `kvpot ask` prints nothing else on stdout."""

from __future__ import annotations

import re

from kvpot.errors import KvpotError

# C0 controls but tab and newline, DEL, C1 controls, and the lone surrogates Python's surrogateescape
# makes of bytes that are not UTF-8 (a file name's, an argument's); newline joins them in `printable`
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_UNSAFE_OR_NEWLINE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match) -> str:
    ch = m.group()
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for the byte it could not decode
        return f"\\x{code - 0xDC00:02x}"
    if code > 0xFF:
        return f"\\u{code:04x}"
    return f"\\x{code:02x}"


def printable(text: str, newlines: bool = False) -> str:
    """`text` with every control character but tab as a visible escape (ESC as `\\x1b`, a newline as `\\n`),
    so that showing it cannot move the cursor, change colours, set a title or start a line of its own.
    `newlines`: keep newlines (text of several lines, such as a whole message, where each line is one)."""
    return (_UNSAFE if newlines else _UNSAFE_OR_NEWLINE).sub(_escape, text)


def undecodable(text: str) -> bool:
    """Whether `text` holds bytes that were not UTF-8: an argument or a line Python decoded with
    surrogateescape keeps each such byte as a lone surrogate, which no tokenizer can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def require_utf8(text: str, what: str) -> str:
    """`text`, or one line that says it holds bytes that are not UTF-8 (naming `what`: "the question")."""
    if undecodable(text):
        raise KvpotError(f"{what} is not valid UTF-8 text (it holds the bytes shown as \\xNN here: "
                         f"{printable(text)[:120]}); pass it as UTF-8")
    return text

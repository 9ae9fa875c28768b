"""The texts `kvpot bench qa` reads: files that ship on a Debian machine with Python, read the same
way on every run. A source is named by path; "{stdlib}" stands for Python's standard library folder
(sysconfig), so one set serves every Python install. Compressed files (.gz) are decompressed, and man
pages (roff source under a man/ folder) are turned into plain text by a small roff stripper rather than
man or groff, whose output depends on their version and the terminal width."""

from __future__ import annotations

import gzip
import re
import sysconfig
from functools import lru_cache
from pathlib import Path

STDLIB = "{stdlib}"


def resolve(source: str) -> Path:
    return Path(source.replace(STDLIB, sysconfig.get_paths()["stdlib"]))


@lru_cache(maxsize=256)
def read_source(source: str) -> str | None:
    """The source's text, or None when this machine lacks the file."""
    path = resolve(source)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    text = raw.decode("utf-8", "replace")
    return strip_roff(text) if "/man/" in source else text


# roff escapes that stand for a character; the rest (\fB, \fI, \fR, \fP, \&, \c, \:) only change the look
_ESCAPES = {r"\-": "-", r"\(em": "--", r"\(en": "-", r"\(aq": "'", r"\(dq": '"', r"\(lq": '"', r"\(rq": '"',
            r"\(oq": "'", r"\(cq": "'", r"\e": "\\", r"\ ": " ", r"\~": " ", r"\(bu": "*", r"\(co": "(C)"}
_FONT = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\[&c:|^%,/]|\\s[-+]?\d")
_MACRO_TEXT = re.compile(r"^\.(B|I|SM|SB|BI|BR|IB|IR|RB|RI|SH|SS|TP|IP|TQ)\b ?(.*)$")


def strip_roff(src: str) -> str:
    """Man-page roff source as plain text: comments and layout requests dropped, font macros and
    escapes reduced to their words. Not a typesetter: enough that a quoted sentence reads as it does
    in `man`, with the words in the same order."""
    out: list[str] = []
    for line in src.splitlines():
        if line.startswith(('.\\"', "'\\\"", '.\\}')) or line.strip() in (".", "'"):
            continue
        m = _MACRO_TEXT.match(line)
        if m:
            args = re.findall(r'"([^"]*)"|(\S+)', m.group(2))
            words = [a or b for a, b in args]
            # alternating-font macros (BR, IR, ...) join their arguments without spaces
            line = ("" if len(m.group(1)) == 2 and m.group(1) not in ("SH", "SS", "TP", "IP", "TQ", "SM", "SB")
                    else " ").join(words)
            if m.group(1) in ("SH", "SS"):
                out.append("")
        elif line.startswith((".", "'")):
            if line[1:3] in ("PP", "LP", "P ", "sp") or line.strip() in (".P", ".br"):
                out.append("")
            continue
        for esc, ch in _ESCAPES.items():
            line = line.replace(esc, ch)
        line = _FONT.sub("", line)
        out.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out))


def passage_pattern(passage: str) -> re.Pattern:
    """The passage's words in order, any whitespace between them (line breaks and indents differ)."""
    return re.compile(r"\s+".join(re.escape(w) for w in passage.split()))


def find_passage(text: str, passage: str) -> tuple[int, int] | None:
    """(start, end) character offsets of the passage in the text, or None."""
    m = passage_pattern(passage).search(text)
    return (m.start(), m.end()) if m else None

"""A Debian changelog (debian/changelog, as /usr/share/doc/PKG/changelog.Debian.gz ships it) read into
its entries: each upload's header line and version, its change items with the bugs they close, and the
trailer line with who signed it and when. The formats are Debian Policy's (section 4.4): the header
"package (version) distributions; urgency=...", the trailer " -- Name <email>  Day, DD Mon YYYY ...", and
the bug-closing pattern dpkg and the archive use ("Closes: #N, #M", case aside)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

HEADER = re.compile(r"^(\S+) \(([^()\s]+)\) [^;\n]*;[^\n]*$", re.M)
TRAILER = re.compile(r"^ -- (.+?) <[^>\n]*>  ([^\n]*?(\d{1,2}) (\w{3}) (\d{4})[^\n]*)$", re.M)
CLOSES = re.compile(r"closes:\s*(?:bug)?\#?\s?\d+(?:,\s*(?:bug)?\#?\s?\d+)*", re.I)
BULLET = re.compile(r"^(\s+)[*+-] ", re.M)


@dataclass(frozen=True)
class Item:
    """One change: a bullet line and the deeper-indented lines that continue it."""

    text: str          # as in the file (line breaks kept)
    at: int            # offset in the changelog's text
    bugs: tuple[str, ...]  # the bug numbers its Closes: names, in order


@dataclass(frozen=True)
class Entry:
    version: str
    header: str        # the header line
    trailer: str       # the trailer line, less its leading space
    name: str          # who signed the upload
    date: str          # "DD Mon YYYY" as the trailer writes it ("05 Jan 2023")
    items: tuple[Item, ...]

    @property
    def bugs(self) -> list[str]:
        return [b for it in self.items for b in it.bugs]


def _items(body: str, base: int) -> list[Item]:
    lines = body.split("\n")
    offsets, at = [], base
    for line in lines:
        offsets.append(at)
        at += len(line) + 1
    out, i = [], 0
    while i < len(lines):
        m = BULLET.match(lines[i])
        if not m:
            i += 1
            continue
        indent, j = len(m.group(1)), i + 1
        while j < len(lines) and lines[j].strip() and not BULLET.match(lines[j]) \
                and len(lines[j]) - len(lines[j].lstrip()) > indent and not lines[j].lstrip().startswith("["):
            j += 1
        text = "\n".join(lines[i:j])
        bugs = tuple(n for c in CLOSES.finditer(text) for n in re.findall(r"\d+", c.group(0)))
        out.append(Item(text, offsets[i], bugs))
        i = j
    return out


def parse(text: str) -> list[Entry]:
    """The changelog's entries, newest first (as the file lists them); an entry without a trailer
    (a broken file) is left out."""
    heads = list(HEADER.finditer(text))
    out = []
    for k, h in enumerate(heads):
        end = heads[k + 1].start() if k + 1 < len(heads) else len(text)
        t = TRAILER.search(text, h.end(), end)
        if t is None:
            continue
        date = f"{t.group(3)} {t.group(4)} {t.group(5)}"
        out.append(Entry(h.group(2), h.group(0), t.group(0)[1:], t.group(1).strip(), date,
                         tuple(_items(text[h.end():t.start()], h.end()))))
    return out


def occurrences(text: str, number: str) -> int:
    """How often the digits appear in the text as a whole number (not inside a longer one)."""
    return len(re.findall(rf"(?<!\d){re.escape(number)}(?!\d)", text))


def signers(entries: list[Entry]) -> Counter:
    return Counter(e.name for e in entries)

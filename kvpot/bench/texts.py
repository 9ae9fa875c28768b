"""The long texts the perplexity tables read (docs/benchmarks.md: IMDC, EdgeInfinite), written by `make bench-texts`.

    python -m kvpot.bench.texts KIND OUT      KIND: code-12, code-8k, code-32k, logbook, manual, library-1m or library-32k

code-N: Python standard-library sources, sorted by name, each headed by "# file: NAME"; code-12 is the first 12
modules (IMDC), code-8k and code-32k the first 40 and 136 of those under 40 KB (EdgeInfinite: no gate trained on a
file that small). logbook: kvpot's generated logbook prose, 12 logbooks of 400 entries without a fact to find.
manual: the GNU diffutils manual as Debian installs it, info's node marks removed.
library-1m: the phone profile's 1M-token read (docs/benchmarks.md, "Inside a phone's memory"): every .py file of the
library whose path holds no "/test", in byte order of its path, the first 4,000,000 bytes (~1.07M tokens for the
Qwen models), with one line to find inserted at 47 %. The same bytes as this shell line, the line then inserted:
`(cd /usr/lib/python3.11 && find . -name '*.py' -not -path '*/test*' | LC_ALL=C sort | xargs cat) | head -c 4000000`.
library-32k: the same, the first 140,000 bytes (the enforced-memory read, `make bench-memory-limit`).
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

from kvpot.bench.logbook import logbook

# the library the figures were measured with; another Python's library gives other texts and other figures
STDLIB = Path("/usr/lib/python3.11")
MANUAL = Path("/usr/share/info/diffutils.info.gz")
SMALL_FILE = 40_000  # bytes: the gates' training reads only files of this size and more


def stdlib_code(n_files: int, max_bytes: int | None = None, folder: Path = STDLIB) -> str:
    files = [f for f in sorted(folder.glob("*.py"), key=lambda p: str(p))
             if max_bytes is None or f.stat().st_size < max_bytes]
    return "".join(f"# file: {f.name}\n" + f.read_text(errors="replace") + "\n" for f in files[:n_files])


LIBRARY_BYTES = 4_000_000
LIBRARY_32K_BYTES = 140_000  # 33,048 tokens for the Qwen models: past the 0.5B's 32,768-token window
STRONGBOX = "# the code of the strongbox is 52445\n"  # asked as "What is the code of the strongbox?"


def library_text(folder: Path = STDLIB, n_bytes: int = LIBRARY_BYTES, depth: float = 0.47) -> str:
    import fnmatch
    import os

    paths = []
    for root, dirs, files in os.walk(folder):
        rel = "." + root[len(str(folder)):]
        paths += [f"{rel}/{name}" for name in files if name.endswith(".py")]
    paths = sorted((p for p in paths if not fnmatch.fnmatchcase(p, "*/test*")), key=os.fsencode)
    out = bytearray()
    for p in paths:
        out += (folder / p).read_bytes()
        if len(out) >= n_bytes:
            break
    text = bytes(out[:n_bytes]).decode("utf-8", "replace")
    at = text.index("\n", len(text) * int(depth * 100) // 100) + 1
    return text[:at] + STRONGBOX + text[at:]


def logbook_text() -> str:
    return "".join(logbook(n_entries=400, seed=s, fact_at=2.0)[0] for s in range(12))


def manual_text(path: Path = MANUAL) -> str:
    return gzip.decompress(path.read_bytes()).decode("utf-8", "replace").replace(chr(31), "")


KINDS = {
    "code-12": lambda: stdlib_code(12),
    "code-8k": lambda: stdlib_code(40, SMALL_FILE),
    "code-32k": lambda: stdlib_code(136, SMALL_FILE),
    "logbook": logbook_text,
    "manual": manual_text,
    "library-1m": library_text,
    "library-32k": lambda: library_text(n_bytes=LIBRARY_32K_BYTES),
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in KINDS:
        print(f"usage: python -m kvpot.bench.texts {'|'.join(KINDS)} OUT", file=sys.stderr)
        return 2
    Path(argv[1]).write_text(KINDS[argv[0]]())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

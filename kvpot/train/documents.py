"""Training samples from text already on this machine: each is a prompt and an answer, as in Locret's
QA training data (section 3.3: the label of a prompt token is what the answer's queries make of it).

Sources (no network): the running Python's standard library source and /usr/share/doc (Debian's
package documentation), or directories the user names. Two kinds of sample, half each:

- retrieval: a window of a source file with a few generated facts spliced in at line ends, a
  question about one of them, and the answer that repeats it. This generator is kvpot's own and
  shares no wording or seeds with the benchmarks' haystacks (kvpot.bench.niah, kvpot.bench.haystack)
  or the sample logbook (kvpot.bench.logbook).
- continuation: a window of a source file; the answer is the text that follows it (the "later
  rows" of a plain document).
"""

from __future__ import annotations

import gzip
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from kvpot.errors import KvpotError

TEXT_SUFFIXES = {".py", ".txt", ".rst", ".md", ".gz", ""}
MIN_BYTES = 4096
MAX_BYTES = 2_000_000

_ATTRS = ["locker number", "ticket id", "serial number", "room code", "order number", "badge id", "shelf mark"]
_NAMES = ["Mira Holt", "the north depot", "Oskar Lind", "the copper kettle", "Ines Varga", "the night ferry",
          "Tomas Reed", "the east wing", "Lena Ostrova", "the glass workshop", "Pavel Dunn", "the old mill"]


@dataclass(frozen=True)
class Sample:
    tokens: list[int]   # prompt then answer, without BOS
    n_prompt: int       # tokens [0, n_prompt) get labels; [n_prompt, len) are the answer's query rows
    kind: str           # "retrieval" or "continuation"


def default_sources() -> list[Path]:
    out = [Path(sysconfig.get_paths()["stdlib"]), Path("/usr/share/doc")]
    return [p for p in out if p.is_dir()]


def list_files(sources: list[Path]) -> list[Path]:
    """Text files of MIN_BYTES..MAX_BYTES under the sources, in a fixed order (sorted paths)."""
    files = []
    for src in sources:
        src = Path(src).expanduser()
        if not src.exists():
            raise KvpotError(f"training data {src} does not exist")
        paths = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink())
        for p in paths:
            # the standard library only: site-packages holds whatever happens to be installed
            if (p.suffix not in TEXT_SUFFIXES or "test" in p.name
                    or {"__pycache__", "site-packages", "dist-packages"} & set(p.parts)):
                continue
            try:
                size = p.stat().st_size
            except OSError:
                continue
            if MIN_BYTES <= size <= MAX_BYTES:
                files.append(p)
    if not files:
        raise KvpotError(f"no text files of at least {MIN_BYTES} bytes under {', '.join(map(str, sources))}")
    return files


def read_text(path: Path) -> str | None:
    """The file as text, or None for something that is not text (binary, unreadable)."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if b"\0" in raw[:4096]:
        return None
    return raw.decode("utf-8", errors="replace")


def _window(rng: random.Random, files: list[Path], n_chars: int) -> str:
    """About n_chars of text starting at a line of a random file (the next files when it is short)."""
    out = ""
    i = rng.randrange(len(files))
    for _ in range(64):
        text = read_text(files[i % len(files)]) or ""
        if not out and len(text) > n_chars:
            start = rng.randrange(len(text) - n_chars // 2)
            start = text.find("\n", start) + 1  # begin at a line
            text = text[start:]
        out += text + "\n"
        if len(out) >= n_chars:
            return out[:n_chars]
        i += 1
    raise KvpotError("the training files hold too little text")


def _is_line_end(model, token: int) -> bool:
    return model.piece(token).endswith(b"\n")


def make_sample(model, files: list[Path], length: int, rng: random.Random, kind: str,
                n_answer: int = 64) -> Sample:
    """One sample of `length` tokens (fewer if the text runs short)."""
    doc = model.tokenize(_window(rng, files, length * 6))
    if kind == "continuation":
        doc = doc[:length]
        n_prompt = len(doc) - min(n_answer, len(doc) // 4)
        return Sample(tokens=doc, n_prompt=n_prompt, kind=kind)
    names = rng.sample(_NAMES, 3)
    facts = [(rng.choice(_ATTRS), name, str(rng.randint(1000, 9_999_999))) for name in names]
    attr, name, value = facts[rng.randrange(len(facts))]
    question = model.tokenize(f"\n\nQuestion: what is the {attr} of {name}?\nAnswer: The {attr} of {name} is")
    answer = model.tokenize(f" {value}. It is the {attr} written down for {name}: {value}.")
    fact_tokens = [model.tokenize(f"Note: the {a} of {n} is {v}.\n") for a, n, v in facts]
    n_doc = length - len(question) - len(answer) - sum(map(len, fact_tokens))
    if n_doc < 16:
        raise KvpotError(f"sample length {length} is too short for a retrieval sample")
    doc = doc[:n_doc]
    # splice each fact in after a line end (a line start for the fact), anywhere in the window
    ends = [i + 1 for i, t in enumerate(doc) if _is_line_end(model, t)] or [len(doc)]
    at = sorted(rng.sample(ends, min(len(facts), len(ends))) if len(ends) >= len(facts) else
                [rng.choice(ends) for _ in facts])
    out, prev = [], 0
    for pos, ft in zip(at, fact_tokens):
        out += doc[prev:pos] + ft
        prev = pos
    out += doc[prev:] + question
    return Sample(tokens=out + answer, n_prompt=len(out), kind=kind)


def make_samples(model, sources: list[Path], n_samples: int, length: int, seed: int) -> list[Sample]:
    """n_samples samples, retrieval and continuation alternating; fixed by seed and the files."""
    files = list_files(sources)
    out = []
    for i in range(n_samples):
        rng = random.Random(f"kvpot-locret-train-{seed}-{i}")
        out.append(make_sample(model, files, length, rng, "retrieval" if i % 2 == 0 else "continuation"))
    return out

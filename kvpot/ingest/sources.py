"""Where the text comes from: files, directories (kvpot.ingest.tree) and stdin, read lazily.

Nothing here holds a whole file: `SourceSet.pieces()` yields decoded text a piece at a time, and
records where each piece starts (file, and page, chapter, paragraph or line: `SourceSet.where`).
Files are told apart by content (kvpot.ingest.formats): PDF, EPUB, DOCX, ODT and HTML are read as
their text, compressed files decompressed; stdin and pipes are told apart the same way by their first
bytes (HTML, compressed text), except the documents that need seeking (PDF, zips), which are refused
with the way to read them (their path). Invalid UTF-8 is replaced with U+FFFD and counted;
binary and unreadable files are left out (named in `skipped`, with reasons in `left_out`); several
sources are joined with their names as headers.
"""

from __future__ import annotations

import codecs
import errno
import io
import os
import stat
import sys
import threading
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from kvpot.errors import KvpotError
from kvpot.ingest import formats
from kvpot.ingest.formats import Kind, UnreadableInput, compressed
from kvpot.ingest.textfile import SNIFF_BYTES
from kvpot.ingest.tree import walk
from kvpot.safe_write import protect, protect_folder

PIECE_BYTES = 1 << 16   # bytes read per piece: 64 KiB keeps memory flat and tokenizer calls few
STDIN = "-"
# what is said when the document is to be typed on the terminal (callers that hold notices say this at once)
STDIN_PROMPT = "reading the document from stdin"


@dataclass(frozen=True)
class Source:
    name: str               # shown in headers and in saved contexts
    path: Path | None       # None for stdin
    size: int | None        # bytes; None for streams (stdin, pipes, /proc files: unknown until read)
    head: bytes = b""       # streams only: the first bytes, read up front to refuse an empty or binary stream
    stream: BinaryIO | None = None  # a pipe or pseudo-file opened once (reading it again would lose data)
    complete: bool = False  # streams only: `head` holds all of it (read ahead to its end; see read_ahead)
    kind: Kind = Kind("text")  # what the file is (kvpot.ingest.formats); size is its file's, not its text's
    # a compressed file's text size where its format says it (gzip's trailer when plausible, zstd's frame
    # header; compressed.text_size), else None: unknown until read
    text_estimate: int | None = None
    # what was said about this source while reading (a PDF's damaged page): said once, however often
    # the source is read (counted, read, quoted)
    said: set[str] = field(default_factory=set, compare=False, repr=False)

    @property
    def is_stream(self) -> bool:
        """stdin or a pipe: its bytes are `head` and then (unless `complete`) what is left of the stream."""
        return self.path is None or self.stream is not None or self.complete


def say_on_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def header(name: str) -> str:
    return f"\n\n===== {name} =====\n\n"


@dataclass(frozen=True)
class Mark:
    offset: int     # characters of the joined text before the piece
    source: str     # the source's name
    where: str      # "p. 12", "ch. 3", "¶ 40", "line 1200"


@dataclass
class SourceSet:
    sources: list[Source]
    skipped: list[str] = field(default_factory=list)    # files named or found that are not read (binary, unreadable)
    replaced: int = 0       # invalid UTF-8 sequences replaced so far
    bytes_read: int = 0
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (path, why) for everything not read
    marks: list[Mark] = field(default_factory=list)  # where each piece of pieces() came from, in order
    chars: int = 0          # characters pieces() has yielded
    # told, as reading meets it, what is left out of a source (a PDF's damaged page); stderr by default,
    # since it happens while reading, after the command's opening lines
    warn: Callable[[str], None] = field(default=say_on_stderr, repr=False)
    warnings: list[str] = field(default_factory=list)  # everything told to `warn`, in order (--json's inputs.warnings)

    def counter(self) -> SourceSet:
        """The same sources with counters of their own (marks, characters, bytes: a count before the read);
        what reading them meets is told to this set's `warn` and recorded in its `warnings`."""
        return SourceSet(sources=list(self.sources), warn=self.warn, warnings=self.warnings)

    def can_read_again(self) -> bool:
        """pieces() gives the same text again: every source is a file (a pipe or stdin is read once)."""
        return all(s.path is not None and s.stream is None for s in self.sources)

    @property
    def sizes_are_text(self) -> bool:
        """Every size is its text's size (plain text files): no PDF, document or compressed file."""
        return all(s.kind.plain for s in self.sources)

    def where(self, offset: int) -> Mark | None:
        """The source and place the character at `offset` of the joined text came from."""
        i = bisect_right([m.offset for m in self.marks], offset) - 1
        return self.marks[i] if i >= 0 else None

    @property
    def total_bytes(self) -> int | None:
        """Total size when every source has one (stdin has none)."""
        if any(s.size is None for s in self.sources):
            return None
        return sum(s.size for s in self.sources)

    @property
    def text_bytes(self) -> int | None:
        """The text's size as far as it is known before reading, for a progress estimate: a file's size,
        a compressed file's uncompressed size where its format says it (Source.text_estimate); None when
        any is unknown (a stream, a compressed file whose format does not say), rather than a wrong one."""
        total = 0
        for s in self.sources:
            n = s.size if s.kind.codec is None else s.text_estimate
            if n is None:
                return None
            total += n
        return total

    def read_ahead(self, max_bytes: int, stdin: BinaryIO | None = None,
                   notice: Callable[[str], None] = lambda msg: None) -> None:
        """Read the streams (stdin, pipes) ahead, at most `max_bytes` of them in all: a stream that ends
        within that is held in memory and gets a size, so an input of unknown length can be counted
        (`--budget auto` then reads a short one with full attention, as it does a file). A longer
        stream keeps what was read in its head and is read on from there; memory stays at max_bytes."""
        held = sum(len(s.head) for s in self.sources if s.size is None)
        for i, src in enumerate(self.sources):
            if src.size is not None or src.complete:
                continue
            stream = src.stream if src.path is not None else stdin_buffer(stdin)
            read = getattr(stream, "read1", None) or stream.read
            head, ended = bytearray(src.head), False
            with _SayIfBlocked(notice, f"reading {src.name} ahead (up to {max_bytes:,} bytes) to learn its length"):
                while held <= max_bytes:
                    try:
                        raw = read(PIECE_BYTES)
                    except OSError as e:
                        raise KvpotError(f"cannot read {src.name}: {e.strerror}") from None
                    if not raw:
                        ended = True
                        break
                    head += raw
                    held += len(raw)
            if ended and src.stream is not None:
                src.stream.close()
            self.sources[i] = replace(src, head=bytes(head), complete=ended, size=len(head) if ended else None,
                                      stream=None if ended else src.stream)
            if not ended:
                return  # past max_bytes: the rest is read when the document is

    def pieces(self, piece_bytes: int = PIECE_BYTES, stdin: BinaryIO | None = None) -> Iterator[str]:
        """Decoded text, piece by piece; headers between sources when there are several. Where each
        piece came from is recorded in `marks`."""
        self.marks, self.chars = [], 0
        multi = len(self.sources) > 1
        for i, src in enumerate(self.sources):
            if multi:
                head = header(src.name).lstrip("\n") if i == 0 else header(src.name)
                self.chars += len(head)
                yield head
            for text, where in self._source_pieces(src, piece_bytes, stdin):
                if not self.marks or (self.marks[-1].source, self.marks[-1].where) != (src.name, where):
                    self.marks.append(Mark(self.chars, src.name, where))
                self.chars += len(text)
                yield text

    def _warn_once(self, src: Source, msg: str) -> None:
        if msg not in src.said:
            src.said.add(msg)
            self.warnings.append(msg)
            self.warn(msg)

    def _source_pieces(self, src: Source, piece_bytes: int, stdin: BinaryIO | None) -> Iterator[tuple[str, str]]:
        if not src.kind.plain:
            shown = "stdin" if src.path is None else src.name
            raw = None
            if src.is_stream:  # HTML or compressed text on stdin or a pipe
                raw = io.BytesIO(src.head) if src.complete else _Prefixed(
                    src.head, stdin_buffer(stdin) if src.path is None else src.stream)
            try:
                if src.kind.document is None:  # compressed text
                    with formats.open_bytes(src.kind, src.path, shown, raw) as f:
                        yield from self._decode(f, piece_bytes, src.name)
                else:
                    for text, where in formats.pieces(src.kind, src.path, shown, stream=raw,
                                                      warn=lambda msg: self._warn_once(src, msg)):
                        self.bytes_read += len(text.encode("utf-8"))
                        yield text, where
            except OSError as e:
                raise KvpotError(f"cannot read {shown}: {e.strerror or e}") from None
            finally:
                if src.stream is not None:
                    src.stream.close()
            return
        if src.complete:  # a stream read ahead to its end
            yield from self._decode(io.BytesIO(src.head), piece_bytes, src.name)
        elif src.path is None:
            yield from self._decode(_Prefixed(src.head, stdin_buffer(stdin)), piece_bytes, src.name)
        elif src.stream is not None:
            try:
                yield from self._decode(_Prefixed(src.head, src.stream), piece_bytes, src.name)
            except OSError as e:
                raise KvpotError(f"cannot read {src.name}: {e.strerror}") from None
            finally:
                src.stream.close()
        else:
            try:
                with open(src.path, "rb") as f:
                    yield from self._decode(f, piece_bytes, src.name)
            except OSError as e:
                raise KvpotError(f"cannot read {src.name}: {e.strerror}") from None

    def _decode(self, f: BinaryIO, piece_bytes: int, name: str) -> Iterator[tuple[str, str]]:
        """(text, "line N") from a byte stream; N is the line the piece starts on."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors=_COUNTING)
        n, line = 0, 1
        while True:
            raw = f.read(piece_bytes)
            final = not raw
            with _count_into(self):
                text = decoder.decode(raw, final=final)
            n += len(raw)
            self.bytes_read += len(raw)
            if text:
                yield text, f"line {line}"
                line += text.count("\n")
            if final:
                break
        if n == 0 and name == STDIN:
            raise KvpotError("stdin was empty (closed before any text arrived)")


def stdin_buffer(stdin: BinaryIO | None = None) -> BinaryIO:
    """The binary stdin to read `-` from; Python starts with no sys.stdin when fd 0 is closed."""
    if stdin is not None:
        return stdin
    if sys.stdin is None:
        raise KvpotError("stdin is closed: there is nothing to read for - (pipe the document in, or pass a file)")
    return sys.stdin.buffer


class _Prefixed:
    """A binary stream with bytes already taken from it put back in front."""

    def __init__(self, head: bytes, rest: BinaryIO):
        self.head, self.rest = head, rest

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            out, self.head = self.head + self.rest.read(), b""
            return out
        if self.head:
            out, self.head = self.head[:n], self.head[n:]
            return out
        return self.rest.read(n)


WAIT_NOTICE_S = 1.0  # a read that has not returned by then is said to be waiting


class _SayIfBlocked:
    """Tell the user once when a read blocks (a pipe with no writer yet, a terminal)."""

    def __init__(self, notice: Callable[[str], None], message: str):
        self._timer = threading.Timer(WAIT_NOTICE_S, notice, (message,))
        self._timer.daemon = True

    def __enter__(self):
        self._timer.start()

    def __exit__(self, *exc):
        self._timer.cancel()


def stdin_is_piped() -> bool:
    """stdin is a pipe or a file redirected into it: a document to read when `ask` is given only a
    question. A terminal, /dev/null, a socket or a closed stdin is not (nothing was sent)."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def _read_head(stream: BinaryIO, name: str = STDIN) -> bytes:
    read1 = getattr(stream, "read1", None)
    try:
        return read1(SNIFF_BYTES) if read1 else stream.read(SNIFF_BYTES)
    except OSError as e:
        raise KvpotError(f"cannot read {'stdin' if name == STDIN else name}: {e.strerror}") from None


def _stdin_head(stream: BinaryIO, notice: Callable[[str], None] = lambda msg: None) -> bytes:
    """Wait for the first bytes on stdin (or its end) so an empty stream is refused before a model
    is loaded."""
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        notice(STDIN_PROMPT + " (the terminal); end it with Ctrl-D")
        head = _read_head(stream)
    else:
        with _SayIfBlocked(notice, "waiting for input on stdin"):
            head = _read_head(stream)
    if not head:
        raise KvpotError("stdin was empty (closed before any text arrived)")
    return head


# a stream that starts with this much whitespace is read as it comes (the bytes read ahead stay bounded)
WHITESPACE_PROBE = 1 << 20


def _read_on(stream: BinaryIO, head: bytes, enough: Callable[[bytes], bool], shown: str) -> tuple[bytes, bool]:
    """`head` and what follows it on `stream`, read until `enough(bytes so far)` or the stream ends;
    True when it ended."""
    read = getattr(stream, "read1", None) or stream.read
    out = bytearray(head)
    while not enough(out):
        try:
            raw = read(PIECE_BYTES)
        except OSError as e:
            raise KvpotError(f"cannot read {shown}: {e.strerror}") from None
        if not raw:
            return bytes(out), True
        out += raw
    return bytes(out), False


def _stream_source(name: str, path: Path | None, head: bytes, stream: BinaryIO,
                   notice: Callable[[str], None]) -> Source:
    """A stream's source (stdin when `path` is None), its kind told from its first bytes
    (formats.identify_stream). A compressed stream is read ahead up to compressed.VERIFY_BYTES and
    held: one that ends within that is decompressed whole now, so a truncated or corrupt one is
    refused before a model loads, as a file of that size is."""
    shown = "stdin" if path is None else name
    starts = formats.magics()  # the first bytes that tell a stream's kind: a head shorter than one is read on
    head, ended = _read_on(stream, head, lambda b: not any(m.startswith(bytes(b)) and len(b) < len(m)
                                                            for m in starts), shown)
    if not ended and formats.compression(head):
        limit = compressed.VERIFY_BYTES
        with _SayIfBlocked(notice, f"reading {shown} ahead (up to {limit:,} bytes) to check the compressed stream"):
            head, ended = _read_on(stream, head, lambda b: len(b) > limit, shown)
    kind = formats.identify_stream(head, ended, shown)
    if ended and path is not None:
        stream.close()
    return Source(name, path, len(head) if ended else None, head=head, complete=ended, kind=kind,
                  stream=None if ended or path is None else stream)


# -- counting replacements: a codecs error handler that replaces like errors="replace" and counts

_COUNTING = "kvpot-count-replace"
_counter: list[SourceSet] = []


def _replace_and_count(exc: UnicodeDecodeError) -> tuple[str, int]:
    if _counter:
        _counter[-1].replaced += 1
    return "\ufffd", exc.end


codecs.register_error(_COUNTING, _replace_and_count)


class _count_into:
    def __init__(self, target: SourceSet):
        self.target = target

    def __enter__(self):
        _counter.append(self.target)

    def __exit__(self, *exc):
        _counter.pop()


# -- collecting sources -------------------------------------------------------------------------

def _sniff(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(SNIFF_BYTES)
    except OSError as e:
        raise KvpotError(f"cannot read {path}: {e.strerror}") from None


# what an OS error on an input path means, said in the words of the path the user typed
_PATH_ERRORS = {
    errno.ENOENT: "does not exist",
    errno.EACCES: "cannot be reached: permission denied (a folder on its path is not searchable)",
    errno.ELOOP: "is a symlink loop (too many levels of symbolic links)",
    errno.ENOTDIR: "does not exist: a part of its path is a file, not a folder",
    errno.ENAMETOOLONG: "has a name too long for the filesystem",
}


def stat_input(item: str, what: str = "input") -> os.stat_result:
    """os.stat of an input path (symlinks followed), every failure one line that says which:
    missing, unreachable (permissions), a symlink loop or a broken symlink, a file used as a folder."""
    try:
        return os.stat(item)
    except ValueError:  # a NUL byte in the name
        raise KvpotError(f"{what} path {item!r} holds a NUL byte") from None
    except OSError as e:
        if e.errno == errno.ENOENT and os.path.islink(item):
            raise KvpotError(f"{what} {item} is a broken symlink (to {os.readlink(item)}, which does not exist)") from None
        why = _PATH_ERRORS.get(e.errno, f"cannot be read: {e.strerror}")
        raise KvpotError(f"{what} {item} {why}") from None


def looks_like_input(arg: str) -> bool:
    """True when a lone `ask` argument names something to read (so it is not the question)."""
    if arg == STDIN:
        return True
    try:
        return bool(arg.strip()) and Path(arg).exists()
    except (OSError, ValueError):
        return False


def _open_stream(path: Path, item: str, notice: Callable[[str], None]) -> Source:
    """A pipe, FIFO, device or pseudo-file (/proc): opened once and read as a stream, its first
    bytes kept, so nothing is consumed twice; a FIFO with no writer yet says it is waiting. An
    empty one has no kind (`head` is empty); a stream kvpot cannot read is UnreadableInput."""
    with _SayIfBlocked(notice, f"waiting for input on {item}"):
        try:
            f = open(path, "rb")
            head = _read_head(f, item)
        except OSError as e:
            raise KvpotError(f"cannot read {item}: {e.strerror}") from None
    if not head:
        f.close()
        return Source(item, path, None)
    try:
        return _stream_source(item, path, head, f, notice)
    except KvpotError:
        f.close()
        raise


def _is_stream(path: Path, st: os.stat_result) -> bool:
    """Not a regular file, or one whose size says nothing (files under /proc and /sys report 0)."""
    return not stat.S_ISREG(st.st_mode) or st.st_size == 0 and _pseudo_fs(path)


def _pseudo_fs(path: Path) -> bool:
    real = os.path.realpath(path)
    return real.startswith(("/proc/", "/sys/"))


BINARY = "binary"
UNREADABLE = "unreadable"


def _text_estimate(kind: Kind, path: Path, size: int) -> int | None:
    return compressed.text_size(kind.codec, path, size) if kind.codec else None


def only_whitespace(path: Path) -> bool:
    """The file holds whitespace and nothing else (read until its first other byte)."""
    try:
        with open(path, "rb") as f:
            while raw := f.read(PIECE_BYTES):
                if raw.strip():
                    return False
    except OSError as e:
        raise KvpotError(f"cannot read {path}: {e.strerror}") from None
    return True


def _identify(path: Path, name: str) -> Kind:
    try:
        return formats.identify(path, _sniff(path), name)
    except OSError as e:  # read while it was looked into (a zip's member, a PDF's objects)
        raise UnreadableInput(f"cannot read {name}: {e.strerror or e}") from None


def collect_sources(inputs: list[str], glob: str | Iterable[str] = "*", notice: Callable[[str], None] = lambda msg: None,
                    stdin: BinaryIO | None = None, exclude: Iterable[str] = (), verbose: bool = False) -> SourceSet:
    """Resolve the user's inputs into sources; refuse what cannot be read with one clear line. Among
    several inputs, a document that cannot be read (broken, encrypted, no text layer) is said on
    `notice` and left out; alone, or when nothing else is left, it is the error. Folders are walked
    by kvpot.ingest.tree (`glob`: the files kept, `exclude`: the files and folders left out, both
    any number of patterns) and summed up in one notice line; `verbose` lists what was left out.
    Every file found is protected from this command's saves (kvpot.safe_write.protect)."""
    if not inputs:
        raise KvpotError("no input: pass a file, a directory, or - for stdin")
    if inputs.count(STDIN) > 1:
        raise KvpotError("stdin (-) can be read only once")
    globs = [glob] if isinstance(glob, str) else list(glob) or ["*"]
    excludes = list(exclude)
    sources: list[Source] = []
    skipped: list[str] = []
    left_out: list[tuple[str, str]] = []
    unreadable: list[str] = []   # the reasons of named inputs left out
    blank: list[str] = []        # named text files that hold only whitespace
    walked = False
    for item in inputs:
        if item == STDIN:
            stream = stdin_buffer(stdin)
            head = _stdin_head(stream, notice)
            if not head.strip():  # only whitespace so far: read on until text arrives or the stream ends
                head, ended = _read_on(stream, head, lambda b: bool(bytes(b).strip()) or len(b) >= WHITESPACE_PROBE,
                                       "stdin")
                if ended and not head.strip():
                    raise KvpotError("stdin held only whitespace: there is no text to read")
            src = _stream_source(STDIN, None, head, stream, notice)
            if src.kind.binary:
                inside = f" once decompressed ({src.kind.codec})" if src.kind.codec else ""
                raise KvpotError(f"stdin looks binary{inside} (not text); kvpot reads text")
            sources.append(src)
            continue
        if not item.strip():
            raise KvpotError("an input path is empty")
        path = Path(item)
        st = stat_input(item)
        is_dir = stat.S_ISDIR(st.st_mode)
        if not is_dir and _is_stream(path, st):
            try:
                src = _open_stream(path, item, notice)
            except UnreadableInput as e:
                if len(inputs) == 1:
                    raise
                skipped.append(item)
                unreadable.append(str(e))
                left_out.append((item, f"{UNREADABLE}: {e}"))
                continue
            if not src.head:
                raise KvpotError(f"input {item} is empty (nothing arrived before it ended)")
            if src.kind.binary:
                if src.stream is not None:
                    src.stream.close()
                skipped.append(item)
                left_out.append((item, BINARY))
            else:
                sources.append(src)
            continue
        if is_dir:
            walked = True
            protect_folder(path, f"the input folder {item}")  # what the walk leaves out too
            tree = walk(path, globs, excludes, notice)
            left_out += tree.left_out
            found = []
            for p in tree.files:
                try:
                    kind = _identify(p, str(p))
                except UnreadableInput as e:
                    skipped.append(str(p))
                    left_out.append((str(p), f"{UNREADABLE}: {e}"))
                    continue
                if kind.binary:
                    skipped.append(str(p))
                    left_out.append((str(p), BINARY))
                elif size := p.stat().st_size:
                    found.append(Source(str(p), p, size, kind=kind, text_estimate=_text_estimate(kind, p, size)))
            if not found:
                raise KvpotError(f"directory {item} has no text files matching "
                                 f"{' or '.join(repr(g) for g in globs)}" + _counts(left_out, " (left out: {})"))
            sources += found
            continue
        try:
            kind = _identify(path, str(path))
        except UnreadableInput as e:
            if len(inputs) == 1:
                raise
            skipped.append(str(path))
            unreadable.append(str(e))
            left_out.append((str(path), f"{UNREADABLE}: {e}"))
            continue
        if kind.binary:
            skipped.append(str(path))
            left_out.append((str(path), BINARY))
            continue
        if kind.plain and st.st_size and only_whitespace(path):
            blank.append(str(path))
        sources.append(Source(str(path), path, st.st_size, kind=kind,
                              text_estimate=_text_estimate(kind, path, st.st_size)))
    if not sources:
        if unreadable:
            raise KvpotError(f"nothing left to read: {'; '.join(unreadable)}")
        if len(inputs) == 1 and skipped:
            raise KvpotError(f"no text to read: every input is binary ({skipped[0]} looks binary: not "
                             f"{formats.read_as()})")
        raise KvpotError("no text to read: every input is binary" if skipped else "no input to read")
    for why in unreadable:  # told only when there is something else to read
        notice(f"skipping {why}")
    _tell(left_out, sources, walked, verbose, notice)
    if all(s.size == 0 or s.name in blank for s in sources):  # streams have no size (None): they held text
        if blank and len(sources) == 1:
            raise KvpotError(f"the input {blank[0]} is empty (it holds only whitespace)")
        if blank:
            raise KvpotError("every input file is empty or holds only whitespace")
        raise KvpotError("the input is empty" if len(sources) == 1 else "every input file is empty")
    # no save of this command may replace an input, read or skipped (kvpot.safe_write)
    for name in [s.name for s in sources if s.path is not None] + skipped:
        protect(name, f"the input {name}")
    return SourceSet(sources=sources, skipped=skipped, left_out=left_out)


def _counts(left_out: list[tuple[str, str]], template: str = "{}") -> str:
    """ "3 ignored by .gitignore, 2 binary" (unreadable ones counted together); "" for none."""
    if not left_out:
        return ""
    counts = Counter(why.partition(":")[0] for _, why in left_out)
    return template.format(", ".join(f"{n} {why}" for why, n in counts.most_common()))


def _tell(left_out: list[tuple[str, str]], sources: list[Source], walked: bool, verbose: bool,
          notice: Callable[[str], None]) -> None:
    """One line for what was read and left out (folders, or any input left out); each left out
    with its reason only when verbose."""
    if not walked and not left_out:
        return
    if not walked and len(left_out) == 1 and not verbose:  # one named input: its own line says it all
        name, why = left_out[0]
        if why == BINARY:
            notice(f"skipping binary file {name}")
        return
    n = len(sources)
    line = f"reading {n} file{'s' if n != 1 else ''}"
    if left_out:
        line += f"; left out {len(left_out)}: {_counts(left_out)}"
        if not verbose:
            line += " (-v lists them)"
    notice(line)
    if verbose:
        for name, why in left_out:
            notice(f"  left out {name}: {why}")

"""A `bench qa` reading saved where it is, so that a stopped one goes on with `--resume` instead of from
token 0: a 128K question-first read of the 1.5B model takes 78 minutes to over 2 hours on a 2-core CPU,
longer than the session that runs it may last.

The save is the reading's saved context (Session.save: the pot and its read point, as `kvpot ask
--save-context` keeps a stopped read) beside a small JSON of what the bench reports of the reading so
far (its reading time, peak RSS, the processes and CPUs that read it) and the reading it belongs to
(`key`). Going on reopens the context and reads the rest of the same input from the read point
(Session.read's `resume`, which checks the text before the point is the text that was read), so the
pot ends as one uninterrupted read leaves it. A save that cannot be used (another key, a rebuilt
runtime, a damaged file) is said, deleted, and the reading starts again.

A policy that keeps data on disk beside the pot (InfLLM's block store) is not saved: the context would
reference a store that deleting the save must not leave behind."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from kvpot.errors import KvpotError
from kvpot.runtime.cpu import describe_host
from kvpot.safe_write import atomic_write, remove_stale_temps

FORMAT = "kvpot bench qa read"


@dataclass
class QaSoFar:
    tokens: int = 0             # document tokens in the saved context (what tells a pair of files apart
                                # that a signal between their two writes left from two saves)
    seconds: float = 0.0        # reading time of the parts saved (the saves not counted)
    peak_rss_mib: float | None = None  # the largest reading peak of those parts (None: not measured)
    parts: int = 0              # processes that read a part
    cpus: list[str] = field(default_factory=list)  # each part's CPU


class QaReadStopped(Exception):
    """A reading stopped by a signal: `saved` is where it goes on from (None: it was not saved)."""

    def __init__(self, what: str, tokens: int, saved: Path | None):
        super().__init__(f"{what}: stopped after {tokens:,} tokens")
        self.what, self.tokens, self.saved = what, tokens, saved


@dataclass(frozen=True)
class QaSaves:
    """Where and how often a grid's readings are saved (`bench qa --json`); `resume`: go on from a save
    that is there (else a reading starts from token 0 and its old save is deleted)."""
    folder: Path
    every: float = 600.0        # seconds of reading between saves (0: after every chunk)
    resume: bool = True

    def read(self, key: dict) -> QaReadSave:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        return QaReadSave(self.folder / f"qa-{digest}.kvpot", key)


@dataclass(frozen=True)
class QaReadSave:
    context: Path   # the reading's saved context
    key: dict       # the reading it belongs to (kvpot.bench.qa.read_save_key)

    @property
    def figures(self) -> Path:
        return self.context.with_suffix(".json")

    def load(self, say) -> QaSoFar | None:
        """The figures of a usable save (its context is then reopened by the caller), or None: no save, or
        one that cannot be used, which is said on `say` and deleted."""
        if not self.context.exists() and not self.figures.exists():
            return None
        try:
            meta = json.loads(self.figures.read_text(encoding="utf-8"))
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise ValueError("not a bench qa reading's figures")
            if meta.get("key") != self.key:
                raise ValueError("saved for another reading")
            so_far = _so_far(meta.get("so_far"))
            if not self.context.is_file():
                raise ValueError("its context file is missing")
        except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError
            self.drop()
            say(f"the save of this reading at {self.context} cannot be used ({e}); reading from the start")
            return None
        return so_far

    def reopen(self, facts, name: str, threads: int, resettable: bool, so_far: QaSoFar, say):
        """The saved context as a Session whose read goes on, or None (said, and the save deleted)."""
        from kvpot.api.plan import reopen

        try:  # reopened as `kvpot ask --context` reopens it (kvpot.api.plan.reopen: checked before the model loads)
            s = reopen(self.context, str(facts.path), threads, resettable=resettable)
        except KvpotError as e:  # another runtime or model, a damaged file
            self.drop()
            say(f"the save of this reading cannot be reopened ({e}); reading from the start")
            return None
        why = ("it holds no read to go on with" if s.read_point is None else
               f"its context holds {s.doc_tokens:,} tokens, its figures {so_far.tokens:,}"
               if s.doc_tokens != so_far.tokens else None)
        if why is not None:
            s.close()
            self.drop()
            say(f"the save of this reading at {self.context} cannot be used ({why}); reading from the start")
            return None
        return s

    def save(self, session, so_far: QaSoFar) -> None:
        self.context.parent.mkdir(parents=True, exist_ok=True)
        session.save(self.context)
        with atomic_write(self.figures, "bench qa reading's figures") as f:
            f.write(json.dumps({"format": FORMAT, "key": self.key, "so_far": asdict(so_far)}, indent=1).encode())

    def drop(self) -> None:
        """Delete the save (both files, and temporary files a killed save left)."""
        for p in (self.context, self.figures):
            p.unlink(missing_ok=True)
            remove_stale_temps(p)


def this_part(so_far: QaSoFar | None) -> QaSoFar:
    """The figures as this process's part begins: the saved parts', one part more, this CPU added."""
    base = so_far or QaSoFar()
    return QaSoFar(tokens=base.tokens, seconds=base.seconds, peak_rss_mib=base.peak_rss_mib, parts=base.parts + 1,
                   cpus=[*base.cpus, describe_host()])


def _so_far(saved) -> QaSoFar:
    """The saved figures, each of the type QaSoFar declares (the file can be hand-edited)."""
    if not isinstance(saved, dict) or set(saved) != {f.name for f in fields(QaSoFar)}:
        raise ValueError("its figures are not a reading's")
    for name, value in saved.items():
        if name == "cpus":
            ok = isinstance(value, list) and all(isinstance(c, str) for c in value)
        elif name == "peak_rss_mib" and value is None:
            ok = True
        else:
            kind = int if name in ("tokens", "parts") else (int, float)
            ok = isinstance(value, kind) and not isinstance(value, bool) and value >= 0
        if not ok:
            raise ValueError(f"so_far.{name} is {str(value)[:40]!r}")
    return QaSoFar(**saved)

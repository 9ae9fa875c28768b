"""`/ask QUESTION` in `kvpot chat`: read the chat's files again with the question first, then answer.

Chat reads before any question is asked, so a pot the question would steer (InfiniPot's CaP-Q) kept
what no question chose; past the 1.5B model's window that answers at the level of the model with no
document (docs/benchmarks.md, "Beyond the window"). `/ask` reads the files again as `kvpot ask` reads
them (the question as the catalyst, ask's budget) and the chat goes on with that reading.

The chat's own reading is saved to a file under kvpot's home first, not held in memory, and the chat's
session is closed before the new one loads, so the two never share the device's memory. A re-read that
is stopped (Ctrl-C) or refused reopens that file and the chat goes on where it was."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from kvpot.display import printable
from kvpot.errors import KvpotError
from kvpot.paths import home
from kvpot.session.settings import reads_with_question

from ._common import err

if TYPE_CHECKING:  # opened by kvpot.api through the chat's reader, never assembled here
    from kvpot.session.session import Session

# said when /ask would read the same cells again
WHOLE_INPUT_HELD = ("/ask: nothing of the input was left out of memory, so reading it again with the question "
                    "first would keep the same; answering as usual")
NOT_STEERED = ("/ask: {spec} keeps the same cells whatever the question, so reading again would keep the same; "
               "answering as usual")
NO_FILES = ("/ask reads the chat's files again, and this chat reopened a saved context: the question is answered "
            "from it as usual (`kvpot ask FILE... QUESTION` reads the files with the question first)")


class ReadingLost(KvpotError):
    """The chat's reading could not be reopened after a stopped re-read: the chat cannot go on."""


@dataclass
class Reread:
    """The files and options the chat read, for reading them again; `model` as the first reading
    resolved it (a registry name or a path), so that the same model loads without being chosen again."""

    inputs: list[str]
    glob: list[str]
    exclude: list[str]
    model: str
    opts: dict = field(default_factory=dict)


def worth_reading_again(session: Session) -> str | None:
    """None when reading again with the question first can keep other cells; else why not, to say."""
    policy = session.engine.policy
    if not reads_with_question(policy):
        return NOT_STEERED.format(spec=session.policy_spec)
    if session.engine.stats().n_compactions == 0:
        return WHOLE_INPUT_HELD
    return None


def read_again(session: Session, reread: Reread, question: str, open_session) -> Session:
    """The session to answer `question` from: a new one that read the files with the question first,
    or, when that read is stopped or refused, the chat's reading reopened as it was. `session` is
    closed once it is saved aside; a KvpotError before that leaves it open and the chat goes on with
    it, a ReadingLost after it ends the chat. `open_session(inputs, question, ...)` is the chat's own
    reader (cli.ask._open_session), passed in to keep one reading path."""
    from ._session import reopen_session

    aside = Path(tempfile.mkdtemp(prefix="chat-aside-", dir=_aside_dir()))
    kept = aside / "reading.kvctx"
    try:
        try:
            with err.status("keeping the chat's reading aside"):
                session.save(kept)
        except KeyboardInterrupt:
            raise KvpotError("/ask stopped before reading; the chat goes on as it was") from None
        except KvpotError as e:
            raise KvpotError(f"/ask: the chat's reading could not be kept aside ({e}); nothing was read again") from None
        session.close()
        try:
            new = open_session(reread.inputs, question, None, None, None, reread.model, reread.glob, "",
                               exclude=reread.exclude, resettable=True, **reread.opts)
        except (KeyboardInterrupt, KvpotError) as e:
            why = "stopped" if isinstance(e, KeyboardInterrupt) else f"refused: {e}"
            err.print(f"[yellow]/ask: reading again {escape(printable(why))}; back to the chat's reading[/yellow]",
                      soft_wrap=True)
            try:
                return reopen_session(str(kept), reread.model, reread.opts.get("threads"),
                                      reread.opts.get("max_tokens"), resettable=True)
            except KvpotError as lost:
                raise ReadingLost(f"the chat's reading could not be reopened: {lost}") from None
        err.print("read again with the question first; the chat goes on from this reading "
                  "(/reset comes back to it)", soft_wrap=True)
        return new
    finally:
        # a reopened context reads its state through its own descriptor, so the file can go now
        shutil.rmtree(aside, ignore_errors=True)


def _aside_dir() -> Path:
    """Under kvpot's home, not the system's temporary folder: on many systems /tmp is memory, and the
    point of saving the reading is to not hold it in memory while the files are read again."""
    path = home() / "tmp"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KvpotError(f"/ask: cannot make {path} to keep the chat's reading aside: {e.strerror}") from None
    return path

"""How `kvpot chat` reads a question: line editing and a history per document where stdin and stdout are a
terminal and Python has readline (some Termux and Windows builds do not: then plain lines, as from a pipe),
a line ending with a backslash continued on the next ("...> "), and several lines pasted at once read as
one question where the terminal shows it (the rest of a paste is already waiting when a line ends)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import sys
from pathlib import Path

from kvpot import paths
from kvpot.errors import KvpotError
from kvpot.safe_write import atomic_write

from ._common import err, is_quiet

HISTORY_LINES = 1000   # lines kept per document's history
PROMPT, MORE = "you> ", "...> "


def history_path(inputs: list[str], context: str | None) -> Path:
    """The history file of a chat: one per document (its paths, absolute) or per reopened context, under
    $KVPOT_HOME/history/, named by a digest of what it is kept for."""
    key = f"context\0{os.path.abspath(context)}" if context else "files\0" + "\0".join(
        sorted(os.path.abspath(p) for p in inputs))
    return paths.home() / "history" / (hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:24] + ".txt")


def _readline():
    """Python's readline module, or None where this Python has none."""
    try:
        import readline
    except ImportError:
        return None
    return readline


class ChatInput:
    def __init__(self, history: Path | None = None):
        """`history`: the file the lines typed are kept in (read at the start) where line editing is on."""
        self.readline = None
        if sys.stdin.isatty() and sys.stdout.isatty():  # input() edits lines only where both are a terminal
            self.readline = _readline()
        self.history = history if self.readline is not None else None
        if self.history is not None:
            self._load()

    @property
    def editing(self) -> bool:
        return self.readline is not None

    def _load(self) -> None:
        rl = self.readline
        rl.clear_history()
        with contextlib.suppress(OSError, UnicodeDecodeError):
            for line in self.history.read_text(encoding="utf-8", errors="surrogateescape").splitlines()[-HISTORY_LINES:]:
                if line.strip():
                    rl.add_history(line)

    def _save(self) -> None:
        """The history's last HISTORY_LINES lines, written whole (kvpot.safe_write); a failure is said once."""
        rl = self.readline
        n = rl.get_current_history_length()
        lines = [rl.get_history_item(i) for i in range(max(1, n - HISTORY_LINES + 1), n + 1)]
        text = "".join(f"{line}\n" for line in lines if line and "\n" not in line)
        try:
            self.history.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with atomic_write(self.history, "chat history") as f:
                os.fchmod(f.fileno(), 0o600)  # the user's questions: theirs alone, as a shell's history is
                f.write(text.encode("utf-8", "surrogateescape"))
        except (OSError, KvpotError) as e:
            err.print(f"[yellow]the chat's history is not kept:[/yellow] {e}", soft_wrap=True, markup=True)
            self.history = None

    def _line(self, prompt: str) -> str:
        if self.editing:
            return input(prompt)  # readline: the prompt is part of the line it edits
        if not is_quiet():
            err.print(f"[bold green]{prompt}[/bold green]", end="")
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    def _pending(self) -> bool:
        """More typed input is already waiting: the rest of a paste of several lines (a terminal only: a
        pipe always has its next lines waiting, and each is a question)."""
        if not sys.stdin.isatty():
            return False
        try:
            return bool(select.select([sys.stdin], [], [], 0)[0])
        except (OSError, ValueError, TypeError):  # no descriptor to wait on
            return False

    def read(self) -> str:
        """One question: its lines joined with newlines. EOFError at the end of input (Ctrl-D on an empty
        line); KeyboardInterrupt (Ctrl-C) drops what was typed of it."""
        lines = [self._line(PROMPT)]
        while lines[-1].endswith("\\") or self._pending():
            if lines[-1].endswith("\\"):
                lines[-1] = lines[-1][:-1]
            try:
                lines.append(self._line(MORE))
            except EOFError:
                break  # what was typed is the question
        if self.history is not None:
            self._save()
        return "\n".join(lines)

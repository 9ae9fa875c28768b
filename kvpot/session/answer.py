"""An answer as the user sees it: it starts at its first visible character, ends where the answer ends
(a stop string, the end of the line for completion prompts, or a loop), with no trailing blank lines.

The model's text arrives in pieces; `AnswerText.feed` returns what may be shown now and holds back
what is not decided yet (whitespace that may turn out to be trailing, the beginning of a stop string,
a line that so far repeats an earlier one), so streaming and the final text agree.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

# a line seen this many times ends the answer before its last copy (a model looping on one line)
LINE_REPEATS = 3
# lines shorter than this may repeat legitimately (a closing brace, "else:", a blank separator)
MIN_LOOP_LINE = 8
# the same run of this many words this many times ends the answer (a loop within one long line)
NGRAM_WORDS, NGRAM_REPEATS = 8, 4


def _partial_stop(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is the beginning of a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                best = max(best, n)
                break
    return best


@dataclass
class AnswerText:
    """Streaming filter for one answer. `stops`: strings that end it (not shown); `one_line`: the answer
    ends at its first line break (completion prompts: what a base model writes after "Answer:" is one
    line, and what follows is the document continued)."""

    stops: tuple[str, ...] = ()
    one_line: bool = False
    stopped: str | None = None       # why the filter ended the answer (None: the model ended it)
    kind: str | None = None          # the same by name: stop-string, end-of-line, loop-guard
    loop: bool = False               # the stop was the loop guard
    _held: str = ""                  # decided-later text, not shown yet
    _started: bool = False
    _line: str = ""                  # the current line as shown so far plus held
    _lines: Counter = field(default_factory=Counter)
    _words: list = field(default_factory=list)
    _ngrams: Counter = field(default_factory=Counter)

    def feed(self, piece: str) -> str:
        """The part of the text so far that may be shown now ("" once the answer has ended)."""
        if self.stopped is not None:
            return ""
        text, self._held = self._held + piece, ""
        cut = min((text.find(s) for s in self.stops if s in text), default=-1)
        if cut >= 0:
            stop = next(s for s in self.stops if text.find(s) == cut)
            self.stopped, self.kind = f"the stop string {stop!r}", "stop-string"
            return self._show(text[:cut].rstrip(), final=True)
        if self.one_line:  # a line break after the answer's first visible character ends it
            start = 0 if self._started else len(text) - len(text.lstrip())
            nl = text.find("\n", start)
            if nl >= 0:
                self.stopped, self.kind = "the end of the answer's line", "end-of-line"
                return self._show(text[:nl].rstrip(), final=True)
        # hold the possible start of a stop string and trailing whitespace (both may still vanish), and a
        # line that so far is a copy of one the loop guard would stop at (it must not show in part)
        keep = max(_partial_stop(text, self.stops), len(text) - len(text.rstrip()))
        out, self._held = text[:len(text) - keep], text[len(text) - keep:]
        # and the last word, unfinished until whitespace follows (the loop guard counts whole words)
        word = re.search(r"\S*$", out).group()
        out, self._held = out[:len(out) - len(word)], word + self._held
        tail = out.rsplit("\n", 1)[-1]
        if tail and self._may_repeat(self._line + out if "\n" not in out else tail):
            out, self._held = out[:len(out) - len(tail)], tail + self._held
        return self._show(out, final=False)

    def finish(self) -> str:
        """What is still held when the model stops on its own (trailing whitespace dropped)."""
        if self.stopped is not None:
            return ""
        rest, self._held = self._held.rstrip(), ""
        return self._show(rest, final=True)

    def _show(self, text: str, final: bool) -> str:
        """Text decided for showing: leading whitespace of the answer dropped, then the loop guard."""
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        return self._release(text, final)

    # -- the loop guard -----------------------------------------------------------------------------

    def _release(self, text: str, final: bool) -> str:
        """Show `text` unless it completes a line seen LINE_REPEATS - 1 times already, or a word run seen
        NGRAM_REPEATS - 1 times; then the answer ends before that line (or run) and `loop` is set."""
        shown = []
        for part in text.splitlines(keepends=True):
            line = self._line + part
            if part.endswith("\n") or final:
                key = line.strip()
                if len(key) >= MIN_LOOP_LINE:
                    self._lines[key] += 1
                    if self._lines[key] >= LINE_REPEATS:
                        self._loop(f"a line repeated {LINE_REPEATS} times ({key[:40]!r})")
                        break
                self._line = "" if part.endswith("\n") else line
            else:
                self._line = line
            cut = self._ngram_cut(part)
            if cut is not None:
                self._loop(f"a run of {NGRAM_WORDS} words repeated {NGRAM_REPEATS} times")
                shown.append(part[:cut].rstrip())
                break
            shown.append(part)
        return "".join(shown)

    def _may_repeat(self, line: str) -> bool:
        """Whether this unfinished line could still become a copy the loop guard stops at."""
        start = line.lstrip()
        return bool(start) and any(n >= LINE_REPEATS - 1 and key.startswith(start) for key, n in self._lines.items())

    def _ngram_cut(self, part: str) -> int | None:
        """Where in `part` the word that completes a looping run starts (None: no loop). Words arrive
        whole: feed holds an unfinished last word."""
        for m in re.finditer(r"\S+", part):
            self._words.append(m.group())
            if len(self._words) >= NGRAM_WORDS:
                gram = tuple(self._words[-NGRAM_WORDS:])
                self._ngrams[gram] += 1
                if self._ngrams[gram] >= NGRAM_REPEATS:
                    return m.start()
        return None

    def _loop(self, why: str) -> None:
        self.stopped, self.loop, self.kind = f"the loop guard: {why}", True, "loop-guard"

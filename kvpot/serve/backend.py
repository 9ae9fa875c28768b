"""The model side of `kvpot serve`: documents read once into saved contexts, one session open at a time,
one answer at a time. Nothing here knows about HTTP (kvpot.serve.app) or terminals (cli/serve.py).

Each document is a context file under $KVPOT_HOME/serve, reopened with `resettable` so its read state stays
in the file and is restored from there before every request: a request's conversation never changes what
the next request sees, and memory stays one pot however many requests come. Only one session (one model,
one context) is open: a request for another document closes it and reopens that document's context. The
plain model (no document) answers in the open session's engine, emptied first.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvpot.api.focusing import find_passages, open_focused
from kvpot.errors import KvpotError
from kvpot.paths import home
from kvpot.session.answer import AnswerText
from kvpot.session.locating import locator_for
from kvpot.session.sampling import DEFAULT_TOP_P, Sampler
from kvpot.session.settings import reads_in_full

from .conversation import BadRequest, after_document, parse_messages, without_document

DOCUMENT_PREFIX = "kvpot:"


def contexts_dir() -> Path:
    return home() / "serve"


def _stat_key(path: Path) -> list:
    """What says a document changed: the resolved path, and size and mtime of it (a file) or of every
    file under it (a folder)."""
    path = path.resolve()
    if path.is_dir():
        out = []
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                p = Path(root, name)
                try:
                    st = p.stat()
                except OSError:
                    continue
                out.append([str(p.relative_to(path)), st.st_size, st.st_mtime_ns])
        return [str(path), out]
    st = path.stat()
    return [str(path), st.st_size, st.st_mtime_ns]


def context_path(name: str, document: Path, model_path: Path, read_options: dict) -> Path:
    """The saved context of `document` read by this model with these options: the file name holds the
    document's name and a hash of its path, size and mtime, the model file's path, size and mtime, and the
    options that change what is read, so a changed input or model reads again and an unchanged one reopens."""
    mst = model_path.stat()
    key = json.dumps({"document": _stat_key(document), "model": [str(model_path.resolve()), mst.st_size,
                                                                   mst.st_mtime_ns], "options": read_options},
                     sort_keys=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64]
    return contexts_dir() / f"{safe}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.kvctx"


@dataclass
class Params:
    """The request's sampling fields kvpot has (OpenAI's names)."""

    max_tokens: int | None = None
    temperature: float = 0.0      # greedy unless asked: the same answer every time, as `kvpot ask`
    top_p: float = DEFAULT_TOP_P
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def sampler(self) -> Sampler | None:
        if self.temperature <= 0:
            return None  # greedy: the engine's own argmax, as Session.ask without a sampler
        return Sampler(temp=self.temperature, top_p=self.top_p, seed=self.seed)


@dataclass
class Result:
    """How an answer ended, filled in as it streams."""

    prompt_tokens: int = 0       # the document's tokens (as read) plus the conversation's
    completion_tokens: int = 0
    finish_reason: str = "stop"  # "length": max_tokens or the context's room ended it
    cancelled: bool = False


@dataclass
class Document:
    name: str
    source: str       # the path as given
    context: Path     # its saved context
    tokens: int = 0   # document tokens read


@dataclass
class Backend:
    """`open_context(path)`: a Session reopened from a saved context, resettable (cli/_session.reopen_session)."""

    model_id: str
    documents: dict[str, Document]
    open_context: Callable[[Path], object]
    session: object | None = None
    open_doc: str | None = None
    dirty: bool = False          # the open session's engine holds more than its document
    log: Callable[[str], None] = lambda line: None
    _busy: threading.Lock = field(default_factory=threading.Lock)

    def model_ids(self) -> list[str]:
        return [self.model_id] + [DOCUMENT_PREFIX + name for name in self.documents]

    def target(self, model: str) -> str | None:
        """The document a model id names (None: the plain model); KeyError for an unknown id."""
        if model == self.model_id:
            return None
        if model.startswith(DOCUMENT_PREFIX) and model[len(DOCUMENT_PREFIX):] in self.documents:
            return model[len(DOCUMENT_PREFIX):]
        raise KeyError(model)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def _session_for(self, doc: str | None):
        """The open session, holding `doc`'s read state (None: emptied for the plain model)."""
        if doc is not None and doc != self.open_doc:
            self.close()
            self.open_doc, self.dirty = None, False
            self.log(f"switching to document {doc}: reopening {self.documents[doc].context}")
            self.session = self.open_context(self.documents[doc].context)
            self.open_doc = doc
        if self.session is None:  # no document open yet: the first one's engine serves the plain model too
            first = next(iter(self.documents))
            self.session = self.open_context(self.documents[first].context)
            self.open_doc, self.dirty = first, False
        s = self.session
        if doc is None:
            s.engine.reset()
            self.dirty = True
        elif self.dirty:
            s.reset_conversation()  # the document's state, restored from its context file
            self.dirty = False
        return s

    def answer(self, model: str, messages, params: Params, cancel: threading.Event, result: Result) -> Iterator[str]:
        """Stream the answer's text; `result` says how it ended once the iterator is done. Stops at the next
        piece once `cancel` is set. Raises BadRequest for a conversation that cannot be answered."""
        doc = self.target(model)
        conv = parse_messages(messages)
        sampler = params.sampler()
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("Backend.answer runs one request at a time")  # the app queues them
        try:
            yield from self._answer(doc, conv, params, sampler, cancel, result)
        finally:
            self._busy.release()

    def _answer(self, doc, conv, params, sampler, cancel, result) -> Iterator[str]:
        s = self._session_for(doc)
        focus = self._focus(s, conv) if doc is not None else None
        if focus is not None:  # the passages read again with full attention answer, as `kvpot chat` past the pot
            text = focus.text
            s.suspend()  # the pot's model and cache freed while the focused session runs: one model in memory
            try:
                with open_focused(focus, s.facts, s.model_name) as f:
                    f.read(text)
                    self.log(f"focused read of {len(text.windows)} passages ({f.doc_tokens:,} tokens) for "
                             f"{DOCUMENT_PREFIX + doc}")
                    yield from self._stream(f, after_document(f.format, conv), f.doc_tokens, doc, params, sampler,
                                            cancel, result)
            finally:
                s.resume()
            return
        eng, fmt = s.engine, s.format
        self.dirty = True  # from here on the engine holds this request's turn
        if doc is None:
            template = eng.model.chat_template()
            render = (lambda msgs, add: eng.model.apply_template(template, msgs, add)) if template else None
            segs = without_document(fmt, conv, render)
        else:
            segs = after_document(fmt, conv)
        yield from self._stream(s, segs, s.doc_tokens if doc is not None else 0, doc, params, sampler, cancel, result)

    def _focus(self, s, conv):
        """The focused read (kvpot.api.focusing.Focus) for the conversation's last question, or None where the pot
        answers (kvpot.api.focusing.find_passages; said in the server's log), or where the locator needs the
        pot's own answer (`--locator pot`). The conversation before the last question is read after the
        passages, so its tokens are counted in the focused read's room."""
        if locator_for(s)[0] == "pot":
            return None
        question = conv.turns[-1][1]
        tokens = lambda segs: sum(len(s.engine.model.tokenize(g.text, special=g.special)) for g in segs)  # noqa: E731
        extra = max(0, tokens(after_document(s.format, conv)) - tokens(s.format.first_question(question)))
        found = find_passages(s, question, extra_tokens=extra, notice=lambda kind, text: self.log(
            f"the pot answers: {text}" if kind == "pot" else text))
        return found

    def _stream(self, s, segs, doc_tokens: int, doc, params, sampler, cancel, result) -> Iterator[str]:
        """Prompt `s` with `segs` and stream the answer's text (stopping at `cancel`), `result` filled in."""
        eng, fmt = s.engine, s.format
        toks: list[int] = []
        for seg in segs:
            toks += eng.model.tokenize(seg.text, special=seg.special)
        max_tokens = params.max_tokens or s.settings.max_tokens
        result.prompt_tokens = doc_tokens + len(toks)
        if reads_in_full(s.policy_spec):
            # full attention keeps every cell: a long conversation makes room as chat's turns do
            eng.make_room(len(toks) + max_tokens)
        t0 = time.perf_counter()
        logits = eng.prompt(toks)
        text = AnswerText(stops=fmt.stop + tuple(params.stop), one_line=fmt.name == "completion")
        chosen = 0

        def pick(logits: np.ndarray, recent: list[int]) -> int:
            nonlocal chosen
            chosen += 1
            return int(np.argmax(logits)) if sampler is None else sampler.pick(logits, recent)

        ended_by_text = False
        for piece in eng.generate(logits, max_tokens, pick):
            shown = text.feed(piece)
            if shown:
                yield shown
            if text.stopped is not None:
                ended_by_text = True
                break
            if cancel.is_set():
                result.cancelled = True
                break
        if not result.cancelled:
            shown = text.finish()
            if shown:
                yield shown
        reason = eng.stop_reason
        eog = reason.startswith("end-of-generation")
        result.completion_tokens = chosen - (1 if eog and not ended_by_text else 0)
        result.finish_reason = "stop" if (eog or ended_by_text) else "length"
        self.log(f"answered {DOCUMENT_PREFIX + doc if doc else self.model_id}: {result.prompt_tokens:,} prompt tokens, "
                 f"{result.completion_tokens:,} answer tokens in {time.perf_counter() - t0:.1f}s"
                 + (" (cancelled: the client went away)" if result.cancelled else f", {result.finish_reason}"))


def check_params(body: dict, default_max: int) -> Params:
    """The request's sampling fields, checked (BadRequest names the field)."""
    def number(name: str, lo: float, hi: float, default, integer: bool = False, lo_open: bool = False):
        v = body.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            raise BadRequest(f"{name} must be {'an integer' if integer else 'a number'}", name)
        if not (lo < v if lo_open else lo <= v) or v > hi or v != v:
            raise BadRequest(f"{name} must be in {'(' if lo_open else '['}{lo}, {hi}], got {v}", name)
        return v

    if body.get("n", 1) != 1:
        raise BadRequest("n must be 1 (one answer per request)", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest("max_tokens must be a positive integer", "max_tokens")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise BadRequest("stop must be a string or a list of strings", "stop")
    if any(not s for s in stops):
        raise BadRequest("stop strings must not be empty", "stop")
    return Params(max_tokens=max_tokens if max_tokens is not None else default_max,
                  temperature=float(number("temperature", 0, 2, 0.0)),
                  top_p=float(number("top_p", 0, 1, DEFAULT_TOP_P, lo_open=True)),
                  seed=number("seed", 0, 2**32 - 1, None, integer=True), stop=stops)


def describe_error(e: BaseException) -> str:
    return str(e) if isinstance(e, (KvpotError, BadRequest)) else f"{type(e).__name__}: {e}"

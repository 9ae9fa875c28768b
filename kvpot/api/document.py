"""The Python front door: a `Model` reads inputs into a `Document`, which answers questions (`ask`, `chat`),
is saved and reopened. The layer under it is kvpot.session.Session (a Document's `session`), as llama.cpp's
raw API is under llama-cpp-python's `Llama`; the reading is planned by kvpot.api.plan, as `kvpot ask` plans it.

    model = kvpot.Model("qwen2.5-coder-0.5b")
    doc = model.read(["notes/", "log.txt"], budget=4096, policy="infinipot")
    print(doc.ask("Which port does the server use?").text)
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

from kvpot.api.answering import Answer, R, answer_in, check_question, past_the_pot
from kvpot.api.focusing import Focus, Locating, Notice, Working, never_stopped, no_status, quiet
from kvpot.api.plan import Plan, check_locator, plan_read, reopen
from kvpot.errors import KvpotError
from kvpot.ingest import SourceSet
from kvpot.ingest.sources import STDIN
from kvpot.models.resolve import resolve_model
from kvpot.session.default_model import default_model
from kvpot.session.locating import locator_for
from kvpot.session.sampling import Sampler
from kvpot.session.session import ReadProgress, Session

Progress = Callable[[int, "int | None"], object]  # (tokens read, the input's tokens: counted, else estimated)


class _Utf8:
    """A text stream read as the binary stream an input is (UTF-8)."""

    def __init__(self, text: io.TextIOBase):
        self.text = text

    def read(self, n: int = -1) -> bytes:
        return self.text.read(n).encode("utf-8", "replace")


def _inputs(inputs) -> tuple[list[str], object]:
    """The inputs as paths ("~" expanded, as a shell does), and the stream one of them is (None: none is): a
    path, a list of paths, or a text or binary stream (a file object, io.StringIO)."""
    if hasattr(inputs, "read"):
        return [STDIN], inputs if isinstance(inputs.read(0), bytes) else _Utf8(inputs)
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    try:
        paths = [os.path.expanduser(os.fspath(p)) for p in inputs]
    except TypeError:
        raise KvpotError("inputs are paths (files, folders) or one text stream") from None
    return paths, None


def _read(session: Session, sources: SourceSet, progress: Progress | None) -> None:
    """Read the sources into the session, `progress` told (tokens read, total) after each chunk and, last,
    (tokens, tokens) once the whole input is read."""
    counted = session.counted
    exact = counted.tokens if counted is not None and counted.complete else None

    def on_chunk(p: ReadProgress) -> None:
        total = exact or p.est_total
        progress(p.tokens, None if total is None else max(total, p.tokens))

    session.read(sources, on_chunk if progress is not None else lambda p: None)
    if progress is not None:
        progress(session.doc_tokens, session.doc_tokens)


class Document:
    """A read input: `ask` answers a question as `kvpot ask` does, `chat` as a turn of `kvpot chat` (the
    conversation kept); `save` writes the context to reopen later (`Document.open`) without reading again.
    Close it (or use `with`) to free the model and the pot."""

    def __init__(self, session: Session, plan: Plan | None = None):
        self.session = session
        self.plan = plan  # how it was read (None: reopened from a file, or read where the plan is not kept)
        self.history: list[tuple[str, str]] = []

    @classmethod
    def open(cls, path: str | os.PathLike, model: Model | str | None = None, *, threads: int | None = None,
             max_tokens: int | None = None) -> Document:
        """A saved context reopened with the model it names (or `model`); checked before the model loads."""
        spec = model.spec if isinstance(model, Model) else model
        return cls(reopen(os.fspath(path), spec, threads, max_tokens, resettable=False))

    @property
    def tokens(self) -> int:
        """The input's tokens read."""
        return self.session.doc_tokens

    @property
    def budget(self) -> int:
        return self.session.settings.budget

    @property
    def policy(self) -> str:
        return self.session.policy_spec

    def ask(self, question: str, *, max_tokens: int | None = None, sampler: Sampler | None = None,
            stop: tuple[str, ...] = (), sources: bool = False, locator: str | None = None, focus: bool = True,
            on_text: Callable[[str], object] | None = None, progress: Progress | None = None) -> Answer:
        """Answer one question as `kvpot ask` does: past what the pot kept, from the passages its own answer
        locates (`locator`: another of RunSettings' locators), read again with full attention (`focus`); else
        from the pot. Greedy unless `sampler`; `stop`: texts that end the answer; `on_text` hears the answer
        as it comes; `progress` the focused read's."""
        return self._ask(question, max_tokens, sampler, stop, sources, locator, focus, on_text, progress, keep=True)

    def _ask(self, question, max_tokens, sampler, stop, sources, locator, focus, on_text, progress, keep: bool):
        """`ask`; `keep` False: it answers once: the pot's session is closed, not suspended, before a focused
        read, and closed in any case when this returns."""
        check_question(question)
        how = check_locator(locator) if locator is not None else "pot"
        answer = self._answerer(question, max_tokens, sampler, stop, sources, on_text)
        if not focus:
            try:
                return answer(self.session, None)
            finally:
                if not keep:
                    self.session.close()
        return past_the_pot(self.session, question, answer, lambda s, text: _read(s, text, progress), locator=how,
                            keep=keep)

    def chat(self, question: str, *, max_tokens: int | None = None, sampler: Sampler | None = None,
             stop: tuple[str, ...] = (), sources: bool = False, on_text: Callable[[str], object] | None = None,
             progress: Progress | None = None) -> Answer:
        """One turn of a conversation, as `kvpot chat` answers it: past what the pot kept, the session's
        locator finds the passages, read again with the conversation so far after them; the exchange stays."""
        check_question(question)
        return self.turn(question, self._answerer(question, max_tokens, sampler, stop, sources, on_text),
                         read=lambda s, text: _read(s, text, progress))

    def turn(self, question: str, answer: Callable[[Session, Focus | None], R],
             read: Callable[[Session, SourceSet], object] | None = None, notice: Notice = quiet,
             working: Working = no_status, locating: Locating = never_stopped) -> R:
        """One turn of the conversation (`chat`), answered by the caller's own `answer(session, found)`: in the
        pot's session (`found` None) where the session's locator is the pot (its locating answer would stay in
        the conversation) or nothing needs reading again, else in the session that read the question's
        passages (`read(session, text)`; default: no progress) with the conversation so far after them
        (kvpot.api.answering.past_the_pot). What `answer` returns has the answer's `text`, which the
        conversation keeps. `notice`, `working`, `locating`: what is said and shown meanwhile (kvpot.api.focusing;
        `kvpot chat` passes the terminal's)."""
        if locator_for(self.session)[0] == "pot":
            said = answer(self.session, None)
        else:
            said = past_the_pot(self.session, question, answer, read or (lambda s, text: _read(s, text, None)),
                                history=list(self.history), notice=notice, working=working, locating=locating)
        self.history.append((question, said.text))
        return said

    def _answerer(self, question, max_tokens, sampler, stop, sources, on_text):
        def answer(session: Session, found) -> Answer:
            said = answer_in(session, question, sampler, tuple(stop), max_tokens, sources, on_text)
            if found is None:
                return said
            windows = [{"source": w.source, "where": w.where, "start": w.start, "end": w.end}
                       for w in found.text.windows]
            return Answer(said.text, said.sources, said.stop_reason, said.seconds, said.tokens,
                          {"passages": windows, "located": found.passages, "tokens_read": session.doc_tokens})
        return answer

    def reset(self) -> None:
        """Forget the conversation, keep the document (a document read without a question keeps a copy)."""
        self.session.reset_conversation()
        self.history = []

    def save(self, path: str | os.PathLike) -> int:
        """Write the context to `path` (bytes written); a stopped read saved this way can be read on."""
        return self.session.save(Path(path))

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Document:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Model:
    """A model to read with: a registry name (`kvpot models`) or a GGUF file's path; None: the most capable
    downloaded model this device holds, as `kvpot ask` chooses it. The file is checked here; it loads when
    a document is read."""

    def __init__(self, model: str | os.PathLike | None = None):
        if model is None:
            model = default_model()
        self.spec = os.fspath(model)
        self.facts, known = resolve_model(self.spec)
        self.name = known.name if known else self.facts.name

    def plan(self, inputs, question: str | None = None, *, glob=("*",), exclude=(), save_to=None,
             focus: bool = True, notice: Callable[[str], object] = lambda msg: None, **settings) -> Plan:
        """The reading of `inputs`, every setting decided and checked, nothing loaded (kvpot.api.plan)."""
        paths, stream = _inputs(inputs)
        if question is not None:
            check_question(question)
        return plan_read(paths, self.spec, question, glob=glob, exclude=exclude, save_to=save_to, focus=focus,
                         notice=notice, stdin=stream, **settings)

    def read(self, inputs, question: str | None = None, *, budget: int | str | None = None,
             policy: str | None = None, progress: Progress | None = None, glob=("*",), exclude=(),
             focus: bool = True, notice: Callable[[str], object] = lambda msg: None, **settings) -> Document:
        """Read `inputs` (a path, a list of files and folders, or a text stream) into a Document.
        `question`: known before reading, it steers what the pot keeps, as `kvpot ask` reads. `budget`:
        cells kept per layer and KV head, or "auto" (what the device holds: the default); `policy`: a
        policy spec (docs/methods.md); `settings`: the rest of RunSettings (chunk, threads, prompt,
        max_tokens, flash_attn, question_before, locator); `progress(tokens read, total)` after each step."""
        plan = self.plan(inputs, question, glob=glob, exclude=exclude, focus=focus, notice=notice,
                         budget=budget, policy=policy, **settings)
        session = plan.open()
        try:
            _read(session, plan.sources, progress)
        except BaseException:
            session.close()
            raise
        return Document(session, plan)

    def ask(self, inputs, question: str, **kwargs) -> Answer:
        """Read `inputs` with the question known and answer it, as `kvpot FILE... QUESTION` does; the model
        is freed before returning. Takes read's and Document.ask's keywords."""
        asking = {k: kwargs.pop(k, None) for k in ("sampler", "stop", "sources", "on_text")}
        doc = self.read(inputs, question, **kwargs)
        return doc._ask(question, kwargs.get("max_tokens"), asking["sampler"], asking["stop"] or (),
                            bool(asking["sources"]), kwargs.get("locator"), kwargs.get("focus", True),
                            asking["on_text"], kwargs.get("progress"), keep=False)

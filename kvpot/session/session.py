"""A document session: read sources into the pot, answer questions in turns, save and reopen.

This is what `kvpot ask` and `kvpot chat` drive; it knows nothing about terminals.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from kvpot.engine import Engine, EngineConfig, FeedEvent
from kvpot.errors import KvpotError
from kvpot.ingest import IncrementalTokenizer, SourceSet
from kvpot.locator.keys import DEFAULT_BLOCK, uses_keys
from kvpot.locator.sources import SourceMap, top_passages
from kvpot.models.gguf_file import ModelFacts
from kvpot.models.model_hash import model_sha256
from kvpot.policies import ExternalMemory, Policy, make_policy
from kvpot.runtime import abort, library
from kvpot.session.answer import AnswerText
from kvpot.session.checks import answer_reserve
from kvpot.session.context_file import FORMAT_NAME, SavedContext, read_context, write_context
from kvpot.session.prompting import Segment, choose_format
from kvpot.session.sampling import Sampler
from kvpot.session.settings import RunSettings, option_name, reads_in_full, setting_problem
from kvpot.state.engine_state import EngineState
from kvpot.state.read_point import PieceLog, ReadPoint, ReadStopped, resumable_sources, text_after
from kvpot.version import __version__
from kvpot.wording import plural

# a folder: each answer's first-token logits are saved there as turn-N.npy (docs/formats.md)
SAVE_LOGITS_ENV = "KVPOT_SAVE_LOGITS"
# assumed bytes per token before any text has been tokenized
BYTES_PER_TOKEN_GUESS = 4.0


class ReadingStopped(Exception):
    """Raised from a progress callback to stop reading; what was read so far stays in the pot."""


@dataclass
class ReadProgress:
    tokens: int              # tokens read so far (document only)
    est_total: int | None    # estimated tokens in the whole input (None: unknown, e.g. stdin)
    cells: int               # cells in the pot
    capacity: int            # cells the context holds
    compactions: int
    bytes_read: int
    replaced: int            # invalid UTF-8 sequences replaced so far


@dataclass
class _ReadStart:
    """Where a read begins (Session._new_read, Session._continued_read)."""
    text: Iterator[str]          # the text still to read, piece by piece
    log: PieceLog                # the tokenized pieces, for a read point if the read stops
    at: int                      # the stream position of the first token the text yields
    opening: list[Segment]       # read before the text (the document's opening)
    chars: int                   # the character offset of the text's start in the joined sources
    bytes_before: int            # the UTF-8 size of the joined sources' text before it
    start_tokens: int            # the stream position where the document's tokens are counted from
    expected: int | None         # the input's length told to the policy (None: keep the one it has)


class Session:
    def __init__(self, facts: ModelFacts, model_name: str, settings: RunSettings, n_ctx: int | None = None,
                 policy: Policy | None = None, resettable: bool = True):
        """`policy`: the one `settings.policy` names, already built (and fitted: the engine's fit then
        does nothing) by the checks before the model loaded; without one it is built here.
        `resettable`: keep a copy of the state right after reading, for `reset_conversation` (chat's
        /reset). The copy is as large as the pot's cells, so a session that answers once (`kvpot ask`)
        keeps none: its memory stays what `--budget auto` planned."""
        self.facts = facts
        self.model_name = model_name
        self.settings = settings
        self.policy_spec = settings.policy  # sized by --budget and --chunk (Policy.fit)
        reserve = answer_reserve(settings)
        if policy is None:
            policy = make_policy(self.policy_spec)
        self.engine = Engine(str(facts.path), policy, EngineConfig(
            budget=settings.budget, chunk=settings.chunk, n_threads=settings.threads, answer_reserve=reserve,
            n_ctx=n_ctx, flash_attn=settings.flash_attn == "on",  # "auto" is resolved by the reading plan
            # the read-once locator's keys, where the pot may leave input out and questions locate by them
            locator_block=DEFAULT_BLOCK if uses_keys(settings.locator) and not reads_in_full(self.policy_spec) else 0))
        self.format = choose_format(self.engine.model, settings.prompt)
        self.sources: list[dict] = []
        self.source_set: SourceSet | None = None  # what read() read (None for a reopened context)
        self.source_map = SourceMap()  # stream position -> place in the inputs (--sources), saved with contexts
        self.doc_tokens = 0
        self.turns = 0
        self.conversation_dropped = 0  # cells the last turn dropped to fit (full attention, see ask)
        self.read_seconds = 0.0
        self.read_here = 0  # document tokens this process read (a continued read's are not all of them)
        # the input's tokens as counted before reading (kvpot.session.reading_plan), for the progress's total
        self.counted = None
        self.resettable = resettable
        self._after_reading: EngineState | None = None
        # each turn since the read as decoded (its prompt's tokens, its answer's), and whether decoding them
        # again from _after_reading gives the same cells (no compaction, drop or long turn read through the
        # pot since): what answer_sources replays
        self._turn_log: list[tuple[list[int], list[int]]] = []
        self._replayable = True
        self._question: str | None = None  # set_question's, put before the document where puts_question_before()
        self._suspended: EngineState | None = None  # the pot's state while suspended (suspend/resume)
        # where a stopped read goes on (None: read to its end, or stopped where it cannot go on)
        self.read_point: ReadPoint | None = None
        # how much of the input a read that stopped early had read (None: read to its end), kept whether or
        # not it can go on (a stream cannot): a reopened context says so
        self.read_stopped: ReadStopped | None = None

    def close(self) -> None:
        if self._suspended is not None:  # the model and context are freed already; the policy forgets the document
            self._suspended = None
            self.engine.policy.reset()
            return
        self.engine.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set_max_tokens(self, max_tokens: int) -> None:
        """A reopened context may answer at another length (the answer reserve limits it anyway)."""
        problem = setting_problem("max_tokens", max_tokens)  # the rest was checked as the session began
        if problem:
            raise KvpotError(f"{option_name('max_tokens')} {problem}")
        self.settings = replace(self.settings, max_tokens=max_tokens)

    # -- reading ---------------------------------------------------------------------------------

    def set_question(self, question: str) -> None:
        """The question, known before reading, becomes InfiniPot's catalyst (CaP-Q), and is put before
        the document too where puts_question_before() says so."""
        self.engine.set_question(question)
        self._question = question

    def puts_question_before(self) -> bool:
        """settings.question_before (docs/benchmarks.md, "The question before the document")."""
        return self.settings.question_before == "on"

    def read(self, sources: SourceSet, on_progress: Callable[[ReadProgress], None] = lambda p: None,
             resume: ReadPoint | None = None) -> None:
        """Stream the sources into the pot. A ReadingStopped from on_progress ends reading early;
        it propagates after the session is left consistent (keep it with `finish_reading`), with
        `read_point` set where the rest can be read later. A signal that stops a chunk's decode (the CLI
        watches signals: kvpot.runtime.abort) ends it the same way, without that chunk, as a ReadingStopped.

        `resume`: a reopened context's point (its `read_point`): the sources are the ones it was reading,
        the text before the point is checked against what was read, and the tokens after it are read as
        the stopped read would have read them, in the same chunks."""
        eng = self.engine
        start = self._new_read(sources) if resume is None else self._continued_read(sources, resume)
        self.source_set = sources
        total_bytes = sources.text_bytes  # a compressed file's text size where its format says it, else unknown
        text, log, opening, at = start.text, start.log, start.opening, start.at
        names = resumable_sources(sources)
        tok = IncrementalTokenizer(log.tokenize)
        tok.chars = start.chars  # the source map's character offsets

        def pieces() -> Iterator[list[int]]:
            nonlocal at
            for seg in opening:
                toks = eng.model.tokenize(seg.text, special=seg.special)
                at += len(toks)
                yield toks
            done = tok.chars
            for toks in tok.stream(text):
                log.piece_read(at, toks)
                self.source_map.add(at, done, tok.chars - done, toks, eng.model.piece, text=log.last_text)
                self.source_map.marks = sources.marks
                first, at, done = at, at + len(toks), tok.chars
                if resume is not None and first == resume.pos:
                    # the piece the read stopped in, tokenized again whole: its first tokens are in the pot
                    resume.check_skipped(toks)
                    toks = toks[resume.skip:]
                yield toks

        est = None

        def on_chunk(ev: FeedEvent) -> None:
            nonlocal est
            self.doc_tokens = ev.tokens_read - start.start_tokens
            est = None
            if total_bytes:
                # the tokens tokenized so far (the reader runs a piece ahead of the pot) and the rest at
                # their bytes per token. A continued read knows the tokens before its point and measures
                # the rate after it only: scaling the whole input by that rate is wrong wherever the text
                # changes (prose takes ~4 bytes a token, numbers and code far fewer)
                per = tok.bytes / tok.tokens if tok.tokens else BYTES_PER_TOKEN_GUESS
                left = max(0, total_bytes - start.bytes_before - tok.bytes)
                est = max(self.doc_tokens, at - start.start_tokens + int(left / max(per, 0.5)))
            on_progress(ReadProgress(self.doc_tokens, est, ev.cells, eng.ctx.n_ctx, ev.stats.n_compactions,
                                     sources.bytes_read, sources.replaced))

        t0, seen0 = time.perf_counter(), eng.tokens_seen
        stopped = False
        try:
            eng.feed_stream(pieces(), expected=start.expected, on_chunk=on_chunk, abortable=True)
            self.read_point = self.read_stopped = None  # read to its end
        except (ReadingStopped, abort.Interrupted) as e:
            stopped = True
            self.read_point = None if names is None else log.point(eng.tokens_seen, names)
            if isinstance(e, abort.Interrupted):
                raise ReadingStopped(str(e)) from None
            raise
        finally:
            self.read_seconds += time.perf_counter() - t0
            self.read_here += eng.tokens_seen - seen0
            self.doc_tokens = eng.tokens_seen - start.start_tokens
            if stopped:
                self.read_stopped = ReadStopped(self.doc_tokens, est, sources.bytes_read,
                                                total_bytes, names is None)
        if self.doc_tokens <= len(eng.model.bos()):
            raise KvpotError("the input holds no text")
        self.finish_reading()

    def _new_read(self, sources: SourceSet) -> _ReadStart:
        """A read from the sources' first byte: the document's opening (and the question, where it goes
        first) before the text, and the input's length told to the policy as a guess from its bytes."""
        eng = self.engine
        self.sources = [{"name": s.name, "size": s.size} for s in sources.sources]
        before = self._question if self._question and self.puts_question_before() else None
        # what the document was read with, as a saved context's header records it
        self.settings = replace(self.settings, question_before="on" if before else "off")
        total = sources.text_bytes  # a compressed file's text size where its format says it, else unknown
        return _ReadStart(
            text=sources.pieces(), log=PieceLog(eng.model.tokenize),
            # the stream position of the first token pieces() yields (the engine puts the BOS before it)
            at=eng.tokens_seen + (0 if eng._bos_done else len(eng.model.bos())),
            opening=self.format.document_open(before), chars=0, bytes_before=0, start_tokens=eng.tokens_seen,
            expected=int(total / BYTES_PER_TOKEN_GUESS) if total else None)

    def _continued_read(self, sources: SourceSet, resume: ReadPoint) -> _ReadStart:
        """A stopped read going on: the text after its point (the text before it checked against what
        was read), no opening, and no length told, since the policy keeps the one told when the read
        began (saved with it)."""
        eng = self.engine
        if eng.tokens_seen != resume.next_position:
            raise KvpotError(f"the context's next position {eng.tokens_seen} is not its read point's "
                             f"{resume.next_position}")
        text, digest, size = text_after(sources, resume)
        self.source_map.truncate(resume.pos, resume.char)
        return _ReadStart(text=text, log=PieceLog(eng.model.tokenize, resume.char, digest), at=resume.pos,
                          opening=[], chars=resume.char, bytes_before=size,
                          start_tokens=eng.tokens_seen - self.doc_tokens,
                          expected=None)

    def finish_reading(self) -> None:
        """Mark the document as read (also after an interrupted read the user chose to keep)."""
        self._after_reading = self.engine.export_state() if self.resettable else None
        self._turn_log, self._replayable = [], True

    # -- asking ----------------------------------------------------------------------------------

    def _tokens(self, segments: list[Segment]) -> list[int]:
        out: list[int] = []
        for seg in segments:
            out += self.engine.model.tokenize(seg.text, special=seg.special)
        return out

    def ask(self, question: str, max_tokens: int | None = None,
            on_progress: Callable[[ReadProgress], None] | None = None,
            sampler: Sampler | None = None, stop: tuple[str, ...] = ()) -> Iterator[str]:
        """Stream the answer to a question; the exchange stays in the pot for the next turn.
        `sampler`: how each token is chosen (greedy without one); `stop`: strings that also end the answer.

        `on_progress`: called as a question too long for the free cells is read through the pot,
        chunk by chunk (first with 0 tokens read, before the first chunk); never for a short one."""
        if not question.strip():
            raise KvpotError("the question is empty")
        segs = self.format.first_question(question) if self.turns == 0 else self.format.follow_up(question)
        toks = self._tokens(segs)
        eng = self.engine
        self.conversation_dropped = 0
        if self.turns and reads_in_full(self.policy_spec):
            # full attention keeps every token, so a conversation fills its context: rather than cut
            # the answer (and leave none for the next question), the oldest turns make way, StreamingLLM-style
            self.conversation_dropped = eng.make_room(len(toks) + (max_tokens or self.settings.max_tokens))
        on_chunk = None
        if on_progress is not None and eng.prompt_is_read(len(toks)):
            start, total = eng.tokens_seen, len(toks)

            def progress(tokens: int, cells: int, compactions: int) -> None:
                on_progress(ReadProgress(tokens, total, cells, eng.ctx.n_ctx, compactions, 0, 0))

            def on_chunk(ev: FeedEvent) -> None:
                progress(ev.tokens_read - start, ev.cells, ev.stats.n_compactions)

            progress(0, eng.n_cells, eng.stats().n_compactions)
        before = eng.stats().n_compactions
        self._replayable = self._replayable and not self.conversation_dropped and not eng.prompt_is_read(len(toks))
        logits = eng.prompt(toks, on_chunk=on_chunk)
        if on_chunk is not None:  # the last token is decoded after the chunks: the question is read
            progress(len(toks), eng.n_cells, eng.stats().n_compactions)
        self.turns += 1
        if os.environ.get(SAVE_LOGITS_ENV):  # diagnostics: compare answers across processes
            np.save(Path(os.environ[SAVE_LOGITS_ENV]) / f"turn-{self.turns}.npy", logits)
        text = AnswerText(stops=self.format.stop + tuple(stop), one_line=self.format.name == "completion")
        self.answer_loop = False
        pick = None if sampler is None else sampler.pick
        answering = self.engine.generate(logits, max_tokens or self.settings.max_tokens, pick)
        try:
            for piece in answering:
                shown = text.feed(piece)
                if shown:
                    yield shown
                if text.stopped is not None:
                    break
        finally:
            if hasattr(answering, "close"):  # the answer's decoding ends here, however the caller stops reading
                answering.close()
            self._turn_log.append((toks, list(eng.answer_ids)))
            self._replayable = self._replayable and eng.stats().n_compactions == before
        shown = text.finish()
        if shown:
            yield shown
        if text.stopped is not None:
            self.engine.stop_reason, self.answer_loop = text.stopped, text.loop
            self.engine.stop_kind = text.kind

    def suspend(self) -> None:
        """Free the model and the pot's cache while another session runs (chat's focused read), the pot's state
        kept in memory; `resume` loads them again. Between the two the session answers nothing."""
        if self._suspended is None:
            self._suspended = self.engine.suspend()

    def resume(self) -> None:
        if self._suspended is not None:
            self.engine = Engine.resume(str(self.facts.path), self.engine, self._suspended)
            self._suspended = None

    def add_exchange(self, question: str, answer: str) -> None:
        """Put a question and its answer into the conversation as if the session itself had given it (chat's
        focused read gives it): the turn's tokens and the answer's are decoded after the pot, so a follow-up reads
        them (the locator's queries too) and a saved context keeps them."""
        if not question.strip():
            raise KvpotError("the question is empty")
        segs = self.format.first_question(question) if self.turns == 0 else self.format.follow_up(question)
        said = answer.strip()
        toks = self._tokens(segs + ([Segment(" " + said if self.format.name == "completion" else said)] if said else []))
        before = self.engine.stats().n_compactions
        self._replayable = self._replayable and not self.engine.prompt_is_read(len(toks))
        self.engine.prompt(toks)
        self._replayable = self._replayable and self.engine.stats().n_compactions == before
        self._turn_log.append((toks, []))
        self.turns += 1

    def reset_conversation(self) -> None:
        """Back to the moment the document was read (the conversation is forgotten)."""
        if self._after_reading is None:
            if not self.resettable and self.doc_tokens:
                raise KvpotError("a session that answers once (kvpot ask) keeps no copy of the read document to go back to")
            if self.turns:  # reopened from a context saved mid-conversation
                raise KvpotError(f"this context was saved after {plural(self.turns, 'turn')}; its conversation cannot be "
                                 "told apart from the document (save contexts before chatting to keep /reset)")
            raise KvpotError("nothing has been read yet")
        self.engine.import_state(self._after_reading)
        self.turns = 0
        self._turn_log, self._replayable = [], True

    def answer_sources(self) -> list | None:
        """The passages the last answer drew on, for an answer given without tracking (chat's /sources): the
        conversation decoded again from the state right after reading, the same tokens at the same positions,
        with the last answer's rows tapped (kvpot.locator.sources.top_passages ranks them, as --sources does).
        The state afterwards is the conversation's again. None where that cannot give the same cells: no copy
        of the read state (kvpot ask's sessions, a context saved mid-conversation), no answer yet, or a turn
        that compacted, dropped cells or was read through the pot."""
        if self._after_reading is None or not self._turn_log or not self._replayable or self._suspended is not None:
            return None
        eng, log = self.engine, list(self._turn_log)
        eng.import_state(self._after_reading)
        for i, (toks, ids) in enumerate(log):
            last = i == len(log) - 1
            if last:
                eng.track_answer_attention(True)
            try:
                eng.prompt(toks)
                eng.replay_answer(ids)
                if last:
                    return top_passages(self)
            finally:
                if last:
                    eng.track_answer_attention(False)
        return None

    def stats(self) -> dict:
        st = self.engine.stats()
        out = {"model": self.model_name, "policy": self.policy_spec, "prompt": self.format.name,
                "document tokens": self.doc_tokens, "tokens in pot": st.n_cells_used,
                "pot capacity": st.n_cells_total, "pot MiB": round(st.bytes_used / 2**20, 1),
                "compactions": st.n_compactions, "turns": self.turns}
        if self.read_seconds:  # a reopened context was read by another process: no rate to show
            out["read tok/s"] = round(self.read_here / self.read_seconds, 1)
        return out

    # -- saving ----------------------------------------------------------------------------------

    def disk_need(self, n_tokens: int):
        """(bytes, folder, how to write less) the policy writes to disk beside the pot reading n_tokens of
        this model (InfLLM's block store, which a saved context references rather than holds), or None."""
        return ExternalMemory.of(self.engine.policy).disk_need(self.facts, n_tokens)

    def save(self, path: Path) -> int:
        rt = library.info()
        header = {
            "format": FORMAT_NAME,
            "kvpot_version": __version__,
            "runtime": {"abi": rt.abi, "llama_commit": rt.llama_commit},
            "model": {"name": self.model_name, "path": str(self.facts.path), "sha256": model_sha256(self.facts.path),
                      "architecture": self.facts.arch},
            "policy": self.policy_spec,
            "settings": asdict(self.settings),
            "n_ctx": self.engine.ctx.n_ctx,
            "prompt_format": self.format.name,
            "tokens_read": self.doc_tokens,
            "sources": self.sources,
            "turns": self.turns,
            "source_map": self.source_map.to_header(),
        }
        point = self.read_point
        if point is not None and self.turns == 0 and point.next_position == self.engine.tokens_seen:
            # a stopped read: where its rest begins (a read that failed after its point has none)
            header["read_point"] = point.to_header()
        if self.read_stopped is not None:  # the input was read only partly (with or without a point to go on from)
            header["read_stopped"] = self.read_stopped.to_header()
        state = self.engine.export_state()
        # the file will reference the policy's disk data (InfLLM's store): mark it kept before the file exists,
        # so no moment has a saved context whose store a signal's cleanup would delete (a save that then
        # fails leaves a kept store behind, never a context without its store)
        ExternalMemory.of(self.engine.policy).keep_on_disk()
        return write_context(path, SavedContext(header=header, state=state))

    @classmethod
    def reopen(cls, path: Path, facts: ModelFacts, model_name: str, threads: int | None = None,
               policy: Policy | None = None, resettable: bool = True, saved: SavedContext | None = None) -> Session:
        """Reopen a saved context with the given model; refuses another model or runtime. `policy`:
        the one the saved header names, already built (else it is built here); `resettable` as for a
        new session (without it the saved state is not kept once restored); `saved`: the file already
        read (read_context with seq_in_file), else it is read here. llama.cpp restores the sequence
        state straight from the file, so it is never held in memory beside the cache it fills."""
        saved = saved if saved is not None else read_context(path, seq_in_file=True)
        h = saved.header
        rt = library.info()
        if h["runtime"]["abi"] != rt.abi:
            raise KvpotError(f"{path} was saved by kvpot ABI {h['runtime']['abi']}; this runtime is ABI {rt.abi}")
        if h["runtime"]["llama_commit"] != rt.llama_commit:
            raise KvpotError(f"{path} was saved with llama.cpp {h['runtime']['llama_commit']}; this runtime is {rt.llama_commit}")
        sha = model_sha256(facts.path)
        if sha != h["model"]["sha256"]:
            raise KvpotError(f"{path} was saved with model {h['model']['name']} (sha256 {h['model']['sha256'][:12]}…), "
                             f"not {model_name} (sha256 {sha[:12]}…)")
        # read_context checked every field (context_file.check_saved): the settings as `ask` checks them
        settings = RunSettings(**dict(h["settings"], **({"threads": threads} if threads else {})))
        s = cls(facts, model_name, settings, n_ctx=h["n_ctx"], policy=policy, resettable=resettable)
        try:
            s.engine.import_state(saved.state)
            s._check_restored(saved.state)
        except KvpotError as e:
            s.close()
            raise KvpotError(f"{path} cannot be restored: {e}") from None
        s.sources, s.doc_tokens, s.turns = h["sources"], h["tokens_read"], h["turns"]
        try:
            s.source_map = SourceMap.from_header(h.get("source_map"))
        except KvpotError as e:
            s.close()
            raise KvpotError(f"{path} cannot be restored: {e}") from None
        if "read_point" in h:  # checked with the file (context_file.check_saved)
            s.read_point = ReadPoint.from_header(h["read_point"])
        if "read_stopped" in h:
            s.read_stopped = ReadStopped.from_header(h["read_stopped"])
        s._after_reading = saved.state if s.turns == 0 and resettable else None
        return s

    def _check_restored(self, state: EngineState) -> None:
        """The engine's next position against the cache llama.cpp restored: the next decode must continue
        it (llama.cpp refuses a gap, and says so in its own words, only when that decode runs)."""
        restored = self.engine.pot.stats().pos_next
        if state.values["pos_next"] != restored:
            raise KvpotError(f"the engine's next position {state.values['pos_next']} does not follow the restored "
                             f"cache (which ends at position {restored - 1})")

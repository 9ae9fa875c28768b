"""The Engine: reads token streams chunk by chunk into the pot, asks its policy what to keep, answers.

The engine never asks what kind of policy it holds: it calls the core hooks of
`kvpot.policies.base.Policy` at fixed points, asks the capabilities some policies have through
`Capability.of` (whose defaults do nothing where the policy has none), and applies what they return.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvpot.errors import KvpotError
from kvpot.locator.keys import BlockKeys
from kvpot.models.gguf_file import read_model_facts
from kvpot.models.registry import shipped_adapter_for
from kvpot.policies.base import (
    DEAD,
    PAD,
    Catalyst,
    ExternalMemory,
    GraphPieces,
    LengthAware,
    Policy,
    PotView,
    QuestionFirst,
    Recall,
    TapRequest,
    check_keep,
    keep_ends,
)
from kvpot.runtime import abort
from kvpot.runtime.llama import ContextParams, LlamaContext, LlamaModel
from kvpot.runtime.outputs import outputs_max
from kvpot.runtime.pot import Pot, PotStats
from kvpot.state.engine_state import EngineState, SeqInFile, decode_tree, encode_tree
from kvpot.state.recall_cells import RecallCells

# cells kept free past budget + chunk for the question and the answer
DEFAULT_ANSWER_RESERVE = 256
# cells an answer leaves free (besides the catalyst) so the next chat turn can start
MIN_TURN_ROOM = 64
# engine bookkeeping saved with a context (see export_state)
_SAVED_SCALARS = ("tokens_seen", "pos_next", "n_compactions", "compact_seconds", "nll_sum", "nll_count",
                  "_carry_lp", "_bos_done", "step")


@dataclass(frozen=True)
class EngineConfig:
    budget: int = 1024          # cells the pot keeps after each compaction
    chunk: int = 512            # tokens decoded per step (and llama.cpp's n_batch/n_ubatch)
    n_ctx: int | None = None    # cache size; default budget + chunk + answer_reserve
    answer_reserve: int = DEFAULT_ANSWER_RESERVE
    n_threads: int = 2
    flash_attn: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    measure_nll: bool = False   # accumulate -log p of every token read (perplexity benchmarks)
    locator_block: int = 0      # keep the read-once locator's keys in blocks of this many tokens (0: none)

    def cache_size(self, policy: Policy) -> int:
        return self.n_ctx or policy.cache_cells(self.budget, self.chunk) + self.answer_reserve


@dataclass
class FeedEvent:
    """What the engine reports after each chunk (for progress bars and benchmarks)."""

    tokens_read: int
    cells: int             # cells after this step (after compaction, if any)
    cells_peak: int        # cells right after the chunk was decoded, before compaction
    compacted: bool
    stats: PotStats


class Engine:
    def __init__(self, model_path: str, policy: Policy, config: EngineConfig = EngineConfig()):
        facts = read_model_facts(model_path)  # a bad file never reaches llama.cpp
        if config.budget < 1 or config.chunk < 1:
            raise KvpotError(f"budget ({config.budget}) and chunk ({config.chunk}) must be positive")
        pieces = GraphPieces.of(policy)
        # the adapter kvpot ships for this model (Locret's heads, EdgeInfinite's gate), used where the
        # spec names none
        shipped = shipped_adapter_for(pieces.adapter_kind, model_path)
        # EdgeInfinite's gate, checked against the model; its memory counts against the budget
        gate = pieces.memory_gate(model_path, shipped)
        # the one place --budget and --chunk reach the policy: it sizes itself or refuses
        policy.fit(config.budget, config.chunk)
        need = policy.cache_cells(config.budget, config.chunk)
        if config.cache_size(policy) < need:
            raise KvpotError(f"context size {config.cache_size(policy)} cannot hold budget {config.budget} + chunk {config.chunk}")
        self.facts = facts
        self.policy = policy
        self.config = config
        n_ctx = config.cache_size(policy)
        if config.n_ctx is None and any(facts.swa_layers):
            # llama.cpp gives a sliding-window layer min(n_ctx, window + n_ubatch) cells: with fewer than
            # window + chunk it has no room for a chunk once the stream passes the window (a small pot)
            n_ctx = max(n_ctx, facts.sliding_window + config.chunk)
        self.model = LlamaModel(model_path)
        # the compute buffer holds the output head for the rows the engine uses: the last row of a step,
        # and NuC's block of rows where the policy (or measure_nll) asks for every row's log-prob
        logprobs = config.measure_nll or pieces.wants_logprobs()
        self.ctx = LlamaContext(self.model, ContextParams(
            n_ctx=n_ctx, n_batch=config.chunk, n_threads=config.n_threads,
            flash_attn=config.flash_attn, type_k=config.type_k, type_v=config.type_v,
            n_outputs_max=outputs_max(config.chunk, logprobs)))
        self.pot = Pot(self.ctx)
        self.pot.reset()
        # trained graph pieces the policy brings (Locret's retaining heads), checked against the model
        self.heads = pieces.retaining_heads(model_path, shipped)
        if self.heads is not None:
            self.pot.set_heads(self.heads)
            self.pot.enable_heads(False)  # scored only while reading chunks that ask for it
        self.gate = gate
        if gate is not None:
            self.pot.set_gate(gate)
        self.pot.set_budget(min(config.budget, self.ctx.n_ctx))
        self._init_state()

    # -- state ---------------------------------------------------------------------------------

    def _init_state(self) -> None:
        L, H = self.pot.n_layers, self.pot.n_head_kv
        self.positions = np.zeros((L, H, 0), dtype=np.int64)  # stream position per (layer, head, cell)
        self.tokens_seen = 0      # stream position of the next token
        self.pos_next = 0         # llama position of the next token (differs once CR-RoPE renumbers)
        self.n_compactions = 0
        self.compact_seconds = 0.0  # wall time spent compacting (policy selection + runtime graph)
        self.nll_sum = 0.0          # with measure_nll: sum of -log p over tokens read, and their count
        self.nll_count = 0
        self._carry_lp: float = float("nan")  # log p of the next chunk's first token, from this chunk's last row
        self._bos_done = False
        self.step = 0             # chunks read so far
        self._catalyst_cache: tuple[str | None, list[int]] = (None, [])
        self.stop_reason = ""     # why the last answer ended (for "the model produced no answer")
        # the same by name, for scripts (--json): end-of-generation, max-tokens, context-full; a session's
        # filter sets stop-string, end-of-line, loop-guard
        self.stop_kind = ""
        self.answer_tokens = 0    # tokens the last answer generated (the end-of-generation token not counted)
        self.answer_ids: list[int] = []  # the last answer's tokens decoded into the cache (replay_answer)
        # with track_answer_attention: stream position -> attention the answer's rows gave it, summed over
        # layers, KV heads and rows (kvpot.locator.sources, read through `answer_mass`); None when not tracking
        self._answer_mass: dict[int, float] | None = None
        self._answer_taps = False  # the runtime is summing answer rows' attention per cell, not yet read back
        # recalled cells the runtime treats apart until the next compaction (Recall.fetch, Recall.distance)
        # (the policy's external memory, whose lookup_store the in-graph lookup reads)
        self.recall_cells = RecallCells(self.pot, ExternalMemory.of(self.policy))
        # the read-once locator (kvpot.locator.keys): every block read, whatever the pot keeps of it
        self.block_keys = (BlockKeys(L, H, self.facts.head_dim_k, self.config.locator_block)
                           if self.config.locator_block else None)

    def reset(self) -> None:
        """Forget the document: empty cache, policy state and positions; the model stays loaded."""
        self.ctx.clear()
        self.pot.reset()
        self.pot.set_budget(min(self.config.budget, self.ctx.n_ctx))
        self.policy.reset()
        self._init_state()

    @property
    def n_cells(self) -> int:
        return self.positions.shape[2]

    def stats(self) -> PotStats:
        return self.pot.stats()

    def close(self) -> None:
        """Free the context, then the model (the pot refuses calls from then on); the policy forgets
        the document (InfLLM deletes a block store no saved context references)."""
        self.policy.reset()
        self.ctx.close()
        self.model.close()

    def suspend(self) -> EngineState:
        """Free llama.cpp's context and model (another session may load the model meanwhile: chat's focused read),
        keeping everything needed to go on in the returned state; `resume` continues from it. The policy keeps
        the document (an exported state keeps InfLLM's store)."""
        state = self.export_state()
        self.ctx.close()
        self.model.close()
        return state

    @classmethod
    def resume(cls, model_path: str, suspended: Engine, state: EngineState) -> Engine:
        """The engine `suspend` freed, loaded again with the same policy and settings and its state restored."""
        eng = cls(model_path, suspended.policy, suspended.config)
        try:
            eng.import_state(state)
        except BaseException:
            eng.close()
            raise
        return eng

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------------

    def feed_text(self, text: str, on_chunk: Callable[[FeedEvent], None] | None = None) -> None:
        self.feed(self.model.tokenize(text), on_chunk)

    def set_question(self, text: str) -> None:
        """Tell the policy the question before reading (InfiniPot uses it as its catalyst, CaP-Q)."""
        QuestionFirst.of(self.policy).set_question(text)

    def feed(self, tokens: Sequence[int], on_chunk: Callable[[FeedEvent], None] | None = None) -> None:
        """Read tokens (the BOS is added before the first one) chunk by chunk, compacting as needed."""
        self.feed_stream([tokens], expected=len(tokens), on_chunk=on_chunk)

    def feed_stream(self, pieces: Iterable[Sequence[int]], expected: int | None = None,
                    on_chunk: Callable[[FeedEvent], None] | None = None, abortable: bool = False) -> None:
        """Read token lists as they arrive (e.g. from the incremental tokenizer) in the policy's chunks.

        `expected`: tokens about to be read, when known or estimated (IMDC plans its chunks by it).
        At most two chunks plus one piece are held in memory. An exception raised by `on_chunk`
        stops reading with the engine in a consistent state (everything before it was read), and so
        does abort.Interrupted when `abortable` and a signal stops a chunk's decode (the chunks before
        it read, nothing of it)."""
        buf: list[int] = []
        if not self._bos_done:
            buf = self.model.bos()
            self._bos_done = True
        if expected is not None:
            LengthAware.of(self.policy).set_expected_length(self.tokens_seen + len(buf) + expected)
        it = iter(pieces)
        ended = False
        while True:
            size = max(1, self.policy.chunk_size(self.step, self.config.chunk))
            nominal_next = max(1, self.policy.chunk_size(self.step + 1, self.config.chunk))
            while not ended and len(buf) < size + nominal_next:
                more = next(it, None)
                if more is None:
                    ended = True
                else:
                    buf.extend(more)
            if not buf:
                break
            piece = buf[:min(size, self._room())]
            del buf[:len(piece)]
            nxt = buf[0] if buf else -1
            next_size = min(nominal_next, len(buf)) if ended else nominal_next
            try:
                compacted, peak = self._feed_chunk(piece, nxt, next_size, abortable)
            except abort.Interrupted:
                if self.tokens_seen == 0:  # the BOS went back with the chunk: a later read starts with it
                    self._bos_done = False
                raise
            self.step += 1
            if on_chunk:
                on_chunk(FeedEvent(self.tokens_seen, self.n_cells, peak, compacted, self.pot.stats()))

    def _capacity(self) -> int:
        """Cells the policy works in (the context less the answer reserve)."""
        return min(self.policy.cache_cells(self.config.budget, self.config.chunk), self.ctx.n_ctx)

    def _room(self) -> int:
        """Tokens the next chunk may hold: up to the policy's capacity less the catalyst that may have
        to follow (so InfiniPot's pot fills to |M| - |P| before it distills), or into the answer
        reserve when a question and its answer used part of it."""
        cat = len(self._catalyst_tokens(self.catalyst_text()))
        room = self._capacity() - self.n_cells - cat
        if room < 1:
            room = self.ctx.n_ctx - self.n_cells - cat
        if room < 1:
            raise KvpotError(
                f"{self.policy.name} keeps every token: {self.tokens_seen + 1} tokens do not fit the context "
                f"of {self.ctx.n_ctx} cells; choose an evicting policy or a larger context")
        return room

    def _decode(self, tokens: list[int], pos0: int, logits: str, abortable: bool = False) -> None:
        """Decode in pieces of at most n_batch (a step may be longer, e.g. IMDC's first chunks, and
        llama.cpp may have taken a smaller n_batch than the chunk when the context is small).
        abortable: a signal may stop it (abort.Interrupted, nothing of it left behind); only a step
        of one piece, as llama.cpp takes back the aborted piece alone."""
        nb = self.ctx.n_batch
        abortable = abortable and len(tokens) <= nb
        for s in range(0, len(tokens), nb):
            self.ctx.decode(tokens[s:s + nb], pos0 + s, logits=logits, abortable=abortable)
            self.recall_cells.book(self.positions)

    def _feed_chunk(self, piece: list[int], next_token: int, next_size: int, abortable: bool = False) -> tuple[bool, int]:
        n = len(piece)
        req: TapRequest = self.policy.before_chunk(n)
        if self.config.measure_nll and not req.logprobs:
            req = replace(req, logprobs=True)
        pos0 = self.pos_next
        if req.tap_last:
            k = n if req.tap_last < 0 else min(req.tap_last, n)
            self.pot.tap_request(np.arange(pos0 + n - k, pos0 + n), req.tap_what)
        if req.logprobs:
            self.pot.logprobs_request(pos0, piece[1:] + [next_token])
        if req.head_scores:
            self._take_head_scores(0)  # nothing stale: scores must be this chunk's alone
            self.pot.enable_heads(True)
        if req.query_angle is not None:
            self.pot.query_request(True, req.query_angle)
        queries = None
        try:
            n_old = self.n_cells
            # log-probs are computed for every row inside the graph; only the last row's logits leave it
            self._decode(piece, pos0, "last", abortable)
            head_scores = self._take_head_scores(n) if req.head_scores else None
            scores = self.pot.tap_get(n_old + n) if req.tap_last else None
            logprobs = None
            if req.logprobs:
                rows = self.pot.logprobs_get(n)
                logprobs = np.concatenate([[self._carry_lp], rows[:-1]]).astype(np.float32)
                self._carry_lp = float(rows[-1])
                finite = logprobs[np.isfinite(logprobs)]
                self.nll_sum -= float(finite.sum())
                self.nll_count += int(finite.size)
            if req.query_angle is not None:
                queries = self.pot.query_take(self.facts.head_dim_k)
        finally:
            if req.query_angle is not None:
                self.pot.query_request(False)
            if req.tap_last:
                self.pot.tap_clear()
            if req.logprobs:
                self.pot.logprobs_clear()
            if req.head_scores:
                self.pot.enable_heads(False)

        # the chunk went to cells n_old.. (compaction leaves every later cell free)
        cell_pos = self.pot.cell_positions(n_old + n)
        if not np.array_equal(cell_pos[n_old:], np.arange(pos0, pos0 + n)):
            raise KvpotError("internal: the chunk did not land in the cells after the pot")
        L, H = self.pot.n_layers, self.pot.n_head_kv
        chunk_stream = self._append_cells(n)
        if self.block_keys is not None:  # before any compaction: the chunk's keys, at RoPE 0
            self.block_keys.add(self._read_cells(n_old, n, 0)[0], int(chunk_stream[0]))

        view = PotView(n_layer=L, n_head_kv=H, n_cells=self.n_cells, positions=self.positions,
                       scores=scores, logprobs=logprobs, chunk_positions=chunk_stream, tokens_seen=self.tokens_seen,
                       head_scores=head_scores, queries=queries, read_cells=self._read_cells)
        self.policy.after_chunk(view)
        peak = self.n_cells
        return self._maybe_compact(view, next_size), peak

    def _take_head_scores(self, n: int) -> np.ndarray | None:
        """[L, H, n] retaining-head scores of the n tokens just decoded, per pot layer; n = 0 drops
        whatever is pending."""
        if self.heads is None:
            if n:
                raise KvpotError(f"internal: {self.policy.name} asked for head scores but brought no heads")
            return None
        rows = [self.pot.take_head_scores(il, max(n, self.config.chunk * 4 + 64)) for il in self.pot.layer_ids]
        if n and any(r.shape[0] != n for r in rows):
            raise KvpotError(f"internal: {rows[0].shape[0]} tokens were scored for a chunk of {n}")
        return np.stack([r.T for r in rows]) if n else None

    def catalyst_text(self) -> str | None:
        """The text the policy has decoded and tapped before each selection (InfiniPot's CaP), or None."""
        return Catalyst.of(self.policy).catalyst_text()

    def _catalyst_tokens(self, text: str | None) -> list[int]:
        if not text:
            return []
        if self._catalyst_cache[0] != text:
            self._catalyst_cache = (text, self.model.tokenize(text))
        return self._catalyst_cache[1]

    def _maybe_compact(self, view: PotView, next_size: int) -> bool:
        budget = self.policy.budget_at(self.step, self.config.budget)
        catalyst = self.catalyst_text()
        n_cat = len(self._catalyst_tokens(catalyst))
        # the next chunk is cut to the room left (see _room), so while any is left it fits
        fit = self._capacity() - self.n_cells - n_cat
        if next_size and fit >= 1:
            next_size = min(next_size, fit)
        # room for the next chunk and for the catalyst that precedes a distillation
        if not self.policy.wants_compaction(self.n_cells, budget, next_size + n_cat):
            return False
        t0 = time.perf_counter()
        if catalyst:
            view = self._append_catalyst(catalyst, view)
        keep = self.policy.select(view, budget)
        if keep is None:
            if catalyst:
                raise KvpotError(f"internal: {self.policy.name} read a catalyst but kept every cell")
            return False
        fold = GraphPieces.of(self.policy).memory_fold()
        if fold is not None and len(fold):
            self.pot.fold(fold)  # into the gated memory before the compaction drops those cells
        self.compact(keep, self.policy.cr_rope)
        self._recall()
        self.compact_seconds += time.perf_counter() - t0
        return True

    def _read_cells(self, cell0: int, n: int, rope_to: int) -> tuple[np.ndarray, np.ndarray]:
        """K (re-rotated to RoPE position rope_to) and V of cells [cell0, cell0 + n), for PotView.read_cells."""
        return self.pot.read_at(cell0, n, rope_to, self.facts.head_dim_k, self.facts.head_dim_v)

    def _recall(self) -> None:
        """Append the cells the policy recalls after a compaction (InfLLM's initial tokens and blocks)."""
        rec: Recall | None = ExternalMemory.of(self.policy).recall(self.pos_next)
        if rec is None:
            return
        L, H = self.pot.n_layers, self.pot.n_head_kv
        m = rec.k.shape[2]
        if rec.positions.shape != (L, H, m) or self.n_cells + m > self._capacity():
            raise KvpotError(f"internal: {self.policy.name} recalled {m} cells for a pot of {self.n_cells} "
                             f"and capacity {self._capacity()}")
        cell0 = self.n_cells
        self.pot.insert(rec.k, rec.v, rec.rope_from, rec.rope_to)
        self.positions = np.concatenate([self.positions, rec.positions.astype(np.int64)], axis=2)
        self.recall_cells.apply(rec, cell0)

    def _lookup_for_prompt(self, toks: list[int]) -> None:
        """A policy that looks its memory up by the question's queries (InfLLM) gets them: the question
        is decoded once with the queries captured, taken back out, and the pot is re-selected and
        recalled for it before the question is decoded for real."""
        req = ExternalMemory.of(self.policy).before_prompt(len(toks))
        if req.query_angle is None or not self.n_cells:
            return
        pos0 = self.pos_next
        self.pot.query_request(True, req.query_angle)
        try:
            self._decode(toks, pos0, "last")
            queries = self.pot.query_take(self.facts.head_dim_k)
        finally:
            self.pot.query_request(False)
            self.ctx.remove_from(pos0)
        L, H = self.pot.n_layers, self.pot.n_head_kv
        view = PotView(n_layer=L, n_head_kv=H, n_cells=self.n_cells, positions=self.positions, scores=None,
                       logprobs=None, chunk_positions=np.zeros(0, dtype=np.int64), tokens_seen=self.tokens_seen,
                       queries=queries, read_cells=self._read_cells)
        keep = self.policy.select(view, self.policy.budget_at(self.step, self.config.budget))
        if keep is not None:
            self.compact(keep, self.policy.cr_rope)
            self._recall()

    def question_queries(self, toks: list[int], capture: tuple[int, int], angle: int) -> np.ndarray | None:
        """[L, H, d_k] lookup queries of toks[capture[0]:capture[1]] (summed over those rows and the query heads of
        each KV group, rotated to RoPE position `angle`: kvpot-lookup's query_sum), read as the next turn after
        the pot would read them; nothing of them stays in the cache. None when the pot has no room for them."""
        a, b = capture
        toks = list(toks[:b])
        room = self.ctx.n_ctx - self.n_cells - 1
        if room < 1 or a >= b:
            return None
        if len(toks) > room:  # a question longer than the free cells: its own last tokens
            cut = len(toks) - room
            toks, a = toks[cut:], max(0, a - cut)
        pos0 = self.pos_next
        try:
            if a:
                self._decode(toks[:a], pos0, "last")
            self.pot.query_request(True, angle)
            self._decode(toks[a:], pos0 + a, "last")
            return self.pot.query_take(self.facts.head_dim_k)
        finally:
            self.pot.query_request(False)
            self.ctx.remove_from(pos0)

    def _append_catalyst(self, text: str, view: PotView) -> PotView:
        """Decode the catalyst after the pot with a tap on its rows, then remove it from every cache;
        its (now empty) cells are marked -1 until the compaction that follows rebuilds the pot."""
        toks = self._catalyst_tokens(text)
        n_old, pos0 = self.n_cells, self.pos_next
        if n_old + len(toks) > self.ctx.n_ctx:
            raise KvpotError(f"the catalyst prompt ({len(toks)} tokens) does not fit the pot")
        self.pot.tap_request(np.arange(pos0, pos0 + len(toks)))
        try:
            self._decode(toks, pos0, "last")
            scores = self.pot.tap_get(n_old + len(toks))
        finally:
            self.pot.tap_clear()
            # the catalyst leaves every cache at once, the sliding-window layers' included
            # (the pot's compaction would drop its cells there anyway, but not in the window part)
            self.ctx.remove_from(pos0)
        L, H = self.pot.n_layers, self.pot.n_head_kv
        self.positions = np.concatenate([self.positions, np.full((L, H, len(toks)), -1, dtype=np.int64)], axis=2)
        return PotView(n_layer=L, n_head_kv=H, n_cells=self.n_cells, positions=self.positions, scores=scores,
                       logprobs=view.logprobs, chunk_positions=view.chunk_positions, tokens_seen=self.tokens_seen)

    def compact(self, keep: np.ndarray, cr_rope: bool) -> None:
        """Apply a keep list [L, H, n] (rows of a layer that keeps fewer end with PAD): the pot is
        rebuilt in the runtime, the bookkeeping follows; a padded cell is DEAD in its layer."""
        keep = np.asarray(keep, dtype=np.int64)
        check_keep(keep, self.positions, self.policy.name)
        self.pot.compact(keep, cr_rope)
        self.recall_cells.after_compaction()
        held = keep != PAD
        kept = np.take_along_axis(self.positions, np.where(held, keep, 0), axis=2)
        self.positions = np.where(held, kept, DEAD)
        self.policy.after_compaction(keep)
        self.pos_next = self.pot.stats().pos_next
        self.n_compactions += 1

    # -- answering -----------------------------------------------------------------------------

    def track_answer_attention(self, on: bool) -> None:
        """From the next prompt on, score-tap the question's last row and every answer row and add up
        the attention each stream position received (`answer_mass`); the cells' stream positions
        (`positions`) already follow every compaction and recall, so the sum is by position. Off (or on
        again) forgets what an earlier answer gathered."""
        if self._answer_taps:
            self._answer_taps = False
            self.pot.tap_clear()
        self._answer_mass = {} if on else None

    @property
    def answer_mass(self) -> dict[int, float] | None:
        """Stream position -> attention the tracked rows gave it so far (None: not tracking). Read in the
        middle of an answer, it holds the rows decoded until then."""
        self._tally_answer_rows()
        return self._answer_mass

    def _tap_answer_rows(self, pos: int) -> None:
        """Tap the row at llama position `pos` and every row after it: the runtime adds each tapped row's
        attention to a per-cell sum as it decodes (kvpot_tap_request keeps one accumulator per pot layer
        and KV head until the next request), so an answer costs one read-back, not one per token. An
        answer never runs past the context's free cells, which bounds the positions asked for."""
        if self._answer_mass is None:
            return
        self._tally_answer_rows(go_on=False)  # rows tapped before these are read first
        self.pot.tap_request(np.arange(pos, pos + self.ctx.n_ctx - self.n_cells + 1))
        self._answer_taps = True

    def _tally_answer_rows(self, go_on: bool = True) -> None:
        """Read the runtime's per-cell sums of the rows tapped since the last tally into answer_mass, by
        the cells' stream positions (every tapped row's cell is already booked by _append_cells), and
        start the sums again from zero for the rows still to come (`go_on`; else the taps end)."""
        if not self._answer_taps:
            return
        try:
            scores = self.pot.tap_get(self.n_cells)
        finally:
            self._answer_taps = False
            self.pot.tap_clear()
        if self.pot.n_layers and self.n_cells:
            add_by_position(self._answer_mass, scores, self.positions)
        if go_on:
            self._tap_answer_rows(self.pos_next)

    def next_logits(self, text: str) -> np.ndarray:
        """Feed text (no eviction past the reserve) and return the logits for the token after it."""
        return self.prompt(self.model.tokenize(text))

    def prompt(self, toks: Sequence[int], on_chunk: Callable[[FeedEvent], None] | None = None) -> np.ndarray:
        """Decode a question (or a chat turn) and return the logits for the token after it.

        A turn that fits the free cells (keeping room for the next turn) is decoded as it is; a
        longer one is read through the pot like the document, all but its last token."""
        toks = list(toks)
        self.recall_cells.hold(False)  # a new turn looks its blocks up again
        if not self._bos_done:
            toks = self.model.bos() + toks
            self._bos_done = True
        if not toks:
            raise KvpotError("nothing to ask: the question is empty")
        if self.prompt_is_read(len(toks)):
            self.feed_stream([toks[:-1]], on_chunk=on_chunk)
            toks = toks[-1:]
        self._lookup_for_prompt(toks)
        self._tap_answer_rows(self.pos_next + len(toks) - 1)  # from the row that chooses the answer's first token
        self._decode(toks, self.pos_next, "last")
        self._append_cells(len(toks))
        return self.ctx.logits_last()

    def make_room(self, n_tokens: int, n_sink: int = 4) -> int:
        """Free cells for a turn of n tokens (question, answer and the next turn's start) by keeping
        the first `n_sink` cells and the most recent ones, as StreamingLLM keeps them, re-rotated to
        consecutive positions. For a policy that never evicts (full attention), whose conversation
        would otherwise end at a full context. Returns the cells dropped (0: they fit already, or
        nothing short of the sinks would make them fit)."""
        n_keep = self.ctx.n_ctx - self._turn_room() - n_tokens
        if self.n_cells <= n_keep or n_keep <= n_sink:
            return 0
        dropped = self.n_cells - n_keep
        self.compact(keep_ends(self.positions, n_sink, n_keep - n_sink), cr_rope=True)
        return dropped

    def prompt_is_read(self, n_tokens: int) -> bool:
        """Whether `prompt` reads a turn of n tokens through the pot, chunk by chunk (with progress),
        rather than decoding it as it is."""
        return self.n_cells + n_tokens > self.ctx.n_ctx - self._turn_room()

    def _turn_room(self) -> int:
        """Cells an answer leaves free so the next chat turn can start a chunk (and a catalyst)."""
        return len(self._catalyst_tokens(self.catalyst_text())) + MIN_TURN_ROOM

    def _append_cells(self, n: int) -> np.ndarray:
        """Book n tokens just decoded after the pot; returns their stream positions."""
        L, H = self.pot.n_layers, self.pot.n_head_kv
        stream = np.arange(self.tokens_seen, self.tokens_seen + n, dtype=np.int64)
        self.positions = np.concatenate([self.positions, np.broadcast_to(stream, (L, H, n))], axis=2)
        self.tokens_seen += n
        self.pos_next += n
        return stream

    def generate(self, logits: np.ndarray, max_tokens: int = 64,
                 pick: Callable[[np.ndarray, list[int]], int] | None = None) -> Iterator[str]:
        """An answer from the given logits, streamed as text pieces (UTF-8 safe). `pick(logits, tokens so
        far)` chooses each token (kvpot.session.sampling); greedy without it. Every token yielded except
        the last is in the cache; it stops at end-of-generation, at max_tokens, or when the cache must
        keep room for the next turn. The answer's rows stop being tapped when it ends, however it ends."""
        try:
            yield from self._generate(logits, max_tokens, pick)
        finally:
            if getattr(self.ctx, "ptr", None):
                self._tally_answer_rows(go_on=False)
            else:  # closed under an unfinished answer: nothing is left to read
                self._answer_taps = False

    def _generate(self, logits: np.ndarray, max_tokens: int,
                  pick: Callable[[np.ndarray, list[int]], int] | None) -> Iterator[str]:
        pending = b""
        chosen: list[int] = []
        self.stop_reason, self.stop_kind = f"the {max_tokens}-token limit", "max-tokens"
        self.answer_tokens = 0
        self.answer_ids = []  # the answer's tokens decoded into the cache, for replay_answer
        self.recall_cells.hold(True)  # the answer reads the blocks its question chose
        for _ in range(max_tokens):
            tok = int(np.argmax(logits)) if pick is None else pick(logits, chosen)
            chosen.append(tok)
            if self.model.is_eog(tok):
                self.stop_reason = f"end-of-generation ({self.model.piece(tok).decode('utf-8', 'replace') or tok})"
                self.stop_kind = "end-of-generation"
                break
            self.answer_tokens += 1
            pending += self.model.piece(tok)
            try:
                text = pending.decode("utf-8")
                pending = b""
                yield text
            except UnicodeDecodeError:
                pass
            if self.n_cells + 1 > self.ctx.n_ctx - self._turn_room():
                self.stop_reason, self.stop_kind = "the room left in the context", "context-full"
                break
            self.ctx.decode([tok], self.pos_next, logits="last")
            self.answer_ids.append(tok)
            self.recall_cells.book(self.positions)
            self._append_cells(1)
            if self.recall_cells.fetch_n:  # the lookup may put other blocks in its cells at the next decode
                self._tally_answer_rows()
            logits = self.ctx.logits_last()
        if pending:
            yield pending.decode("utf-8", errors="replace")

    def replay_answer(self, ids: Sequence[int]) -> None:
        """Decode an answer's tokens again as `generate` decoded them (one at a time, the recall held as an
        answer holds it), after the same turn's prompt: the same tokens at the same positions, so with
        tracking on the taps gather the attention the answer paid (chat's /sources after an untracked answer)."""
        try:
            self.recall_cells.hold(True)
            for tok in ids:
                self.ctx.decode([int(tok)], self.pos_next, logits="last")
                self.recall_cells.book(self.positions)
                self._append_cells(1)
                if self.recall_cells.fetch_n:
                    self._tally_answer_rows()
        finally:
            self._tally_answer_rows(go_on=False)

    def answer(self, question_text: str, max_tokens: int = 64) -> Iterator[str]:
        """Greedy answer to a plain-text question, streamed as text pieces."""
        return self.generate(self.next_logits(question_text), max_tokens)

    # -- saving ------------------------------------------------------------------------------------

    def export_state(self) -> EngineState:
        """Everything needed to continue later: llama.cpp's sequence state, kvpot's per-head state,
        the engine's bookkeeping and the policy's per-document state."""
        self.pot.settle()
        values = {name: getattr(self, name) for name in _SAVED_SCALARS} | self.recall_cells.export()
        arrays = {"positions": np.ascontiguousarray(self.positions)}
        if self.gate is not None:  # EdgeInfinite's M, z (layout: kvpot.h, kvpot_memory_state_get)
            arrays["memory"] = np.frombuffer(self.pot.memory_bytes(), dtype=np.uint8)
        values["policy"] = encode_tree(self.policy.state_dict(), arrays, "policy")
        if self.block_keys is not None:
            values["locator"], kept = self.block_keys.state()
            arrays.update({f"locator_{k}": v for k, v in kept.items()})
        return EngineState(seq=self.ctx.seq_state(), pot=self.pot.state_bytes(), values=values, arrays=arrays)

    def import_state(self, state: EngineState) -> None:
        """Continue from an exported state (same model, policy and config; the caller checks)."""
        self.reset()
        if isinstance(state.seq, SeqInFile):
            state.seq.before_restore()
            self.ctx.set_seq_state_from_file(state.seq.file.fileno(), state.seq.offset, state.seq.size)
        else:
            self.ctx.set_seq_state(state.seq)
        self.pot.set_state_bytes(state.pot)
        positions = state.arrays["positions"]
        L, H = self.pot.n_layers, self.pot.n_head_kv
        if positions.ndim != 3 or positions.shape[:2] != (L, H) or positions.shape[2] != self.pot.stats().n_cells_used:
            raise KvpotError("saved engine state does not match the restored cache")
        self.positions = positions.astype(np.int64)
        if (self.gate is not None) != ("memory" in state.arrays):
            raise KvpotError("saved engine state and this policy disagree on the gated memory")
        if self.gate is not None:
            self.pot.set_memory_bytes(np.ascontiguousarray(state.arrays["memory"], dtype=np.uint8).tobytes())
        for name in _SAVED_SCALARS:
            setattr(self, name, type(getattr(self, name))(state.values[name]))
        self.policy.load_state_dict(decode_tree(state.values["policy"], state.arrays))
        self.recall_cells.restore(state.values)
        # a context saved without a locator (or by an older kvpot) has none: questions locate by the pot
        self.block_keys = None
        if "locator" in state.values:
            kept = {k[len("locator_"):]: v for k, v in state.arrays.items() if k.startswith("locator_")}
            self.block_keys = BlockKeys.from_state((L, H, self.facts.head_dim_k), state.values["locator"], kept)


def add_by_position(mass: dict[int, float], scores: np.ndarray, positions: np.ndarray) -> None:
    """Add per-cell attention `scores` [L, H, N] into `mass` by the cells' stream positions [L, H, N]
    (a position held in several layers and KV heads gets each one's; catalyst and dead cells, < 0,
    hold no token)."""
    live = positions >= 0
    where, inv = np.unique(positions[live], return_inverse=True)
    got = np.bincount(inv, weights=scores[live].astype(np.float64), minlength=where.size)
    for p, m in zip(where.tolist(), got.tolist()):
        mass[p] = mass.get(p, 0.0) + m

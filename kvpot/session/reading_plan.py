"""How `ask` and `chat` read their input: the budget the settings name, or `--budget auto`.

auto: the device's memory sets the largest context (kvpot.session.auto_budget). An input that fits it and the
model's trained context is read with full attention, the exact stock computation (unless the user
chose a policy); a longer one goes through the pot at the largest budget that fits, or, with the default
policy and a model measured past the window, at the size that answered best there
(kvpot.session.beyond_window). `--policy full` sizes its context from the input and refuses before
reading when the input cannot fit.

Inputs with a known size are counted exactly before reading, with the tokenizer alone (a
vocabulary-only load) and the same incremental tokenization the session reads with, and only up
to the most that could fit, so a huge file costs no more than the limit's worth of tokenizing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvpot.errors import KvpotError
from kvpot.ingest import IncrementalTokenizer, SourceSet
from kvpot.locator.keys import keys_bytes, uses_keys
from kvpot.models.gguf_file import ModelFacts
from kvpot.policies import GraphPieces, Policy, make_policy
from kvpot.runtime.llama import LlamaModel
from kvpot.session import auto_budget as device_budget
from kvpot.session.beyond_window import Asking, measured_pot
from kvpot.session.prompting import choose_format
from kvpot.session.settings import AUTO, RunSettings, reads_in_full

# no tokenizer packs more than this many bytes of ordinary text into a token on average: an input
# larger than limit x this cannot fit and is not counted (loading Gemma's vocabulary alone takes ~3 s)
MAX_BYTES_PER_TOKEN = 16


@dataclass(frozen=True)
class TokenCount:
    tokens: int      # the input's tokens, or, when not complete, fewer than it has (counting stopped)
    complete: bool   # every token was counted


@dataclass(frozen=True)
class ReadingPlan:
    settings: RunSettings    # with a number for the budget (full attention: the input's tokens)
    note: str | None         # what was decided and why, for stderr (None: the user's own budget, as given)
    # the policy to run: the one plan_reading was given, or full attention's when the plan chose it
    # instead of the settings' (None: none was given and the settings' spec stands)
    policy: Policy | None = None
    # the input's tokens as counted before reading (None: not counted, a --budget N pot, or stdin)
    counted: TokenCount | None = None


def count_tokens(facts: ModelFacts, prompt: str, sources: SourceSet, limit: int,
                 question: str | None = None) -> int | None:
    """Tokens the session will read (BOS, the prompt format's opening, `question` where it is put
    before the document, the sources), exactly; None when unknown (stdin). Past `limit` it stops
    counting and returns a number above the limit (a lower bound of the input's tokens)."""
    counted = count_input(facts, prompt, sources, limit, question)
    return None if counted is None else counted.tokens


def count_input(facts: ModelFacts, prompt: str, sources: SourceSet, limit: int,
                question: str | None = None, vocab: LlamaModel | None = None) -> TokenCount | None:
    """count_tokens, saying whether the count is the input's whole length or stopped past `limit`
    (the input has more tokens than it says). `vocab`: the loaded model's (else its vocabulary is loaded)."""
    if sources.total_bytes is None:
        return None
    # a lower bound only where sizes are text's (a PDF's images or a compression ratio say nothing of it)
    if sources.sizes_are_text and sources.total_bytes > limit * MAX_BYTES_PER_TOKEN:
        # a lower bound, already past the limit: no token holds more than MAX_BYTES_PER_TOKEN bytes on average
        return TokenCount(sources.total_bytes // MAX_BYTES_PER_TOKEN - 1, complete=False)
    own = vocab is None
    if vocab is None:
        vocab = LlamaModel(str(facts.path), vocab_only=True)
    try:
        n = len(vocab.bos())
        n += sum(len(vocab.tokenize(s.text, special=s.special)) for s in choose_format(vocab, prompt).document_open(question))
        tok = IncrementalTokenizer(vocab.tokenize)
        pieces = tok.stream(sources.counter().pieces())  # a copy: its own counters
        for toks in pieces:
            n += len(toks)
            if n > limit:
                # stopped here, unless this was the last piece: then the count is whole
                return TokenCount(n, complete=next(pieces, None) is None)
        return TokenCount(n, complete=True)
    finally:
        if own:
            vocab.close()


def resolve_flash_attn(settings: RunSettings, facts: ModelFacts, mem: device_budget.DeviceMemory,
                       wants_logprobs: bool, keeps_copy: bool, context: int | None = None) -> tuple[RunSettings, str | None]:
    """`flash_attn = auto`: on only where the device cannot hold, without it, the model's whole trained
    context, or `context` cells where the reading's size is already known (a pot with --budget N: its
    cells, the chunk and the answer's room). Flash attention keeps no chunk x cells score matrix (the same
    memory holds two to five times the cells) but, on the CPUs measured, reads a large context slower
    (docs/benchmarks.md, "Flash attention"), so a device with room reads without it and a small one gets
    the cells. Returns the settings and, where auto turned it on, why (for the plan's line on stderr)."""
    if settings.flash_attn != "auto":
        return settings, None
    rows = settings.chunk if wants_logprobs else 1
    try:
        held = device_budget.plan_cells(facts, mem, settings.chunk, logit_rows=rows, keeps_copy=keeps_copy).cells
    except KvpotError:  # not even a minimal pot fits without it
        held = 0
    window = facts.n_ctx_train or held + 1
    need = min(window, context) if context else window
    if held >= need:
        return replace(settings, flash_attn="off"), None
    under = f"under the {need:,} this reading needs" if need < window else f"under the model's {window:,}-token window"
    return replace(settings, flash_attn="on"), (
        f"flash attention on (auto: without it this device holds {held:,} cells, {under})")


CTX_PAD = 256  # llama.cpp rounds a context's cells up to a multiple of this (llama_context's constructor)


def _pot_context(steps: Policy | None, budget, chunk: int, reserve: int) -> int | None:
    """The cells a pot of --budget N allocates (what its policy holds while reading, plus the answer's
    room, rounded up to a multiple of 256 as llama.cpp sizes a context), or None where the budget is still
    to be chosen or the reading is full attention. Fitting here is the fit the session does anyway: a policy
    fits once for one budget and chunk."""
    if steps is None or budget == AUTO:
        return None
    steps.fit(budget, chunk)
    return -(-(steps.cache_cells(budget, chunk) + reserve) // CTX_PAD) * CTX_PAD


def locator_bytes(facts: ModelFacts, settings: RunSettings, sources: SourceSet) -> int:
    """The read-once locator's keys for this input (none unless the locator uses them): its tokens guessed from its
    size at 2 bytes a token (numbers and code take fewer than prose's ~4), so the plan leaves room for them."""
    if not uses_keys(settings.locator) or not sources.text_bytes:
        return 0
    return keys_bytes(facts.n_layer, facts.n_head_kv, facts.head_dim_k, sources.text_bytes // 2)


def plan_reading(settings: RunSettings, facts: ModelFacts, sources: SourceSet, policy_chosen: bool,
                 reserve: int, memory: device_budget.DeviceMemory | None = None,
                 notice: Callable[[str], None] = lambda msg: None, policy: Policy | None = None,
                 keeps_copy: bool = False, asking: Asking = Asking.LATER,
                 question: str | None = None) -> ReadingPlan:
    """Resolve the budget. `policy_chosen`: the user named a policy (then auto sizes it, never
    replaces it); `reserve`: cells the session keeps for the question and the answer; `notice`: told
    when reading a stream ahead waits; `policy`: the session's, built from `settings.policy` and not
    yet fitted (the plan asks what its steps need, and hands it on); `keeps_copy`: the session keeps a
    copy of the state after reading (Session's `resettable`), which the memory plan counts; `asking`: when the
    question is known and what answers it (`kvpot chat`, `ask` on a pipe, `ask`'s focused read), for the pot
    measured best that way past the window (kvpot.session.beyond_window); `question`: its text, counted where
    the session may put it before the document (question_before)."""
    full = reads_in_full(settings.policy)
    chunk = settings.chunk
    steps = None if full else policy if policy is not None else make_policy(settings.policy)
    wants_logprobs = steps is not None and GraphPieces.of(steps).wants_logprobs()
    flash_note, mem = None, memory
    asked_auto = settings.flash_attn == "auto"
    if settings.flash_attn == "auto" or settings.budget == AUTO:
        mem = memory or device_budget.device_memory()
        context = _pot_context(steps, settings.budget, chunk, reserve)
        settings, flash_note = resolve_flash_attn(settings, facts, mem, wants_logprobs, keeps_copy, context)
    if settings.budget != AUTO and not full:
        return ReadingPlan(settings, flash_note, policy)  # counted once the model is loaded (kvpot.api.plan)
    # counted where the session puts it before the document (Session.puts_question_before)
    before = question if settings.question_before == "on" else None
    plan = _plan_budget(settings, facts, sources, policy_chosen, reserve, mem, notice, policy, keeps_copy,
                        asking, full, wants_logprobs, before)
    if flash_note and asked_auto:
        # auto weighed the model's window before the budget was known; the reading chosen may need far less (the
        # pot measured best past the window, an input that fits in full): ask again for its own context
        context = _pot_context(plan.policy or make_policy(plan.settings.policy), plan.settings.budget, chunk, reserve)
        again, flash_note = resolve_flash_attn(replace(plan.settings, flash_attn="auto"), facts, mem, wants_logprobs,
                                               keeps_copy, context)
        plan = replace(plan, settings=again)
    if flash_note:
        return replace(plan, note=f"{plan.note}; {flash_note}" if plan.note else flash_note)
    return plan


def _plan_budget(settings: RunSettings, facts: ModelFacts, sources: SourceSet, policy_chosen: bool, reserve: int,
                 mem: device_budget.DeviceMemory | None, notice: Callable[[str], None], policy: Policy | None,
                 keeps_copy: bool, asking: Asking, full: bool, wants_logprobs: bool,
                 question: str | None) -> ReadingPlan:
    """plan_reading's budget, flash attention already resolved: `--budget auto`, or `--policy full`'s
    context for a budget the user named."""
    chunk = settings.chunk
    if settings.budget != AUTO:  # --policy full --budget N: a context of N cells, as asked
        limit, why = settings.budget, f"--budget {settings.budget}"
    else:
        assert mem is not None  # plan_reading reads the device whenever the budget is auto
        plan = device_budget.plan_cells(facts, mem, chunk, logit_rows=chunk if wants_logprobs else 1,
                                        keeps_copy=keeps_copy, flash_attn=settings.flash_attn == "on",
                                        besides=0 if full else locator_bytes(facts, settings, sources))
        limit, why = plan.cells, plan.reason
    n_ctx_train = facts.n_ctx_train or limit
    # stdin and pipes have no size: read them ahead as far as an input that fits can reach, so one that
    # ends within it is counted (and read whole, as a file of that size would be), not sent to the pot
    sources.read_ahead(min(limit, n_ctx_train) * MAX_BYTES_PER_TOKEN, notice=notice)
    counted = count_input(facts, settings.prompt, sources, min(limit, n_ctx_train), question)
    tokens = None if counted is None else counted.tokens
    if full:
        exact = counted is None or counted.complete
        cells = device_budget.full_context(n_ctx_train, tokens, reserve, chunk, limit, exact=exact,
                                           asked=settings.budget != AUTO)
        note = (f"full attention over {tokens:,} tokens" if tokens is not None
                else f"full attention, up to {cells:,} tokens (stdin: length unknown)")
        return ReadingPlan(replace(settings, budget=cells), f"{note}; the most that fits: {why}", policy, counted)
    device, complete = device_budget.DevicePlan(limit, why), counted is None or counted.complete
    reading = device_budget.choose_reading(device, n_ctx_train, tokens, reserve, chunk, complete=complete)
    if reading.mode == "pot" and not policy_chosen and settings.policy == RunSettings.policy:
        # the default path past the window: the pot measured best for this model, where it was measured
        measured = measured_pot(facts, asking)
        if measured:
            reading = device_budget.choose_reading(device, n_ctx_train, tokens, reserve, chunk, complete=complete,
                                                   default_pot=measured)
    if reading.mode == "full" and not policy_chosen:
        # the settings' policy was built only to learn what its steps need (the device plan's logit rows)
        return ReadingPlan(replace(settings, policy="full", budget=reading.cells), f"budget auto: {reading.reason}",
                           make_policy("full"), counted)
    if reading.mode == "full":  # the user's policy, at the largest budget (it will not need to evict)
        pot = device_budget.pot_cells(limit, n_ctx_train, reserve, chunk)
        return ReadingPlan(replace(settings, budget=pot), f"budget auto: {settings.policy} with {pot:,} cells ({why})",
                           policy, counted)
    return ReadingPlan(replace(settings, budget=reading.cells), f"budget auto: {reading.reason}", policy, counted)

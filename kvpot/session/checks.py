"""Checks that run before llama.cpp sees a combination of options it would abort on or choke on.

Each refusal is one KvpotError line that names the command-line option to change. The stages:
- `check_cli_numbers`: option values on their own (no model needed);
- `check_budget`: a budget the policy can never work with (SnapKV's window, StreamingLLM's sinks, ...),
  which the policy itself would only find at its first compaction, after loading and reading;
- `check_memory`: what the context and its buffers will take, from the GGUF header, before the
  model is loaded (a huge --budget or --chunk otherwise fails after a long wait);
- `check_pot_room`: with the model loaded and the question known, whether the policy's catalyst
  (InfiniPot's CaP, which holds the question) leaves room to read after a compaction.
"""

from __future__ import annotations

import copy
import os
import shutil

import numpy as np

from kvpot.engine import MIN_TURN_ROOM
from kvpot.errors import KvpotError
from kvpot.models.gguf_file import ModelFacts
from kvpot.models.registry import shipped_adapter_for
from kvpot.policies import BudgetTooSmall, ExternalMemory, GraphPieces, LengthAware, Policy, build_policy, make_policy
from kvpot.session.auto_budget import MEMORY_ENV, ContextCost, context_cost, device_memory
from kvpot.wording import size_text

# llama.cpp keeps context and batch sizes in uint32 and positions in int32; ctypes would wrap larger values:
# the bound every cell count is checked against, wherever it comes from (options, the config file, a saved
# context's header)
MAX_CELLS = 1 << 30
# room for the first question's tokens in the answer reserve (longer questions go through the pot)
QUESTION_ROOM = 128


def answer_reserve(settings) -> int:
    """Cells a session keeps past the budget for the first question, the answer and the next turn: what
    `check_settings_fit` checks before the model loads and what Session sizes its context with.
    `settings`: a RunSettings (kvpot.session.settings, which imports this module for its checks)."""
    return settings.max_tokens + MIN_TURN_ROOM + QUESTION_ROOM


def cpu_cores() -> int:
    return os.cpu_count() or 1


def check_threads(threads: int | None, option: str = "--threads") -> None:
    if threads is None:
        return
    cores = cpu_cores()
    if threads < 1:
        raise KvpotError(f"{option} must be at least 1, got {threads} (leave it out to use every core)")
    if threads > cores:
        raise KvpotError(f"{option} {threads} is more than the {cores} CPU cores of this machine "
                         f"(more threads than cores only slows llama.cpp down)")


def check_cli_numbers(budget: int | None, chunk: int | None, threads: int | None, max_tokens: int | None) -> None:
    """Ranges of the numeric options of ask/chat, named as the user typed them."""
    check_threads(threads)
    for value, option in ((budget, "--budget"), (chunk, "--chunk")):
        if value is not None and value > MAX_CELLS:
            raise KvpotError(f"{option} {value:,} is larger than llama.cpp can address ({MAX_CELLS:,} cells)")
    if max_tokens is not None and max_tokens > MAX_CELLS:
        raise KvpotError(f"--n-predict {max_tokens:,} is larger than any context ({MAX_CELLS:,})")


def check_budget(policy: Policy | str, budget: int, chunk: int, option: str = "--budget",
                 expected_tokens: int | None = None) -> Policy:
    """Refuse a budget the policy cannot work with, before the model loads: the policy sized as the
    engine will size it (`Policy.fit`). `policy`: the session's own, fitted here once (the engine's
    fit then does nothing), or a spec, built for this check alone (commands that start the engine
    elsewhere, a benchmark's worker). `expected_tokens`: the input's estimated length, where a
    policy's smallest step depends on it (IMDC's m_0). Returns the fitted policy."""
    try:
        if isinstance(policy, str):
            policy = make_policy(policy)
        policy.fit(budget, chunk)
        if expected_tokens:
            # declared on a copy: a declared length shrinks IMDC's cache_cells to this estimate's
            # schedule, while the engine sizes its context for every schedule (c + m_max) and the session
            # declares the length it counts as reading starts
            LengthAware.of(copy.deepcopy(policy)).set_expected_length(expected_tokens)
    except BudgetTooSmall as e:
        if e.least is None:  # another parameter of the policy must change, not the budget
            raise
        raise BudgetTooSmall(f"{e}; raise {option} to at least {e.least}", least=e.least) from None
    return policy


def check_disk(facts: ModelFacts, policy: Policy, n_tokens: int | None, free_bytes=None) -> None:
    """Refuse, before reading, an input whose files on disk (InfLLM's block store) would not fit the
    free space of their folder, with the numbers and what would fit. `n_tokens`: the input's estimated
    length (None: unknown, e.g. a pipe, and nothing is checked); `free_bytes`: the folder's free bytes
    (default: what the file system says)."""
    if not n_tokens:
        return
    need = ExternalMemory.of(policy).disk_need(facts, n_tokens)
    if need is None:
        return
    nbytes, folder, ways = need
    probe = folder
    while not probe.exists() and probe != probe.parent:  # KVPOT_HOME/blocks is made at the first block
        probe = probe.parent
    unwritable = _unwritable(probe)
    if unwritable:  # a read-only disk reports no free space: say what is wrong with it, not that it is full
        raise KvpotError(f"{policy.name}: reading about {n_tokens:,} tokens writes about {size_text(nbytes)} of "
                         f"blocks to {folder}, but {probe} {unwritable}; {ways}")
    if free_bytes is None:
        try:
            free_bytes = shutil.disk_usage(probe).free
        except OSError:
            return  # a folder the OS cannot measure: the write itself reports a full disk
    if nbytes <= free_bytes:
        return
    raise KvpotError(f"{policy.name}: reading about {n_tokens:,} tokens writes about {size_text(nbytes)} to {folder}, "
                     f"which has {size_text(free_bytes)} free; free space there, {ways}, or read less")


def _unwritable(folder) -> str | None:
    """What keeps kvpot from writing in `folder` (a read-only file system, a folder without write
    permission), as the rest of a sentence; None when it can."""
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "is on a read-only file system"
    except (OSError, AttributeError):  # no statvfs (Windows): the permission check below still runs
        pass
    if not os.access(folder, os.W_OK | os.X_OK):
        return "is not writable (no write permission)"
    return None


def check_adapters(policy: Policy | str, model_path) -> None:
    """The trained parts a policy runs in llama.cpp (Locret's retaining heads, EdgeInfinite's memory
    gate), read and checked against the model: for commands that do work before they build the engine
    (a benchmark measures stock llama.cpp first, `ask` plans the budget and says so), so that a wrong or
    missing adapter is said first, as the only line. `policy`: the policy or its spec."""
    if isinstance(policy, str):
        policy = make_policy(policy)
    pieces = GraphPieces.of(policy)
    shipped = shipped_adapter_for(pieces.adapter_kind, model_path)
    pieces.retaining_heads(model_path, shipped)
    pieces.memory_gate(model_path, shipped)


# -- memory ---------------------------------------------------------------------------------------

def memory_need(facts: ModelFacts, n_ctx: int, n_batch: int, flash_attn: bool = False) -> ContextCost:
    """What a context of n_ctx cells read in n_batch-token steps takes besides the weights: the same
    cost model `--budget auto` plans with (kvpot.session.auto_budget), every row of a step given logits
    (the most a policy asks for: NuC scores each token)."""
    return context_cost(facts, n_ctx, n_batch, logit_rows=n_batch, flash_attn=flash_attn)


def available_memory() -> int | None:
    """Free memory as `--budget auto` sees it (KVPOT_DEVICE_MEMORY, else the OS); None when unknown."""
    try:
        return device_memory().free_bytes
    except KvpotError:
        return None


def _gib(n: int) -> str:
    return size_text(n)


def check_settings_fit(facts: ModelFacts, settings, policy: Policy | None = None) -> None:
    """The context `Session` would create for these settings, checked before the model loads.
    `policy`: the session's, fitted to the settings (check_budget); without one it is built here."""
    reserve = answer_reserve(settings)
    if policy is None:
        policy = build_policy(settings.policy, settings.budget, settings.chunk)  # refuses a budget it cannot honour
    n_ctx = policy.cache_cells(settings.budget, settings.chunk) + reserve
    check_memory(facts, n_ctx, settings.chunk, settings.budget, settings.chunk, settings.max_tokens,
                 flash_attn=settings.flash_attn == "on")


def check_memory(facts: ModelFacts, n_ctx: int, n_batch: int, budget: int, chunk: int,
                 max_tokens: int = 0, available: int | None = None, flash_attn: bool = False) -> None:
    """Refuse a context that cannot fit the memory left, naming the option that makes it big."""
    if n_ctx > MAX_CELLS:
        raise KvpotError(f"a context of {n_ctx:,} cells is larger than llama.cpp can address; "
                         "lower --budget, --chunk or --n-predict")
    avail = available_memory() if available is None else available
    if avail is None:
        return
    need = memory_need(facts, n_ctx, min(n_batch, n_ctx), flash_attn)  # llama.cpp caps n_batch at n_ctx
    if need.total <= avail:
        return
    # what grows with the context's cells (KV, and the scores of a step over them) names the option that
    # made the context big: --budget, --n-predict (the answer's room) and, for policies that read a chunk
    # on top of the budget, --chunk; what grows with the step alone (logits, activations) names --chunk
    if need.kv + need.scores >= need.logits + need.activations:
        sizes = {"--budget": budget, "--n-predict": max_tokens}
        if n_ctx >= budget + chunk:
            sizes["--chunk"] = chunk
        option = max(sizes, key=sizes.get)
        hint = f"lower {option} (now {sizes[option]:,})"
        if need.scores > need.kv and option != "--chunk":
            hint += f" or --chunk (now {chunk:,})"
    else:
        hint = f"lower --chunk (now {chunk:,})"
    raise KvpotError(f"a context of {n_ctx:,} cells with {n_batch:,}-token steps needs about {_gib(need.total)} "
                     f"(KV {_gib(need.kv)}, logits {_gib(need.logits)}, attention and activations "
                     f"{_gib(need.scores + need.activations)}); "
                     f"{_gib(avail)} is available: {hint}")


def check_context_fits(facts: ModelFacts, header: dict, path, available: int | None = None) -> None:
    """A saved context reopened makes the context it was saved with (its n_ctx cells, read in its chunks,
    with or without flash attention): the same memory check a new read's settings get (check_settings_fit),
    before the model loads. A context saved on a larger machine is refused with the numbers; its options
    cannot change it, so the way out is reading the files again with a smaller budget."""
    settings = header["settings"]
    n_ctx, chunk = header["n_ctx"], settings["chunk"]
    avail = available_memory() if available is None else available
    if avail is None:
        return
    need = memory_need(facts, n_ctx, min(chunk, n_ctx), flash_attn=settings.get("flash_attn") == "on")
    if need.total <= avail:
        return
    where = f" ({MEMORY_ENV})" if os.environ.get(MEMORY_ENV) else ""
    raise KvpotError(f"saved context {path} holds a context of {n_ctx:,} cells, which needs about "
                     f"{size_text(need.total)} (KV {size_text(need.kv)}, logits {size_text(need.logits)}, attention "
                     f"and activations {size_text(need.scores + need.activations)}); {size_text(avail)} is "
                     f"available here{where}: it was saved where more memory was free; read the files again "
                     "with a smaller --budget")


def threads_for_machine(threads: int, where: str) -> tuple[int, str | None]:
    """A thread count that came from a file (a saved context, the config file), at most this machine's
    cores (more threads than cores only slows llama.cpp down), with a line saying so when it was lowered."""
    cores = cpu_cores()
    if threads <= cores:
        return threads, None
    return cores, f"{where} asks for {threads} threads; this machine has {cores} CPU cores: using {cores}"


# -- the pot's room for a catalyst ----------------------------------------------------------------

def check_pot_room(engine, budget_option: str = "--budget") -> None:
    """After a compaction the pot must still take the catalyst and at least one new token, or the
    engine would read past the budget (into the answer reserve) or a policy would find nothing to
    drop. Said before reading, with the question's share when the catalyst holds it."""
    policy = engine.policy
    text = engine.catalyst_text()
    n_cat = len(engine.model.tokenize(text)) if text else 0
    if not n_cat:
        return
    capacity = engine._capacity()
    budget = engine.config.budget
    # what stays after a compaction: the first step's and the last (IMDC's grows to m_max)
    kept = max(int(np.max(policy.budget_at(0, budget))), int(np.max(policy.budget_at(1 << 40, budget))))
    room = capacity - kept - n_cat
    if room >= 1:
        return
    question = getattr(policy, "_question", None)
    n_q = len(engine.model.tokenize(question)) if question else 0
    who = (f"the question is too long for the budget: {policy.name}'s catalyst prompt, which holds the question "
           f"({n_q} tokens), is {n_cat} tokens") if n_q else f"{policy.name}'s catalyst prompt is {n_cat} tokens"
    # a bare `infinipot` sizes the pot from the budget (|M| = budget, |C| = budget / 2)
    if capacity == budget and kept == budget // 2:
        fix = f"raise {budget_option} to at least {2 * (n_cat + 1)}"
    else:
        fix = f"make the pot at least {kept + n_cat + 1} cells (pot = keep + catalyst + 1) or lower keep"
    raise KvpotError(f"{who}, and a pot of {capacity} cells that keeps {kept} leaves no room to read: {fix}"
                     + (" or ask a shorter question" if n_q else ""))

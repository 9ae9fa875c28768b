"""The reading plan: every setting of one reading, from the caller's options to what the engine runs.

`plan_read` merges the options over the config file and the model's registry defaults once, builds the
policy once and fits it once to the budget (resolved from the device where it is `auto`, with the reason),
collects the inputs, and runs every check that can refuse before the model loads. What it returns, a
`Plan`, is all `Plan.open` needs to load the model: nothing is looked up again on the way to the engine.
`reopen` is the same for a saved context. Nothing here writes to a terminal: what is worth saying goes
to the `notice` callback or into `Plan.notes`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import kvpot.policies
from kvpot.errors import KvpotError
from kvpot.ingest import SourceSet, collect_sources
from kvpot.ingest.sources import STDIN, STDIN_PROMPT
from kvpot.models.gguf_file import ModelFacts
from kvpot.models.registry import KNOWN, shipped_adapter_for
from kvpot.models.resolve import resolve_model
from kvpot.policies import Policy, make_policy
from kvpot.policies.base import Wrapping
from kvpot.safe_write import protect, resolve_target
from kvpot.session.beyond_window import Asking
from kvpot.session.checks import (
    check_adapters,
    check_budget,
    check_cli_numbers,
    check_context_fits,
    check_disk,
    check_pot_room,
    check_settings_fit,
    check_threads,
    threads_for_machine,
)
from kvpot.session.context_file import check_context_path, read_context
from kvpot.session.reading_plan import TokenCount, count_input, plan_reading
from kvpot.session.session import BYTES_PER_TOKEN_GUESS, Session, answer_reserve
from kvpot.session.settings import (
    AUTO,
    KEYS,
    RunSettings,
    config_path,
    reads_in_full,
    resolve_settings_and_policy,
    set_in_config,
    setting_problem,
)
from kvpot.state.read_point import ReadStopped, cannot_continue

# what a command imports from here: the plan and its parts, and the checks a command that plans no reading runs
# through the API too (check_adapters: a bench's adapters against its model; check_threads: `kvpot train`'s)
__all__ = ["Notice", "Plan", "check_adapters", "check_locator", "check_option_names", "check_policy", "check_threads",
           "estimated_tokens", "known_policies", "parse_budget", "plan_read", "policy_files", "protect_recorded_inputs",
           "protect_session_files", "reopen", "run_settings", "set_question"]

Notice = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    """One reading, decided: the merged and resolved settings (the budget a number), the policy built
    from them and fitted to that budget, the model's facts, the inputs, and why the budget is what it is.
    Opened once (`open`): the policy belongs to the one engine that runs it (`again` copies the plan for
    another session)."""

    settings: RunSettings
    policy: Policy
    facts: ModelFacts
    model_name: str                # the registry's name, or the file's
    sources: SourceSet
    reason: str | None             # why the budget and flash attention are what they are (budget auto)
    counted: TokenCount | None     # the input's tokens, counted before reading where it has a size
    expected_tokens: int | None    # the input's length guessed from its size (what the policy is told)
    question: str | None           # known before reading: InfiniPot's catalyst (CaP-Q)
    resettable: bool               # a copy of the read state is kept for a reset (chat's /reset)
    notes: tuple[str, ...] = ()    # what the inputs and the settings gave, to say once nothing is refused

    def again(self, resettable: bool | None = None) -> Plan:
        """The same reading for another session (a benchmark reads one input once per question): its own copy
        of the fitted policy, since a policy belongs to the one engine that runs it; `resettable` as given."""
        return dataclasses.replace(self, policy=copy.deepcopy(self.policy),
                                   resettable=self.resettable if resettable is None else resettable)

    def open(self) -> Session:
        """Load the model and make the session that reads the inputs (the question set where it is known)."""
        session = Session(self.facts, self.model_name, self.settings, policy=self.policy,
                          resettable=self.resettable)
        try:
            session.counted = self.counted if self.counted is not None else self._count(session)
            if self.question:
                session.set_question(self.question)
            check_pot_room(session.engine)  # a catalyst (and question) the pot cannot take: said before reading
        except BaseException:
            session.close()
            raise
        return session

    def _count(self, session: Session) -> TokenCount | None:
        """A pot of a named size is not counted while planning (nothing is decided by the count), but the
        line said before reading and the progress then give one exact length rather than two guesses from
        the size: counted with the loaded model's vocabulary, up to its window (past it "more than N")."""
        window = self.facts.n_ctx_train
        if not window or reads_in_full(self.settings.policy):
            return None
        before = self.question if self.settings.question_before == "on" else None
        return count_input(self.facts, self.settings.prompt, self.sources, window, before, vocab=session.engine.model)


def parse_budget(raw: str | int | None) -> int | str | None:
    """A budget as given: a number of cells (text or int), `auto`, or None (not given)."""
    if raw is None or raw == AUTO or (isinstance(raw, int) and not isinstance(raw, bool)):
        return raw
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise KvpotError(f"--budget must be a number of cells or {AUTO}, got {raw!r}") from None


def check_locator(value: str) -> str:
    """A locator asked for after reading (a reopened context's questions; a new reading's is checked with
    the other settings)."""
    problem = setting_problem("locator", value)
    if problem:
        raise KvpotError(f"--locator {problem}")
    return value


def run_settings(model: str, policy=None, budget=None, chunk=None, threads=None, prompt=None, max_tokens=None,
                 flash_attn=None, question_before=None, locator=None) -> tuple[RunSettings, Policy]:
    """The options merged over the config file and the model's registry defaults, checked, with the
    policy they name: built once, here, and the one the session runs. A bad spec is refused before the
    model loads, and so is a budget the policy cannot honour (fitted to it, naming where the budget
    was set); an automatic budget is fitted once it is resolved (plan_read)."""
    budget = parse_budget(budget)
    check_cli_numbers(budget if budget != AUTO else None, chunk, threads, max_tokens)
    known = KNOWN.get(model)
    given = {"policy": policy, "budget": budget, "chunk": chunk, "threads": threads, "prompt": prompt,
             "max_tokens": max_tokens, "flash_attn": flash_attn, "question_before": question_before,
             "locator": locator}
    return resolve_settings_and_policy(known.name if known else None, known.defaults if known else {}, given)


def check_policy(spec: str, budget: int | None = None, chunk: int | None = None, model_path: Path | None = None,
                 expected_tokens: int | None = None) -> Policy:
    """A policy spec as a bench names it, built and checked before any model loads: fitted to `budget` where one
    is given (read `chunk` tokens a step: RunSettings' default where None; `expected_tokens`: the longest input,
    for a policy whose smallest step depends on it), and its adapters checked against the model at `model_path`."""
    chunk = RunSettings.chunk if chunk is None else chunk
    policy = check_budget(spec, budget, chunk, expected_tokens=expected_tokens) if budget else make_policy(spec)
    if model_path is not None:
        check_adapters(policy, model_path)
    return policy


def known_policies() -> list[str]:
    """Every policy kvpot runs by name, the ones registered from outside kvpot included (for help texts): the
    registry as it is when asked."""
    return list(kvpot.policies.POLICIES)


def check_option_names(options: dict) -> None:
    """Options a reading takes are RunSettings' keys; any other name is one line, before anything else."""
    unknown = sorted(set(options) - set(KEYS))
    if unknown:
        raise KvpotError(f"unknown setting {unknown[0]!r} (settings: {', '.join(KEYS)})")


def _innermost(policy: Policy) -> Policy:
    while isinstance(policy, Wrapping):
        policy = policy.wrapped
    return policy


def policy_files(policy: Policy, model_path: Path) -> list[tuple[Path, str]]:
    """The files a policy reads or writes beside the model, with what each is: Locret's retaining
    heads and EdgeInfinite's memory gate (named in the spec, else the ones shipped for the model), and
    InfLLM's block store (store=; a store of its own making is new, under KVPOT_HOME)."""
    inner = _innermost(policy)
    out: list[tuple[Path, str]] = []
    for field, kind, role in (("heads", "locret", "the retaining-heads adapter"),
                              ("gate", "edgeinfinite", "the memory-gate adapter")):
        if inner.name != kind:
            continue
        named = getattr(inner, field, "")
        if named and named not in ("init", "closed"):  # gate=init / gate=closed are built, not read
            out.append((Path(named).expanduser(), role))
        elif not named:
            shipped = shipped_adapter_for(kind, model_path)
            if shipped is not None:
                out.append((shipped, role))
    store = getattr(inner, "store", None) if inner.name == "infllm" else None
    if store:
        out.append((Path(store).expanduser(), "the InfLLM block store"))
    return out


def protect_session_files(policy: Policy, model_path: Path, save_to: Path | str | None) -> None:
    """The model and the policy's files are never replaced by a save of this reading, and a save path
    that names one of them (or an input, protected as it was collected) is refused now, before anything
    is read."""
    protect(model_path, "the model")
    for path, role in policy_files(policy, model_path):
        protect(path, role)
    if save_to is not None:
        resolve_target(save_to, "context")


def estimated_tokens(sources: SourceSet) -> int | None:
    """The input's length as the session will declare it to the policy when reading starts."""
    # the text's size (a compressed file's where its format says it): the compressed size would understate it
    return int(sources.text_bytes / BYTES_PER_TOKEN_GUESS) if sources.text_bytes else None


def plan_read(inputs: list[str], model: str, question: str | None = None, *, glob: str | Iterable[str] = ("*",),
              exclude: Iterable[str] = (), save_to: Path | str | None = None, resettable: bool | None = None,
              focus: bool = False, verbose: bool = False, notice: Notice = lambda msg: None, stdin=None,
              question_first: bool | None = None, **options) -> Plan:
    """The plan for reading `inputs` (files, folders, or "-" for `stdin`, a binary stream) with `model` (a
    registry name or a GGUF path), with everything that can be refused refused before the model loads:
    the options (RunSettings' keys; None: not given), the inputs, the budget, the memory and the disk, a
    save that would replace a file the reading reads. `question`: known before reading (`kvpot ask`), it
    steers the pot; `resettable`: keep a copy of the read state for a reset (default: when no question is
    given); `focus`: questions past the pot are answered from a focused read of the inputs, which the
    default pot is sized for where the inputs can be read again; `question_first`: a question is known before
    reading though not given here (a benchmark plans one reading before it sets each question; None: when
    `question` is given), which the default pot is sized for. `notice` hears what must be said at once (a prompt
    to type the document, a stream read ahead); the rest waits in Plan.notes."""
    check_option_names(options)
    settings, policy = run_settings(model, **options)  # options first: they are cheap to check
    notes: list[str] = []
    if options.get("threads") is None:  # a given thread count was checked against the cores; the config file's is lowered
        threads, lowered = threads_for_machine(settings.threads, f"the config file {config_path()}")
        if lowered:
            settings = dataclasses.replace(settings, threads=threads)
            notes.append(lowered)

    def hold(msg: str) -> None:
        (notice if msg.startswith(STDIN_PROMPT) else notes.append)(msg)

    sources = collect_sources(inputs, glob, notice=hold, exclude=exclude, verbose=verbose, stdin=stdin)
    # what reading meets (a PDF's damaged page) is said as it is met (and listed in sources.warnings)
    sources.warn = notice
    facts, known = resolve_model(model)
    protect_session_files(policy, facts.path, save_to)
    # a policy named by an option or in the config file is the user's: the plan sizes it, never replaces it
    chosen = options.get("policy") is not None or set_in_config("policy", model if model in KNOWN else None)
    if chosen:
        check_adapters(policy, facts.path)  # a named policy's adapters, before the plan says anything
    resettable = question is None if resettable is None else resettable
    reading = plan_reading(settings, facts, sources, policy_chosen=chosen, reserve=answer_reserve(settings),
                           notice=notice, policy=policy, keeps_copy=resettable,
                           asking=Asking.of(question is not None if question_first is None else question_first,
                                            focus and sources.can_read_again()),
                           question=question)
    settings, policy = reading.settings, reading.policy
    # the policy fitted to the budget now that it is known (auto, full attention's), and a policy whose
    # smallest step depends on the input's length (IMDC's m_0) checked against it; a budget fitted with
    # the settings is not fitted again (Policy.fit)
    expected = estimated_tokens(sources)
    check_budget(policy, settings.budget, settings.chunk, expected_tokens=expected)
    check_settings_fit(facts, settings, policy)  # a context that cannot fit is refused before the model loads
    check_disk(facts, policy, expected)  # and a block store that cannot fit the disk
    return Plan(settings, policy, facts, known.name if known else facts.name, sources, reading.note or None,
                reading.counted, expected, question or None, resettable, tuple(notes))


def protect_recorded_inputs(header: dict) -> None:
    """The inputs a saved context was read from are never replaced by a save of the reading that reopens
    it: by the names they were read under (relative to the folder it runs in, as sources name them) and by
    the absolute paths a stopped read recorded to go on."""
    names = [s["name"] for s in header.get("sources", ()) if isinstance(s, dict) and isinstance(s.get("name"), str)]
    point = header.get("read_point")
    if isinstance(point, dict):
        names += [p for _, p in point.get("sources", ()) if isinstance(p, str)]
    for name in names:
        if name and name != STDIN and "\0" not in name:
            protect(name, f"the input {name} this context was read from")


def reopen(context: Path | str, model: str | None = None, threads: int | None = None, max_tokens: int | None = None,
           save_to: Path | str | None = None, resettable: bool = True, go_on: bool = False,
           notice: Notice = lambda msg: None, loading: Callable | None = None) -> Session:
    """A saved context reopened, checked before the model loads (the file, the model it names or `model`,
    the memory its size takes); `resettable` False for a session that answers once (no copy kept for a
    reset); `go_on`: it is to read on, which a context with no read point is refused. `loading`: a context
    manager around the load (a status line)."""
    check_threads(threads)
    context = check_context_path(context)
    # read and checked once: the state stays in the file (restored from there), and the session restores
    # the very file whose header chose the model
    saved = read_context(context, seq_in_file=True)
    header = saved.header
    if go_on and "read_point" not in header:
        stopped = ReadStopped.from_header(header["read_stopped"]) if "read_stopped" in header else None
        raise KvpotError(cannot_continue(context, stopped, header["turns"]))
    name = model or header["model"]["name"]
    if model is None and name not in KNOWN:
        name = header["model"]["path"]
    facts, known = resolve_model(name)
    # the memory the saved context's size takes, checked as a new read's is (a context saved on a larger
    # machine is refused here, before the model loads)
    check_context_fits(facts, header, context)
    # the saved policy, built once for the files it names and the session; reading the file checked its
    # state against a policy of its own (context_file.check_saved, which runs with no session)
    policy = make_policy(header["policy"])
    protect_recorded_inputs(header)
    protect_session_files(policy, facts.path, save_to)
    if threads is None:  # the saved thread count, at most this machine's cores (a given one is checked above)
        threads, lowered = threads_for_machine(header["settings"]["threads"], f"{context}")
        if lowered:
            notice(lowered)
    with loading() if loading is not None else contextlib.nullcontext():
        session = Session.reopen(context, facts, known.name if known else facts.name, threads, policy=policy,
                                 resettable=resettable, saved=saved)
    if max_tokens is not None:  # the answer's length is not part of the saved state
        session.set_max_tokens(max_tokens)
    return session


def set_question(session: Session, question: str) -> None:
    """The question a reopened reading answers next (or reads the rest of its inputs with), set as its catalyst
    where the policy has one: a question the pot cannot take beside the catalyst is refused before it is read,
    naming the budget the files were read with."""
    session.set_question(question)
    check_pot_room(session.engine, budget_option="the --budget the files are read with")

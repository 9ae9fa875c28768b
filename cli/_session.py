"""The one answering path every command shares (ask, chat, run, demo): settings from the options,
a Session opened or reopened, answers streamed to stdout, contexts saved. Terminal-facing; the
session itself (kvpot.session.session) knows nothing about terminals."""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from kvpot.display import printable
from kvpot.errors import KvpotError
from kvpot.ingest import SourceSet, collect_sources
from kvpot.ingest.sources import STDIN, STDIN_PROMPT
from kvpot.models.registry import KNOWN
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
from kvpot.session.locating import HOW
from kvpot.session.reading_plan import plan_reading
from kvpot.session.sampling import Sampler
from kvpot.session.session import BYTES_PER_TOKEN_GUESS, Session, answer_reserve
from kvpot.session.settings import (
    AUTO,
    RunSettings,
    reads_in_full,
    resolve_settings_and_policy,
    set_in_config,
    setting_problem,
)
from kvpot.wording import plural

from ._common import err, is_verbose, print_error, write_out
from ._interrupt import Interrupts
from .reading import QuestionProgress, plain_every_s, read_with_progress


def parse_budget(raw: str | None) -> int | str | None:
    if raw is None or raw == AUTO:
        return raw
    try:
        return int(raw)
    except ValueError:
        raise KvpotError(f"--budget must be a number of cells or {AUTO}, got {raw!r}") from None


def check_locator(value: str) -> str:
    """--locator on a reopened context (a new reading's is checked with the other settings)."""
    problem = setting_problem("locator", value)
    if problem:
        raise KvpotError(f"--locator {problem}")
    return value


def run_settings(model: str, policy, budget, chunk, threads, prompt, max_tokens,
                 flash_attn=None, question_before=None, locator=None) -> tuple[RunSettings, Policy]:
    """The options merged over the config file and the model's registry defaults, checked, with the
    policy they name: built once, here, and the one the session runs. A bad spec is refused before the
    model loads, and so is a budget the policy cannot honour (fitted to it, naming where the budget
    was set); an automatic budget is fitted once it is resolved (new_session)."""
    budget = parse_budget(budget)
    check_cli_numbers(budget if budget != AUTO else None, chunk, threads, max_tokens)
    known = KNOWN.get(model)
    cli = {"policy": policy, "budget": budget, "chunk": chunk, "threads": threads, "prompt": prompt,
           "max_tokens": max_tokens, "flash_attn": flash_attn, "question_before": question_before, "locator": locator}
    return resolve_settings_and_policy(known.name if known else None, known.defaults if known else {}, cli)


def _innermost(policy: Policy) -> Policy:
    while isinstance(policy, Wrapping):
        policy = policy.wrapped
    return policy


def policy_files(policy: Policy, model_path: Path) -> list[tuple[Path, str]]:
    """The files a policy reads or writes beside the model, with what each is: Locret's retaining
    heads and EdgeInfinite's memory gate (named in the spec, else the ones shipped for the model), and
    InfLLM's block store (store=; a store of its own making is new, under KVPOT_HOME)."""
    from kvpot.models.registry import shipped_adapter_for

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
    """The model and the policy's files are never replaced by a save of this command, and a
    --save-context that names one of them (or an input, protected as it was collected) is refused
    now, before anything is read."""
    protect(model_path, "the model")
    for path, role in policy_files(policy, model_path):
        protect(path, role)
    if save_to is not None:
        resolve_target(save_to, "context")


# said when chat reads through a pot that keeps what the question would have chosen, had it been known
# chat past the pot, on files (cli/_focus.focused_turn)
FOCUS_EACH_QUESTION = (
    "past what the pot keeps, each question finds its passages in the whole input ({how}) and reads them again "
    "with full attention before answering")
READ_BEFORE_THE_QUESTION = (
    "this reads before any question is asked, so the pot keeps what a summary of the input needs, not what "
    "your question will need: an answer about one detail may be what the model knows without the document. "
    "`/ask QUESTION` in the chat (or `kvpot ask FILE... QUESTION`) reads again with the question first and keeps "
    "what answers it (qwen2.5-coder-1.5b past its window: 6 of 8 answers right, against 2 of 8 read before the "
    "question; docs/benchmarks.md, Beyond the window)")


def new_session(inputs: list[str], glob: str | list[str], model: str, question: str | None,
                save_to: Path | str | None = None, exclude: list[str] | tuple = (), verbose: bool = False,
                resettable: bool | None = None, focus: bool = False, **opts) -> tuple[Session, SourceSet]:
    """A session for new inputs, with everything that can be refused refused before the model loads
    (options, inputs, the budget, the memory, a save that would replace a file the session reads),
    and the question set when it is known (CaP-Q). `resettable`: keep a copy of the read state for
    /reset (default: when no question is given; chat's /ask gives one and keeps the copy); `focus`: `ask`
    answers from a focused read where the pot leaves input out (kvpot.session.focus), which, on files that
    can be read again, the default pot is sized for."""
    settings, policy = run_settings(model, **opts)  # options first: they are cheap to check
    plain_every_s()  # and the environment's (KVPOT_PROGRESS_EVERY)
    def notice(msg: str) -> None:
        err.print(f"[yellow]{escape(printable(msg))}[/yellow]", soft_wrap=True)

    # what the inputs gave (the folders' summary, inputs skipped) is said once nothing is refused, so that
    # a refusal stays one line; a prompt to type the document on the terminal is said at once
    held: list[str] = []
    if opts.get("threads") is None:  # --threads was checked against the cores; the config file's is lowered to them
        from kvpot.session.settings import config_path

        threads, lowered = threads_for_machine(settings.threads, f"the config file {config_path()}")
        if lowered:
            settings = dataclasses.replace(settings, threads=threads)
            held.append(lowered)

    def hold(msg: str) -> None:
        (notice if msg.startswith(STDIN_PROMPT) else held.append)(msg)

    sources = collect_sources(inputs, glob, notice=hold, exclude=exclude, verbose=verbose)
    # what reading meets (a PDF's damaged page) is a notice too, said as it is met; --json also lists
    # it (inputs.warnings, from sources.warnings)
    sources.warn = notice
    facts, known = resolve_model(model)
    protect_session_files(policy, facts.path, save_to)
    # a policy named by an option or in the config file is the user's: the plan sizes it, never replaces it
    chosen = opts["policy"] is not None or set_in_config("policy", model if model in KNOWN else None)
    if chosen:
        check_adapters(policy, facts.path)  # a named policy's adapters, before the plan says anything
    # `ask` (a question given up front) answers once: it keeps no copy of the read state for a /reset
    resettable = question is None if resettable is None else resettable
    plan = plan_reading(settings, facts, sources, policy_chosen=chosen,
                        reserve=answer_reserve(settings), notice=notice, policy=policy, keeps_copy=resettable,
                        asking=Asking.of(question is not None, focus and sources.can_read_again()), question=question)
    settings, policy = plan.settings, plan.policy
    # the policy fitted to the budget now that it is known (auto, full attention's), and a policy whose
    # smallest step depends on the input's length (IMDC's m_0) checked against it; a budget fitted with
    # the settings is not fitted again (Policy.fit)
    expected = _estimated_tokens(sources)
    check_budget(policy, settings.budget, settings.chunk, expected_tokens=expected)
    check_settings_fit(facts, settings, policy)  # a context that cannot fit is refused before the model loads
    check_disk(facts, policy, expected)  # and a block store that cannot fit the disk
    for msg in held:
        notice(msg)
    if plan.note and is_verbose():  # the plan's reasons; the line before reading says what it comes to
        err.print(plan.note, soft_wrap=True)
    if question is None and (expected is None or expected > settings.budget) and not reads_in_full(settings.policy):
        if settings.locator != "pot" and sources.can_read_again():
            err.print(FOCUS_EACH_QUESTION.format(how=HOW[settings.locator]), soft_wrap=True)
        elif policy.reads_with_question():
            err.print(READ_BEFORE_THE_QUESTION, soft_wrap=True)
    with err.status(f"loading {facts.name}"):
        session = Session(facts, known.name if known else facts.name, settings, policy=policy,
                          resettable=resettable)
    session.counted = plan.counted
    if question:
        session.set_question(question)  # InfiniPot reads with the question as its catalyst (CaP-Q)
    check_pot_room(session.engine)  # a catalyst (and question) the pot cannot take: said before reading
    return session, sources


def _estimated_tokens(sources: SourceSet) -> int | None:
    """The input's length as the session will declare it to the policy when reading starts."""
    # the text's size (a compressed file's where its format says it): the compressed size would understate it
    return int(sources.text_bytes / BYTES_PER_TOKEN_GUESS) if sources.text_bytes else None


def protect_recorded_inputs(header: dict) -> None:
    """The inputs a saved context was read from are never replaced by a save of the command that reopens
    it: by the names they were read under (relative to the folder the command runs in, as --sources
    finds them) and by the absolute paths a stopped read recorded for --continue."""
    names = [s["name"] for s in header.get("sources", ()) if isinstance(s, dict) and isinstance(s.get("name"), str)]
    point = header.get("read_point")
    if isinstance(point, dict):
        names += [p for _, p in point.get("sources", ()) if isinstance(p, str)]
    for name in names:
        if name and name != STDIN and "\0" not in name:
            protect(name, f"the input {name} this context was read from")


def reopen_session(context: str, model: str | None, threads: int | None, max_tokens: int | None = None,
                   save_to: Path | str | None = None, resettable: bool = True, go_on: bool = False) -> Session:
    """A saved context reopened; `resettable` False for `ask`, which answers once (no copy kept for /reset);
    `go_on`: it is to read on (`--continue`), which a context with no read point is refused before loading."""
    from kvpot.session.context_file import check_context_path, read_context
    from kvpot.session.read_point import ReadStopped, cannot_continue, why_no_rest

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
    if threads is None:  # the saved thread count, at most this machine's cores (--threads is checked above)
        threads, lowered = threads_for_machine(header["settings"]["threads"], f"{context}")
        if lowered:
            err.print(f"[yellow]{escape(lowered)}[/yellow]", soft_wrap=True)
    with err.status(f"reopening {context}"):
        session = Session.reopen(context, facts, known.name if known else facts.name, threads, policy=policy,
                                 resettable=resettable, saved=saved)
    if max_tokens is not None:  # the answer's length is not part of the saved state
        session.set_max_tokens(max_tokens)
    err.print(f"reopened {context}: {session.doc_tokens:,} tokens of "
              f"{', '.join(s['name'] for s in session.sources)} in {session.engine.n_cells:,} cells")
    stopped = session.read_stopped
    if stopped is not None and session.read_point is None:  # one with a point says --continue reads the rest
        err.print(f"[yellow]the input was read only partly:[/yellow] {escape(stopped.describe())} before the read "
                  f"stopped; {escape(why_no_rest(stopped, session.turns))}: answers know only that part",
                  soft_wrap=True)
    return session


def continue_reading(session: Session, context: Path | str, question: str | None, save_to: Path | str | None) -> None:
    """Read the rest of the inputs a reopened context stopped in (`--continue`), with the question as the
    catalyst when it is known, as `ask` reads; saved again when stopped, as a new read is."""
    from kvpot.session.read_point import reopen_sources

    point = session.read_point
    if point is None:
        from kvpot.session.read_point import cannot_continue

        raise KvpotError(cannot_continue(context, session.read_stopped, session.turns))
    notices = []
    sources = reopen_sources(point, notice=notices.append)
    if question:
        session.set_question(question)
        check_pot_room(session.engine, budget_option="the --budget the files are read with")
    for msg in notices:
        err.print(f"[yellow]{escape(printable(msg))}[/yellow]", soft_wrap=True)
    read_with_progress(session, sources, save=None if save_to is None else lambda: save(session, save_to),
                       resume=point)


@dataclass(frozen=True)
class Answered:
    text: str        # what was written to stdout (without the closing newline)
    stopped: bool    # Ctrl-C ended it

    @property
    def empty(self) -> bool:
        return not self.text.strip()


def answer(session: Session, question: str, sampler: Sampler | None = None,
           stop_at: tuple[str, ...] = (), echo: bool = True) -> Answered:
    """Stream the answer to stdout (echo=False: only return it, for --json); Ctrl-C stops it. An empty
    answer is said on stderr (never a silent blank line), and so is an answer the loop guard ended."""
    said = ""
    t0 = time.perf_counter()
    progress = QuestionProgress()  # shown only when the question is read through the pot
    with Interrupts() as stop:
        try:
            pieces = session.ask(question, on_progress=progress.update, sampler=sampler, stop=stop_at)
            first = next(pieces, None)
        finally:
            progress.close()
        if session.conversation_dropped:
            err.print(f"[yellow]the context is full:[/yellow] its first tokens and the most recent stay, "
                      f"{session.conversation_dropped:,} cells between them make way for this turn "
                      f"(full attention turns into a StreamingLLM window)", soft_wrap=True)
        for piece in itertools.chain([] if first is None else [first], pieces):
            said += piece
            if echo:
                write_out(piece)
            if stop.hit:
                if echo:
                    write_out("\n")
                err.print("[yellow]answer stopped[/yellow]")
                return Answered(said, stopped=True)
    if echo:
        write_out("\n")
    if session.answer_loop:
        err.print(f"[yellow]answer stopped[/yellow] by {session.engine.stop_reason}", soft_wrap=True)
    done = Answered(said, stopped=False)
    if done.empty:
        err.print(f"[yellow]the model produced no answer[/yellow] (it ended at {session.engine.stop_reason})",
                  soft_wrap=True)
    else:
        err.print(f"answered in {time.perf_counter() - t0:.1f} s ({plural(session.engine.answer_tokens, 'token')})",
                  soft_wrap=True)
    return done


def save(session: Session, path: Path | str) -> bool:
    """Save the context; a failure is one line and the caller goes on (the answer, the chat)."""
    try:
        size = session.save(path)
    except KvpotError as e:
        print_error(str(e))
        return False
    err.print(f"context saved to {path} ({size / 2**20:,.1f} MiB)", soft_wrap=True)
    point = session.read_point
    if point is not None and session.turns == 0 and point.next_position == session.engine.tokens_seen:
        err.print(f"it holds the first {session.doc_tokens:,} tokens read; `kvpot ask --context {path} --continue "
                  f"QUESTION` (or `kvpot chat --context {path} --continue`) reads the rest of {point.names()}",
                  soft_wrap=True, markup=False)
    elif session.read_stopped is not None and session.read_stopped.stream:
        err.print(f"it holds the first {session.read_stopped.describe()}; the input was a "
                  "stream, which cannot be read again, so the rest can only be read with the whole input again",
                  soft_wrap=True, markup=False)
    return True

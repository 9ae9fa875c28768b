"""`kvpot ask` and `kvpot chat`: read files of any length into the pot, then answer about them."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from kvpot.api.answering import past_the_pot
from kvpot.api.document import Document
from kvpot.api.plan import check_locator, set_question
from kvpot.display import printable, require_utf8
from kvpot.errors import KvpotError
from kvpot.ingest import looks_like_input
from kvpot.ingest.sources import STDIN, stdin_is_piped
from kvpot.models.registry import KNOWN
from kvpot.safe_write import resolve_target
from kvpot.session.default_model import default_model
from kvpot.session.sampling import Sampler
from kvpot.session.settings import RunSettings

from ._chat_input import ChatInput, history_path
from ._common import (
    NO_ANSWER_EXIT,
    RPC_HELP,
    OutputFailed,
    connect_rpc,
    err,
    errors_as_json,
    print_error,
    require_stdout,
    set_verbosity,
    user_errors,
    write_out,
)
from ._focus import ON_TERMINAL, focus_report
from ._options import ADVANCED, MODEL_DEFAULT, MODEL_HELP, N_PREDICT_HELP, QuietOpt, VerboseOpt
from ._report import JsonOpt, SourcesOpt, answer_tracked, answer_with_sources, sources_text
from ._reread import NO_FILES, ReadingLost, Reread, read_again, worth_reading_again
from ._sampling import (
    DEFAULTS,
    MinPOpt,
    RepeatPenaltyOpt,
    SeedOpt,
    StopOpt,
    TempOpt,
    TopKOpt,
    TopPOpt,
    make_sampler,
    stops,
)
from ._session import Answered, continue_reading, new_session, reopen_session, save
from .reading import read_with_progress

if TYPE_CHECKING:  # the sessions here are opened by kvpot.api (cli/_session.py), never assembled
    from kvpot.session.session import Session

POLICY_HELP = "what the memory keeps (docs/methods.md)"

# the options ask and chat share (Typer reads type and help from these annotations)
# str, not Path: Path("") would read as "." and an empty path could not be told apart
# a None default is filled from the config file and the model's registry entry (kvpot.session.settings):
# show_default says what that comes to for a user who set neither
ContextOpt = Annotated[str, typer.Option("--context", metavar="PATH", show_default="none: read the files",
                                         help="reopen a saved context instead of files")]
SaveContextOpt = Annotated[str, typer.Option("--save-context", metavar="PATH", show_default="not saved",
                                             help="save the context here, a stopped read too")]
ContinueOpt = Annotated[bool, typer.Option(
    "--continue", help="with --context: finish a stopped read first")]
ModelOpt = Annotated[str, typer.Option("--model", "-m", metavar="MODEL", show_default=MODEL_DEFAULT,
                                       help=MODEL_HELP)]
PolicyOpt = Annotated[str, typer.Option("--policy", "-P", metavar="SPEC", show_default="full if it fits, or infinipot",
                                        help=POLICY_HELP)]
BudgetOpt = Annotated[str, typer.Option(
    "--budget", "-b", metavar="N|auto", show_default="auto",
    help="cells kept per layer and KV head, or auto: what the device holds")]
ChunkOpt = Annotated[int, typer.Option("--chunk", metavar="N", show_default=str(RunSettings.chunk),
                                       rich_help_panel=ADVANCED, help="tokens read per step")]
ThreadsOpt = Annotated[int, typer.Option("--threads", "-t", metavar="N", show_default="every core",
                                         rich_help_panel=ADVANCED, help="CPU threads")]
# --prompt-format, not llama.cpp's --chat-template: that one names which template, this one whether to use the
# model's own (its values are auto, chat, completion); -p/--prompt stays the question's text, as in llama.cpp
PromptFormatOpt = Annotated[str, typer.Option(
    "--prompt-format", metavar="FORMAT", show_default="the model's", rich_help_panel=ADVANCED,
    help="auto, chat or completion")]
# llama.cpp's -fa/--flash-attn takes on|off|auto; its auto asks whether the backend runs it, kvpot's whether
# the device's memory needs it (docs/budget.md)
FlashAttnOpt = Annotated[str, typer.Option(
    "--flash-attn", "-fa", metavar="MODE", show_default=RunSettings.flash_attn, rich_help_panel=ADVANCED,
    help="on, off or auto: on where memory needs it")]
FocusOpt = Annotated[bool, typer.Option(
    "--focus/--no-focus", rich_help_panel=ADVANCED,
    help="answer from the passages the pot found, reread in full")]
LocatorOpt = Annotated[str, typer.Option(
    "--locator", metavar="HOW", show_default=RunSettings.locator, rich_help_panel=ADVANCED,
    help="how questions find passages: bm25, keys, mix, pot")]
QuestionBeforeOpt = Annotated[str, typer.Option(
    "--question-before", metavar="on|off", show_default=RunSettings.question_before, rich_help_panel=ADVANCED,
    help="put the question before the document too")]
NPredictOpt = Annotated[int, typer.Option("--n-predict", "-n", metavar="N", show_default=str(RunSettings.max_tokens),
                                          help=N_PREDICT_HELP)]
# folder inputs: any number of --glob and --exclude patterns (each one given adds to the others)
GlobOpt = Annotated[list[str], typer.Option(
    "--glob", metavar="PATTERN", show_default="every file",
    help="which files of folders ('*.py'); repeatable")]
ExcludeOpt = Annotated[list[str], typer.Option(
    "--exclude", metavar="PATTERN", show_default="none",
    help="what to leave out of folders (.gitignore syntax); repeatable")]
RpcOpt = Annotated[str, typer.Option("--rpc", metavar="HOSTS", show_default="none",
                                     rich_help_panel=ADVANCED, help=RPC_HELP)]
# old spellings, accepted with a note on stderr for one release
ALIASES = {"--prompt": "--prompt-format", "--max-tokens": "--n-predict"}


def _refuse_ignored(context: Path | None, **given) -> None:
    """Options a saved context fixes are refused rather than silently ignored."""
    if context is None:
        return
    named = [opt for opt, value in given.items() if value is not None]
    if named:
        raise KvpotError(f"{', '.join(named)} cannot change a saved context (it was read with its own); "
                         "leave {} out, or read the files again".format("it" if len(named) == 1 else "them"))


def _open_session(inputs: list[str], question: str | None, context: Path | None, save_context: Path | None,
                  rpc: str | None, model: str | None, glob: list[str] | None, missing: str,
                  exclude: list[str] | None = None, verbose: bool = False, resettable: bool | None = None,
                  go_on: bool = False, focus: bool = False, **opts) -> Session:
    """The session ask and chat work in: a saved context reopened, or the inputs read with progress.
    What cannot work is said before a model loads: options a saved context fixes, both files and
    --context, no files, a --save-context path that cannot be written or that names a file the
    session reads (an input, the model, an adapter, a block store)."""
    _refuse_ignored(context, **{"--policy": opts["policy"], "--budget": opts["budget"], "--chunk": opts["chunk"],
                                "--prompt-format": opts["prompt"], "--glob": glob or None,
                                "--exclude": exclude or None, "--question-before": opts.get("question_before")})
    if go_on and context is None:
        raise KvpotError("--continue goes with --context PATH: a context saved from a stopped read")
    if save_context is not None:
        resolve_target(save_context, "context")  # a path that cannot be saved to is said before reading
    if context is not None:
        if inputs:
            raise KvpotError("pass either files to read or --context, not both")
        connect_rpc(rpc)
        session = reopen_session(context, model, opts["threads"], opts["max_tokens"], save_to=save_context,
                                 resettable=question is None, go_on=go_on)
        if opts.get("locator") is not None:  # how questions locate is the asker's choice, not the reading's
            session.settings = dataclasses.replace(session.settings, locator=check_locator(opts["locator"]))
        try:
            if go_on:
                continue_reading(session, context, question, save_context)
            elif session.read_point is not None:
                err.print(f"{printable(str(context))} holds a read stopped after {session.doc_tokens:,} tokens; "
                          "--continue reads "
                          f"the rest of {session.read_point.names()}", soft_wrap=True, markup=False)
        except BaseException:
            session.close()
            raise
        return session
    if not inputs:
        raise KvpotError(missing)
    connect_rpc(rpc)
    # which model was chosen is said once the session stands, so that a refusal stays one line
    chosen: list[str] = []
    model = model or default_model(say=chosen.append)
    session, sources = new_session(inputs, glob or ["*"], model, question, save_to=save_context,
                                   exclude=exclude or [], verbose=verbose, resettable=resettable, focus=focus,
                                   **opts)
    for line in chosen:
        err.print(escape(line), soft_wrap=True)
    try:
        read_with_progress(session, sources, save=None if save_context is None else lambda: save(session, save_context))
    except BaseException:
        session.close()
        raise
    return session


@user_errors
def ask(
    args: list[str] = typer.Argument(..., metavar="[FILE]... QUESTION",
                                     help="files, folders or -, then the question"),
    model: ModelOpt = None,
    budget: BudgetOpt = None,
    policy: PolicyOpt = None,
    max_tokens: NPredictOpt = None,
    context: ContextOpt = None,
    save_context: SaveContextOpt = None,
    go_on: ContinueOpt = False,
    glob: GlobOpt = None,
    exclude: ExcludeOpt = None,
    sources: SourcesOpt = False,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    chunk: ChunkOpt = None,
    threads: ThreadsOpt = None,
    prompt: PromptFormatOpt = None,
    flash_attn: FlashAttnOpt = None,
    question_before: QuestionBeforeOpt = None,
    locator: LocatorOpt = None,
    focus: FocusOpt = True,
    rpc: RpcOpt = None,
    temp: TempOpt = DEFAULTS["temp"],
    top_k: TopKOpt = DEFAULTS["top_k"],
    top_p: TopPOpt = DEFAULTS["top_p"],
    min_p: MinPOpt = DEFAULTS["min_p"],
    repeat_penalty: RepeatPenaltyOpt = DEFAULTS["repeat_penalty"],
    seed: SeedOpt = DEFAULTS["seed"],
    stop: StopOpt = None,
) -> None:
    """Read files of any length, then answer one question about them.

    An input that fits is read whole with full attention; a longer one goes through the pot, which knows the question while reading (docs/usage.md).
    """
    errors_as_json(json_out)
    set_verbosity(verbose, quiet)
    require_stdout()  # the answer's destination, before any reading
    sampler = make_sampler(temp, top_k, top_p, min_p, repeat_penalty, seed)
    stop_at = stops(stop)
    *inputs, question = args
    require_utf8(question, "the question")  # a tokenizer takes text: said before the document is read
    if not inputs and context is None and looks_like_input(question):
        raise KvpotError(f"no question: {question} is an input; pass the question after it "
                         f"(kvpot ask {question} \"QUESTION\")")
    if not inputs and context is None and stdin_is_piped():
        inputs = [STDIN]  # `cat notes.txt | kvpot ask "QUESTION"`: the pipe is the document, as in llm
    if not question.strip():
        raise KvpotError("the question is empty")
    opts = dict(policy=policy, budget=budget, chunk=chunk, threads=threads, prompt=prompt, max_tokens=max_tokens,
                flash_attn=flash_attn, question_before=question_before, locator=locator)
    session = _open_session(inputs, question, context, save_context, rpc, model, glob,
                            "pass the files to read before the question, or - to read stdin (or --context PATH)",
                            exclude=exclude, verbose=verbose, go_on=go_on, focus=focus, **opts)
    try:
        if context is not None:
            set_question(session, question)  # a question too long for a catalyst that holds it: said before reading it
        saved = save(session, save_context) if save_context is not None else True
    except BaseException:
        session.close()
        raise

    def answer(answering: Session, found) -> Answered:
        if found is None:
            return answer_with_sources(answering, question, sampler, stop_at, json_out, sources,
                                       context=None if context is None else str(context))

        def amend(obj: dict) -> None:
            obj["inputs"]["read"], obj["seconds"]["read"] = found.pot["inputs"], found.pot["read_seconds"]
            obj.update(focus_report(found, answering))

        return answer_with_sources(answering, question, sampler, stop_at, json_out, sources, amend=amend)

    # ask locates by its pot's own answer's attention (on files read with the question first, the pot kept what
    # the question needs: 8 of 9 at 48K, docs/benchmarks.md; a reopened context answers as the reading that
    # saved it did) unless --locator says otherwise; chat locates by the session's locator. The pot's session
    # is closed when the answer is given, and before a focused read loads the model afresh
    if focus:
        said = past_the_pot(session, question, answer, read_with_progress, keep=False,
                            locator=locator if locator is not None else "pot", **ON_TERMINAL)
    else:
        with session:
            said = answer(session, None)
    if said.stopped:
        raise typer.Exit(130)
    if said.empty:
        raise typer.Exit(NO_ANSWER_EXIT)
    if not saved:
        raise typer.Exit(1)  # the answer was printed; the exit status still says the save failed


CHAT_COMMANDS = (
    ("/ask QUESTION", "read the files again with the question first, then answer it; when the input did not fit "
                      "the pot, the pot then keeps what the question needs (the chat goes on from there)"),
    ("/save PATH", "save the conversation's context (reopen with kvpot chat --context PATH)"),
    ("/sources", "the passages the last answer drew on most (file, page or line, a quote)"),
    ("/stats", "what the pot holds"),
    ("/reset", "forget the conversation, keep the document"),
    ("/help", "this text"),
    ("/quit", "leave (also Ctrl-D)"),
)
CHAT_INPUT_HELP = ("a line ending with \\ goes on on the next (...>); several lines pasted at once are one "
                   "question; Ctrl-C drops what is typed, or stops an answer")


def chat_help(width: int) -> str:
    """/help's text, wrapped to `width` columns between words, descriptions in a column after the commands
    (under them where the terminal is too narrow for one)."""
    import textwrap

    name_w = max(len(name) for name, _ in CHAT_COMMANDS) + 4
    lines = ["commands:"]
    for name, text in CHAT_COMMANDS:
        if width - name_w >= 20:
            body = textwrap.wrap(text, width - name_w, break_long_words=False, break_on_hyphens=False)
            lines.append(f"  {name:<{name_w - 2}}{body[0]}")
            lines += [" " * name_w + more for more in body[1:]]
        else:
            lines.append(f"  {name}")
            lines += textwrap.wrap(text, width, initial_indent="    ", subsequent_indent="    ",
                                   break_long_words=False, break_on_hyphens=False)
    lines += textwrap.wrap(CHAT_INPUT_HELP.replace("\\\\", "\\"), width, break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines)


def _stats_table(session: Session) -> Table:
    table = Table(show_header=False, box=None)
    for k, v in session.stats().items():
        table.add_row(k, str(v))
    return table


class _Chat:
    """The chat's state between turns: the document answering (kvpot.api.Document, which keeps the
    conversation so far; /ask replaces it), whether each answer's sources are printed after it (--sources),
    recorded for /sources, and the last answer's; what /ask reads again (None for a reopened context)."""

    def __init__(self, session: Session, show_sources: bool = False, reread: Reread | None = None):
        self.doc = Document(session)
        self.show_sources = show_sources
        # taps every answer token: on with --sources, or after a /sources (tracking costs the decode: the
        # score tap is an extra attention over every cell per token, measured in docs/benchmarks.md)
        self.track = show_sources
        self.last: list[dict] | None = None
        self.reread = reread

    @property
    def session(self) -> Session:
        return self.doc.session


def _ask_again(state: _Chat, question: str) -> str | None:
    """/ask: the question to answer next (None: nothing to answer), with state.session read again
    with the question first when that can keep other cells (cli/_reread.py)."""
    if not question:
        err.print("[yellow]usage: /ask QUESTION[/yellow]")
        return None
    why = NO_FILES if state.reread is None else worth_reading_again(state.session)
    if why is not None:
        err.print(escape(printable(why)), soft_wrap=True)
        return question
    try:
        state.doc = Document(read_again(state.session, state.reread, question, _open_session))
    except ReadingLost:
        raise  # the chat has no reading left: its error ends it
    except KvpotError as e:  # not read again: the chat goes on as it was
        err.print(f"[yellow]{escape(printable(str(e)))}[/yellow]", soft_wrap=True)
        return None
    state.last = None
    return question


def _command(session: Session, line: str, state: _Chat | None = None) -> bool:
    """Run a /command; returns False to leave the loop."""
    state = state or _Chat(session)
    cmd, _, arg = line.strip().partition(" ")
    if cmd in ("/quit", "/exit"):
        return False
    if cmd == "/help":
        err.print(chat_help(err.width if err.is_terminal else 80), soft_wrap=True, markup=False, highlight=False)
    elif cmd == "/stats":
        err.print(_stats_table(session))
    elif cmd == "/sources":
        if state.last is not None and state.last and state.last[0].get("read_for_the_answer"):
            # a focused read's answer, not tapped: the passages it was read from, in the locator's order
            err.print("the last answer was read from these passages, in the order the locator ranked them (chat "
                      "--sources ranks them by the answer's own attention):", soft_wrap=True)
            write_out(sources_text([{k: v for k, v in p.items() if k != "read_for_the_answer"} for p in state.last]))
        elif state.last is not None:
            write_out(sources_text(state.last))  # where --sources prints them: after the answers, on stdout
        elif not session.turns:
            err.print("[yellow]no answer yet: /sources lists the passages the last answer drew on[/yellow]")
        else:
            # an answer given without tracking: the conversation decoded again with its rows tapped
            with err.status("finding the last answer's sources (decoding the conversation again)"):
                found = session.answer_sources()
            if found is not None:
                state.last = [p.as_dict() for p in found]
                write_out(sources_text(state.last))
            else:
                state.track = True
                err.print("[yellow]the last answer's sources cannot be found again (the conversation compacted "
                          "or was saved mid-way); from the next answer on, /sources lists them[/yellow]")
    elif cmd == "/reset":
        try:
            state.doc.reset()
            state.last = None
            err.print("conversation forgotten; the document stays")
        except KvpotError as e:  # e.g. a context saved after some turns: the chat goes on
            err.print(f"[yellow]{escape(printable(str(e)))}[/yellow]")
    elif cmd == "/save":
        if not arg.strip():
            err.print("[yellow]usage: /save PATH[/yellow]")
        else:
            save(session, Path(arg.strip()).expanduser())  # a failure is one line; the chat goes on
    else:
        err.print(f"[yellow]unknown command {cmd}; /help lists them[/yellow]")
    return True


@user_errors
def chat(
    inputs: list[str] = typer.Argument(None, metavar="[FILE]...", help="files or directories to read"),
    model: ModelOpt = None,
    budget: BudgetOpt = None,
    policy: PolicyOpt = None,
    max_tokens: NPredictOpt = None,
    context: ContextOpt = None,
    save_context: SaveContextOpt = None,
    go_on: ContinueOpt = False,
    glob: GlobOpt = None,
    exclude: ExcludeOpt = None,
    sources: Annotated[bool, typer.Option(
        "--sources", help="then the passages each answer drew on most")] = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    chunk: ChunkOpt = None,
    threads: ThreadsOpt = None,
    prompt: PromptFormatOpt = None,
    flash_attn: FlashAttnOpt = None,
    locator: LocatorOpt = None,
    rpc: RpcOpt = None,
    temp: TempOpt = DEFAULTS["temp"],
    top_k: TopKOpt = DEFAULTS["top_k"],
    top_p: TopPOpt = DEFAULTS["top_p"],
    min_p: MinPOpt = DEFAULTS["min_p"],
    repeat_penalty: RepeatPenaltyOpt = DEFAULTS["repeat_penalty"],
    seed: SeedOpt = DEFAULTS["seed"],
    stop: StopOpt = None,
) -> None:
    """Read files of any length, then chat about them (/help lists the commands).

    Every exchange stays in the same bounded memory: when it fills, the policy compacts it again; a conversation read with full attention turns into a pot when the context fills, and says so.
    """
    set_verbosity(verbose, quiet)
    require_stdout()
    sampler = make_sampler(temp, top_k, top_p, min_p, repeat_penalty, seed)
    stop_at = stops(stop)
    if sys.stdin is None:  # Python starts with no sys.stdin when fd 0 is closed
        raise KvpotError("stdin is closed: chat reads your questions from it (use kvpot ask for one question)")
    inputs = inputs or []
    if "-" in inputs:
        raise KvpotError("chat reads your questions from stdin; pass the document as a file (or use kvpot ask)")
    opts = dict(policy=policy, budget=budget, chunk=chunk, threads=threads, prompt=prompt, max_tokens=max_tokens,
                flash_attn=flash_attn, locator=locator)
    session = _open_session(inputs, None, context, save_context, rpc, model, glob,
                            "pass the files to read (or --context PATH)", exclude=exclude, verbose=verbose,
                            go_on=go_on, **opts)
    # /ask reads the same files with the same options and model (a registry name, else its path)
    reread = None if context is not None else Reread(
        inputs, glob or ["*"], exclude or [],
        session.model_name if session.model_name in KNOWN else str(session.facts.path), opts)
    state = _Chat(session, sources, reread)
    try:
        reader = ChatInput(history_path(inputs, context))
        _chat_loop(state, save_context, sampler, stop_at, reader)
    finally:
        state.session.close()


def _chat_loop(state: _Chat, save_context: Path | None, sampler: Sampler, stop: tuple[str, ...],
               reader: ChatInput | None = None) -> None:
    if save_context is not None:
        save(state.session, save_context)
    err.print("ask about the document; /help for commands, /quit to leave")
    # a line that is not UTF-8 is read as it is (its bad bytes kept as lone surrogates) and refused below,
    # rather than ending the chat with a decoding error
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdin.reconfigure(errors="surrogateescape")
    reader = reader or ChatInput()
    while True:
        try:
            line = reader.read()
        except EOFError:
            break
        except KeyboardInterrupt:
            err.print("\n(/quit or Ctrl-D to leave)")
            continue
        if not line.strip():
            continue
        try:
            require_utf8(line, "the line")
        except KvpotError as e:  # refused; the chat goes on
            print_error(str(e))
            continue
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "/ask":
            line = _ask_again(state, arg.strip())
            if line is None:
                continue
        elif line.startswith("/"):
            if not _command(state.session, line, state):
                break
            continue
        try:
            try:
                said, found = _turn(state, line, sampler, stop)
            except KeyboardInterrupt:  # Ctrl-C while finding or reading the passages: the question is dropped
                err.print("\n(stopped; the question was not answered)")
                continue
            state.last = found
            if found is not None and state.show_sources and not said.stopped:
                write_out(sources_text(found))
        except OutputFailed:
            raise  # no later answer could be written either
        except KvpotError as e:
            print_error(str(e))


def _turn(state: _Chat, question: str, sampler: Sampler, stop: tuple[str, ...]) -> tuple[Answered, list[dict] | None]:
    """One chat turn through the API's (kvpot.api.Document.turn: in the pot, or past it from a focused read of
    the question's passages with the conversation so far), the answer streamed to stdout: (what was said, the
    passages it drew on: ranked by its own attention when tracked, else those a focused read was given, each
    marked `read_for_the_answer`; None for an untracked answer from the pot)."""
    passages = None

    def answer(session: Session, found) -> Answered:
        nonlocal passages
        said, _, got = answer_tracked(session, question, sampler, stop, True, state.track)
        passages = got if got is not None or found is None else [dict(p, read_for_the_answer=True)
                                                                  for p in found.passages]
        return said

    said = state.doc.turn(question, answer, read=read_with_progress, **ON_TERMINAL)
    return said, passages

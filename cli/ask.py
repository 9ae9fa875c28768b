"""`kvpot ask` and `kvpot chat`: read files of any length into the pot, then answer about them."""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvpot.checks import check_budget, check_cli_numbers, check_pot_room, check_settings_fit, check_threads
from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources, looks_like_input
from kvpot.model_ref import resolve_model
from kvpot.models.registry import DEFAULT_MODEL, KNOWN
from kvpot.policies import make_policy
from kvpot.reading_plan import plan_reading
from kvpot.safe_write import resolve_target
from kvpot.session import BYTES_PER_TOKEN_GUESS, Session, answer_reserve
from kvpot.settings import AUTO, resolve_settings

from ._common import NO_ANSWER_EXIT, RPC_HELP, connect_rpc, err, user_errors
from ._interrupt import Interrupts
from .reading import QuestionProgress, read_with_progress

MODEL_HELP = "a known model name or a path to a .gguf file (default: the saved context's model, else gemma3-270m)"
POLICY_HELP = ("how the pot chooses what to keep: infinipot (default), streaming, snapkv, h2o, truncate, imdc, "
               "with parameters as in `infinipot:pot=4096,keep=2048`")

# the options ask and chat share (Typer reads type and help from these annotations)
# str, not Path: Path("") would read as "." and an empty path could not be told apart
ContextOpt = Annotated[str, typer.Option("--context", help="reopen a saved context instead of reading files")]
SaveContextOpt = Annotated[str, typer.Option("--save-context", help="save the compressed context here after reading")]
ModelOpt = Annotated[str, typer.Option("--model", "-m", help=MODEL_HELP)]
PolicyOpt = Annotated[str, typer.Option("--policy", "-P", help=POLICY_HELP)]
BudgetOpt = Annotated[str, typer.Option(
    "--budget", "-b", help="cells the memory may hold (per layer and KV head), or auto (default): the most the "
                           "device's free memory holds, and full attention when the whole input fits")]
ChunkOpt = Annotated[int, typer.Option("--chunk", help="tokens read per step")]
ThreadsOpt = Annotated[int, typer.Option("--threads", "-t", help="CPU threads (default: every core)")]
PromptOpt = Annotated[str, typer.Option("--prompt", help="auto (chat template if the model has one), chat or completion")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", "-n", help="longest answer, in tokens")]
GlobOpt = Annotated[str, typer.Option("--glob", help="which files to read inside directories")]
RpcOpt = Annotated[str, typer.Option("--rpc", help=RPC_HELP)]


def _budget(raw: str | None) -> int | str | None:
    if raw is None or raw == AUTO:
        return raw
    try:
        return int(raw)
    except ValueError:
        raise KvpotError(f"--budget must be a number of cells or {AUTO}, got {raw!r}") from None


def _settings(model: str, policy, budget, chunk, threads, prompt, max_tokens):
    budget = _budget(budget)
    check_cli_numbers(budget if budget != AUTO else None, chunk, threads, max_tokens)
    known = KNOWN.get(model)
    cli = {"policy": policy, "budget": budget, "chunk": chunk, "threads": threads, "prompt": prompt,
           "max_tokens": max_tokens}
    settings = resolve_settings(known.name if known else None, known.defaults if known else {}, cli)
    # a bad spec is refused before the model loads (an automatic budget is checked with a stand-in)
    make_policy((replace(settings, budget=1024) if settings.budget == AUTO else settings).policy_spec())
    return settings


def _new_session(inputs: list[str], glob: str, model: str, question: str | None, **opts) -> tuple[Session, object]:
    settings = _settings(model, **opts)  # options first: they are cheap to check
    sources = collect_sources(inputs, glob, notice=lambda msg: err.print(f"[yellow]{msg}[/yellow]", soft_wrap=True))
    facts, known = resolve_model(model)
    plan = plan_reading(settings, facts, sources, policy_chosen=opts["policy"] is not None,
                        reserve=answer_reserve(settings))
    settings = plan.settings
    # an automatic budget, and a policy whose smallest step depends on the input's length (IMDC's m_0),
    # checked against the policy now that both are known
    check_budget(settings.policy_spec(), settings.budget, expected_tokens=_estimated_tokens(sources))
    if plan.note:
        err.print(plan.note, soft_wrap=True)
    check_settings_fit(facts, settings)  # a context that cannot fit is refused before the model loads
    with err.status(f"loading {facts.name}"):
        session = Session(facts, known.name if known else facts.name, settings)
    if question:
        session.set_question(question)  # InfiniPot reads with the question as its catalyst (CaP-Q)
    check_pot_room(session.engine)  # a catalyst (and question) the pot cannot take: said before reading
    return session, sources


def _estimated_tokens(sources) -> int | None:
    """The input's length as the session will declare it to the policy when reading starts."""
    return int(sources.total_bytes / BYTES_PER_TOKEN_GUESS) if sources.total_bytes else None


def _reopen(context: str, model: str | None, threads: int | None, max_tokens: int | None = None) -> Session:
    from kvpot.context_file import check_context_path, read_context

    check_threads(threads)
    context = check_context_path(context)
    name = model or read_context(context).header["model"]["name"]
    if model is None and name not in KNOWN:
        name = read_context(context).header["model"]["path"]
    facts, known = resolve_model(name)
    with err.status(f"reopening {context}"):
        session = Session.reopen(context, facts, known.name if known else facts.name, threads)
    if max_tokens is not None:  # the answer's length is not part of the saved state
        session.set_max_tokens(max_tokens)
    err.print(f"reopened {context}: {session.doc_tokens:,} tokens of "
              f"{', '.join(s['name'] for s in session.sources)} in {session.engine.n_cells:,} cells")
    return session


def _answer(session: Session, question: str) -> bool | None:
    """Stream the answer to stdout; Ctrl-C stops it. Returns False when stopped, None when the model
    produced no answer (said on stderr, never a silent blank line)."""
    said = ""
    progress = QuestionProgress()  # shown only when the question is read through the pot
    with Interrupts() as stop:
        try:
            pieces = session.ask(question, on_progress=progress.update)
            first = next(pieces, None)
        finally:
            progress.close()
        for piece in itertools.chain([] if first is None else [first], pieces):
            said += piece
            sys.stdout.write(piece)
            sys.stdout.flush()
            if stop.hit:
                sys.stdout.write("\n")
                err.print("[yellow]answer stopped[/yellow]")
                return False
    sys.stdout.write("\n")
    sys.stdout.flush()
    if not said.strip():
        err.print(f"[yellow]the model produced no answer[/yellow] (it ended at {session.engine.stop_reason})",
                  soft_wrap=True)
        return None
    return True


def _save(session: Session, path: Path | str) -> bool:
    """Save the context; a failure is one line and the caller goes on (the answer, the chat)."""
    try:
        size = session.save(path)
    except KvpotError as e:
        err.print(f"[red]error:[/red] {e}", soft_wrap=True)
        return False
    err.print(f"context saved to {path} ({size / 2**20:,.1f} MiB)")
    return True


def _refuse_ignored(context: Path | None, **given) -> None:
    """Options a saved context fixes are refused rather than silently ignored."""
    if context is None:
        return
    named = [opt for opt, value in given.items() if value is not None]
    if named:
        raise KvpotError(f"{', '.join(named)} cannot change a saved context (it was read with its own); "
                         "leave {} out, or read the files again".format("it" if len(named) == 1 else "them"))


@user_errors
def ask(
    args: list[str] = typer.Argument(..., metavar="[FILE]... QUESTION",
                                     help="files, directories or - (stdin) to read, then the question"),
    context: ContextOpt = None,
    save_context: SaveContextOpt = None,
    model: ModelOpt = None,
    policy: PolicyOpt = None,
    budget: BudgetOpt = None,
    chunk: ChunkOpt = None,
    threads: ThreadsOpt = None,
    prompt: PromptOpt = None,
    max_tokens: MaxTokensOpt = None,
    glob: GlobOpt = "*",
    rpc: RpcOpt = None,
) -> None:
    """Read files of any length, then answer one question about them.

    The question is known before reading, so InfiniPot uses it as its catalyst (CaP-Q) and keeps what matters for it. Memory stays at --budget cells however long the input is.
    """
    *inputs, question = args
    if not inputs and context is None and looks_like_input(question):
        raise KvpotError(f"no question: {question} is an input; pass the question after it "
                         f"(kvpot ask {question} \"QUESTION\")")
    if not question.strip():
        raise KvpotError("the question is empty")
    _refuse_ignored(context, **{"--policy": policy, "--budget": budget, "--chunk": chunk, "--prompt": prompt,
                                "--glob": None if glob == "*" else glob})
    if save_context is not None:
        resolve_target(save_context, "context")  # a path that cannot be saved to is said before reading
    if context is not None:
        if inputs:
            raise KvpotError("pass either files to read or --context, not both")
        connect_rpc(rpc)
        session = _reopen(context, model, threads, max_tokens)
        session.set_question(question)
        # a question too long for a catalyst that holds it: said before reading it
        check_pot_room(session.engine, budget_option="the --budget the files are read with")
    else:
        if not inputs:
            raise KvpotError("pass the files to read before the question (or --context PATH)")
        connect_rpc(rpc)
        session, sources = _new_session(inputs, glob, model or DEFAULT_MODEL, question, policy=policy, budget=budget,
                                        chunk=chunk, threads=threads, prompt=prompt, max_tokens=max_tokens)
        read_with_progress(session, sources)
    saved = _save(session, save_context) if save_context is not None else True
    completed = _answer(session, question)
    session.engine.close()
    if completed is None:
        raise typer.Exit(NO_ANSWER_EXIT)
    if not completed:
        raise typer.Exit(130)
    if not saved:
        raise typer.Exit(1)  # the answer was printed; the exit status still says the save failed


CHAT_HELP = """commands:
  /save PATH   save the conversation's context (reopen with kvpot chat --context PATH)
  /stats       what the pot holds
  /reset       forget the conversation, keep the document
  /help        this text
  /quit        leave (also Ctrl-D)"""


def _stats_table(session: Session) -> Table:
    table = Table(show_header=False, box=None)
    for k, v in session.stats().items():
        table.add_row(k, str(v))
    return table


def _command(session: Session, line: str) -> bool:
    """Run a /command; returns False to leave the loop."""
    cmd, _, arg = line.strip().partition(" ")
    if cmd in ("/quit", "/exit"):
        return False
    if cmd == "/help":
        err.print(CHAT_HELP)
    elif cmd == "/stats":
        err.print(_stats_table(session))
    elif cmd == "/reset":
        try:
            session.reset_conversation()
            err.print("conversation forgotten; the document stays")
        except KvpotError as e:  # e.g. a context saved after some turns: the chat goes on
            err.print(f"[yellow]{e}[/yellow]")
    elif cmd == "/save":
        if not arg.strip():
            err.print("[yellow]usage: /save PATH[/yellow]")
        else:
            _save(session, Path(arg.strip()).expanduser())  # a failure is one line; the chat goes on
    else:
        err.print(f"[yellow]unknown command {cmd}; /help lists them[/yellow]")
    return True


@user_errors
def chat(
    inputs: list[str] = typer.Argument(None, metavar="[FILE]...", help="files or directories to read"),
    context: ContextOpt = None,
    save_context: SaveContextOpt = None,
    model: ModelOpt = None,
    policy: PolicyOpt = None,
    budget: BudgetOpt = None,
    chunk: ChunkOpt = None,
    threads: ThreadsOpt = None,
    prompt: PromptOpt = None,
    max_tokens: MaxTokensOpt = None,
    glob: GlobOpt = "*",
    rpc: RpcOpt = None,
) -> None:
    """Read files of any length, then chat about them (/help lists the commands).

    Every exchange stays in the same bounded memory: when it fills, the policy compacts it again.
    """
    inputs = inputs or []
    _refuse_ignored(context, **{"--policy": policy, "--budget": budget, "--chunk": chunk, "--prompt": prompt,
                                "--glob": None if glob == "*" else glob})
    if save_context is not None:
        resolve_target(save_context, "context")
    if context is not None:
        if inputs:
            raise KvpotError("pass either files to read or --context, not both")
        connect_rpc(rpc)
        session = _reopen(context, model, threads, max_tokens)
    else:
        if not inputs:
            raise KvpotError("pass the files to read (or --context PATH)")
        if "-" in inputs:
            raise KvpotError("chat reads your questions from stdin; pass the document as a file (or use kvpot ask)")
        connect_rpc(rpc)
        session, sources = _new_session(inputs, glob, model or DEFAULT_MODEL, None, policy=policy, budget=budget,
                                        chunk=chunk, threads=threads, prompt=prompt, max_tokens=max_tokens)
        read_with_progress(session, sources)
    if save_context is not None:
        _save(session, save_context)
    err.print("ask about the document; /help for commands, /quit to leave")
    while True:
        try:
            line = err.input("[bold green]you>[/bold green] ")
        except EOFError:
            break
        except KeyboardInterrupt:
            err.print("\n(/quit or Ctrl-D to leave)")
            continue
        if not line.strip():
            continue
        if line.startswith("/"):
            if not _command(session, line):
                break
            continue
        try:
            _answer(session, line)
        except KvpotError as e:
            err.print(f"[red]error:[/red] {e}")
    session.engine.close()

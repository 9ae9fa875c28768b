"""`kvpot ask` and `kvpot chat`: read files of any length into the pot, then answer about them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvpot.errors import KvpotError
from kvpot.ingest import collect_sources
from kvpot.model_ref import resolve_model
from kvpot.models.registry import DEFAULT_MODEL, KNOWN
from kvpot.policies import make_policy
from kvpot.session import Session
from kvpot.settings import resolve_settings

from ._common import RPC_HELP, connect_rpc, err, user_errors
from ._interrupt import Interrupts
from .reading import read_with_progress

MODEL_HELP = "a known model name or a path to a .gguf file (default: the saved context's model, else gemma3-270m)"
POLICY_HELP = ("how the pot chooses what to keep: infinipot (default), streaming, snapkv, h2o, truncate, imdc, "
               "with parameters as in `infinipot:pot=4096,keep=2048`")

# the options ask and chat share (Typer reads type and help from these annotations)
ContextOpt = Annotated[Path, typer.Option("--context", help="reopen a saved context instead of reading files")]
SaveContextOpt = Annotated[Path, typer.Option("--save-context", help="save the compressed context here after reading")]
ModelOpt = Annotated[str, typer.Option("--model", "-m", help=MODEL_HELP)]
PolicyOpt = Annotated[str, typer.Option("--policy", "-P", help=POLICY_HELP)]
BudgetOpt = Annotated[int, typer.Option("--budget", "-b", help="cells the memory may hold (per layer and KV head)")]
ChunkOpt = Annotated[int, typer.Option("--chunk", help="tokens read per step")]
ThreadsOpt = Annotated[int, typer.Option("--threads", "-t", help="CPU threads (default: every core)")]
PromptOpt = Annotated[str, typer.Option("--prompt", help="auto (chat template if the model has one), chat or completion")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", "-n", help="longest answer, in tokens")]
GlobOpt = Annotated[str, typer.Option("--glob", help="which files to read inside directories")]
RpcOpt = Annotated[str, typer.Option("--rpc", help=RPC_HELP)]


def _settings(model: str, policy, budget, chunk, threads, prompt, max_tokens):
    known = KNOWN.get(model)
    cli = {"policy": policy, "budget": budget, "chunk": chunk, "threads": threads, "prompt": prompt,
           "max_tokens": max_tokens}
    settings = resolve_settings(known.name if known else None, known.defaults if known else {}, cli)
    make_policy(settings.policy_spec())  # a bad spec is refused before the model loads
    return settings


def _new_session(inputs: list[str], glob: str, model: str, question: str | None, **opts) -> tuple[Session, object]:
    settings = _settings(model, **opts)  # options first: they are cheap to check
    sources = collect_sources(inputs, glob, notice=lambda msg: err.print(f"[yellow]{msg}[/yellow]", soft_wrap=True))
    facts, known = resolve_model(model)
    with err.status(f"loading {facts.name}"):
        session = Session(facts, known.name if known else facts.name, settings)
    if question:
        session.set_question(question)  # InfiniPot reads with the question as its catalyst (CaP-Q)
    return session, sources


def _reopen(context: Path, model: str | None, threads: int | None) -> Session:
    from kvpot.context_file import read_context

    name = model or read_context(context).header["model"]["name"]
    if model is None and name not in KNOWN:
        name = read_context(context).header["model"]["path"]
    facts, known = resolve_model(name)
    with err.status(f"reopening {context}"):
        session = Session.reopen(context, facts, known.name if known else facts.name, threads)
    err.print(f"reopened {context}: {session.doc_tokens:,} tokens of "
              f"{', '.join(s['name'] for s in session.sources)} in {session.engine.n_cells:,} cells")
    return session


def _answer(session: Session, question: str) -> bool:
    """Stream the answer to stdout; Ctrl-C stops it. Returns False when stopped."""
    with Interrupts() as stop:
        for piece in session.ask(question):
            sys.stdout.write(piece)
            sys.stdout.flush()
            if stop.hit:
                sys.stdout.write("\n")
                err.print("[yellow]answer stopped[/yellow]")
                return False
    sys.stdout.write("\n")
    sys.stdout.flush()
    return True


def _save(session: Session, path: Path) -> None:
    size = session.save(path)
    err.print(f"context saved to {path} ({size / 2**20:,.1f} MiB)")


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
    if not question.strip():
        raise KvpotError("the question is empty")
    if context:
        if inputs:
            raise KvpotError("pass either files to read or --context, not both")
        connect_rpc(rpc)
        session = _reopen(context, model, threads)
        session.set_question(question)
    else:
        if not inputs:
            raise KvpotError("pass the files to read before the question (or --context PATH)")
        connect_rpc(rpc)
        session, sources = _new_session(inputs, glob, model or DEFAULT_MODEL, question, policy=policy, budget=budget,
                                        chunk=chunk, threads=threads, prompt=prompt, max_tokens=max_tokens)
        read_with_progress(session, sources)
        if save_context:
            _save(session, save_context)
    completed = _answer(session, question)
    session.engine.close()
    if not completed:
        raise typer.Exit(130)


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
            try:
                _save(session, Path(arg.strip()).expanduser())
            except KvpotError as e:
                err.print(f"[red]error:[/red] {e}")
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
    if context:
        if inputs:
            raise KvpotError("pass either files to read or --context, not both")
        connect_rpc(rpc)
        session = _reopen(context, model, threads)
    else:
        if not inputs:
            raise KvpotError("pass the files to read (or --context PATH)")
        if "-" in inputs:
            raise KvpotError("chat reads your questions from stdin; pass the document as a file (or use kvpot ask)")
        connect_rpc(rpc)
        session, sources = _new_session(inputs, glob, model or DEFAULT_MODEL, None, policy=policy, budget=budget,
                                        chunk=chunk, threads=threads, prompt=prompt, max_tokens=max_tokens)
        read_with_progress(session, sources)
        if save_context:
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

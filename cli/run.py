"""`kvpot run` and `kvpot demo`: answer a question about a document."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from kvpot import paths
from kvpot.checks import check_budget
from kvpot.full_attention import GenSettings, check_fits, default_threads, open_llama, prompt_tokens, stream_answer
from kvpot.model_ref import resolve_model
from kvpot.models.registry import DEFAULT_MODEL
from kvpot.prompting import completion_prompt, document_prefix, question_suffix
from kvpot.pull import pull as pull_model
from kvpot.sample import logbook
from kvpot.textfile import read_document

from ._common import NO_ANSWER_EXIT, RPC_HELP, connect_rpc, err, user_errors


def _answer(model: str, document: str, question: str, ctx: int | None, threads: int | None,
            max_tokens: int, seed: int) -> str:
    facts, known = resolve_model(model)
    n_ctx = ctx or min(facts.n_ctx_train or 4096, (known.defaults.get("n_ctx") if known else None) or 8192)
    settings = GenSettings(n_ctx=n_ctx, n_threads=threads or default_threads(), max_tokens=max_tokens, seed=seed)
    with err.status(f"loading {facts.name}"):
        llm = open_llama(facts, settings)
    tokens = prompt_tokens(llm, completion_prompt(document, question))
    check_fits(len(tokens), settings, facts)
    pieces = []
    with err.status(f"reading {len(tokens)} tokens with full attention (context {n_ctx})") as status:
        stream = stream_answer(llm, tokens, settings)
        first = next(stream, None)
        status.stop()
    for piece in ([first] if first is not None else []):
        pieces.append(piece)
        sys.stdout.write(piece)
        sys.stdout.flush()
    for piece in stream:
        pieces.append(piece)
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return "".join(pieces)


def _answer_with_pot(model: str, document: str, question: str, policy_spec: str, budget: int, chunk: int,
                     threads: int | None, max_tokens: int) -> str:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from kvpot.engine import Engine, EngineConfig
    from kvpot.policies import make_policy

    policy = make_policy(policy_spec)
    facts, _ = resolve_model(model)
    cfg = EngineConfig(budget=budget, chunk=chunk, n_threads=threads or default_threads(), answer_reserve=max_tokens + 128)
    with err.status(f"loading {facts.name}"):
        eng = Engine(str(facts.path), policy, cfg)
    tokens = eng.model.tokenize(document_prefix(document))
    with Progress(TextColumn("reading"), BarColumn(), TextColumn("{task.completed}/{task.total} tokens"),
                  TextColumn("pot {task.fields[cells]} cells, {task.fields[compactions]} compactions"),
                  TimeRemainingColumn(), console=err, transient=True) as progress:
        task = progress.add_task("read", total=len(tokens) + 1, cells=0, compactions=0)
        eng.feed(tokens, on_chunk=lambda ev: progress.update(task, completed=ev.tokens_read, cells=ev.cells,
                                                            compactions=ev.stats.n_compactions))
    pieces = []
    for piece in eng.answer(question_suffix(question), max_tokens=max_tokens):
        if "\nQuestion:" in "".join(pieces) + piece:
            break
        pieces.append(piece)
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    eng.close()
    return "".join(pieces)


@user_errors
def run(
    file: Path = typer.Option(..., "--file", "-f", help="the document to read (text)"),
    prompt: str = typer.Option(..., "--prompt", "-p", help="the question to ask about it"),
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="a known model name or a path to a .gguf file"),
    policy: str = typer.Option("full", "--policy", "-P",
                               help="full (stock llama.cpp), or a pot policy: truncate, streaming, snapkv, h2o (e.g. snapkv:window=32)"),
    budget: int = typer.Option(1024, "--budget", "-b", min=1, help="cells the pot keeps (pot policies)"),
    chunk: int = typer.Option(512, "--chunk", min=16, help="tokens read per step (pot policies)"),
    ctx: int = typer.Option(None, "--ctx", "-c", min=64, help="context size in tokens for full attention (default: the model's, up to 8192)"),
    threads: int = typer.Option(None, "--threads", "-t", min=1, help="CPU threads (default: all cores)"),
    max_tokens: int = typer.Option(128, "--max-tokens", "-n", min=1, help="longest answer, in tokens"),
    seed: int = typer.Option(0, "--seed", help="sampling seed"),
    rpc: str = typer.Option(None, "--rpc", help=RPC_HELP),
) -> None:
    """Answer a question about a document.

    With --policy full (the default) the document must fit the context, as in stock llama.cpp;
    a pot policy reads any length in chunks and keeps at most --budget cells per layer and KV head.
    """
    if policy != "full":  # a bad spec or a budget it cannot work with: before anything is read or loaded
        check_budget(policy, budget)
    document = read_document(file)
    connect_rpc(rpc)
    if policy == "full":
        said = _answer(model, document, prompt, ctx, threads, max_tokens, seed)
    else:
        said = _answer_with_pot(model, document, prompt, policy, budget, chunk, threads, max_tokens)
    if not said.strip():
        err.print("[yellow]the model produced no answer[/yellow]")
        raise typer.Exit(NO_ANSWER_EXIT)


# ~8K tokens: long enough that the pot compacts several times at the default budget
DEMO_ENTRIES = 180


@user_errors
def demo(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m", help="a known model name or a path to a .gguf file"),
    threads: int = typer.Option(None, "--threads", "-t", min=1, help="CPU threads (default: all cores)"),
    entries: int = typer.Option(DEMO_ENTRIES, "--entries", min=10, help="logbook days to write (about 44 tokens each)"),
) -> None:
    """Write a long sample logbook (generated by kvpot), then run `kvpot ask` on it and check the answer."""
    from . import ask as ask_cmd

    document, question, expected = logbook(n_entries=entries)
    sample = paths.home() / "samples" / "logbook.txt"
    sample.parent.mkdir(parents=True, exist_ok=True)
    sample.write_text(document)
    if not Path(model).exists():
        pull_model(model)
    err.print(f"[bold]document[/bold] {sample} ({len(document):,} characters, one fact hidden halfway)")
    err.print(f"[bold]running[/bold] kvpot ask {sample} {question!r} --model {model}", soft_wrap=True)
    capture = _Tee(sys.stdout)
    sys.stdout = capture
    try:
        ask_cmd.ask.__wrapped__([str(sample), question], context=None, save_context=None, model=model, policy=None,
                                budget=None, chunk=None, threads=threads, prompt=None, max_tokens=32, glob="*")
    finally:
        sys.stdout = capture.inner
    verdict = "[green]correct[/green]" if expected in capture.text else f"[yellow]expected {expected}[/yellow]"
    err.print(f"[bold]answer[/bold] {verdict}")



class _Tee:
    """stdout that also remembers what was written (to check the demo's answer)."""

    def __init__(self, inner):
        self.inner = inner
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return self.inner.write(s)

    def flush(self) -> None:
        self.inner.flush()

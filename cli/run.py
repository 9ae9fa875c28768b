"""`kvpot run` and `kvpot demo`: answer a question about a document, through the same Session as
`kvpot ask` (same prompt, same stop rules, same answer room)."""

from __future__ import annotations

import stat
from pathlib import Path

import typer
from rich.markup import escape

from kvpot import paths
from kvpot.bench.logbook import logbook
from kvpot.display import require_utf8
from kvpot.errors import KvpotError
from kvpot.ingest.sources import STDIN, stat_input
from kvpot.models.pull import pull as pull_model
from kvpot.session.default_model import default_model
from kvpot.session.settings import RunSettings, setting_problem

from ._common import (
    NO_ANSWER_EXIT,
    RPC_HELP,
    connect_rpc,
    err,
    errors_as_json,
    require_stdout,
    set_verbosity,
    user_errors,
)
from ._options import ADVANCED, MODEL_DEFAULT, MODEL_HELP, N_PREDICT_HELP, QuietOpt, VerboseOpt
from ._report import JsonOpt, SourcesOpt, answer_with_sources
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
from ._session import answer, new_session
from .reading import read_with_progress

FULL = "full"
RUN_POLICY_HELP = "full (stock llama.cpp: the document must fit) or a pot policy, see docs/methods.md"
# old spellings, accepted with a note on stderr for one release
ALIASES = {"--ctx": "--ctx-size", "--max-tokens": "--n-predict"}


@user_errors
def run(
    file: Path = typer.Option(..., "--file", "-f", metavar="PATH",
                              help="the document to read (docs/formats.md)"),
    prompt: str = typer.Option(..., "--prompt", "-p", metavar="TEXT", help="the question to ask about it"),
    model: str = typer.Option(None, "--model", "-m", metavar="MODEL", show_default=MODEL_DEFAULT, help=MODEL_HELP),
    policy: str = typer.Option(FULL, "--policy", "-P", metavar="SPEC", help=RUN_POLICY_HELP),
    budget: str = typer.Option(None, "--budget", "-b", metavar="N|auto", show_default="auto",
                               help="a pot's cells per layer and KV head, or auto: what the device holds"),
    chunk: int = typer.Option(None, "--chunk", min=16, metavar="N", show_default=str(RunSettings.chunk),
                              rich_help_panel=ADVANCED, help="tokens read per step"),
    ctx: int = typer.Option(None, "--ctx-size", "-c", min=64, metavar="N",
                            show_default="what the document needs", help="context size for --policy full"),
    threads: int = typer.Option(None, "--threads", "-t", min=1, metavar="N", show_default="every core",
                                rich_help_panel=ADVANCED, help="CPU threads"),
    max_tokens: int = typer.Option(None, "--n-predict", "-n", min=1, metavar="N",
                                   show_default=str(RunSettings.max_tokens), help=N_PREDICT_HELP),
    rpc: str = typer.Option(None, "--rpc", metavar="HOSTS", show_default="none", rich_help_panel=ADVANCED,
                            help=RPC_HELP),
    json_out: JsonOpt = False,
    sources: SourcesOpt = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    temp: TempOpt = DEFAULTS["temp"],
    top_k: TopKOpt = DEFAULTS["top_k"],
    top_p: TopPOpt = DEFAULTS["top_p"],
    min_p: MinPOpt = DEFAULTS["min_p"],
    repeat_penalty: RepeatPenaltyOpt = DEFAULTS["repeat_penalty"],
    seed: SeedOpt = DEFAULTS["seed"],
    stop: StopOpt = None,
) -> None:
    """Answer a question about a document, llama.cpp style (-f FILE -p QUESTION).

    With --policy full (the default) the whole document is kept, as stock llama.cpp computes it, and one that cannot fit is refused before reading; a pot policy reads any length. Answers as `kvpot ask` does.
    """
    errors_as_json(json_out)
    set_verbosity(verbose, quiet)
    require_stdout()  # the answer's destination, before any reading
    sampler = make_sampler(temp, top_k, top_p, min_p, repeat_penalty, seed)
    stop_at = stops(stop)
    require_utf8(prompt, "the prompt (-p)")  # a tokenizer takes text: said before the document is read
    if ctx is not None:
        if policy.partition(":")[0].strip().lower() != FULL:
            raise KvpotError("--ctx-size sizes full attention's context; a pot policy takes --budget")
        if budget is not None:
            raise KvpotError("pass --ctx-size or --budget, not both (for --policy full they are the same)")
        problem = setting_problem("budget", ctx)  # checked here, so that it names -c, not the --budget it becomes
        if problem:
            raise KvpotError(f"--ctx-size {problem}")
        budget = str(ctx)
    if str(file) != STDIN:
        st = stat_input(str(file))  # missing, unreachable, a symlink loop: one line each
        if stat.S_ISDIR(st.st_mode):  # -f names one document; ask reads folders
            raise KvpotError(f"input path {file} is a directory; pass a file (kvpot ask reads folders)")
    # the document is read as ask reads it (kvpot.ingest: PDF, EPUB, DOCX, ODT, HTML, compressed text),
    # a binary or empty file refused there with one line
    connect_rpc(rpc)
    # the model ask would choose, said once the session stands, so that a refusal stays one line
    chosen: list[str] = []
    model = model or default_model(say=chosen.append)
    session, read = new_session([str(file)], "*", model, prompt, policy=policy, budget=budget, chunk=chunk,
                                threads=threads, prompt=None, max_tokens=max_tokens, verbose=verbose)
    for line in chosen:
        err.print(escape(line), soft_wrap=True)
    with session:
        read_with_progress(session, read)
        said = answer_with_sources(session, prompt, sampler, stop_at, json_out, sources)
    if said.stopped:
        raise typer.Exit(130)
    if said.empty:
        raise typer.Exit(NO_ANSWER_EXIT)


# the demo shows what kvpot is for in about two minutes on 2 cores: a document longer than the memory's
# budget (120 logbook days are ~5,200 tokens, the budget 2,048 cells: the pot compacts four times, shown on
# the progress line) and a correct answer in a sentence from the capable small model (docs/benchmarks.md,
# "Demo"); -m, --entries and --budget change it
DEMO_MODEL = "qwen2.5-coder-0.5b"
DEMO_ENTRIES = 120
DEMO_BUDGET = 2048


@user_errors
def demo(
    model: str = typer.Option(DEMO_MODEL, "--model", "-m", metavar="NAME|PATH",
                              help="a known model name (pulled if needed) or a path to a .gguf file"),
    threads: int = typer.Option(None, "--threads", "-t", min=1, metavar="N", show_default="every core",
                                rich_help_panel=ADVANCED, help="CPU threads"),
    entries: int = typer.Option(DEMO_ENTRIES, "--entries", min=10, metavar="N",
                                help="logbook days to write (about 44 tokens each)"),
    budget: str = typer.Option(str(DEMO_BUDGET), "--budget", "-b", metavar="N|auto",
                               help="cells the memory may hold; less than the document, so the pot compacts"),
) -> None:
    """Write a long sample logbook (generated by kvpot), then answer a question about it as `kvpot ask` does and check the answer."""
    require_stdout()
    document, question, expected = logbook(n_entries=entries)
    sample = paths.home() / "samples" / "logbook.txt"
    sample.parent.mkdir(parents=True, exist_ok=True)
    sample.write_text(document)
    if not Path(model).exists():
        pull_model(model)
    err.print(f"[bold]document[/bold] {sample} ({len(document):,} characters, one fact hidden halfway)")
    err.print(f"[bold]running[/bold] kvpot ask {sample} {question!r} --model {model} --budget {budget}",
              soft_wrap=True)
    session, sources = new_session([str(sample)], "*", model, question, policy=None, budget=budget, chunk=None,
                                   threads=threads, prompt=None, max_tokens=32)
    with session:
        read_with_progress(session, sources)
        said = answer(session, question)
    if said.stopped:
        raise typer.Exit(130)
    verdict = "[green]correct[/green]" if expected in said.text else f"[yellow]expected {expected}[/yellow]"
    err.print(f"[bold]answer[/bold] {verdict}")

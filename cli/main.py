"""The kvpot command line: one Typer app, one module per command group."""

from __future__ import annotations

from importlib import metadata

import typer

import kvpot
from kvpot.build.pins import LLAMA_CPP_COMMIT

from . import ask, bench, build, convert, doctor, models, rpc, run, serve, train
from ._crash import enable_crash_reports
from ._interrupt import exit_cleanly_on_signals
from ._options import KvpotCommand, KvpotGroup, aliased

app = typer.Typer(
    name="kvpot",
    cls=KvpotGroup,
    help="Long-document inference on small GGUF models with a bounded KV memory (the pot) inside llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # llama.cpp's tools and most CLIs take -h
    context_settings={"help_option_names": ["-h", "--help"]},
)


def version_line() -> str:
    """kvpot, the runtime package and the llama.cpp commit it is built from; read from package metadata,
    so it works (and says so) without loading libllama or with no runtime installed."""
    try:
        runtime = f"llama-cpp-python {metadata.version('llama_cpp_python')}"
    except metadata.PackageNotFoundError:
        runtime = "no llama-cpp-python runtime installed (make runtime)"
    return f"kvpot {kvpot.__version__} ({runtime}, llama.cpp {LLAMA_CPP_COMMIT})"


def _version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                       help="Print kvpot's version, its runtime's and the llama.cpp commit, and exit.")
          ) -> None:
    """Long-document inference on small GGUF models with a bounded KV memory (the pot) inside llama.cpp."""

app.command(cls=aliased(ask.ALIASES))(ask.ask)
app.command(cls=aliased(ask.ALIASES))(ask.chat)
app.command(cls=KvpotCommand)(doctor.doctor)
app.command(cls=KvpotCommand)(models.pull)
app.command(cls=KvpotCommand)(models.models)
app.command(cls=aliased(run.ALIASES))(run.run)
app.command(cls=KvpotCommand)(run.demo)
app.command(cls=KvpotCommand)(build.build)
app.command(name="rpc-server", cls=KvpotCommand)(rpc.rpc_server)
app.command(cls=KvpotCommand)(serve.serve)
app.add_typer(bench.app, name="bench")
app.add_typer(convert.app, name="convert")
app.add_typer(train.app, name="train")


def main() -> None:
    enable_crash_reports()
    exit_cleanly_on_signals()
    app()

"""The kvpot command line: one Typer app, one module per command group."""

from __future__ import annotations

import typer

from . import ask, bench, build, convert, doctor, models, rpc, run, train
from ._crash import enable_crash_reports

app = typer.Typer(
    name="kvpot",
    help="Long-document inference on small GGUF models with a bounded KV memory (the pot) inside llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command()(ask.ask)
app.command()(ask.chat)
app.command()(doctor.doctor)
app.command()(models.pull)
app.command()(models.models)
app.command()(run.run)
app.command()(run.demo)
app.command()(build.build)
app.command(name="rpc-server")(rpc.rpc_server)
app.add_typer(bench.app, name="bench")
app.add_typer(convert.app, name="convert")
app.add_typer(train.app, name="train")


def main() -> None:
    enable_crash_reports()
    app()

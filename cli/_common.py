"""What every command shares: stderr console for diagnostics and the one-line error contract."""

from __future__ import annotations

import functools

import typer
from rich.console import Console

from kvpot.errors import KvpotError

# `ask` and `run` exit with this when the model produced no answer (nothing but whitespace): the
# command ran, but its one product is missing, and a script must be able to tell that from an answer
# (1 is for user errors, 130 for Ctrl-C); `chat` says so on stderr and goes on
NO_ANSWER_EXIT = 5

# diagnostics, progress and tables go to stderr; answers go to stdout
err = Console(stderr=True, highlight=False)


def user_errors(fn):
    """Turn KvpotError into one red line on stderr and its exit code; Ctrl-C into exit 130."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KvpotError as e:
            err.print(f"[red]error:[/red] {e}", soft_wrap=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            err.print("[yellow]interrupted[/yellow]")
            raise typer.Exit(130) from None

    return wrapper


RPC_HELP = ("HOST:PORT[,HOST:PORT...] of `kvpot rpc-server` processes (other machines or this one): "
            "the model's layers and their part of the pot are spread over their devices")


def connect_rpc(spec: str | None) -> None:
    """Register the RPC servers' devices before a model loads (each server is checked first)."""
    if not spec:
        return
    from kvpot.runtime.rpc import parse_endpoints, use_servers

    endpoints = parse_endpoints(spec)
    devices = use_servers(endpoints)
    err.print(f"RPC: {', '.join(endpoints)} (devices: {', '.join(devices)})", soft_wrap=True)

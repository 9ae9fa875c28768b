"""`kvpot rpc-server`: lend this machine's device to `kvpot ask --rpc` on another machine."""

from __future__ import annotations

import typer

from kvpot.session.settings import default_threads

from ._common import err, user_errors


@user_errors
def rpc_server(
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDR",
                             help="address to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(50052, "--port", "-p", min=1, max=65535, help="TCP port"),
    threads: int = typer.Option(None, "--threads", "-t", min=1, show_default="every core",
                                help="CPU threads"),
    device: str = typer.Option(None, "--device", show_default="the first GPU, else the CPU",
                              help="which device to serve"),
) -> None:
    """Serve this machine's GPU or CPU to kvpot (or llama.cpp) clients over llama.cpp's RPC protocol.

    Runs until Ctrl-C. Clients pass --rpc HOST:PORT; layers of the model and their part of the pot then live here. Client and server must run the same kvpot build. The protocol has no authentication: listen beyond loopback only on a trusted network (docs/backends.md).
    """
    from kvpot.runtime.rpc import serve

    serve(host, port, threads or default_threads(), device, say=lambda m: err.print(f"[yellow]{m}[/yellow]"))

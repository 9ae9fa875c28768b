"""`kvpot serve`: an OpenAI-compatible HTTP server over documents read once into the pot (docs/serve.md)."""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from kvpot.display import printable
from kvpot.errors import KvpotError

from ._common import err, set_verbosity, user_errors
from .ask import (
    BudgetOpt,
    ChunkOpt,
    FlashAttnOpt,
    LocatorOpt,
    ModelOpt,
    NPredictOpt,
    PolicyOpt,
    PromptFormatOpt,
    ThreadsOpt,
)

API_KEY_ENV = "KVPOT_API_KEY"
DEFAULT_PORT = 8080  # llama-server's
INSTALL = "kvpot serve needs Starlette and uvicorn: pip install 'kvpot[serve]' (or pip install starlette uvicorn)"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _require_stack() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise KvpotError(INSTALL) from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_documents(specs: list[str]) -> dict[str, Path]:
    """NAME=PATH pairs, checked before any model loads: a name a model id can hold, each once, a path that
    exists."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not path:
            raise KvpotError(f"--document takes NAME=PATH, got {printable(spec)!r}")
        if not NAME.fullmatch(name):
            raise KvpotError(f"--document name {printable(name)!r}: use letters, digits, '.', '_' and '-' "
                             "(up to 64, starting with a letter or digit); it becomes the model id kvpot:NAME")
        if name in out:
            raise KvpotError(f"--document name {name!r} is given twice")
        p = Path(path).expanduser()
        if not p.exists():
            raise KvpotError(f"--document {name}: {printable(path)} does not exist")
        out[name] = p
    return out


def _bind(host: str, port: int) -> socket.socket:
    """The listening address, taken before the documents are read (a port in use is said at once, not after
    minutes of reading); connections are refused until the server listens on it."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise KvpotError(f"--host {printable(host)}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise KvpotError(f"cannot listen on {host}:{port}: {e.strerror} (choose another --port)") from None
    return sock


@user_errors
def serve(
    documents: Annotated[list[str], typer.Option(
        "--document", "-d", metavar="NAME=PATH", show_default="none",
        help="a file or folder to serve as the model kvpot:NAME; repeatable")] = None,
    model: ModelOpt = None,
    policy: PolicyOpt = None,
    budget: BudgetOpt = None,
    chunk: ChunkOpt = None,
    threads: ThreadsOpt = None,
    prompt: PromptFormatOpt = None,
    max_tokens: NPredictOpt = None,
    flash_attn: FlashAttnOpt = None,
    locator: LocatorOpt = None,
    host: Annotated[str, typer.Option("--host", metavar="ADDR",
                                      help="address to listen on; beyond loopback, with --api-key")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", metavar="N", help="TCP port")] = DEFAULT_PORT,
    api_key: Annotated[str, typer.Option(
        "--api-key", metavar="KEY", envvar=API_KEY_ENV, show_default=f"${API_KEY_ENV}, else none",
        help="require Authorization: Bearer KEY")] = None,
    allow_origin: Annotated[list[str], typer.Option(
        "--allow-origin", metavar="ORIGIN", show_default="none",
        help="a web page origin let call it (CORS); repeatable")] = None,
) -> None:
    """Serve documents of any length over OpenAI's chat completions API (docs/serve.md).

    Each --document is read once (as `kvpot chat` reads it) and answers as the model kvpot:NAME: every request's conversation goes after the document, whose read state is restored before each request. Past what the pot holds, each request's last question is answered as `kvpot chat` answers it: its passages located (--locator) and read again with full attention, the conversation after them. The read is saved under $KVPOT_HOME/serve, so a restart reopens it instead of reading it again. The model's own name answers without a document. Requests queue and are answered one at a time, in the memory of one pot. --allow-origin names a web page origin (http://localhost:3000) whose scripts may call the API from a browser.
    """
    set_verbosity(verbose=True)  # a server's log keeps the reading's details (budget, context, prompt format)
    _require_stack()
    if api_key is not None and not api_key.strip():
        raise KvpotError(f"--api-key (or ${API_KEY_ENV}) is empty; give a key or leave it out")
    if not is_loopback(host) and not api_key:
        # the documents are served to whoever can reach the port: on a network, a key is the least
        raise KvpotError(f"--host {printable(host)} is reachable from other machines: give --api-key KEY (or "
                         f"${API_KEY_ENV}) so that only clients with the key read the documents")
    if not 1 <= port <= 65535:
        raise KvpotError(f"--port must be in 1 … 65535, got {port}")
    if not documents:
        raise KvpotError("pass at least one --document NAME=PATH to serve")
    docs = parse_documents(documents)
    sock = _bind(host, port)
    try:
        backend = _read_documents(docs, model, threads, max_tokens, dict(
            policy=policy, budget=budget, chunk=chunk, threads=threads, prompt=prompt, max_tokens=max_tokens,
            flash_attn=flash_attn, question_before=None, locator=locator))
        try:
            _run(backend, sock, host, api_key, allow_origin or [])
        finally:
            backend.close()
    finally:
        sock.close()


def _read_documents(docs: dict[str, Path], model: str | None, threads, max_tokens, opts: dict):
    """Each document's saved context reopened, or its input read and saved first; the backend holds the
    last one open."""
    from kvpot.models.registry import KNOWN
    from kvpot.models.resolve import resolve_model
    from kvpot.serve.backend import Backend, Document, context_path, contexts_dir
    from kvpot.session.default_model import default_model

    from ._session import new_session, reopen_session, save
    from .reading import read_with_progress

    chosen: list[str] = []
    model = model or default_model(say=chosen.append)
    for line in chosen:
        err.print(escape(line), soft_wrap=True)
    facts, _ = resolve_model(model)
    key_opts = {k: v for k, v in opts.items() if k != "threads"}

    def reopen(path: Path):
        return reopen_session(str(path), model, threads, max_tokens, resettable=True)

    session = None
    served: dict[str, Document] = {}
    for name, path in docs.items():
        ctx = context_path(name, path, facts.path, key_opts)
        if session is not None:
            session.close()
            session = None
        if ctx.is_file():
            try:
                session = reopen(ctx)
            except KvpotError as e:
                err.print(f"[yellow]{escape(printable(str(e)))}; reading {escape(name)} again[/yellow]", soft_wrap=True)
        if session is None:
            err.print(f"[bold]{escape(name)}[/bold]: {escape(printable(str(path)))}", soft_wrap=True)
            contexts_dir().mkdir(parents=True, exist_ok=True)
            reading, sources = new_session([str(path)], ["*"], model, None, save_to=ctx, resettable=False, **opts)
            try:
                if not read_with_progress(reading, sources):
                    raise KvpotError(f"the read of {name} was stopped: nothing is served")
                if not save(reading, ctx):
                    raise KvpotError(f"{name}'s context could not be saved to {ctx}")
            finally:
                reading.close()
            session = reopen(ctx)  # served from the file: its state is restored from there for each request
        served[name] = Document(name, str(path), ctx, session.doc_tokens)
    # the plain model's id: a registry name as given, else the file's name without .gguf (a GGUF's own
    # general.name may hold spaces, which some front ends cannot put in a model field)
    model_id = session.model_name if session.model_name in KNOWN else facts.path.stem
    return Backend(model_id=model_id, documents=served, open_context=reopen, session=session,
                   open_doc=name, log=lambda line: err.print(printable(line), soft_wrap=True, markup=False, emoji=False))


def _run(backend, sock: socket.socket, host: str, api_key: str | None, origins: list[str]) -> None:
    import uvicorn

    from kvpot.serve.app import make_app

    app = make_app(backend, api_key=api_key, allow_origins=origins)
    port = sock.getsockname()[1]
    where = f"[{host}]" if ":" in host else host
    err.print(f"serving {', '.join(backend.model_ids())} on http://{where}:{port}/v1 "
              f"({'API key required' if api_key else 'no API key'}); Ctrl-C stops", soft_wrap=True, markup=False,
              emoji=False)
    config = uvicorn.Config(app, log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=5)
    uvicorn.Server(config).run(sockets=[sock])

"""The HTTP side of `kvpot serve`: OpenAI's chat completions API on Starlette.

One model is loaded per process, so requests queue on an asyncio lock and answer one at a time; each
answer runs in one worker thread (every llama.cpp call is made from that thread) and its pieces pass to
the event loop through a queue. A client that goes away (a closed stream, a dropped connection) sets the
answer's cancel flag and generation stops at its next piece; the lock is released only when the worker
has returned, so the next request never finds the engine in use.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from kvpot.errors import KvpotError

from .backend import Backend, Params, Result, check_params, describe_error
from .conversation import BadRequest, parse_messages

# how often a non-streamed answer checks that its client is still there
DISCONNECT_POLL_S = 0.5


def error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
          code: str | None = None) -> JSONResponse:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status)


class Server:
    def __init__(self, backend: Backend, api_key: str | None = None):
        self.backend = backend
        self.api_key = api_key
        self.lock = asyncio.Lock()
        # one thread: every llama.cpp call comes from it
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpot-answer")
        self.created = int(time.time())

    # -- auth and errors ----------------------------------------------------------------------------

    def _unauthorized(self, request: Request) -> JSONResponse | None:
        if not self.api_key:
            return None
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            what = "no API key given" if not auth else "the API key is wrong"
            return error(401, f"{what}: send Authorization: Bearer KEY (the key kvpot serve was started with)",
                         "invalid_request_error", code="invalid_api_key")
        return None

    # -- endpoints ----------------------------------------------------------------------------------

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> JSONResponse:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        data = [{"id": m, "object": "model", "created": self.created, "owned_by": "kvpot"}
                for m in self.backend.model_ids()]
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> JSONResponse:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        name = request.path_params["model"]
        if name not in self.backend.model_ids():
            return self._unknown_model(name)
        return JSONResponse({"id": name, "object": "model", "created": self.created, "owned_by": "kvpot"})

    def _unknown_model(self, name) -> JSONResponse:
        return error(404, f"the model {name!r} does not exist; this server has {', '.join(self.backend.model_ids())}",
                     param="model", code="model_not_found")

    async def chat_completions(self, request: Request):
        if (denied := self._unauthorized(request)) is not None:
            return denied
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            return error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return error(400, "the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return error(400, "model is required (GET /v1/models lists them)", param="model")
        try:
            self.backend.target(model)
        except KeyError:
            return self._unknown_model(model)
        try:
            params = check_params(body, None)
            parse_messages(body.get("messages"))  # checked before queueing: a bad body never waits
        except BadRequest as e:
            return error(400, str(e), param=e.param)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            return error(400, "stream must be true or false", param="stream")
        opts = body.get("stream_options") or {}
        include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
        ident = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if stream:
            return StreamingResponse(self._sse(request, ident, model, body["messages"], params, include_usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self._complete(request, ident, model, body["messages"], params)

    # -- answering ----------------------------------------------------------------------------------

    async def _pieces(self, model: str, messages, params: Params, result: Result, cancel: threading.Event):
        """The answer's pieces as they come from the worker thread; ("error", exc) items for a failure.
        Waits its turn on the lock; whoever stops iterating (a client gone) cancels the answer."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        put = lambda item: loop.call_soon_threadsafe(queue.put_nowait, item)  # noqa: E731

        def work() -> None:
            try:
                for piece in self.backend.answer(model, messages, params, cancel, result):
                    put(("piece", piece))
                put(("done", None))
            except BaseException as e:  # reported to the request, never lost in the thread
                put(("error", e))

        await self.lock.acquire()
        try:
            future = loop.run_in_executor(self.worker, work)
        except BaseException:
            self.lock.release()
            raise
        # released when the worker returns, not when this request's task ends: a cancelled request's
        # answer stops at its next piece, and the next request waits for that
        future.add_done_callback(lambda _: self.lock.release())
        try:
            while True:
                kind, value = await queue.get()
                if kind == "done":
                    return
                yield kind, value
                if kind == "error":
                    return
        finally:
            cancel.set()  # a no-op once the answer is done

    async def _complete(self, request: Request, ident: str, model: str, messages, params: Params):
        result, cancel = Result(), threading.Event()
        parts: list[str] = []
        pieces = self._pieces(model, messages, params, result, cancel)
        watch = asyncio.ensure_future(self._watch_disconnect(request, cancel))
        try:
            async for kind, value in pieces:
                if kind == "error":
                    return self._failure(value)
                parts.append(value)
        finally:
            watch.cancel()
            await pieces.aclose()
        if result.cancelled:
            return error(499, "the client went away", "invalid_request_error")  # nobody reads it
        return JSONResponse({
            "id": ident, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(parts)},
                         "finish_reason": result.finish_reason, "logprobs": None}],
            "usage": self._usage(result)})

    async def _watch_disconnect(self, request: Request, cancel: threading.Event) -> None:
        while not cancel.is_set():
            if await request.is_disconnected():
                cancel.set()
                return
            await asyncio.sleep(DISCONNECT_POLL_S)

    async def _sse(self, request: Request, ident: str, model: str, messages, params: Params, include_usage: bool):
        result, cancel = Result(), threading.Event()
        created = int(time.time())

        def chunk(delta: dict, finish: str | None = None) -> str:
            return "data: " + json.dumps({"id": ident, "object": "chat.completion.chunk", "created": created,
                                          "model": model, "choices": [{"index": 0, "delta": delta,
                                                                       "finish_reason": finish,
                                                                       "logprobs": None}]}) + "\n\n"

        pieces = self._pieces(model, messages, params, result, cancel)
        try:
            yield chunk({"role": "assistant", "content": ""})
            async for kind, value in pieces:
                if kind == "error":
                    err = self._error_body(value)
                    yield "data: " + json.dumps(err) + "\n\n"
                    yield "data: [DONE]\n\n"
                    return
                yield chunk({"content": value})
            yield chunk({}, result.finish_reason)
            if include_usage:
                yield "data: " + json.dumps({"id": ident, "object": "chat.completion.chunk", "created": created,
                                             "model": model, "choices": [], "usage": self._usage(result)}) + "\n\n"
            yield "data: [DONE]\n\n"
        finally:
            cancel.set()
            await pieces.aclose()

    @staticmethod
    def _usage(result: Result) -> dict:
        return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens}

    @staticmethod
    def _error_body(e: BaseException) -> dict:
        if isinstance(e, BadRequest):
            return {"error": {"message": str(e), "type": "invalid_request_error", "param": e.param, "code": None}}
        return {"error": {"message": describe_error(e), "type": "server_error", "param": None, "code": None}}

    def _failure(self, e: BaseException) -> JSONResponse:
        body = self._error_body(e)
        status = 400 if isinstance(e, (BadRequest, KvpotError)) else 500
        return JSONResponse(body, status_code=status)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    kind = {404: "not found", 405: "method not allowed"}.get(exc.status_code, exc.detail)
    return error(exc.status_code, f"{request.method} {request.url.path}: {kind}",
                 code={404: "not_found", 405: "method_not_allowed"}.get(exc.status_code))


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    return error(500, describe_error(exc), "server_error")


def make_app(backend: Backend, api_key: str | None = None, allow_origins: list[str] | None = None) -> Starlette:
    server = Server(backend, api_key)
    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{model:path}", server.model, methods=["GET"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        # the same without /v1, as llama-server answers both
        Route("/models", server.models, methods=["GET"]),
        Route("/chat/completions", server.chat_completions, methods=["POST"]),
    ]
    middleware = []
    if allow_origins:  # browsers' front ends on another origin (llama.cpp's web UI served elsewhere)
        middleware.append(Middleware(CORSMiddleware, allow_origins=allow_origins, allow_methods=["GET", "POST"],
                                     allow_headers=["Authorization", "Content-Type"]))
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={HTTPException: _http_error, Exception: _server_error})
    app.state.server = server
    return app

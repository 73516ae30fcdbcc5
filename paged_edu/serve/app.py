"""The HTTP routes: OpenAI's API over the engine core, ``/metrics``, ``/health``, ``/reset_prefix_cache``.

===========================  ==========================================================================
``POST /v1/completions``      a prompt (text or token ids) -> its continuation; ``stream: true`` as
                              server-sent events (``data: {...}`` chunks, ``data: [DONE]`` last)
``POST /v1/chat/completions`` messages through the model's chat template -> the assistant's reply
``GET /v1/models``            the one model served (``max_model_len`` beside it, as vLLM lists it)
``GET /health``               200 while the engine core runs, 503 once it has stopped
``GET /metrics``              Prometheus text: vLLM's names (:mod:`~paged_edu.serve.metrics`)
``POST /reset_prefix_cache``  drop every cached block no request holds (vLLM has it in dev mode only)
===========================  ==========================================================================

Every refusal is an OpenAI error body (:func:`~paged_edu.serve.protocol.error_body`) naming the
field, and leaves the engine as it was: a body that is not JSON, a field of the wrong type or out
of range, a prompt or ``max_tokens`` past the model length -> 400; a request without the
``--api-key`` -> 401 (``/v1/*`` only, as vLLM); a body past ``--max-body-bytes`` -> 413 before a
byte of it is parsed (:class:`BodyLimit`). A client that disconnects, mid-stream or while waiting
for a whole answer, has its request aborted: the engine frees its blocks before the next step.

Streaming sends, each time a route gets the event loop, everything its request produced since its
last chunk: one chunk per sample with new text. Under light load that is a chunk per engine step;
when the HTTP side falls behind (one event loop writes every stream), a chunk carries the tokens of
several steps (:class:`~paged_edu.serve.client.RequestStream` keeps them, as vLLM's output processor
merges them), so a busy server costs fewer writes rather than a growing queue -- and the engine, in
its own process (:mod:`~paged_edu.serve.core`), never waits for the writes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from paged_edu.serve import protocol as P
from paged_edu.serve.client import EngineClient, RequestStream, Update
from paged_edu.serve.tokenizer import Detokenizer, apply_chat_template

__all__ = ["APIKey", "BodyLimit", "OpenAIRoutes", "ServerState", "asgi_app", "build_app"]

log = logging.getLogger("paged_edu.serve")


@dataclass
class ServerState:
    """What the routes need: the engine core's client and what to say about the model."""

    client: EngineClient
    tokenizer: object
    model_name: str
    max_model_len: int
    vocab_size: int
    metrics: object
    api_key: str | None = None


def _error(exc: P.RequestError) -> JSONResponse:
    return JSONResponse(P.error_body(str(exc), exc.status, exc.param), status_code=exc.status)


def _validation_error(exc: ValidationError) -> P.RequestError:
    """pydantic's complaint as a 400 naming the field (``messages.0.role``); a value that fits none
    of a field's accepted types gets one message, not one per type pydantic tried."""
    errors = exc.errors()
    first = errors[0]
    path = [str(p) for p in first["loc"] if not _TYPE_TAG.search(str(p))]
    param = ".".join(path) or None
    if sum(".".join(str(p) for p in e["loc"]).startswith(param or "") for e in errors) > 1:
        got = first.get("input")
        return P.RequestError(f"{param} has the wrong type: got {type(got).__name__} {str(got)[:60]!r}", param)
    return P.RequestError(f"{param}: {first['msg']}" if param else first["msg"], param)


_TYPE_TAG = re.compile(r"[\[\]]|^(str|int|float|bool|dict|list|none|function-[a-z]+)$")


class BodyLimit:
    """ASGI middleware: a body past ``max_bytes`` gets 413 before it is parsed -- at once from its
    ``Content-Length``, or while a chunked body is read (read here, up to the bound, then handed on)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.max_bytes:
                return await self._too_large(send, length.decode("latin-1"))
            return await self.app(scope, receive, send)
        if scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:  # a chunked body: read it here, never past the bound
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self._too_large(send, f"more than {len(body)}")
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send, length: str) -> None:
        body = json.dumps(
            P.error_body(
                f"the request body ({length} bytes) is past this server's bound of {self.max_bytes} bytes "
                "(--max-body-bytes)",
                413,
            )
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class APIKey:
    """ASGI middleware: ``/v1/*`` needs ``Authorization: Bearer <--api-key>``, else 401 (vLLM checks
    the same paths, with a pure ASGI middleware too). Written on ASGI, not as an ``@app.middleware``
    function: starlette's ``BaseHTTPMiddleware`` behind that decorator hands every streamed chunk of
    every request through a task and a memory stream of its own -- 19-27 % of the API process's CPU
    while 512 streams ran on the tiny model here, with no key set."""

    def __init__(self, app, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                return await JSONResponse(
                    P.error_body("a valid API key is needed: 'Authorization: Bearer KEY'", 401), status_code=401
                )(scope, receive, send)
        await self.app(scope, receive, send)


class OpenAIRoutes:
    """ASGI middleware: ``POST /v1/completions`` and ``POST /v1/chat/completions`` -- every request a
    client's workload sends -- go from the ASGI call straight to the route (:func:`_serve`, as
    :func:`build_app` declares them); every other request goes on to the FastAPI app.

    What it buys: FastAPI's way to a route (its error, body-limit and exit-stack middlewares, the
    router, the request handler with its dependency solver) is the same work for every request, and
    with the engine in its own process the API server's one event loop paces intake. A completion of
    157 prompt token ids, its ASGI call to its end with a stub core (2 tokens), in-process on this
    2-core CPU, best runs: 342 / 334 us of CPU through FastAPI, 191 / 193 us straight (FastAPI's
    middlewares left around it: 231 / 215 us).
    """

    PATHS = {"/v1/completions": False, "/v1/chat/completions": True}  # path -> chat?

    def __init__(self, app, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        chat = self.PATHS.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if chat is None:
            return await self.app(scope, receive, send)
        response = await _serve(self.state, Request(scope, receive), chat)
        await response(scope, receive, send)


def asgi_app(state: ServerState, max_body_bytes: int, app: FastAPI):
    """The ASGI application around ``app`` (:func:`build_app`'s), outermost first: the body bound
    (413 before a byte is parsed), the API key (401), the completions' short way (:class:`OpenAIRoutes`)."""
    inner = OpenAIRoutes(app, state)
    if state.api_key is not None:
        inner = APIKey(inner, state.api_key)
    return BodyLimit(inner, max_body_bytes)


def build_app(state: ServerState) -> FastAPI:
    """The routes as FastAPI serves them (the two completions routes are reached through
    :class:`OpenAIRoutes`, in :func:`asgi_app`, which calls the same :func:`_serve`)."""
    app = FastAPI(title="paged_edu", docs_url=None, redoc_url=None)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if state.client.alive else 503)

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        card = {
            "id": state.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "paged_edu",
            "root": state.model_name,
            "max_model_len": state.max_model_len,
            "vocab_size": state.vocab_size,
        }
        return {"object": "list", "data": [card]}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        return {"num_cached_blocks_left": await state.client.call("reset_prefix_cache")}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _serve(state, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _serve(state, request, chat=True)

    return app


async def _serve(state: ServerState, request: Request, chat: bool) -> Response:
    try:
        req, prompt = await _read(state, request, chat)
        params, stop = P.sampling_params(req, len(prompt), state.max_model_len, state.tokenizer.eos_token_id)
    except P.RequestError as exc:
        return _error(exc)
    stream = state.client.add(prompt, params, req.cache_salt, state.client.now())
    try:
        await stream.accepted
    except P.RequestError as exc:  # the engine refused it (the message names the field)
        if exc.param == "prompt" and chat:
            exc.param = "messages"
        return _error(exc)
    except asyncio.CancelledError:  # the client left while it was being queued
        state.client.abort(stream.rid)
        raise
    reply = _Reply(state, req, chat, prompt, stop, params.n)
    if req.stream:
        return _EventStream(state, stream, reply)
    return await _whole(state, request, stream, reply)


async def _read(state: ServerState, request: Request, chat: bool):
    """The request and its prompt's token ids, or a :class:`~paged_edu.serve.protocol.RequestError`."""
    raw = await request.body()
    model = P.ChatCompletionRequest if chat else P.CompletionRequest
    try:  # parsed and checked in one pass of pydantic's JSON parser: 15 us for 157 token ids, 30 the way below
        req = model.model_validate_json(raw)
    except ValidationError:  # refused: again the plain way, for the error that names what is wrong
        req = _parse(raw, model)
    ignored = P.ignored_fields(req)
    if ignored:  # as vLLM: real clients send extras
        log.warning("The following fields were present in the request but ignored: %s", set(ignored))
    refused = P.unsupported_field(req)
    if refused is not None:
        raise refused
    if req.model is not None and req.model != state.model_name:
        raise P.RequestError(f"The model `{req.model}` does not exist (this server serves {state.model_name!r}).",
                             "model", 404)  # fmt: skip
    if chat:
        prompt = apply_chat_template(state.tokenizer, P.chat_messages(req))
    else:
        text_or_ids = P.prompt_of(req)
        prompt = state.tokenizer.encode(text_or_ids) if isinstance(text_or_ids, str) else list(text_or_ids)
        if not prompt:
            raise P.RequestError("prompt is empty; it needs at least one token", "prompt")
        if min(prompt) < 0 or max(prompt) >= state.vocab_size:
            bad = next(t for t in prompt if not 0 <= t < state.vocab_size)
            raise P.RequestError(f"prompt: token id {bad} is outside the vocabulary [0, {state.vocab_size})", "prompt")
    return req, prompt


def _parse(raw: bytes, model):
    """The request in ``raw``, through ``json`` then ``model``, or a :class:`~paged_edu.serve.protocol.RequestError`
    saying what is wrong: not JSON, not an object, a field (the same request as ``model_validate_json`` gives
    where both accept the body)."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise P.RequestError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise P.RequestError(f"the body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from None


class _Reply:
    """The reply as it grows: per sample its text (with stop strings), its token ids, why it ended."""

    def __init__(self, state: ServerState, req, chat: bool, prompt: list[int], stop, n: int) -> None:
        self.req, self.chat, self.model, self.n = req, chat, state.model_name, n
        self.num_prompt_tokens = len(prompt)
        self.detok = [Detokenizer(state.tokenizer, prompt, stop) for _ in range(n)]
        self.token_ids: list[list[int]] = [[] for _ in range(n)]
        self.text = [""] * n
        self.finish: list[str | None] = [None] * n
        self.stop_reason: list = [None] * n
        self.num_cached_tokens = 0
        self.error: str | None = None
        self.id = P.new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())

    @property
    def done(self) -> bool:
        return None not in self.finish

    def take(self, update: Update, on_stop) -> dict[int, tuple[str, list[int]]]:
        """Apply one update; returns ``sample -> (new text, new token ids)``. ``on_stop(i)`` is called
        for a sample whose stop string just appeared (the engine must end it)."""
        new: dict[int, tuple[str, list[int]]] = {}
        for i, ids in update.tokens:
            detok = self.detok[i]
            if self.finish[i] is not None:
                continue  # past its stop string: the engine's abort is on its way
            if detok.stop:  # a stop string can end the sample at any token: they go one by one
                text = ""
                for k, token in enumerate(ids):
                    text += detok.add([token])
                    if detok.stopped is not None:
                        ids = ids[: k + 1]  # the tokens after it are not the reply's
                        break
            else:  # the same text as a token at a time (the detokenizer walks them one by one): one call
                text = detok.add(ids)
            self.token_ids[i] += ids
            self.text[i] += text
            new[i] = (text, ids)
            if detok.stopped is not None:
                self.finish[i], self.stop_reason[i] = "stop", detok.stopped
                if update.finish_reasons is None:
                    on_stop(i)
        if update.finish_reasons is not None:
            self.num_cached_tokens, self.error = update.num_cached_tokens, update.error
            for i, reason in enumerate(update.finish_reasons):
                if self.finish[i] is None:
                    text = self.detok[i].add([], final=True)
                    self.text[i] += text
                    t, ids = new.get(i, ("", []))
                    new[i] = (t + text, ids)
                    self.finish[i] = "stop" if self.detok[i].stopped is not None else reason
                    self.stop_reason[i] = self.detok[i].stopped
        return new

    def usage(self) -> dict:
        return P.usage(self.num_prompt_tokens, sum(map(len, self.token_ids)), self.num_cached_tokens)


def _watch_client(receive, stream: RequestStream) -> asyncio.Future:
    """A task that :meth:`~paged_edu.serve.client.RequestStream.interrupt`-s ``stream`` when its client
    disconnects; the route cancels it once its answer is out."""

    async def watch():
        while (await receive())["type"] != "http.disconnect":
            pass
        stream.interrupt()

    return asyncio.ensure_future(watch())


def _body(text: str, more: bool) -> dict:
    return {"type": "http.response.body", "body": text.encode(), "more_body": more}


class _EventStream(Response):
    """A streamed answer: server-sent events written straight to the ASGI ``send``, one body each time
    the route gets the event loop (everything its request produced since), and at the end the last
    chunk, the usage and ``[DONE]`` as one body. Written on ASGI rather than with starlette's
    ``StreamingResponse``, which runs each response in a task group of its own (the body and a
    disconnect listener, under anyio's cancel scopes) and sends the end in four bodies. The chunks'
    JSON is :class:`~paged_edu.serve.protocol.ChunkEncoder`'s. Both together, 512 streams on the tiny
    model on this 2-core CPU (``bench-serve --request-rate inf``, runs interleaved with the
    ``StreamingResponse`` version): the API process's CPU 1.53 / 1.38 / 1.62 / 1.19 / 1.61 s against
    1.71 / 1.59 / 1.65 / 1.43 / 1.52 s (length scale 0.1), 4.35 / 4.70 s against 5.05 / 4.78 s (0.3)."""

    def __init__(self, state: ServerState, stream: RequestStream, reply: _Reply) -> None:
        self.state, self.stream, self.reply = state, stream, reply
        self.status_code, self.background = 200, None  # (what FastAPI reads of a Response)
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8")]

    async def __call__(self, scope, receive, send) -> None:
        state, stream, reply = self.state, self.stream, self.reply
        chunks = P.ChunkEncoder(reply.chat, reply.id, reply.created, reply.model)
        return_ids = reply.req.return_token_ids

        def stop_sample(i: int) -> None:
            state.client.abort(stream.rid, i)

        watch = _watch_client(receive, stream)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if reply.chat:  # the role first, as OpenAI and vLLM send it
                first = [P.chunk_choice(True, i, "", first=True) for i in range(reply.n)]
                await send(_body(P.event(P.chunk(True, reply.id, reply.created, reply.model, first)), more=True))
            while True:
                update = await stream.next()
                if update is None:
                    return  # the client left
                new = reply.take(update, stop_sample)
                if update.error is not None:
                    out = P.event(P.error_body(f"the request was ended: {update.error}", 500))
                else:
                    choices = [
                        chunks.choice(i, text, reply.finish[i], ids if return_ids else None, reply.stop_reason[i])
                        for i, (text, ids) in sorted(new.items())
                        if text or ids or reply.finish[i] is not None
                    ]
                    out = chunks.event(choices) if choices else ""
                if update.error is None and not reply.done:
                    if out:
                        await send(_body(out, more=True))
                    continue
                options = reply.req.stream_options
                if options is not None and options.include_usage and reply.error is None:
                    out += P.event(P.chunk(reply.chat, reply.id, reply.created, reply.model, [], reply.usage()))
                await send(_body(out + P.event("[DONE]"), more=False))
                return
        finally:
            watch.cancel()
            if not reply.done:  # the client went away (or the server is stopping): free its blocks
                state.client.abort(stream.rid)


async def _whole(state: ServerState, request: Request, stream: RequestStream, reply: _Reply):
    """A non-streamed answer, aborted if the client disconnects while it waits."""
    watch = _watch_client(request.receive, stream)
    try:
        while not reply.done:
            update = await stream.next()
            if update is None:
                return Response(status_code=499)  # nobody is listening
            reply.take(update, lambda i: state.client.abort(stream.rid, i))
    finally:
        watch.cancel()
        if not reply.done:
            state.client.abort(stream.rid)
    if reply.error is not None:
        return JSONResponse(P.error_body(f"the request was ended: {reply.error}", 500), status_code=500)
    choices = [
        P.choice(
            reply.chat,
            i,
            reply.text[i],
            reply.finish[i],
            token_ids=reply.token_ids[i] if reply.req.return_token_ids else None,
            stop_reason=reply.stop_reason[i],
        )
        for i in range(reply.n)
    ]
    return JSONResponse(P.response(reply.chat, reply.id, reply.model, choices, reply.usage()))

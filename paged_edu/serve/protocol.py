"""The OpenAI API as the server speaks it: request bodies, their checks, and the JSON it answers.

A request body is read by pydantic into :class:`CompletionRequest` or :class:`ChatCompletionRequest`
(the fields of OpenAI's API that paged_edu serves, and vLLM's extensions to it: ``cache_salt``,
``ignore_eos``, ``stop_token_ids``, ``return_token_ids``). Three kinds of field, as vLLM treats them
(``vllm/entrypoints/openai/protocol.py``):

* a field the server serves is checked -- its type, then its range against the model
  (:func:`sampling_params`); anything wrong is a :class:`RequestError` naming the field, answered
  with HTTP 400 and an OpenAI error body (:func:`error_body`);
* a field the server knows but does not serve (``logprobs``, ``tools``, a penalty, ...) is a 400
  saying so, when it asks for something (``logprobs: false`` asks for nothing);
* a field the server does not know is ignored with a logged warning (:func:`ignored_fields`):
  real clients send extras, and vLLM ignores them the same way.

Responses are plain dicts in the shapes of OpenAI's API (``completion``, ``chat.completion`` and
their streamed ``chunk`` forms); ``usage.prompt_tokens_details.cached_tokens`` counts the prompt
tokens the prefix cache served.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from paged_edu.core.validation import MAX_CACHE_SALT_LEN, SEED_LIMIT

__all__ = [
    "MAX_N",
    "ChatCompletionRequest",
    "ChunkEncoder",
    "CompletionRequest",
    "RequestError",
    "error_body",
    "ignored_fields",
    "sampling_params",
    "unsupported_field",
]

MAX_N = 128  # OpenAI's bound on ``n``

StrictInt = Annotated[int, Field(strict=True)]
Number = Annotated[float, Field(strict=True)]  # a JSON number (an int is one too), never a string


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` with an OpenAI error body naming ``param``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 413: "RequestTooLarge"}


def error_body(message: str, status: int = 400, param: str | None = None) -> dict:
    """OpenAI's error shape, as vLLM answers it: ``{"error": {message, type, param, code}}``."""
    kind = ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class _Request(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    n: StrictInt = 1
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extensions
    cache_salt: str | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    # Known, not served: refused when they ask for something (see UNSUPPORTED).
    logprobs: Any = None
    top_logprobs: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    logit_bias: Any = None
    min_tokens: Any = None
    best_of: Any = None
    response_format: Any = None


class CompletionRequest(_Request):
    """``POST /v1/completions``: ``prompt`` is text or token ids (one prompt per request)."""

    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    echo: Any = None
    suffix: Any = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict] | None = None


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``: ``messages`` through the model's chat template."""

    messages: list[ChatMessage]
    max_completion_tokens: StrictInt | None = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None


# A served field of the other endpoint, or a known one this server does not serve: refused when it
# asks for something; its "off" values pass.
UNSUPPORTED = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
    "min_tokens": (None, 0),
    "best_of": (None, 1),
    "response_format": (None, {"type": "text"}),
    "echo": (None, False),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "parallel_tool_calls": (None, False, True),
}


def unsupported_field(request: _Request) -> RequestError | None:
    """The first known field the server does not serve that asks for something, as a 400. Only the fields
    the body sent are read (a field left out has its default, None: off): reading all sixteen from the
    model -- the other endpoint's through pydantic's ``__getattr__`` -- was a quarter of a completion's
    CPU in the API process, its route called straight from ASGI (:class:`~paged_edu.serve.app.OpenAIRoutes`)."""
    sent = request.model_fields_set
    for name, off in UNSUPPORTED.items():
        if name not in sent:
            continue
        value = getattr(request, name)
        if not any(value is o or (type(value) is type(o) and value == o) for o in off):
            return RequestError(
                f"{name}={value!r} is not supported by paged_edu's server (it serves text and token ids only)", name
            )
    return None


def ignored_fields(request: _Request) -> list[str]:
    """Fields of the body the server does not know (they are ignored, with a logged warning)."""
    return sorted(request.model_extra or {})


def prompt_of(request: CompletionRequest) -> str | list[int]:
    """The one prompt of a completion request: text or token ids."""
    p = request.prompt
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        if len(p) != 1:
            raise RequestError(f"one prompt per request, got a batch of {len(p)}", "prompt")
        p = p[0]
    if isinstance(p, list) and not p:
        raise RequestError("prompt is empty; it needs at least one token", "prompt")
    return p


def chat_messages(request: ChatCompletionRequest) -> list[dict]:
    """The conversation as ``{"role", "content": str}`` dicts (text parts joined; other parts refused)."""
    if not request.messages:
        raise RequestError("messages is empty; a chat needs at least one message", "messages")
    out = []
    for i, m in enumerate(request.messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(
                        f"messages[{i}].content[{j}]: only text parts are served, got type {part.get('type')!r}",
                        f"messages[{i}].content",
                    )
                texts.append(part["text"])
            content = "".join(texts)
        out.append({"role": "system" if m.role == "developer" else m.role, "content": content or ""})
    return out


def sampling_params(request: _Request, num_prompt_tokens: int, max_model_len: int, eos_token_id: int | None):
    """The request's :class:`~paged_edu.engine.sampling.SamplingParams` and ``stop`` strings, every field
    checked against the model: raises :class:`RequestError` naming the field."""
    from paged_edu.engine.sampling import SamplingParams

    if num_prompt_tokens >= max_model_len:
        raise RequestError(
            f"the prompt is {num_prompt_tokens} tokens; this model's maximum context length is {max_model_len} "
            "tokens, and the reply needs at least one",
            "messages" if isinstance(request, ChatCompletionRequest) else "prompt",
        )
    room = max_model_len - num_prompt_tokens
    max_tokens = request.max_tokens
    if isinstance(request, ChatCompletionRequest) and request.max_completion_tokens is not None:
        max_tokens = request.max_completion_tokens
    if max_tokens is None:
        max_tokens = 16 if isinstance(request, CompletionRequest) else room  # OpenAI's and vLLM's defaults
    if max_tokens < 1:
        raise RequestError(f"max_tokens must be >= 1, got {max_tokens}", "max_tokens")
    if max_tokens > room:
        raise RequestError(
            f"max_tokens={max_tokens} is past the model length: this model's maximum context length is "
            f"{max_model_len} tokens and the prompt has {num_prompt_tokens}, so at most {room} can be generated",
            "max_tokens",
        )
    temperature = 1.0 if request.temperature is None else request.temperature  # OpenAI's default
    if not (math.isfinite(temperature) and temperature >= 0):
        raise RequestError(f"temperature must be a finite number >= 0, got {temperature}", "temperature")
    top_p = 1.0 if request.top_p is None else request.top_p
    if not (0 < top_p <= 1):
        raise RequestError(f"top_p must be in (0, 1], got {top_p}", "top_p")
    if not 1 <= request.n <= MAX_N:
        raise RequestError(f"n must be in [1, {MAX_N}], got {request.n}", "n")
    if request.seed is not None and not 0 <= request.seed <= SEED_LIMIT - request.n:
        raise RequestError(f"seed must be in [0, 2**64 - n], got {request.seed}", "seed")
    if request.cache_salt is not None and not 1 <= len(request.cache_salt) <= MAX_CACHE_SALT_LEN:
        raise RequestError(
            f"cache_salt must be a non-empty string of at most {MAX_CACHE_SALT_LEN} characters, "
            f"got one of {len(request.cache_salt)}",
            "cache_salt",
        )
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    stop_ids = list(request.stop_token_ids or [])
    if eos_token_id is not None and not request.ignore_eos:
        stop_ids.append(eos_token_id)
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=request.seed,
            stop_token_ids=tuple(stop_ids),
            n=request.n,
        )
    except ValueError as exc:  # e.g. n > 1 greedy: SamplingParams says why
        raise RequestError(str(exc), "n" if request.n > 1 else None) from None
    return params, tuple(s for s in stop if s)


# ----------------------------------------------------------------------------------------------
# Responses
# ----------------------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int) -> dict:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
        "prompt_tokens_details": {"cached_tokens": num_cached_tokens},
    }


def response(chat: bool, request_id: str, model: str, choices: list[dict], usage_: dict) -> dict:
    """A whole (non-streamed) answer: ``text_completion`` or ``chat.completion``."""
    body = {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
    }
    return body


def choice(chat: bool, index: int, text: str, finish_reason: str | None, token_ids=None, stop_reason=None) -> dict:
    out = {"index": index}
    if chat:
        out["message"] = {"role": "assistant", "content": text}
    else:
        out["text"] = text
    out.update(logprobs=None, finish_reason=finish_reason, stop_reason=stop_reason)
    if token_ids is not None:
        out["token_ids"] = token_ids
    return out


def chunk(chat: bool, request_id: str, created: int, model: str, choices: list[dict], usage_=None) -> dict:
    """One server-sent event's JSON: ``text_completion`` or ``chat.completion.chunk``."""
    body = {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body


def chunk_choice(chat: bool, index: int, text: str, finish_reason=None, token_ids=None, first=False, stop_reason=None):
    out = {"index": index}
    if chat:
        out["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
    else:
        out["text"] = text
    out.update(logprobs=None, finish_reason=finish_reason)
    if finish_reason is not None:
        out["stop_reason"] = stop_reason
    if token_ids is not None:
        out["token_ids"] = token_ids
    return out


_COMPACT = json.JSONEncoder(separators=(",", ":"))  # made once: json.dumps(..., separators=...) makes one a call


def dumps(data) -> str:
    """JSON as the server writes it: compact (no spaces after ``,`` and ``:``)."""
    return _COMPACT.encode(data)


def event(data: dict | str) -> str:
    """One server-sent event of any JSON (or ``[DONE]``): ``data: <json>`` and a blank line."""
    return f"data: {data if isinstance(data, str) else dumps(data)}\n\n"


class ChunkEncoder:
    """One streamed request's chunks as server-sent events: :func:`event` of :func:`chunk` of
    :func:`chunk_choice`, to the byte -- built cheaply for the choices that make most of a stream,
    those still mid-way (no finish reason): the chunk's fixed fields (id, object, created, model) are
    serialised once per request, and such a choice is its text's JSON between two fixed strings.
    (While 512 streams ran on the tiny model on a 2-core CPU, ``json.dumps`` of each chunk's dict was
    ~5 % of the API process's CPU.)"""

    def __init__(self, chat: bool, request_id: str, created: int, model: str) -> None:
        self.chat = chat
        self._head = "data: " + dumps(chunk(chat, request_id, created, model, []))[: -len("]}")]  # ..."choices":[
        self._open = '{"index":%d,"delta":{"content":' if chat else '{"index":%d,"text":'
        self._close = '},"logprobs":null,"finish_reason":null' if chat else ',"logprobs":null,"finish_reason":null'

    def choice(self, index: int, text: str, finish_reason=None, token_ids=None, stop_reason=None) -> str:
        """:func:`chunk_choice`'s JSON (not a chat's first, with the role: that one is :func:`event`'s)."""
        if finish_reason is not None:  # once per sample: the general way
            return dumps(chunk_choice(self.chat, index, text, finish_reason, token_ids, stop_reason=stop_reason))
        out = self._open % index + dumps(text) + self._close
        if token_ids is not None:
            out += ',"token_ids":' + dumps(token_ids)
        return out + "}"

    def event(self, choices: list[str]) -> str:
        """The chunk of ``choices`` (each :meth:`choice`'s JSON), as one server-sent event."""
        return self._head + ",".join(choices) + "]}\n\n"

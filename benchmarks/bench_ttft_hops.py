"""A lone request's time to first token through ``paged-edu serve``, hop by hop, with an engine whose steps
take a fixed time: what the server and HTTP add to the engine's own first token.

    python benchmarks/bench_ttft_hops.py                          # 24 requests, 1 s apart, T = 0.656 ms
    python benchmarks/bench_ttft_hops.py --gap 0.2 --requests 16  # quicker (the processes stay warmer)
    python benchmarks/bench_ttft_hops.py --no-sleep-on-idle       # the engine core spins while idle

Issue 46's target is a median TTFT at 1 req/s of at most 3 engine steps ("engine steps": the ITL p50 of the
same run). At that rate every request finds the server idle: its first token costs one prompt step and the
trip through both processes. This benchmark runs the real server -- the API process (uvicorn, the routes,
:class:`~paged_edu.serve.client.EngineClient`) and the engine core's process (:class:`~paged_edu.serve.core.EngineCore`'s
real loop and messages) -- with :class:`SteppedEngine` in place of the model's engine (the core's seam,
:data:`~paged_edu.serve.core.ENGINE_FACTORY`): a step that takes in a new request lasts ``--prompt-ms`` (default
1.469 ms: the H100's TTFT inside the engine at 96 prompt tokens, ``bench_ttft.py``, 63658e5), every other step
``--step-ms`` (T, default 0.656 ms: that lease's decode step), and every step gives each running sample a token.
The client is ``bench-serve``'s own (:func:`paged_edu.serve.bench._one`, aiohttp, streamed, token ids).

Each process marks the moments a request passes (``time.perf_counter``: one monotonic clock for the whole
machine), by wrappers this script puts around the server's functions -- in the API process, which it starts
through itself (``--api-process``), and in the engine core's, from the engine factory -- so the server's
code runs as it is; the wrappers cost a microsecond or two each. A mark is taken as a call starts (or as
one ends where nothing leaves the process in it): after a send the other process may be first. The hops, in order:

=================  ===========================================================================================
``client_out``     the client builds and writes the request -> the API process reads it (uvicorn's ``data_received``)
``http_in``        -> the route is called (uvicorn's parse, its task for the request, the ASGI middlewares)
``parse``          the body read, checked (pydantic) and its prompt known (``app._read``)
``to_core``        the sampling parameters made (``protocol.sampling_params``), the engine's clock read
``wake``           ``EngineClient.add`` called -> the core handles its message (the stream made, the message
                   packed and sent, ZeroMQ's I/O threads in both processes, the core's wakeup, unpack)
``add``            ``engine.add_request`` and the core's bookkeeping
``pre_step``       the core's work between the add and the step (the "added" reply packed and sent first)
``step``           the prompt step (the stub's ``--prompt-ms``)
``post_step``      the step's end -> its message starts out (the tokens gathered)
``back``           the message packed and sent -> the API process handles it (the event loop's reader callback)
``route``          the message handled -> the route has the tokens (the stream's waiter, a task switch)
``sse``            the route's chunk: detokenize, encode, write to the socket
``http_out``       written -> the client has the chunk parsed (loopback, aiohttp, JSON)
=================  ===========================================================================================

The server runs with its defaults; ``--no-sleep-on-idle`` passes that flag to it (the engine core polls its
input socket in a loop while idle instead of sleeping in the poll: :mod:`paged_edu.serve.core`), for an A/B of
the ``wake`` hop and the cold ones after it.

It prints the median of each hop, TTFT in units of T and of the client's ITL p50, and writes
``benchmarks/records/cpu/ttft_hops.json`` (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(HERE)]

from bench_api_stream import PacedEngine  # noqa: E402

HOPS_DIR_ENV = "PAGED_EDU_HOPS_DIR"  # where each process writes its marks as it stops
STEP_MS_ENV = "PAGED_EDU_STUB_STEP_MS"
PROMPT_MS_ENV = "PAGED_EDU_STUB_PROMPT_MS"
# The marks, in the order a request passes them: each hop is the time from one to the next
MARKS = ("client_send", "api_data", "api_call", "api_parsed", "api_add", "core_recv", "core_added", "step_start",
         "step_end", "core_tokens_sent", "api_tokens_in", "api_route_woke", "api_sse_sent", "client_first")  # fmt: skip
HOPS = ("client_out", "http_in", "parse", "to_core", "wake", "add", "pre_step", "step", "post_step", "back", "route", "sse",
        "http_out")  # fmt: skip
# Off the first token's path (the add's return, and what happens while the step runs), beside it: from the API's add
SIDE = ("api_add_sent", "core_reply_sent", "api_accepted", "api_headers_sent")

_marks: list[tuple[str, float]] = []


def mark(name: str) -> None:
    _marks.append((name, time.perf_counter()))


def _dump(process: str) -> None:
    folder = os.environ.get(HOPS_DIR_ENV)
    if folder:
        Path(folder, f"{process}.json").write_text(json.dumps(_marks))


def _wrap(owner, name: str, before=None, after=None) -> None:
    """``owner.name`` with ``before(*args)`` called first and ``after(result, *args)`` last."""
    inner = getattr(owner, name)

    if asyncio.iscoroutinefunction(inner):

        @functools.wraps(inner)
        async def wrapped(*args, **kwargs):
            if before is not None:
                before(*args)
            result = await inner(*args, **kwargs)
            if after is not None:
                after(result, *args)
            return result
    else:

        @functools.wraps(inner)
        def wrapped(*args, **kwargs):
            if before is not None:
                before(*args)
            result = inner(*args, **kwargs)
            if after is not None:
                after(result, *args)
            return result

    setattr(owner, name, wrapped)


# -- the engine core's process ----------------------------------------------------------------------------
class SteppedEngine(PacedEngine):
    """:class:`~bench_api_stream.PacedEngine` whose step lasts ``prompt_s`` when a request joins in it (its
    prompt step: the first token comes out of it, as a lone request's does from the engine with async
    scheduling, ``bench_ttft.py``) and ``step_s`` otherwise, from the call's start (slept, the last 0.2 ms
    spun: a GPU engine's host waits for the device busy too)."""

    def __init__(self, step_s: float, prompt_s: float, vocab: int = 259) -> None:
        super().__init__(step_s, vocab)
        self.prompt_s = prompt_s

    def step(self):
        start = time.perf_counter()
        mark("step_start")
        if self._busy_since is None:
            self._busy_since = start
        end = start + (self.prompt_s if self._new else self.step_s)
        if end - time.perf_counter() > 3e-4:
            time.sleep(end - time.perf_counter() - 2e-4)
        while time.perf_counter() < end:
            pass
        outputs = self._produce()
        mark("step_end")
        return outputs

    def close(self) -> None:
        _dump("core")


def stepped_engine(args):
    """:data:`paged_edu.serve.core.ENGINE_FACTORY`'s callable: the stub, and the core's marks."""
    # (the core's process runs paged_edu/serve/core.py as __main__: its EngineCore is that module's)
    EngineCore = (
        getattr(sys.modules["__main__"], "EngineCore", None)
        or importlib.import_module("paged_edu.serve.core").EngineCore
    )

    def handle(core, message):
        if message[0] == "add":
            mark("core_recv")

    def handled(_, core, message):
        if message[0] == "add":
            mark("core_added")

    def sending(core):  # (as the send starts: the API process may have the message before it returns)
        if any(c.rids or c.more for c in core.channels):  # (a step's tokens: the core's message, its docstring)
            mark("core_tokens_sent")
        elif any(c.replies for c in core.channels):
            mark("core_reply_sent")

    _wrap(EngineCore, "_handle", handle, handled)
    _wrap(EngineCore, "_send", sending)
    step_s = float(os.environ.get(STEP_MS_ENV, "0.656")) / 1e3
    engine = SteppedEngine(step_s, float(os.environ.get(PROMPT_MS_ENV, "1.469")) / 1e3)
    info = {
        "model_name": args.served_model_name or "stepped-stub",
        "max_model_len": engine.max_model_len,
        "vocab_size": engine.vocab,
        "kv_events_endpoint": None,
        "description": f"a stub engine: prompt steps {engine.prompt_s * 1e3:g} ms, others {step_s * 1e3:g} ms",
    }
    return engine, None, info


# -- the API process ----------------------------------------------------------------------------------------
def api_process(argv: list[str]) -> int:
    """``paged-edu serve ARGV`` with the API process's marks (this script run with ``--api-process``)."""
    from paged_edu import cli
    from paged_edu.serve import app, client

    def first_send(response_call):
        @functools.wraps(response_call)
        async def call(self, scope, receive, send):
            async def marked(message):  # (marked as the write starts: the client may have it before it returns)
                if message["type"] == "http.response.start":
                    mark("api_headers_sent")
                else:  # (a body: a chunk, or the last one -- all the tokens at once, if the route fell behind)
                    mark("api_sse_sent")
                await send(message)

            return await response_call(self, scope, receive, marked)

        return call

    _wrap(app.OpenAIRoutes, "__call__", lambda *a: mark("api_call"))
    for module, protocol in (("httptools_impl", "HttpToolsProtocol"), ("h11_impl", "H11Protocol")):
        try:  # (whichever the server runs: process.http_stack)
            http = importlib.import_module(f"uvicorn.protocols.http.{module}")
        except ImportError:
            continue
        _wrap(getattr(http, protocol), "data_received", lambda *a: mark("api_data"))
    _wrap(app, "_read", after=lambda *a: mark("api_parsed"))
    _wrap(client.EngineClient, "add", lambda *a: mark("api_add"), lambda *a: mark("api_add_sent"))
    _wrap(client.EngineClient, "_reply", after=lambda _, c, reply: reply[0] == "added" and mark("api_accepted"))
    _wrap(client.EngineClient, "_process", lambda c, message: (message[0] or message[3]) and mark("api_tokens_in"))
    _wrap(client.RequestStream, "next", after=lambda update, s: update and update.tokens and mark("api_route_woke"))
    _wrap(client.EngineClient, "close", lambda *a: _dump("api"))
    app._EventStream.__call__ = first_send(app._EventStream.__call__)
    return cli.main(argv)


# -- the measurement ----------------------------------------------------------------------------------------
def _first_after(marks: list[tuple[str, float]], name: str, start: float, end: float) -> float:
    return next((t for n, t in marks if n == name and start <= t < end), float("nan"))


def decompose(marks: list[tuple[str, float]], sends: list[float]) -> list[dict]:
    """Per request (sent at ``sends[k]``): its marks (the first of each name after the one before it) and
    its hops in microseconds."""
    marks = sorted(marks, key=lambda m: m[1])
    rows = []
    for k, start in enumerate(sends):
        end = sends[k + 1] if k + 1 < len(sends) else float("inf")
        times, t = {}, start
        for name in MARKS:
            t = times[name] = _first_after(marks, name, t, end) if name != "client_send" else start
        for name in SIDE:
            times[name] = _first_after(marks, name, times["api_add"], end)
        hops = {h: 1e6 * (times[b] - times[a]) for h, a, b in zip(HOPS, MARKS, MARKS[1:])}
        side = {s: 1e6 * (times[s] - times["api_add"]) for s in SIDE}
        rows.append({"hops_us": hops, "side_us": side, "ttft_us": 1e6 * (times["client_first"] - start)})
    return rows


async def _send_all(url: str, model: str, prompts, max_tokens: int, gap: float) -> tuple[list[float], list, list]:
    """Each request alone, ``gap`` seconds after the one before ended: send times, TTFTs, ITLs (s)."""
    import aiohttp

    from paged_edu.serve.bench import Outcome, _one
    from paged_edu.serve.bench import _body as body_of
    from paged_edu.serve.traffic import Send

    sends, ttfts, itls = [], [], []
    options = argparse.Namespace(ignore_eos=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0, sock_read=60.0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        for prompt in prompts:
            await asyncio.sleep(gap)
            outcome = Outcome("request", len(prompt))
            body = body_of(model, prompt, Send(0.0, prompt, max_tokens), options)
            t = time.perf_counter()
            mark("client_send")
            await _one(session, f"{url}/v1/completions", body, outcome, {})
            if not outcome.ok:
                raise RuntimeError(f"a request failed: {outcome.error}")
            sends.append(t)
            _marks.append(("client_first", t + outcome.ttft))  # (_one's clock starts as it is called)
            ttfts.append(outcome.ttft)
            itls += outcome.itl
    return sends, ttfts, itls


def one_run(args) -> dict:
    import random

    import httpx

    from paged_edu.serve.core import ENGINE_FACTORY
    from paged_edu.serve.process import ServerProcess

    folder = tempfile.mkdtemp(prefix="ttft-hops-")
    env = dict(os.environ)
    env.update({ENGINE_FACTORY: "bench_ttft_hops:stepped_engine", HOPS_DIR_ENV: folder,
                STEP_MS_ENV: str(args.step_ms), PROMPT_MS_ENV: str(args.prompt_ms)})  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    rng = random.Random(args.seed)
    total = args.warmups + args.requests
    prompts = [[rng.randrange(97, 123) for _ in range(args.prompt_len)] for _ in range(total)]
    idle = [] if args.sleep_on_idle else ["--no-sleep-on-idle"]
    argv = ["--model", "tiny-random", "--uvicorn-log-level", "warning", *idle]
    _marks.clear()
    with ServerProcess(argv, env=env, program=[__file__, "--api-process"]) as server:
        model = json.loads(httpx.get(f"{server.url}/v1/models").text)["data"][0]["id"]
        sends, ttfts, itls = asyncio.run(_send_all(server.url, model, prompts, args.max_tokens, args.gap))
    marks = list(_marks)
    for process in ("api", "core"):
        path = Path(folder, f"{process}.json")
        if not path.exists():
            raise RuntimeError(f"the {process} process wrote no marks; its last lines:\n" + "\n".join(server.lines))
        marks += [tuple(m) for m in json.loads(path.read_text())]
    rows = decompose(marks, sends)[args.warmups :]
    itl_p50 = statistics.median(itls)
    for row, ttft in zip(rows, ttfts[args.warmups :]):
        row["client_ttft_us"] = 1e6 * ttft
    return {"rows": rows, "itl_p50_us": 1e6 * itl_p50}


def summarize(rows: list[dict], step_ms: float, itl_p50_us: float) -> dict:
    med = {h: statistics.median(r["hops_us"][h] for r in rows) for h in HOPS}
    side = {s: statistics.median(r["side_us"][s] for r in rows) for s in SIDE}
    ttft = statistics.median(r["ttft_us"] for r in rows)
    return {
        "hops_us": med,
        "side_us": side,
        "ttft_us": ttft,
        "client_ttft_us": statistics.median(r["client_ttft_us"] for r in rows),
        "outside_step_us": ttft - med["step"],
        "ttft_in_T": ttft / (1e3 * step_ms),
        "itl_p50_us": itl_p50_us,
        "ttft_in_itl": ttft / itl_p50_us,
    }


def print_table(summary: dict, step_ms: float) -> None:
    print(f"{'hop':<12}{'us (median)':>12}")
    for h in HOPS:
        print(f"{h:<12}{summary['hops_us'][h]:12.1f}")
    print(f"{'TTFT':<12}{summary['ttft_us']:12.1f}   (client's own: {summary['client_ttft_us']:.1f})")
    print(f"{'not step':<12}{summary['outside_step_us']:12.1f}")
    print("off the path, from the API's add: " + ", ".join(f"{s} {v:.1f}" for s, v in summary["side_us"].items()))
    print(
        f"TTFT = {summary['ttft_in_T']:.2f} T (T = {step_ms:g} ms) = {summary['ttft_in_itl']:.2f} ITL p50 "
        f"({summary['itl_p50_us']:.0f} us); target <= 3"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24, help="timed requests")
    ap.add_argument("--warmups", type=int, default=3, help="requests sent first and left out")
    ap.add_argument("--gap", type=float, default=1.0, help="seconds of idle server before each request (1 req/s)")
    ap.add_argument("--step-ms", type=float, default=0.656, help="T, the stub's decode step")
    ap.add_argument("--prompt-ms", type=float, default=1.469, help="the stub's prompt step")
    ap.add_argument("--prompt-len", type=int, default=96, help="prompt token ids per request")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--sleep-on-idle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the server's flag: its engine core sleeps on its input socket while idle (default), or spins",
    )
    ap.add_argument("--out", default=None, help="the record (default benchmarks/records/cpu/ttft_hops.json; '' none)")
    args = ap.parse_args(argv)
    from record import provenance, write_record

    run = one_run(args)
    summary = summarize(run["rows"], args.step_ms, run["itl_p50_us"])
    print_table(summary, args.step_ms)
    print("JSON " + json.dumps(summary))
    if args.out == "":
        return 0
    record = {**provenance("bench_ttft_hops.py", argv), "settings": vars(args), "summary": summary, **run}
    write_record(record, args.out, "ttft_hops.json")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--api-process"]:
        sys.exit(api_process(sys.argv[2:]))
    sys.exit(main())

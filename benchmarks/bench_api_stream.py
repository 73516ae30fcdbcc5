"""How many tokens a second the API side of ``paged-edu serve`` can stream: the real API process and the
real ``paged-edu bench-serve`` client against a stand-in engine that never waits and costs no GPU.

    python benchmarks/bench_api_stream.py                  # 512 streams, a token each per 1 ms step (~10 s here)
    python benchmarks/bench_api_stream.py --step-ms 0.25   # faster than the API side: delivered = its capacity
    python benchmarks/bench_api_stream.py --vocab 259      # text tokens (a character each) instead of random ids
    python benchmarks/bench_api_stream.py --hold-intake    # no token until all 512 are in: the intake alone

The served run on a GPU (``bench_serve_vs_offline.py``) measures the engine and the HTTP side together;
on a host with a slow CPU the HTTP side -- the API process writing every token to 512 server-sent-event
streams, and the client parsing them -- cannot keep up with the engine, and the run stretches. This
benchmark takes the engine out: ``paged-edu serve`` runs as usual (:class:`~paged_edu.serve.process.ServerProcess`,
its API process, its engine core process with :class:`~paged_edu.serve.core.EngineCore`'s real loop and
messages) but the core builds :class:`PacedEngine` instead of the model's engine (the core's one seam,
:data:`paged_edu.serve.core.ENGINE_FACTORY`). The stub gives every running sample one token per step and
paces its steps at ``--step-ms`` (the GPU engine's decode step at 256-512 running sequences is about
1 ms); each request ends at its ``max_tokens``, the workload's output lengths (``bench-serve --workload
sharegpt --ignore-eos``, the very requests of ``bench_serve_vs_offline.py``).

Per round, after an untimed pass (every route and shape met once):

* **produced**: the tokens the stub generated over its busy time, per second (what the engine offers);
* **delivered**: output tokens per second as the client counts them (``bench-serve``'s output throughput);
* **ratio** delivered / produced: the API side's capacity at that pace (it keeps up: a little under 1, the
  client's clock also holding the requests' intake and the last tokens' way out);
* **CPU per 1k tokens** of the API process and of the engine core's (``psutil``, user + system: the core's
  holds the stub's own token making, the same on both sides of an A/B) and of the client (this process's
  ``time.process_time``), around the timed pass only;
* **the core's own work** a step -- its loop around ``engine.step()``: inputs, the tokens gathered, the message
  packed and sent -- as the core reports it when the server stops (both passes; wall-clock and CPU);
* **the intake** (``intake``), in ms from the client's start of the timed pass (its first request begun;
  ``time.perf_counter`` is one clock for every process of the machine): the client's last request begun,
  its first and last POST's body written, the stub's first and last ``add_request`` in the core process,
  the last response's headers back at the client; the client's TTFT p50 / p90. With ``--hold-intake`` the
  stub gives no token until every request is in (the intake alone, no stream competing for the CPU), and
  the CPU each process spent on the intake is read then, per request (``psutil``'s counters tick at 10 ms).

The record (``benchmarks/records/cpu/api_stream.json`` by default) keeps every round.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(HERE)]

STEP_MS_ENV = "PAGED_EDU_STUB_STEP_MS"  # the stub's step period, handed to the core process
VOCAB_ENV = "PAGED_EDU_STUB_VOCAB"  # ... and its vocabulary
HOLD_ENV = "PAGED_EDU_STUB_HOLD"  # --hold-intake: no token until this many requests are in
_BUSY = re.compile(r"stub engine: (\d+) tokens in (\d+) steps, ([\d.]+) s busy")
_ADDS = re.compile(r"stub adds: (\d+) first ([\d.]+) last ([\d.]+)")
_INTAKE = "stub intake: all in"
HOLD_PAUSE_S = 0.3  # --hold-intake: the stub's pause once every request is in (the API process idles: its CPU is read)


# -- the stand-in engine (runs in the engine core's process) ---------------------------------------------
@dataclass(slots=True)
class _Seq:
    """What the core reads of a running sequence (``Sequence``'s names)."""

    request_id: int
    sample_index: int
    max_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)


@dataclass(slots=True)
class _Metrics:
    first_token_time: float | None
    finish_time: float | None
    num_cached_tokens: int = 0


@dataclass(slots=True)
class _Output:
    request_id: int
    outputs: list[list[int]]
    finish_reasons: list[str]
    metrics: _Metrics


class _Scheduler:
    def __init__(self) -> None:
        self.running: list[_Seq] = []
        self.waiting: list[_Seq] = []
        self.swapped: list[_Seq] = []
        self.num_preemptions = 0


class _Allocator:
    usage = 0.0
    num_blocks = num_used_blocks = num_cached_blocks = 0

    class stats:  # noqa: N801 -- the allocator's counters, as the core reads them
        queried_tokens = hit_tokens = 0

    def reset_prefix_cache(self) -> int:
        return 0


class PacedEngine:
    """The engine interface :class:`~paged_edu.serve.core.EngineCore` uses, with no model: a request joins
    the running batch at the next step, every running sample gets one token a step, and a sample ends at
    its ``max_tokens``. The tokens: with ``vocab`` 259 (the tiny model's) lower-case letters, one byte
    each (a character each through the byte tokenizer); with a larger one, ids spread over it as random
    weights draw them (``bench_serve_vs_offline.py``'s random SmolLM2, 49,152 ids: through the byte
    tokenizer, where SmolLM2's is not installed, nearly all of them are past the bytes and decode to nothing).
    :meth:`step` sleeps until ``step_s`` after the previous step began (never waits if behind), so the
    tokens come at the GPU engine's pace whatever the HTTP side does.

    Every ``add_request`` is timed (``time.perf_counter``: one monotonic clock for every process of the
    machine), and each busy stretch's first and last adds are printed when it ends (the intake span). With
    ``hold`` (``--hold-intake``) the steps give no token until ``hold`` requests are in (or none came for
    a second: the warm-up's), then say so and pause :data:`HOLD_PAUSE_S`: the intake alone, no stream
    competing for the CPU."""

    def __init__(self, step_s: float, vocab: int = 259, max_model_len: int = 2048, hold: int = 0) -> None:
        self.step_s, self.vocab, self.max_model_len, self.hold = step_s, vocab, max_model_len, hold
        self._adds: list[float] = []  # this busy stretch's add_request times
        self._held = bool(hold)
        self.scheduler, self.allocator = _Scheduler(), _Allocator()
        self._requests: dict[int, list[_Seq]] = {}
        self._new: list[_Seq] = []
        self._next_id = 0
        self._next_step = 0.0
        self._busy_since: float | None = None
        self._busy_tokens = self._busy_steps = 0

    def now(self) -> float:
        return time.perf_counter()

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def add_request(self, prompt, params, *, cache_salt=None) -> int:
        self._adds.append(time.perf_counter())
        if params.max_tokens is None or not 1 <= params.max_tokens <= self.max_model_len - len(prompt):
            raise ValueError(f"max_tokens {params.max_tokens} does not fit {self.max_model_len} positions")
        request_id, self._next_id = self._next_id, self._next_id + 1
        seqs = [_Seq(request_id, i, params.max_tokens) for i in range(params.n)]
        self._requests[request_id] = seqs
        self._new += seqs
        return request_id

    def abort_request(self, request_id: int, sample_index: int | None = None) -> _Output | None:
        seqs = self._requests.get(request_id)
        if seqs is None:
            raise ValueError(f"request {request_id} is not live")
        return self._end(request_id, "abort")

    def step(self) -> list[_Output]:
        now = time.perf_counter()
        if self._busy_since is None:
            self._busy_since, self._next_step = now, now
        if self._next_step > now:
            time.sleep(self._next_step - now)
        self._next_step = max(self._next_step + self.step_s, time.perf_counter() - self.step_s)
        if self._held:
            if len(self._adds) < self.hold and time.perf_counter() - self._adds[-1] < 1.0:
                return []  # (the adds come between steps, as with the GPU engine)
            self._held = False
            print(f"{_INTAKE}: {len(self._adds)} requests", flush=True)
            time.sleep(HOLD_PAUSE_S)
            self._busy_since = self._next_step = time.perf_counter()
        return self._produce()

    def _produce(self) -> list[_Output]:
        """The step's tokens: one for every running sample (the new requests join first); the ended requests."""
        running = self.scheduler.running
        running += self._new
        self._new = []
        now = time.perf_counter()
        ended = []
        letters = self.vocab == 259
        for seq in running:
            k = seq.request_id + len(seq.output_token_ids)
            seq.output_token_ids.append(97 + k % 26 if letters else (k * 2654435761) % self.vocab)
            seq.token_times.append(now)
            if len(seq.output_token_ids) >= seq.max_tokens:
                ended.append(seq.request_id)
        self._busy_tokens += len(running)
        self._busy_steps += 1
        outputs = [self._end(request_id, "length") for request_id in dict.fromkeys(ended)]
        if not self._requests:  # idle: say what this busy time produced (the benchmark reads the lines)
            print(f"stub adds: {len(self._adds)} first {self._adds[0]:.6f} last {self._adds[-1]:.6f}", flush=True)
            self._adds, self._held = [], bool(self.hold)
            print(
                f"stub engine: {self._busy_tokens} tokens in {self._busy_steps} steps, "
                f"{time.perf_counter() - self._busy_since:.6f} s busy",
                flush=True,
            )
            self._busy_since, self._busy_tokens, self._busy_steps = None, 0, 0
        return outputs

    def _end(self, request_id: int, reason: str) -> _Output:
        seqs = self._requests.pop(request_id)
        gone = {id(s) for s in seqs}
        self.scheduler.running = [s for s in self.scheduler.running if id(s) not in gone]
        self._new = [s for s in self._new if id(s) not in gone]
        first = min((s.token_times[0] for s in seqs if s.token_times), default=None)
        return _Output(
            request_id,
            [s.output_token_ids for s in seqs],
            [reason] * len(seqs),
            _Metrics(first, time.perf_counter()),
        )

    def close(self) -> None:
        pass


def paced_engine(args):
    """:data:`paged_edu.serve.core.ENGINE_FACTORY`'s callable: ``(engine, None, info)`` as ``build_engine``."""
    step_ms = float(os.environ.get(STEP_MS_ENV, "1.0"))
    engine = PacedEngine(step_ms / 1e3, int(os.environ.get(VOCAB_ENV, "259")), hold=int(os.environ.get(HOLD_ENV, "0")))
    info = {
        "model_name": args.served_model_name or "paced-stub",
        "max_model_len": engine.max_model_len,
        "vocab_size": engine.vocab,  # (the API process's byte tokenizer, --model tiny-random, takes it)
        "kv_events_endpoint": None,
        "description": f"a paced stub engine: one token per running sample every {step_ms:g} ms",
    }
    return engine, None, info


# -- the measurement ------------------------------------------------------------------------------------
def _busy_lines(server) -> list[tuple[str, str, str]]:
    """The stub's reports so far: (tokens, steps, seconds) per busy stretch."""
    return [m.groups() for line in list(server.lines) if (m := _BUSY.search(line))]


def _add_lines(server) -> list[tuple[str, str, str]]:
    """... and (adds, first, last add time) per busy stretch."""
    return [m.groups() for line in list(server.lines) if (m := _ADDS.search(line))]


class _ClientClock:
    """The client's side of the intake, timed from outside it (the client's code unchanged): each request's
    start (``paged_edu.serve.bench._one`` entered), its body written (aiohttp's ``on_request_chunk_sent``)
    and its response's headers read (``on_request_end``: the server has the core's "added")."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.written: list[float] = []
        self.headers: list[float] = []

    def __enter__(self):
        import aiohttp

        from paged_edu.serve import bench as client

        self._saved = client._one, aiohttp.ClientSession
        one, session = self._saved
        trace = aiohttp.TraceConfig()

        async def on_chunk(*_):
            self.written.append(time.perf_counter())

        async def on_end(*_):
            self.headers.append(time.perf_counter())

        trace.on_request_chunk_sent.append(on_chunk)
        trace.on_request_end.append(on_end)

        async def timed_one(*a, **kw):
            self.starts.append(time.perf_counter())
            return await one(*a, **kw)

        client._one = timed_one
        aiohttp.ClientSession = lambda *a, **kw: session(*a, trace_configs=[trace], **kw)
        return self

    def __exit__(self, *exc) -> None:
        import aiohttp

        from paged_edu.serve import bench as client

        client._one, aiohttp.ClientSession = self._saved


def _watch_intake(server, since: int, api, core, clock: _ClientClock, got: dict):
    """--hold-intake: a thread that reads the processes' CPU times as the client starts its first request
    and once the stub says every request is in."""
    import threading

    def read(when: str) -> None:
        got[when] = time.perf_counter(), sum(api.cpu_times()[:2]), sum(core.cpu_times()[:2]), time.process_time()

    def watch() -> None:
        deadline = time.monotonic() + 60
        while not clock.starts and time.monotonic() < deadline:
            time.sleep(0.0005)
        read("start")
        while time.monotonic() < deadline:
            if any(_INTAKE in line for line in list(server.lines)[since:]):
                read("in")
                return
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def one_round(args) -> dict:
    import psutil

    from bench_serve_vs_offline import bench
    from paged_edu.serve.core import ENGINE_FACTORY
    from paged_edu.serve.process import ServerProcess

    env = dict(os.environ)
    env[ENGINE_FACTORY] = "bench_api_stream:paced_engine"
    env[STEP_MS_ENV] = str(args.step_ms)
    env[VOCAB_ENV] = str(args.vocab)
    env[HOLD_ENV] = str(args.num_prompts if args.hold_intake else 0)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    argv = ["--model", "tiny-random", "--max-num-seqs", str(args.num_prompts), "--uvicorn-log-level", "warning"]
    common = ["--workload", "sharegpt", "--seed", "0", "--ignore-eos", "--length-scale", str(args.length_scale),
              "--num-prompts", str(args.num_prompts), "--request-rate", "inf"]  # fmt: skip
    with ServerProcess(argv, env=env) as server:
        api = psutil.Process(server.proc.pid)
        core = api.children()[0]  # the engine core, the API process's one child
        bench(server.url, [*common, "--num-warmups", "2"])  # untimed
        seen, seen_adds = len(_busy_lines(server)), len(_add_lines(server))
        cpu_api, cpu_core, cpu_client = sum(api.cpu_times()[:2]), sum(core.cpu_times()[:2]), time.process_time()
        held: dict = {}
        with _ClientClock() as clock:
            watcher = _watch_intake(server, len(server.lines), api, core, clock, held) if args.hold_intake else None
            served = bench(server.url, [*common, "--num-warmups", "0"])
        if watcher is not None:
            watcher.join(timeout=5)
        cpu_api, cpu_core = sum(api.cpu_times()[:2]) - cpu_api, sum(core.cpu_times()[:2]) - cpu_core
        cpu_client = time.process_time() - cpu_client
        out_tokens = served["total_output_tokens"]
        deadline = time.monotonic() + 5.0
        while True:  # the stub's lines for the pass (one per busy stretch: it may fall idle as requests trickle in)
            busy, adds = _busy_lines(server)[seen:], _add_lines(server)[seen_adds:]
            if sum(int(t) for t, _, _ in busy) >= out_tokens and len(adds) == len(busy):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    report = server.engine_core_report() or {}
    tokens, steps, seconds = (sum(float(b[k]) for b in busy) for k in range(3))
    produced = tokens / seconds
    t0 = clock.starts[0]  # the client's start of the timed pass: its first request begun

    def ms(t: float) -> float:
        return 1e3 * (t - t0)

    intake = {
        "requests_at_core": sum(int(a[0]) for a in adds),
        "client_last_start_ms": ms(clock.starts[-1]),
        "client_first_written_ms": ms(min(clock.written)),
        "client_last_written_ms": ms(max(clock.written)),  # the last POST's body written
        "core_first_add_ms": ms(min(float(a[1]) for a in adds)),
        "core_last_add_ms": ms(max(float(a[2]) for a in adds)),
        "client_last_headers_ms": ms(max(clock.headers)),  # the last request's response begun (accepted)
        "ttft_p50_ms": served.get("median_ttft_ms"),
        "ttft_p90_ms": served.get("p90_ttft_ms"),
    }
    if "in" in held:  # the intake alone: the CPU the processes spent from the pass's start to the last request in
        (t_a, *a), (t_b, *b) = held["start"], held["in"]
        n = args.num_prompts
        intake.update(
            cpu_read_ms=(ms(t_a), ms(t_b)),  # (psutil's counters tick at 10 ms: a few ms per request of 512)
            api_cpu_us_per_request=1e6 * (b[0] - a[0]) / n,
            core_cpu_us_per_request=1e6 * (b[1] - a[1]) / n,
            client_cpu_us_per_request=1e6 * (b[2] - a[2]) / n,
        )
    return {
        "intake": intake,
        "produced_tok_s": produced,
        "stub_tokens": int(tokens),
        "stub_steps": int(steps),
        "stub_seconds": float(seconds),
        "delivered_tok_s": served["output_throughput"],
        "duration": served["duration"],
        "output_tokens": out_tokens,
        "ratio": served["output_throughput"] / produced,
        "api_cpu_s_per_1k": 1e3 * cpu_api / out_tokens,
        "core_cpu_s_per_1k": 1e3 * cpu_core / out_tokens,
        "core_loop_ms": report.get("loop_ms"),  # the core's own work a step, over the server's life
        "core_loop_cpu_ms": report.get("loop_cpu_ms"),
        "client_cpu_s_per_1k": 1e3 * cpu_client / out_tokens,
        "errors": served.get("errors", []),
        "completed": served.get("completed"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=512)
    ap.add_argument("--step-ms", type=float, default=1.0, help="the stub's step period (default 1 ms)")
    ap.add_argument(
        "--vocab",
        type=int,
        default=49152,
        help="the stub's vocabulary: 49152 (default) as the GPU run's random SmolLM2, 259 for text (letters)",
    )
    ap.add_argument("--length-scale", type=float, default=1.0, help="the workload's lengths times this")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--hold-intake",
        action="store_true",
        help="the stub gives no token until every request is in: the intake alone, and its CPU per request",
    )
    ap.add_argument("--out", default=None, help="the record (default benchmarks/records/cpu/api_stream.json)")
    args = ap.parse_args(argv)
    from record import provenance, write_record

    rounds = []
    for r in range(args.rounds):
        got = one_round(args)
        rounds.append(got)
        print(
            f"round {r}: produced {got['produced_tok_s']:,.0f} tok/s, delivered {got['delivered_tok_s']:,.0f} "
            f"tok/s: ratio {got['ratio']:.3f}; CPU per 1k tokens: API process {got['api_cpu_s_per_1k']:.4f} s, "
            f"engine core {got['core_cpu_s_per_1k']:.4f} s, client {got['client_cpu_s_per_1k']:.4f} s "
            f"({got['output_tokens']} tokens, {got['duration']:.2f} s); the core's own work "
            f"{got['core_loop_ms'] or float('nan'):.4f} ms a step (CPU {got['core_loop_cpu_ms'] or float('nan'):.4f})",
            flush=True,
        )
    keys = ("produced_tok_s", "delivered_tok_s", "ratio", "api_cpu_s_per_1k", "core_cpu_s_per_1k", "client_cpu_s_per_1k",
            "core_loop_ms", "core_loop_cpu_ms")  # fmt: skip
    medians = {k: statistics.median(r[k] for r in rounds) for k in keys}
    print("medians: " + ", ".join(f"{k} {v:.4g}" for k, v in medians.items()))
    record = {
        **provenance("bench_api_stream.py", argv),
        "num_prompts": args.num_prompts,
        "step_ms": args.step_ms,
        "vocab": args.vocab,
        "length_scale": args.length_scale,
        "rounds": rounds,
        "medians": medians,
    }
    write_record(record, args.out, "api_stream.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

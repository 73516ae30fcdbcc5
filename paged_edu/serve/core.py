"""The engine core: the engine in a process of its own, stepping in a loop between two sockets.

What you will learn
-------------------
Why a server runs its engine apart from its HTTP side, and what crosses between them.

**Why a process.** A Python process runs one thread at a time: CPython's interpreter lock (the GIL)
passes between threads, and a thread that gives it up -- for a torch operation, a socket write --
waits for the other thread to hand it back (up to ``sys.getswitchinterval()``, 5 ms). With the engine
in a thread beside uvicorn's, every token streamed to 256 clients costs the HTTP thread a server-sent
event, and the engine waits for it: on our 2-core CPU a step at 256 running sequences took 51 ms in
the server against 14.6 ms in ``Engine.run`` (``benchmarks/bench_serve_vs_offline.py``'s workload,
measured with the engine's thread timed step by step), and the served throughput was a quarter of
the offline one. vLLM V1 runs its engine core in a process of its own for the same reason
(``EngineCoreProc`` in ``vllm/v1/engine/core.py``); the API server process
(:mod:`~paged_edu.serve.client`, :mod:`~paged_edu.serve.app`) parses requests, detokenizes and
streams, and the two processes only exchange messages.

**The loop** (:meth:`EngineCore.run`, vLLM's ``run_busy_loop``):

1. *inputs*: with nothing to compute it waits on the input socket, asleep in its poll
   (``--sleep-on-idle``, the default: no CPU while idle, and a new request starts the engine as soon as
   it is woken) or spinning on it (``--no-sleep-on-idle``: a busy core, for a lone request's TTFT
   3.24 -> 3.13 ms on our 2-core CPU; *Asleep or spinning* below); with work it takes what has arrived
   without waiting --
   new requests (``engine.add_request``: accepted, or refused with the engine's error, which names
   the field), aborts (a client that left, a stop string found: the blocks are freed before the
   next step), calls (``/reset_prefix_cache``), stop -- and answers them at once, before the step
   (a refused request gets its 400 without waiting for a step);
2. one ``engine.step()`` (async scheduling: the step returns the tokens of the step launched before);
3. *outputs*: one message for the step -- every sample's new tokens with their times, the requests
   that ended, the replies to this turn's inputs, and (every :data:`STATS_EVERY` seconds, and with
   every message that ends a request) the engine's gauges and counters: the metrics are read from
   the engine's own state, here, and shipped -- and the KV events of the step on their own socket
   (:mod:`~paged_edu.serve.kv_events`).

**Asleep or spinning while idle.** Asleep (``--sleep-on-idle``, the default), the idle core blocks in
``poll`` with no time limit: it costs no CPU, and a new request starts the engine as soon as the kernel
wakes the process (no polling interval) -- but that wakeup is a thread's and a process's, and the core's
next code runs with cold caches. Spinning (``--no-sleep-on-idle``), it polls with a zero timeout in a loop
until a message is there: one core busy for as long as the server is idle, for a warmer start. On this
2-core CPU a lone request through the real server (``benchmarks/bench_ttft_hops.py --requests 16 --gap 0.5``,
stub engine, 8 runs each way interleaved, ``benchmarks/records/cpu/ttft_hops_idle_*``) measured a median TTFT
of 3.24 ms asleep against 3.13 spinning, the ``wake`` hop (the add's message sent -> the core handling it)
252 -> 186 us. Not in every run: in the 4 later pairs (the machine quieter, ITL p50 ~0.68 ms) 3.16 -> 2.99 ms,
``wake`` 277 -> 178 us; in the 4 earlier ones (ITL p50 ~0.9 ms) 3.30 against 3.29 ms, what the wake saved
lost right after it (``pre_step``, the "added" reply sent, 350 -> 450-500 us; our reading, not measured: the
thread that spun is the one the kernel preempts for the processes' other threads). Spinning takes a core
from the API process and ZeroMQ's I/O threads: a trade for a machine with cores to spare. On an H100's
16-core host it paid every time (e6f5fcf, ``benchmarks/records/h100/ttft_hops_*_e6f5fcf.json``, asleep /
spinning / asleep / spinning): TTFT 3.56 / 3.23 / 3.40 / 3.16 ms, ``wake`` 412 / 254 / 379 / 270 us; and
with the model's engine (``bench_serve_vs_offline.py``, the same lease) the client's TTFT p50 at 1 req/s
4.1 -> 3.6 ms, 6.27 -> 5.50 decode steps. Production engines choose between the two: SGLang's scheduler polls its sockets without
waiting when idle, by default, and ``--sleep-on-idle`` (https://github.com/sgl-project/sglang/pull/6026, after
users' reports of an idle server holding a core at 100 %: https://github.com/sgl-project/sglang/issues/1730,
/3708 and /9863) makes it block; vLLM's ``VLLM_SLEEP_WHEN_IDLE``
(off by default, ``vllm/envs.py``) lets its shared-memory message queue sleep rather than spin, for a small
latency cost when a request comes. Ours sleeps by default: a course server on a laptop or a 2-core CI box
must not burn a core.

What the step produced is found in ``scheduler.running`` (after a step, a sequence's
``output_token_ids`` hold real tokens only) and in the outputs of the requests that ended; the work
is a few attribute reads and two list slices per running sequence, and one ``msgpack`` encoding
per step -- measured in ``benchmarks/bench_serve_vs_offline.py`` (``core_overhead``).

A step that fails is undone by the engine (``StepFailed``); the loop retries it, and after
:data:`MAX_RETRIES` failures in a row ends the requests it was computing with an error, so one
poisoned request cannot stall the others. A bug that stops the loop is reported (``"dead"``): the
API server answers 503 on ``/health`` from then on.

The messages (msgpack over ZeroMQ PUSH/PULL sockets, as vLLM's ``core_client.py``)
---------------------------------------------------------------------------------
API server -> core (``rid``: the API server's id for a request; ``channel``: which API server sent it)::

    ["add", rid, prompt token ids, SamplingParams fields by name, cache salt, channel]
    ["abort", rid, sample index or None, channel]
    ["call", call id, method, channel]          # one of UTILITIES
    ["stop"]

core -> API server: first ``["ready", info]`` or ``["failed", message]``; then, each turn, one message
once its inputs are handled (if they need an answer) and one after its step::

    [rids, tokens, times, more, ends, replies, stats]
    rids, tokens, times: three flat lists, an entry per request whose sample 0 has one new token -- nearly
             every entry of a decode step -- the API server's id, the token's id and its time
    more:    [rid, sample index, new token ids, their times]      for every other sample with new tokens
    ends:    [rid, finish reason per sample, num_cached_tokens, finish time, error or None, launched]
    replies: ["added", rid] | ["refused", rid, message, field] | ["result", call id, value]
             | ["raised", call id, message] | ["dead", message]
    stats:   [requests running, requests waiting, KV usage, prefix-cache queried tokens,
              hit tokens, preemptions, when read] or None         # the counters cumulative; when: the
                                                                  # core's time.perf_counter()

**Several API servers** (``paged-edu serve --api-server-count N``, :mod:`~paged_edu.serve.api_servers`):
the core has one *channel* per API server -- a pair of sockets -- and reads every channel's input socket as
one stream (one PULL socket connected to each API server's address, fair-queued by ZeroMQ). A request
carries its channel; its tokens, its end and the replies go back on that channel only, each turn's
message split by channel (vLLM's engine core routes its outputs the same way, by the request's
``client_index``, in ``EngineCoreProc.process_output_sockets``). The loop itself does not change. With
one API server there is one channel, 0.

Times are the engine's clock (``engine.now()``); ``info["clock_offset"]`` turns the API server's
``time.perf_counter()`` into it, so a request's arrival and its tokens' times are on one clock.
``launched`` is when the ``engine.step()`` call that first scheduled the request began (None if it never
ran): the API server splits a time to first token there, into the wait before the request's first step
(``vllm:request_queue_time_seconds``) and the steps until its first token (``vllm:request_prefill_time_seconds``).
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field

__all__ = ["ENGINE_FACTORY", "MAX_RETRIES", "UTILITIES", "EngineCore", "run_engine_core"]

log = logging.getLogger("paged_edu.serve")

MAX_RETRIES = 3  # failed steps in a row before the requests in them are ended
STATS_EVERY = 0.005  # seconds: the gauges and counters go with a message at most this often (and always
# with one that ends a request or answers a call); a Prometheus scrape reads them every few seconds
UTILITIES = ("reset_prefix_cache", "snapshot")  # the methods a "call" may name
# The environment variable naming, as "module:function", what builds the engine in place of the model's
# (launch.build_engine: the same flags in, the same (engine, KV-event publisher, info) out): a stand-in engine
# that measures the API side alone (benchmarks/bench_api_stream.py). Unset: the model's engine.
ENGINE_FACTORY = "PAGED_EDU_ENGINE_FACTORY"


@dataclass(slots=True)
class _Live:
    """A request the core serves: the API server's id, the engine's, what each sample has been sent."""

    rid: int
    request_id: int
    channel: _Channel  # the API server it came from
    channel_key: tuple[int, int]  # (its channel's index, rid): its key in EngineCore._by_rid
    sent: list[int]  # tokens sent, per sample
    seqs: dict = field(default_factory=dict)  # sample index -> its Sequence, once seen running
    launched: float | None = None  # when the step call that first scheduled it began (engine clock)
    columns: tuple = ()  # its channel's rids.append, tokens.append, times.append (the lists are reused)


@dataclass(slots=True)
class _Channel:
    """One API server's output socket and this turn's message to it, as it fills."""

    socket: object
    rids: list = field(default_factory=list)  # the one-token entries, as three columns (see the module docstring)
    tokens: list = field(default_factory=list)
    times: list = field(default_factory=list)
    more: list = field(default_factory=list)  # [rid, sample index, ids, times]: every other sample's new tokens
    ends: list = field(default_factory=list)
    replies: list = field(default_factory=list)


class EngineCore:
    """``engine`` served over ZeroMQ sockets -- one input socket, one output socket per API server
    (``outputs``: a socket or a list of them, indexed by channel) -- :meth:`run` until a ``stop`` message."""

    def __init__(self, engine, inputs, outputs, kv_events=None, *, sleep_on_idle: bool = True) -> None:
        import msgpack

        self.engine, self.inputs, self.kv_events = engine, inputs, kv_events
        self.sleep_on_idle = sleep_on_idle  # idle: block in poll (True) or spin on poll(0) (False), see above
        self.channels = [_Channel(s) for s in (outputs if isinstance(outputs, list | tuple) else [outputs])]
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self._unpack = msgpack.unpackb
        self._by_request: dict[int, _Live] = {}  # engine request id -> live
        self._by_rid: dict[tuple[int, int], _Live] = {}  # (channel, the API server's id) -> live
        self._unlaunched: list[_Live] = []  # requests added and not yet seen scheduled
        self._step_start: float | None = None  # engine.now() as the step call now running began
        self._stats_time = 0.0  # when the last message carried the stats
        self._stopping = False
        self._failures = 0
        self.num_failed_steps = 0
        # Where the busy turns' time went (reported when the loop ends): in engine.step() and in the whole
        # turn, wall-clock and this thread's CPU time (on a crowded CPU the wall time also holds the
        # moments the process waited for a core).
        self.num_steps = 0
        self.step_seconds = [0.0, 0.0]  # wall, CPU
        self.turn_seconds = [0.0, 0.0]

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> None:
        engine, wall, cpu = self.engine, time.perf_counter, time.thread_time
        try:
            while not self._stopping:
                start = wall(), cpu()
                if engine.has_unfinished():
                    self._take_inputs(wait=False)
                else:  # idle: wait for a message, then start the clocks
                    self._take_inputs(wait=True)
                    start = wall(), cpu()
                # The replies (accepted, refused, results) before the step, not a step later: an accepted
                # request's "added" held for the step's message cost a lone request's TTFT 4.10 -> 4.96 ms (its
                # route's headers then wait for the first token; benchmarks/bench_ttft_hops.py, this 2-core CPU, ABBA)
                self._send()
                if self._stopping or not engine.has_unfinished():
                    continue
                self._step()
                self._send()
                self.num_steps += 1
                self.turn_seconds[0] += wall() - start[0]
                self.turn_seconds[1] += cpu() - start[1]
            self._abort_all("the server is shutting down")
        except BaseException as exc:  # a bug: say so (the API server's /health turns 503), free what we can
            log.exception("the engine core stopped")
            for channel in self.channels:
                channel.replies.append(["dead", f"{type(exc).__name__}: {exc}"])
            self._abort_all(f"the engine core stopped: {type(exc).__name__}: {exc}")
            raise
        finally:
            if self.kv_events is not None:
                self.kv_events.publish()
            self._send()
            ms = [1e3 * (t - s) / max(self.num_steps, 1) for t, s in zip(self.turn_seconds, self.step_seconds)]
            log.info(
                "engine core: %d steps; engine.step %.3f ms/step (CPU %.3f); the loop's own work %.3f ms/step (CPU %.3f)",
                self.num_steps, 1e3 * self.step_seconds[0] / max(self.num_steps, 1),
                1e3 * self.step_seconds[1] / max(self.num_steps, 1), ms[0], ms[1],
            )  # fmt: skip

    def _take_inputs(self, wait: bool) -> None:
        """Every message waiting; with ``wait``, wait for the first one: asleep in ``poll`` (no time limit),
        or, without :attr:`sleep_on_idle`, polling with a zero timeout until it is there (a busy core)."""
        timeout = None if wait else 0  # None: no time limit
        if wait and not self.sleep_on_idle:
            while not self.inputs.poll(0):  # spin (no time.sleep: a sleep is the wakeup this avoids)
                pass
            timeout = 0
        while self.inputs.poll(timeout):
            self._handle(self._unpack(self.inputs.recv()))
            timeout = 0

    def _handle(self, message: list) -> None:
        kind = message[0]
        if kind == "add":
            self._add(*message[1:])
        elif kind == "abort":
            self._abort(*message[1:])
        elif kind == "call":
            self._call(*message[1:])
        elif kind == "stop":
            self._stopping = True
        else:
            log.error("engine core: unknown message %r", kind)

    def _send(self) -> None:
        """This turn's message to each API server that has something to be told (the stats, when due,
        go with each of them)."""
        stats = False  # not read yet
        for c in self.channels:
            if not (c.rids or c.more or c.ends or c.replies):
                continue
            if stats is False:
                stats = self._maybe_stats()
            c.socket.send(self._pack([c.rids, c.tokens, c.times, c.more, c.ends, c.replies, stats]), copy=False)
            c.rids.clear()  # (packed: the lists are reused, and a live request keeps its channel's)
            c.tokens.clear()
            c.times.clear()
            c.more.clear()
            c.ends.clear()
            c.replies.clear()

    def _maybe_stats(self) -> list | None:
        now = time.perf_counter()
        if not any(c.ends or c.replies for c in self.channels) and now - self._stats_time < STATS_EVERY:
            return None
        self._stats_time = now
        return self._stats()

    def _stats(self) -> list:
        """The engine's gauges now and its counters so far (the API server turns them into /metrics)."""
        s, a = self.engine.scheduler, self.engine.allocator
        running = {q.request_id for q in s.running}
        waiting = {q.request_id for q in s.waiting} | {q.request_id for q in s.swapped}
        return [len(running), len(waiting - running), a.usage, a.stats.queried_tokens, a.stats.hit_tokens,
                s.num_preemptions, time.perf_counter()]  # fmt: skip

    # -- inputs --------------------------------------------------------------------------------------
    def _add(self, rid: int, prompt: list[int], params: dict, cache_salt: str | None, channel: int) -> None:
        from paged_edu.engine.sampling import SamplingParams

        out = self.channels[channel]
        try:
            request_id = self.engine.add_request(prompt, SamplingParams(**params), cache_salt=cache_salt)
        except (ValueError, TypeError) as exc:  # refused, engine unchanged: the message names the limit
            out.replies.append(["refused", rid, str(exc), getattr(exc, "field", None)])
            return
        live = _Live(rid, request_id, out, (channel, rid), [0] * params.get("n", 1))
        live.columns = (out.rids.append, out.tokens.append, out.times.append)
        self._by_request[request_id] = self._by_rid[channel, rid] = live
        self._unlaunched.append(live)
        out.replies.append(["added", rid])

    def _abort(self, rid: int, sample_index: int | None, channel: int) -> None:
        live = self._by_rid.get((channel, rid))
        if live is None:
            return  # finished meanwhile (or refused)
        try:
            output = self.engine.abort_request(live.request_id, sample_index)
        except ValueError:  # that sample ended meanwhile
            return
        if output is not None:
            self._finish(output)

    def _call(self, call_id: int, method: str, channel: int) -> None:
        """A utility method, run between two steps; the KV events it caused (a reset) are published
        before its reply goes out, so whoever waits for the reply can wait for the events too."""
        try:
            if method not in UTILITIES:
                raise ValueError(f"unknown engine core call {method!r}; one of {UTILITIES}")
            self.channels[channel].replies.append(["result", call_id, getattr(self, method)()])
        except Exception as exc:  # noqa: BLE001 -- the caller gets it
            self.channels[channel].replies.append(["raised", call_id, f"{type(exc).__name__}: {exc}"])
        finally:
            if self.kv_events is not None:
                self.kv_events.publish()

    # -- the utilities -------------------------------------------------------------------------------
    def reset_prefix_cache(self) -> int:
        """Drop every cached block no request holds; the number of cached blocks left."""
        return self.engine.allocator.reset_prefix_cache()

    def snapshot(self) -> dict:
        """The engine's state in plain numbers (the tests' oracle, read between two steps)."""
        from paged_edu.serve.kv_events import external_hash

        e, a = self.engine, self.engine.allocator
        hashes = []
        block_hash = getattr(a, "block_hash", None)
        if block_hash is not None:
            hashes = sorted({external_hash(h) for b in range(a.num_blocks) if (h := block_hash(b))})
        return {
            "has_unfinished": e.has_unfinished(),
            "num_used_blocks": a.num_used_blocks,
            "num_cached_blocks": a.num_cached_blocks,
            "cached_block_hashes": hashes,
            "num_preemptions": e.scheduler.num_preemptions,
            "kv_events_sent": self.kv_events.sequence if self.kv_events is not None else 0,
            "num_failed_steps": self.num_failed_steps,
        }

    # -- a step --------------------------------------------------------------------------------------
    def _step(self) -> None:
        from paged_edu.engine.engine import StepFailed

        start = time.perf_counter(), time.thread_time()
        self._step_start = self.engine.now()
        try:
            outputs = self.engine.step()
        except StepFailed as exc:
            self._step_start = None  # undone: it scheduled nobody
            self.num_failed_steps += 1
            self._failures += 1
            log.warning("%s (attempt %d of %d)", exc, self._failures, MAX_RETRIES)
            if self._failures >= MAX_RETRIES:
                self._end_failed(exc)
            return
        self.step_seconds[0] += time.perf_counter() - start[0]
        self.step_seconds[1] += time.thread_time() - start[1]
        self._failures = 0
        if self._unlaunched:
            self._mark_launched()
        self._gather(outputs)
        self._step_start = None
        if self.kv_events is not None:
            self.kv_events.publish()

    def _mark_launched(self) -> None:
        """The requests this step scheduled for the first time: running now (or ended in it, :meth:`_finish`)."""
        running = {seq.request_id for seq in self.engine.scheduler.running}
        waiting = []
        for live in self._unlaunched:
            if live.request_id in running:
                live.launched = self._step_start
            elif live.request_id in self._by_request:
                waiting.append(live)
        self._unlaunched = waiting

    def _gather(self, outputs) -> None:
        """Every running sample's tokens not sent yet (with their times), then the requests that ended.

        A sample 0's one new token -- nearly every entry of a decode step -- goes into three flat columns
        (its request, its id, its time) rather than a list of its own: the message packs (and the API server
        unpacks) three lists of numbers whatever the batch. Packing a step's message at 512 running sequences
        (this 2-core CPU, the core's loop over real sockets, 2 x 3 interleaved runs): 0.053 ms with a
        ``[rid, i, id, time]`` list per sample, 0.024 in columns (gathering: 0.09-0.10 ms either way; earlier,
        ``[rid, i, [id], [time]]`` had cost 0.237 ms for both, 0.118 without the one-element lists)."""
        by_request = self._by_request
        for seq in self.engine.scheduler.running:
            live = by_request.get(seq.request_id)
            if live is None:
                continue
            i, ids = seq.sample_index, seq.output_token_ids
            sent, n = live.sent[i], len(ids)
            if n <= sent:
                continue
            live.sent[i] = n
            if n - sent == 1 and sent and not i:  # sample 0's one new token (its first: below, where it is seen)
                put_rid, put_token, put_time = live.columns
                put_rid(live.rid)
                put_token(ids[-1])
                put_time(seq.token_times[-1])
            else:
                if not sent:
                    live.seqs[i] = seq
                live.channel.more.append([live.rid, i, ids[sent:], seq.token_times[sent:]])
        for output in outputs:
            if output.request_id in by_request:
                self._finish(output)

    def _finish(self, output, error: str | None = None) -> None:
        """A request that ended: the tokens not sent yet, why each sample ended, its finish time."""
        live = self._by_request.pop(output.request_id)
        del self._by_rid[live.channel_key]
        m = output.metrics
        if live.launched is None and m.first_token_time is not None:  # it ended in the step that first ran it
            live.launched = self._step_start
        for i, ids in enumerate(output.outputs):
            sent = live.sent[i]
            if len(ids) <= sent:
                continue
            seq = live.seqs.get(i)
            # A sample never seen running ended at its first token (max_tokens 1): that token's time.
            times = seq.token_times[sent:] if seq is not None else [m.first_token_time] * (len(ids) - sent)
            live.channel.more.append([live.rid, i, list(ids[sent:]), times])
            live.sent[i] = len(ids)
        live.channel.ends.append(
            [live.rid, list(output.finish_reasons), m.num_cached_tokens, m.finish_time, error, live.launched]
        )

    def _end_failed(self, exc) -> None:
        """The requests a step failed on every time: ended with the error (their blocks freed)."""
        self._failures = 0
        for request_id in exc.request_ids:
            self._end(request_id, f"{exc.__cause__!r}")

    def _abort_all(self, reason: str) -> None:
        for request_id in list(self._by_request):
            self._end(request_id, reason)

    def _end(self, request_id: int, error: str) -> None:
        """Abort a request and report it ended with ``error``."""
        live = self._by_request.get(request_id)
        if live is None:
            return
        try:
            output = self.engine.abort_request(request_id)
        except (ValueError, RuntimeError):
            output = None
        if output is not None:
            self._finish(output, error)
            return
        del self._by_request[request_id], self._by_rid[live.channel_key]  # the engine lost it: end it here
        live.channel.ends.append([live.rid, ["abort"] * len(live.sent), 0, None, error, live.launched])


def run_engine_core(flags: dict, channels: list[tuple[str, str]]) -> None:
    """The engine core process: build the engine ``flags`` describe (``paged-edu serve``'s, as a dict),
    say ``ready`` with what the API servers need to know (or ``failed`` and why) on every channel --
    ``(input address, output address)`` per API server, bound by it -- then serve."""
    import msgpack
    import zmq

    # Ctrl+C in a terminal reaches the whole process group: the API server finishes its requests
    # first (graceful shutdown) and then stops the core with a "stop" message. (If the API server
    # dies, the kernel ends this process: PR_SET_PDEATHSIG, set when it was started.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    context = zmq.Context()
    inputs = context.socket(zmq.PULL)  # one socket, every API server's input: fair-queued
    inputs.set_hwm(0)
    outputs = []
    for input_address, output_address in channels:
        inputs.connect(input_address)
        out = context.socket(zmq.PUSH)
        out.set_hwm(0)  # never block the engine on a slow reader: the messages queue
        out.connect(output_address)
        outputs.append(out)

    def tell_all(message: list) -> None:
        for out in outputs:
            out.send(msgpack.packb(message))

    engine = kv_events = None
    ready = False
    try:
        from argparse import Namespace

        from paged_edu.serve.process import freeze_startup_heap

        build_engine = _engine_factory()

        try:
            engine, kv_events, info = build_engine(Namespace(**flags))
        except (ValueError, TypeError, FileNotFoundError) as exc:  # a flag the model or the pool cannot meet
            tell_all(["failed", str(exc)])
            return
        core = EngineCore(engine, inputs, outputs, kv_events, sleep_on_idle=flags.get("sleep_on_idle", True))
        info["clock_offset"] = time.perf_counter() - engine.now()
        info["stats"] = core._stats()
        freeze_startup_heap()  # the model, the engine, torch: out of the collector's walks from here on
        tell_all(["ready", info])
        ready = True
        core.run()  # (a bug that stops it is reported by the loop itself: "dead")
    except BaseException as exc:
        if not ready:
            tell_all(["failed", f"{type(exc).__name__}: {exc}"])
        raise
    finally:
        if kv_events is not None:
            kv_events.close()
        if engine is not None:
            engine.close()
        inputs.close(linger=0)
        for out in outputs:
            out.close(linger=5000)  # the last message (the ends of what was aborted) goes out first
        context.term()


def _engine_factory():
    """The callable that builds the engine: :func:`~paged_edu.serve.launch.build_engine`, or the one
    :data:`ENGINE_FACTORY` names."""
    import importlib
    import os

    name = os.environ.get(ENGINE_FACTORY)
    if not name:
        from paged_edu.serve.launch import build_engine

        return build_engine
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


if __name__ == "__main__":  # python -m paged_edu.serve.core CHANNELS_JSON FLAGS_JSON (EngineClient)
    import json
    import sys

    run_engine_core(json.loads(sys.argv[2]), json.loads(sys.argv[1]))

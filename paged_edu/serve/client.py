"""The API server's end of the engine core: the core's process, the two sockets, every request's stream.

:class:`EngineClient` starts the engine core (:mod:`~paged_edu.serve.core`) as a child process
(``python -m paged_edu.serve.core INPUT OUTPUT FLAGS``) and talks to it over two ZeroMQ sockets on
private ``ipc://`` paths: requests, aborts and calls go out on one, the core's messages -- one per
engine step -- come back on the other (vLLM's ``AsyncMPClient``, ``vllm/v1/engine/core_client.py``).
In the API server's event loop:

* a route opens a request with :meth:`EngineClient.add`, which returns its :class:`RequestStream` at
  once; ``await stream.accepted`` says whether the engine took it (a refusal names the field);
* a callback of the event loop on the output socket (started by :meth:`EngineClient.serve_outputs`;
  vLLM reads them in a task, ``output_handler`` in ``vllm/v1/engine/async_llm.py``) reads the core's
  messages as they come -- every one waiting, then it lets the routes run -- and hands each request
  its new tokens; a request's stream keeps what came until its
  route takes it, so a route that falls behind (256 streams written by one thread) takes the tokens
  of several steps at once and sends them as one chunk (vLLM's ``RequestOutputCollector`` merges the
  same way, ``vllm/v1/engine/output_processor.py``). The engine never waits for the HTTP side;
* the same callback turns each message's numbers into ``/metrics``: the engine's gauges and counters as
  the core read them, and -- from the tokens' times, on the engine's clock -- time to first token,
  inter-token latencies and end-to-end latencies, counted as vLLM's output processor counts them
  (``IterationStats.update_from_output``, ``vllm/v1/metrics/stats.py``).

A core that stops (a bug, a crash) ends every open request with an error, and ``/health`` answers 503.

With several API servers (``--api-server-count N``, :mod:`~paged_edu.serve.api_servers`) each has an
:class:`EngineClient` of its own on its own *channel* -- a pair of sockets in the one private folder --
and the client that started the core (the supervising process's) has one more, for ``stop``. A
client's requests carry its channel, and the core answers each on its own (:mod:`~paged_edu.serve.core`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from paged_edu.serve.metrics import Tally
from paged_edu.serve.process import ROOT, die_with_parent
from paged_edu.serve.protocol import RequestError

__all__ = ["CoreProcess", "EngineClient", "RequestStream", "Update", "channel_addresses"]

log = logging.getLogger("paged_edu.serve")

DRAIN = 64  # messages read in one go before the routes get the event loop back


@dataclass(slots=True)
class Update:
    """What a route takes from its stream at once: new tokens per sample; the outcome once it ended."""

    tokens: list[tuple[int, list[int]]] = field(default_factory=list)  # (sample index, its new token ids)
    finish_reasons: list[str] | None = None  # per sample, once the request has ended
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served (known at the end)
    error: str | None = None  # the request was ended by a failure, not by the model


class RequestStream:
    """One request's outputs as the core sends them, kept until its route takes them (:meth:`next`)."""

    def __init__(self, rid: int, n: int, num_prompt_tokens: int, arrival: float) -> None:
        self.rid, self.num_prompt_tokens, self.arrival = rid, num_prompt_tokens, arrival
        self._loop = asyncio.get_running_loop()
        self.accepted: asyncio.Future = self._loop.create_future()
        self._new: list[list[int]] = [[] for _ in range(n)]  # each sample's tokens not taken yet
        self._end: tuple | None = None
        self._last: list[float | None] = [None] * n  # each sample's last token time
        self._first: float | None = None  # the request's first token's time (TTFT)
        self._waiter: asyncio.Future | None = None
        self.interrupted = False  # the route's client left (:meth:`interrupt`)

    # -- from the output task ------------------------------------------------------------------------
    def put_token(self, token: int, time: float, tally: Tally) -> None:
        """Sample 0's one new token and its time, not its first (the core's columns: the first comes
        through :meth:`put_tokens`); ``tally.generated`` is the caller's to count."""
        last = self._last
        tally.itl.append(time - last[0])
        last[0] = time
        self._new[0].append(token)
        if self._waiter is not None:
            self._wake()

    def put_tokens(self, i: int, ids: list[int], times: list[float], tally: Tally) -> None:
        """Sample ``i``'s new tokens and their times."""
        last = self._last[i]
        if last is None and self._first is None:  # the request's first token: its TTFT, its prompt counted
            self._first = times[0]
            tally.prompt_tokens += self.num_prompt_tokens
            tally.ttft.append(times[0] - self.arrival)
        if last is not None:
            tally.itl.append(times[0] - last)
        if len(times) > 1:
            tally.itl += [b - a for a, b in zip(times, times[1:])]
        tally.generated += len(ids)
        self._last[i] = times[-1]
        self._new[i] += ids
        self._wake()

    def put_end(self, finish_reasons, num_cached_tokens, finish_time, error, launched, tally: Tally) -> None:
        if finish_time is not None:
            tally.e2e.append(finish_time - self.arrival)
        if launched is not None and self._first is not None:  # its TTFT in two: before its first step, from it
            tally.queue.append(launched - self.arrival)
            tally.prefill.append(self._first - launched)
        self._end = (finish_reasons, num_cached_tokens, error)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- from the route ------------------------------------------------------------------------------
    def interrupt(self) -> None:
        """The route's client has left: :meth:`next` answers ``None`` at once, from now on."""
        self.interrupted = True
        self._wake()

    async def next(self) -> Update | None:
        """Everything that came since the last call, as one update -- each sample's new tokens at once,
        however many steps brought them (waits until something has); ``None`` once the stream is
        :meth:`interrupt`-ed."""
        while not any(self._new) and self._end is None and not self.interrupted:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self.interrupted:
            return None
        new = self._new
        update = Update([(i, ids) for i, ids in enumerate(new) if ids])
        for i, _ in update.tokens:
            new[i] = []
        if self._end is not None:
            update.finish_reasons, update.num_cached_tokens, update.error = self._end
        return update


def channel_addresses(directory: str, channel: int) -> tuple[str, str]:
    """Channel ``channel``'s ``(input, output)`` ZeroMQ addresses in the server's private folder."""
    return f"ipc://{directory}/input{channel}", f"ipc://{directory}/output{channel}"


class CoreProcess:
    """The engine core as an API server that did not start it sees it: alive while its process is
    (``poll()`` as :class:`subprocess.Popen`'s, the exit status unknown: not this process's child)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self):
        if self.returncode is None and not _pid_alive(self.pid):
            self.returncode = "unknown"
        return self.returncode


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # ended, not yet reaped by its parent: a zombie ("Z")
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class EngineClient:
    """The engine core of ``paged-edu serve``'s ``flags`` (a dict of them) in a child process.

    :meth:`start` (blocking: the model loads in the child) returns the core's ``info``; in the event
    loop, :meth:`serve_outputs` runs as a task while :meth:`add`, :meth:`abort` and :meth:`call`
    are used; :meth:`close` stops the core (what it still runs is aborted) and waits for it.

    ``channel`` of ``num_channels``: this client's channel, and how many the core gets (one per API
    server, and the supervisor's). With ``directory`` and ``core_pid`` the client joins a core another
    process started (an API server of several): it binds its channel there and waits for the core's
    ``ready``; its :meth:`close` leaves the core running.
    """

    def __init__(
        self,
        flags: dict,
        metrics=None,
        startup_timeout: float = 600.0,
        *,
        channel: int = 0,
        num_channels: int = 1,
        directory: str | None = None,
        core_pid: int | None = None,
    ) -> None:
        self.flags, self.metrics, self.startup_timeout = flags, metrics, startup_timeout
        self.channel, self.num_channels = channel, num_channels
        self.owner = directory is None  # this client starts and stops the core
        self.num_requests = 0  # requests sent to the core (the per-process tally the tests read)
        self.info: dict = {}
        self.process = None if core_pid is None else CoreProcess(core_pid)
        self.error: str | None = None  # why the core stopped, if it stopped on its own
        self._streams: dict[int, RequestStream] = {}
        # The metrics the core's messages add, recorded with the next message that carries the core's stats (one
        # every STATS_EVERY, 5 ms, while it steps), ends a request or answers one -- so a request's figures are in
        # before its last chunk is written -- rather than with each message, a step's: ServerMetrics.record is
        # ~9 us at 78 values (five histograms' numpy calls), on this 2-core CPU.
        self._tally = Tally()
        self._calls: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._closed = False
        self._context = self._input = self._output = None
        self._reader = None  # (event loop, descriptor) while the loop reads the output socket
        self._dir: str | None = directory

    # -- starting and stopping (any thread, outside the event loop) ---------------------------------
    def start(self) -> dict:
        """Start the core and wait until it is ready; its ``info``. A flag it cannot meet raises
        ``ValueError`` with the core's message; a core that dies first, ``RuntimeError``."""
        import msgpack
        import zmq

        self._unpack = msgpack.unpackb
        self._pack = msgpack.Packer(use_bin_type=True).pack
        if self.owner:
            self._dir = tempfile.mkdtemp(prefix="paged-edu-serve-")  # private (0700): the sockets' paths
        self._context = zmq.Context()
        self._input = self._context.socket(zmq.PUSH)
        self._output = self._context.socket(zmq.PULL)
        for sock, address in zip((self._input, self._output), channel_addresses(self._dir, self.channel)):
            sock.set_hwm(0)  # no limit: a burst of requests queues, never blocks or drops
            sock.bind(address)
        if self.owner:
            # A fresh interpreter (CUDA cannot be forked), running this checkout's paged_edu; its output is ours.
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
            channels = [channel_addresses(self._dir, k) for k in range(self.num_channels)]
            self.process = subprocess.Popen(
                [sys.executable, "-m", "paged_edu.serve.core", json.dumps(channels), json.dumps(self.flags)],
                env=env,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        deadline = time.monotonic() + self.startup_timeout
        while not self._output.poll(200):
            if self.process.poll() is not None or time.monotonic() > deadline:
                status = self.process.poll()
                self.close()
                raise RuntimeError(f"the engine core did not start (exit status {status})")
        kind, payload = self._unpack(self._output.recv())
        if kind != "ready":
            self.close()
            raise ValueError(payload)
        self.info = payload
        return payload

    def now(self) -> float:
        """The engine's clock, read here (``time.perf_counter`` shifted as the core said)."""
        return time.perf_counter() - self.info["clock_offset"]

    @property
    def directory(self) -> str | None:
        """The private folder of the core's channels (and of the metrics' slots with several API servers)."""
        return self._dir

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None and self.error is None and not self._closed

    def close(self, timeout: float = 30.0) -> None:
        """Stop the core (it aborts what it still runs) and wait for it; again: nothing."""
        if self._closed:
            return
        self._closed = True
        self._stop_reading()  # (the server's lifespan ends: close() runs in the loop's thread)
        if self.owner and self.process is not None and self.process.poll() is None:
            try:
                self._input.send(self._pack(["stop"]))
                self.process.wait(timeout)
            except Exception:  # noqa: BLE001 -- a socket gone, a core that hangs: end it
                self.process.kill()
                self.process.wait()
        for sock in (self._input, self._output):
            if sock is not None:
                sock.close(linger=0)
        if self._context is not None:
            self._context.term()
        if self.owner and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    # -- in the event loop ---------------------------------------------------------------------------
    def add(self, prompt: list[int], params, cache_salt: str | None, arrival: float) -> RequestStream:
        """Send a request to the core; its stream (``await stream.accepted`` raises a refusal)."""
        stream = RequestStream(next(self._ids), params.n, len(prompt), arrival)
        if not self.alive:
            stream.accepted.set_exception(RequestError(self._gone(), status=503))
            return stream
        self._streams[stream.rid] = stream
        fields = {name: getattr(params, name) for name in params.__dataclass_fields__}  # (asdict deep-copies)
        fields["stop_token_ids"] = list(params.stop_token_ids)
        self._input.send(self._pack(["add", stream.rid, prompt, fields, cache_salt, self.channel]))
        self.num_requests += 1
        return stream

    def abort(self, rid: int, sample_index: int | None = None) -> None:
        """End a request (or one sample of it); its blocks are freed before the core's next step. Its
        stream keeps counting what the core still sends for it (the metrics), until its end."""
        if self.alive:
            self._input.send(self._pack(["abort", rid, sample_index, self.channel]))

    async def call(self, method: str):
        """Run a utility method of the core between two steps (:data:`~paged_edu.serve.core.UTILITIES`)."""
        if not self.alive:
            raise RuntimeError(self._gone())
        call_id = next(self._ids)
        self._calls[call_id] = future = asyncio.get_running_loop().create_future()
        self._input.send(self._pack(["call", call_id, method, self.channel]))
        return await future

    async def serve_outputs(self) -> None:
        """The output task: read the core's messages, hand them to the streams, fill the metrics.

        The messages are read by a callback of the event loop on the socket's file descriptor
        (:meth:`_read_outputs`), run in the very loop iteration that finds it readable; the task
        itself only watches the core's process, and takes the callback off when it is cancelled
        (the server stops). What the callback buys over ``await zmq.asyncio.Socket.poll()`` in a
        loop: that poll builds a poller and three futures per wakeup, and its result reaches the
        task through a chain of done-callbacks, each one a turn of the event loop. From a message's
        send in another process to its handler (``benchmarks/bench_output_reader.py``: uvloop, this
        2-core CPU, three interleaved rounds of medians): messages 3 ms apart 200 / 177 / 202 us with
        the poll, 133 / 136 / 144 us with the callback; 0.2 s apart (both sides cold) 2.56 / 2.64 /
        2.10 ms against 1.54 / 1.60 / 1.47 ms. (A whole lone request's TTFT on this CPU varies by
        more than that from run to run: ``bench_lone_request.py --smoke`` did not tell the two apart.)
        """
        import zmq

        loop = asyncio.get_running_loop()
        self._reader = loop, self._output.getsockopt(zmq.FD)
        loop.add_reader(self._reader[1], self._read_outputs, loop, zmq.NOBLOCK, zmq.Again)
        loop.call_soon(self._read_outputs, loop, zmq.NOBLOCK, zmq.Again)  # what came before the reader
        try:
            await self._watch_process()
            await loop.create_future()  # the core has stopped: its last messages may still come
        finally:
            self._stop_reading()

    def _stop_reading(self) -> None:
        """Take the reader off the event loop (in its thread), before the socket closes."""
        if self._reader is not None:
            loop, fd = self._reader
            self._reader = None
            loop.remove_reader(fd)

    def _read_outputs(self, loop, noblock: int, again: type) -> None:
        """Every message waiting, up to :data:`DRAIN` (then the routes run, and this again).

        ZeroMQ's descriptor says only that the socket's state may have changed (edge-triggered): it is
        read until empty (``zmq.Again``) before the loop waits on the descriptor again."""
        if self._reader is None:
            return  # stopped meanwhile
        for _ in range(DRAIN):
            try:
                raw = self._output.recv(noblock)
            except again:
                return
            self._process(self._unpack(raw))
        loop.call_soon(self._read_outputs, loop, noblock, again)

    async def _watch_process(self) -> None:
        """A core that dies without a word (killed, a crash in C) ends the requests too."""
        while self.process.poll() is None:
            await asyncio.sleep(0.5)
        if not self._closed:
            self._core_stopped(f"the engine core exited (status {self.process.returncode})")

    def _process(self, message: list) -> None:
        rids, tokens, times, more, ends, replies, stats = message
        tally = self._tally
        streams = self._streams
        missing = 0
        for rid, token, time_ in zip(rids, tokens, times):  # (the core's columns: see its module docstring)
            stream = streams.get(rid)
            if stream is None:
                missing += 1
                continue
            stream.put_token(token, time_, tally)
        tally.generated += len(rids) - missing
        for rid, i, ids, times in more:
            stream = streams.get(rid)
            if stream is not None:
                stream.put_tokens(i, ids, times, tally)
        for rid, reasons, num_cached, finish_time, error, launched in ends:
            stream = streams.pop(rid, None)
            if stream is not None:
                stream.put_end(reasons, num_cached, finish_time, error, launched, tally)
        if self.metrics is not None and (stats is not None or ends or replies):
            self.metrics.record(stats, tally)  # (the tally of every message since: see _tally in __init__)
            self._tally = Tally()
        for reply in replies:  # (after the tokens and ends: a "dead" core's last ends are counted)
            self._reply(reply)

    def _reply(self, reply: list) -> None:
        kind = reply[0]
        if kind == "added":
            stream = self._streams.get(reply[1])
            if stream is not None and not stream.accepted.done():
                stream.accepted.set_result(None)
        elif kind == "refused":
            stream = self._streams.pop(reply[1], None)
            if stream is not None and not stream.accepted.done():
                stream.accepted.set_exception(RequestError(reply[2], reply[3]))
        elif kind in ("result", "raised"):
            future = self._calls.pop(reply[1], None)
            if future is not None and not future.done():
                if kind == "result":
                    future.set_result(reply[2])
                else:
                    future.set_exception(RuntimeError(reply[2]))
        elif kind == "dead":
            self._core_stopped(f"the engine core stopped: {reply[1]}")

    def _core_stopped(self, why: str) -> None:
        """End every open request and call with ``why``."""
        if self.error is None:
            self.error = why
            log.error("%s", why)
        tally = Tally()
        for stream in self._streams.values():
            if not stream.accepted.done():
                stream.accepted.set_exception(RequestError(why, status=503))
            stream.put_end(["abort"] * len(stream._last), 0, None, why, None, tally)
        self._streams.clear()
        for future in self._calls.values():
            if not future.done():
                future.set_exception(RuntimeError(why))
        self._calls.clear()

    def _gone(self) -> str:
        return self.error or "the server is shutting down"

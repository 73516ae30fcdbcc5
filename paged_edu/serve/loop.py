"""The engine loop: one thread that owns the engine; requests join and leave it between steps.

The HTTP side (uvicorn's event loop) never touches the engine. It hands the loop a request
(:meth:`EngineLoop.submit`), an abort (:meth:`EngineLoop.abort`) or any call (:meth:`EngineLoop.call`)
through an inbox; the loop's thread, between two steps:

1. takes the inbox: ``engine.add_request`` for each new request (accepted or refused with the
   engine's own error, which names the field), ``engine.abort_request`` for each abort -- a client
   that disconnected, a stop string found -- whose blocks are freed at once;
2. runs one ``engine.step()`` (with ``async_scheduling=True`` the host is one step ahead of the
   device: the step returns the tokens of the step launched before);
3. reads what the step produced -- the new tokens of every running sequence
   (``scheduler.running``: after a step, a sequence's ``output_token_ids`` hold its real tokens only)
   and the requests that finished -- updates the metrics, publishes the KV events, and hands each
   request's :class:`Update` to its stream on the HTTP side, one ``call_soon_threadsafe`` per step.

Idle, it sleeps until the inbox is written to. A step that fails is undone by the engine
(``StepFailed``); the loop retries it, and after :data:`MAX_RETRIES` failures in a row ends the
requests it was computing with an error, so one poisoned request cannot stall the others.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from paged_edu.serve.metrics import Tally
from paged_edu.serve.protocol import RequestError

__all__ = ["EngineLoop", "RequestStream", "Update"]

log = logging.getLogger("paged_edu.serve")

MAX_RETRIES = 3  # failed steps in a row before the requests in them are ended


@dataclass(slots=True)
class Update:
    """What one step did for one request: new tokens per sample; the outcome once it ended."""

    tokens: list[tuple[int, list[int]]] = field(default_factory=list)  # (sample index, new token ids)
    finish_reasons: list[str] | None = None  # per sample, once the request has ended
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served (known at the end)
    error: str | None = None  # the request was ended by a failure, not by the model


class RequestStream:
    """The HTTP side's end of a request: an asyncio queue of :class:`Update`, filled from the loop."""

    def __init__(self) -> None:
        self.event_loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Update] = asyncio.Queue()


@dataclass(slots=True)
class _Live:
    """A request the loop serves: who listens, what each sample has been handed."""

    request_id: int
    stream: RequestStream
    num_prompt_tokens: int
    arrival: float  # engine clock (``engine.now()``) when the HTTP request arrived
    sent: list[int]  # tokens handed out, per sample
    seqs: dict = field(default_factory=dict)  # sample index -> its Sequence, once seen running
    first_token: bool = False  # its first token has been counted (TTFT)


class EngineLoop:
    """One thread running ``engine``: :meth:`start`, then :meth:`submit` / :meth:`abort` / :meth:`call`
    from any thread, :meth:`stop` at the end (what is still running is aborted)."""

    def __init__(self, engine, metrics=None, kv_events=None) -> None:
        self.engine, self.metrics, self.kv_events = engine, metrics, kv_events
        self._inbox: deque = deque()
        self._wake = threading.Event()
        self._live: dict[int, _Live] = {}
        self._stopping = False
        self._failures = 0
        self.error: BaseException | None = None  # what ended the thread, if it ended on its own
        self.num_failed_steps = 0
        self._thread = threading.Thread(target=self._run, name="paged-edu-engine-loop", daemon=True)

    # -- any thread ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def submit(
        self, prompt: list[int], params, cache_salt: str | None, arrival: float, stream: RequestStream
    ) -> Future:
        """Queue a request; the future gives its engine id, or raises :class:`RequestError` if refused."""
        future: Future = Future()
        self._post(("add", prompt, params, cache_salt, arrival, stream, future))
        return future

    def abort(self, request_id: int, sample_index: int | None = None) -> None:
        """End a request (or one sample of it); its blocks are freed before the next step."""
        self._post(("abort", request_id, sample_index))

    def call(self, fn) -> Future:
        """Run ``fn(engine)`` on the loop's thread between two steps; the future gives its result."""
        future: Future = Future()
        self._post(("call", fn, future))
        return future

    def stop(self, timeout: float = 30.0) -> None:
        """Abort what is left, end the thread and wait for it (at most ``timeout`` seconds)."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _post(self, item) -> None:
        if self._stopping or not self._thread.is_alive():
            future = item[-1] if isinstance(item[-1], Future) else None
            if future is not None:
                future.set_exception(RequestError("the server is shutting down", status=503))
            return
        self._inbox.append(item)
        self._wake.set()

    # -- the loop's thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                self._wake.clear()
                self._take_inbox()
                if not self.engine.has_unfinished():
                    self._wake.wait(0.5)
                    continue
                self._step()
            self._take_inbox()
            self._abort_all("the server is shutting down")
        except BaseException as exc:  # a bug: say so, and let /health report it
            self.error = exc
            log.exception("the engine loop stopped")
            self._abort_all(f"the engine loop stopped: {type(exc).__name__}: {exc}")
        finally:
            if self.kv_events is not None:
                self.kv_events.publish()

    def _take_inbox(self) -> None:
        while self._inbox:
            item = self._inbox.popleft()
            kind = item[0]
            if kind == "add":
                self._add(*item[1:])
            elif kind == "abort":
                self._abort(item[1], item[2])
            else:
                self._call(*item[1:])

    def _call(self, fn, future: Future) -> None:
        """``fn(engine)``; the KV events it caused (a ``reset_prefix_cache``) are sent before its result
        is handed back, so whoever waits for the result can wait for the events too."""
        try:
            result = fn(self.engine)
        except BaseException as exc:  # noqa: BLE001 -- the caller gets it
            future.set_exception(exc)
            return
        finally:
            if self.kv_events is not None:
                self.kv_events.publish()
        future.set_result(result)

    def _add(self, prompt, params, cache_salt, arrival, stream, future: Future) -> None:
        try:
            request_id = self.engine.add_request(prompt, params, cache_salt=cache_salt)
        except (ValueError, TypeError) as exc:  # refused, engine unchanged: the message names the limit
            future.set_exception(RequestError(str(exc), getattr(exc, "field", None)))
            return
        self._live[request_id] = _Live(request_id, stream, len(prompt), arrival, [0] * params.n)
        future.set_result(request_id)

    def _abort(self, request_id: int, sample_index: int | None) -> None:
        if request_id not in self._live:
            return  # finished meanwhile
        try:
            output = self.engine.abort_request(request_id, sample_index)
        except ValueError:  # that sample (or the request) ended meanwhile
            return
        if output is not None:
            tally = Tally()
            self._deliver([self._finish(output, tally)])
            self._record(tally)

    def _abort_all(self, reason: str) -> None:
        updates = []
        for request_id in list(self._live):
            try:
                output = self.engine.abort_request(request_id)
            except (ValueError, RuntimeError):
                output = None
            live = self._live.pop(request_id, None)
            if live is not None:
                reasons = output.finish_reasons if output is not None else ["abort"] * len(live.sent)
                updates.append((live.stream, Update(finish_reasons=reasons, error=reason)))
        self._deliver(updates)

    def _step(self) -> None:
        from paged_edu.engine.engine import StepFailed

        try:
            outputs = self.engine.step()
        except StepFailed as exc:
            self.num_failed_steps += 1
            self._failures += 1
            log.warning("%s (attempt %d of %d)", exc, self._failures, MAX_RETRIES)
            if self._failures >= MAX_RETRIES:
                self._end_failed(exc)
            return
        self._failures = 0
        self._after_step(outputs)

    def _end_failed(self, exc) -> None:
        """The requests a step failed on every time: ended with the error (their blocks freed)."""
        self._failures = 0
        updates = []
        for request_id in exc.request_ids:
            live = self._live.pop(request_id, None)
            try:
                output = self.engine.abort_request(request_id)
            except ValueError:
                output = None
            if live is not None:
                reasons = output.finish_reasons if output is not None else ["abort"] * len(live.sent)
                updates.append((live.stream, Update(finish_reasons=reasons, error=f"{exc.__cause__!r}")))
        self._deliver(updates)

    def _after_step(self, outputs) -> None:
        """Hand out the step's tokens and endings; the metrics and the KV events follow the engine."""
        scheduler = self.engine.scheduler
        tally = Tally()
        touched: dict[int, Update] = {}
        for seq in scheduler.running:
            live = self._live.get(seq.request_id)
            if live is None:
                continue
            i = seq.sample_index
            live.seqs[i] = seq
            new = self._new_tokens(live, i, seq, tally)
            if new:
                touched.setdefault(live.request_id, Update()).tokens.append((i, new))
        ended = {o.request_id for o in outputs if o.request_id in self._live}
        updates = [(self._live[rid].stream, u) for rid, u in touched.items() if rid not in ended]
        updates += [self._finish(o, tally, touched.get(o.request_id)) for o in outputs if o.request_id in ended]
        running = {s.request_id for s in scheduler.running}
        waiting = {s.request_id for s in scheduler.waiting} | {s.request_id for s in scheduler.swapped}
        self._record(tally, len(running), len(waiting - running))
        if self.kv_events is not None:
            self.kv_events.publish()
        self._deliver(updates)

    def _record(self, tally: Tally, num_running: int | None = None, num_waiting: int | None = None) -> None:
        if self.metrics is not None:
            self.metrics.record(self.engine, tally, num_running, num_waiting)

    @staticmethod
    def _new_tokens(live: _Live, i: int, seq, tally: Tally) -> list[int]:
        """Sample ``i``'s tokens not handed out yet; their TTFT and inter-token gaps go to ``tally``."""
        ids = seq.output_token_ids
        sent = live.sent[i]
        if len(ids) <= sent:
            return []
        live.sent[i] = len(ids)
        times = seq.token_times
        if not live.first_token and times:
            live.first_token = True
            tally.prompt_tokens += live.num_prompt_tokens
            tally.ttft.append(times[0] - live.arrival)
        tally.generated += len(ids) - sent
        tally.itl += [times[k] - times[k - 1] for k in range(max(sent, 1), len(times))]
        return ids[sent:]

    def _finish(self, output, tally: Tally, update: Update | None = None):
        """``(stream, Update)`` for a request that ended: the tokens not handed out, why each sample ended."""
        live = self._live.pop(output.request_id)
        if update is None:
            update = Update()
        for i, ids in enumerate(output.outputs):
            seq = live.seqs.get(i)
            if seq is not None:
                new = self._new_tokens(live, i, seq, tally)
            else:  # ended before a step saw it running (e.g. one token): counted from the output
                new = ids[live.sent[i] :]
                live.sent[i] = len(ids)
                if new and not live.first_token and output.metrics.first_token_time is not None:
                    live.first_token = True
                    tally.prompt_tokens += live.num_prompt_tokens
                    tally.ttft.append(output.metrics.first_token_time - live.arrival)
                tally.generated += len(new)
            if new:
                update.tokens.append((i, new))
        update.finish_reasons = list(output.finish_reasons)
        update.num_cached_tokens = output.metrics.num_cached_tokens
        if output.metrics.finish_time is not None:
            tally.e2e.append(output.metrics.finish_time - live.arrival)
        return live.stream, update

    @staticmethod
    def _deliver(updates: list) -> None:
        """Each ``(stream, Update)`` into its stream's queue: one hop per event loop."""
        by_loop: dict = {}
        for stream, update in updates:
            by_loop.setdefault(stream.event_loop, []).append((stream.queue, update))
        for event_loop, items in by_loop.items():
            try:
                event_loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that event loop has closed: nobody is listening any more
                pass


def _put_all(items) -> None:
    for queue, update in items:
        queue.put_nowait(update)

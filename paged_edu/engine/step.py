"""One engine step in six named phases, shared by the synchronous and the async schedule.

What you will learn
-------------------
A step is six phases, each named once, here:

1. ``schedule`` -- the :class:`~paged_edu.sched.scheduler.Scheduler` picks the step's chunks (and may
   preempt);
2. ``block copies`` -- the swap-outs, copy-on-write copies and swap-ins it asked for, in order;
3. ``prepare`` -- who samples (:func:`~paged_edu.engine.sampling.plan_sampling`) and the flat batch
   on the device (:meth:`~paged_edu.engine.runner.ModelRunner.prepare`);
4. ``forward`` -- one forward pass over the flat batch;
5. ``sample`` -- the tokens drawn on the device, copied back into pinned memory, and -- once the
   copy is done -- regrouped by sequence;
6. ``update`` -- :meth:`Scheduler.update` appends them, finishes sequences and frees their blocks;
   the requests they complete leave the engine.

:class:`StepPhases` holds the phases as methods; :meth:`Engine.step <paged_edu.engine.engine.Engine.step>`
runs them in that order, and async scheduling (:mod:`~paged_edu.engine.overlap`) runs the same
methods in another order: step N+1's ``schedule`` to ``sample`` while step N's tokens are still on
the device, then step N's ``update``. mini-sglang's scheduler is built the same way: its
``overlap_loop`` and ``normal_loop`` call the same ``_schedule_next_batch``, ``_forward`` and
``_process_last_data`` (``python/minisgl/scheduler/scheduler.py``).

One construct names, times and attributes a phase: ``with self.phase("forward"): ...`` books the
time since the last phase ended to ``StepMetrics.phase_times["forward"]`` (synchronising first
under ``sync_timing``) and, if the body raises inside :meth:`StepPhases.undone_on_failure`, names
the phase in the :class:`StepFailed`. Block copies are timed with ``prepare``, as they always were
(``phase_times`` has five keys: ``schedule``, ``prepare``, ``forward``, ``sample``, ``update``).

A step that raises between its block copies and its tokens is undone: no sequence advanced, no
token was sampled, every seeded stream draws the same numbers again, and block copies the scheduler
asked for are applied before the next forward pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from paged_edu.engine.outputs import RequestOutput, RequestState, StepMetrics, step_metrics
from paged_edu.engine.runner import BLOCK_SPACES, ModelRunner
from paged_edu.engine.sampling import Sampler, SamplingPlan, plan_sampling, tokens_by_sequence
from paged_edu.sched.parallel_sampling import ParallelSamples
from paged_edu.sched.scheduler import Scheduler
from paged_edu.sched.scheduler_output import SchedulerOutput
from paged_edu.sched.sequence import Sequence

__all__ = ["PHASES", "LaunchedStep", "StepFailed", "StepPhases"]

PHASES = ("schedule", "block copies", "prepare", "forward", "sample", "update")


class StepFailed(RuntimeError):
    """:meth:`Engine.step` raised half-way -- in its block copies, ``prepare``, the forward pass or
    sampling -- and was undone: no sequence advanced, no token was sampled, every seeded stream
    will draw the same numbers again, and block copies the scheduler asked for are applied before
    the next forward pass. The scheduler's memory decisions stand (admissions, preemptions, swaps):
    they are a state the next step continues from. Calling :meth:`Engine.step` again retries the
    work; a request that fails every time can be ended with :meth:`Engine.abort_request`, which also
    drops the block copies queued for it.

    Attributes: ``step`` (its number), ``phase`` (``"block copies"``, ``"prepare"``, ``"forward"`` or
    ``"sample"``), ``request_ids`` -- the requests the failing phase was working on: for a block copy
    the requests whose blocks it writes, else every request of the step (the phase cannot tell
    which) -- and ``__cause__`` (the error). No request id means the failing copy belongs to no live
    request (a fault of the device, or a copy nobody needs): :meth:`Engine.reset` empties the engine.
    """

    def __init__(self, step: int, phase: str, request_ids: list[int], cause: BaseException) -> None:
        self.step, self.phase, self.request_ids = step, phase, request_ids
        if request_ids:
            advice = f"call step() again to retry requests {request_ids}, or abort_request() one that fails every time"
        else:
            advice = "no live request owns the failing work (the device?): Engine.reset() empties the engine"
        super().__init__(
            f"engine step {step} failed in {phase} ({type(cause).__name__}: {cause}); the step was "
            f"undone and nothing is lost: {advice}"
        )


@dataclass(slots=True)
class LaunchedStep:
    """A step whose device work is queued: what it computes, who samples, and its tokens -- on the
    device (``tokens``), and on their way to the host (``host``, done when ``event`` is)."""

    sched: SchedulerOutput
    plan: SamplingPlan
    tokens: torch.Tensor | None  # (N,) int64 on the device (None: nothing drawn)
    host: torch.Tensor | None  # (N,) its copy in pinned memory (the tensor itself on a CPU)
    event: torch.cuda.Event | None  # recorded after the copy (None on a CPU)


class _Undo:
    """``with phases.undone_on_failure(sched):``: commit the step's draws if the body returns; undo the
    step and raise :class:`StepFailed` naming the phase if it raises. (Made per step and never kept:
    an object the phases keep must not point back at them, or a dropped engine waits for ``gc``.)"""

    __slots__ = ("owner", "sched")

    def __init__(self, owner: StepPhases, sched: SchedulerOutput) -> None:
        self.owner, self.sched = owner, sched

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        p = self.owner
        if exc_type is None:
            p.sampler.commit()
            p.input_batch.commit()  # the next decode step may continue from this one
            return False
        p.sampler.rollback()  # nothing computed counts: the next step schedules the same work again
        p.input_batch.rollback()
        if p.timeline is not None:
            p.timeline.discard()
        p.num_failed_steps += 1
        if not issubclass(exc_type, Exception):
            return False  # KeyboardInterrupt in a notebook: undone all the same, and raised as is
        if p.current == "block copies":  # the requests whose blocks the failing copy writes
            request_ids = p.block_copy_owners(*p.runner.failed_run)
        else:  # the phase worked on every chunk of the step
            request_ids = sorted({seq.request_id for seq in self.sched.chunk_seqs()})
        raise StepFailed(p.step_count, p.current, request_ids, exc) from exc


class StepPhases:
    """The six phases of a step over one scheduler, runner and sampler; the engine runs them in
    order, :class:`~paged_edu.engine.overlap.AsyncScheduling` one step ahead.

    ``requests`` is the engine's table of live requests (by id), shared: the ``prepare`` phase reads
    their sampling params, the ``update`` phase removes the requests it completes. ``input_batch``
    (:class:`~paged_edu.engine.input_batch.InputBatch`) builds each step's batch, keeping the
    sequences' state across steps: it learns of each step's tokens (drawn, then on the host), and whether the
    step committed.
    ``subscribers`` is the engine's list of callbacks: a step's :class:`StepMetrics` is made only if
    someone listens. Holds no reference to the engine (an engine dropped is freed at once).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        sampler: Sampler,
        requests: dict[int, RequestState],
        subscribers: list[Callable],
        *,
        input_batch,
        timeline,
        t0: float,
        sync_timing: bool,
    ) -> None:
        self.scheduler, self.runner, self.sampler = scheduler, runner, sampler
        self.requests, self.subscribers = requests, subscribers
        self.input_batch = input_batch
        self.block_tables = input_batch.block_tables  # the manager's tables (the block copies' owners)
        self.timeline = timeline
        self.t0 = t0
        self.sync = sync_timing and runner.device.type == "cuda"
        self.step_count = 0
        self.num_failed_steps = 0  # steps that raised StepFailed (each undone)
        self.num_finished_tokens = 0  # output tokens of the requests that left the engine
        self.device_wait_s = 0.0  # how long this call waited for the device's tokens
        self.phase_times: dict[str, float] = {}
        self.current = ""  # the phase running now (the one a failure names)
        self._book = ""  # the phase_times key it is timed under
        self.t_start = self.mark = 0.0  # when this call began; when its last phase ended
        on_gpu = runner.device.type == "cuda"
        # The tokens' way back: two pinned buffers, used in turn (two launched steps may be unread).
        self._pinned = [torch.empty(1024, dtype=torch.long, pin_memory=on_gpu) for _ in range(2)]
        self._copied = [torch.cuda.Event() for _ in range(2)] if on_gpu else None  # marks each buffer's copy
        self._turn = 0

    def release(self) -> None:
        """Drop the pinned buffers the tokens come back through, and the input batch's tokens on the
        device (a view of a captured graph's output: it would keep the graph's pool) (``Engine.close``)."""
        self._pinned, self._copied = [], None
        self.input_batch.release()

    # -- naming, timing and undoing -------------------------------------------------------------
    def begin(self) -> None:
        """A call of ``Engine.step`` starts: its phases are timed from now."""
        self.phase_times = {}
        self.device_wait_s = 0.0
        self.t_start = self.mark = time.perf_counter() - self.t0

    def phase(self, name: str, book: str | None = None) -> StepPhases:
        """``with self.phase(name):`` -- the body is phase ``name``: a failure inside
        :meth:`undone_on_failure` names it, and its time (since the last phase ended) is booked to
        ``phase_times[book or name]``. (The phases are their own context manager: a generator-based
        one costs ~1 us more per phase, six times a step.)"""
        self.current = name
        self._book = book or name
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        """A phase ended: book the time since the last one ended (synchronised first under ``sync_timing``)."""
        if exc_type is None:
            if self.sync:
                torch.cuda.synchronize(self.runner.device)
            now = time.perf_counter() - self.t0
            self.phase_times[self._book] = self.phase_times.get(self._book, 0.0) + (now - self.mark)
            self.mark = now
        return False

    def undone_on_failure(self, sched: SchedulerOutput) -> _Undo:
        """``with self.undone_on_failure(sched):`` around the phases that may fail half-way."""
        return _Undo(self, sched)

    # -- the phases -----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Phase 1: what runs this step."""
        with self.phase("schedule"):
            return self.scheduler.schedule()

    def launch(self, sched: SchedulerOutput) -> LaunchedStep:
        """Phases 2-5 up to the tokens' copy: block copies, prepare, the forward pass, and the draw;
        returns without waiting for the device."""
        runner = self.runner
        with self.phase("block copies", book="prepare"):
            if runner.num_unapplied_block_ops:  # copies a failed step left: those still needed go first
                self.drop_dead_block_ops(sched.block_ops)
            runner.apply_block_ops(sched.block_ops)  # swap-outs, copy-on-write copies, swap-ins
        with self.phase("prepare"):
            plan = plan_sampling(sched, self.sampler, self.requests)  # who samples, and how
            batch = runner.prepare(sched, self.input_batch, plan)
        with self.phase("forward"):
            runner.forward(batch)
        with self.phase("sample"):
            if plan.emitting:
                tokens = runner.draw(batch)  # drawn on the device
            else:  # nothing to draw: the launch ends with the forward pass
                tokens = None
                runner.end_launch()
            self.input_batch.launched(tokens)  # what the next step's placeholders will read
            return self._copy_back(sched, plan, tokens)

    def _copy_back(self, sched: SchedulerOutput, plan: SamplingPlan, tokens) -> LaunchedStep:
        """Start copying the step's tokens to the host (the only device-to-host copy), without waiting."""
        if tokens is None or tokens.device.type != "cuda":
            return LaunchedStep(sched, plan, tokens, tokens, None)
        n = tokens.shape[0]
        if n > self._pinned[self._turn].numel():
            self._pinned[self._turn] = torch.empty(2 * n, dtype=torch.long, pin_memory=True)
        host, event = self._pinned[self._turn][:n], self._copied[self._turn]
        self._turn ^= 1
        host.copy_(tokens, non_blocking=True)
        event.record()
        return LaunchedStep(sched, plan, tokens, host, event)

    def wait(self, step: LaunchedStep) -> list[int]:
        """Phase 5's end: wait for the step's tokens (the host's one wait for the device); returns them
        in the plan's order."""
        with self.phase("sample"):
            if step.event is not None:
                t0 = time.perf_counter()
                step.event.synchronize()
                self.device_wait_s += time.perf_counter() - t0
            if step.host is None:
                return []
            host = step.host.numpy()
            self.input_batch.read(step.tokens, host)  # the next step's batch takes them from the host
            return host.tolist()

    def update(self, step: LaunchedStep, tokens: list[int], num_held: int = 0) -> tuple[list[RequestOutput], int]:
        """Phase 6: append the step's ``tokens`` (:meth:`wait`'s), publish the blocks they complete,
        finish sequences; returns the requests completed and the number of sequences finished.
        ``num_held``: the step's first leading decodes that hold a placeholder for their token (async
        scheduling's hold): ``Scheduler.update`` replaces it in place.

        The tokens go to the scheduler regrouped by sequence
        (:func:`~paged_edu.engine.sampling.tokens_by_sequence`), but for the step's leading decodes:
        with one token a chunk their tokens are the first, in their order, and go as that list
        (``Scheduler.update``'s ``decode_tokens``: no map entry made or looked up per decode; what it
        buys: ``bench_host --graph-path`` at 256 running, the sample phase 0.034 -> 0.020 ms and the step
        0.4575 -> 0.4365 ms, medians of 6 interleaved runs on this 2-core CPU, with the async hold below:
        ``benchmarks/records/cpu/host_ab_decode_tokens.json``).
        """
        with self.phase("update"):
            plan, sched = step.plan, step.sched
            if len(tokens) == len(plan.emitting):  # one token a chunk: the decodes' first
                num = len(sched.decode_seqs)
                decode_tokens, sampled = tokens[:num], tokens_by_sequence(plan, tokens, first=num)
            else:  # a parallel-sampling prompt drew several
                decode_tokens, sampled = None, tokens_by_sequence(plan, tokens)
            finished = self.scheduler.update(sched, sampled, self.mark, decode_tokens, num_held)
            for seq in finished:
                self.sampler.remove(seq.request_id, seq.sample_index)
            done = ParallelSamples.completed(finished)
            return [self.finish_request(self.requests[s.request_id]) for s in done], len(finished)

    def finish_request(self, request: RequestState) -> RequestOutput:
        """The finished (or aborted) request's output; it leaves the engine and the sampler for good."""
        del self.requests[request.request_id]
        self.sampler.remove_request(request.request_id, request.params.n)
        output = request.output()
        self.num_finished_tokens += sum(map(len, output.outputs))
        return output

    def close(self, sched: SchedulerOutput, num_finished: int) -> StepMetrics | None:
        """Count the call (it launched ``sched``; its updates finished ``num_finished`` sequences); its
        :class:`StepMetrics` when someone subscribed (None otherwise). Its duration is its phases' sum."""
        now, t_start = self.mark, self.t_start
        if self.timeline is not None and not sched.is_empty:  # (async scheduling's last call launches nothing)
            self.timeline.close(self.step_count, sched, t_start, now - t_start - self.device_wait_s)
        metrics = None
        if self.subscribers:
            metrics = step_metrics(
                self.step_count,
                sched,
                self.scheduler,
                now,
                now - t_start,
                num_finished,
                self.phase_times,
                self.device_wait_s,
            )
        self.step_count += 1
        return metrics

    # -- block copies left by a failed step ----------------------------------------------------
    def _block_owners(self, then=()) -> dict[str, dict[int, Sequence]]:
        """``{"gpu": {block: sequence}, "cpu": {block: sequence}}``: the live sequence that needs each
        block a pending copy writes -- one holding it (a GPU block in its table, a CPU block of its
        swap copy), or, for a block a later copy reads (a swap-out's CPU block that a swap-in queued
        after it, or asked for in ``then``, this step's ops, brings back), the owner of that later
        copy's destination."""
        s = self.scheduler
        running = s.running
        gpu = {b: q for q, table in zip(running, self.block_tables([q.seq_id for q in running])) for b in table}
        cpu = {b: q for q in s.swapped for b in s.swap_space.blocks_of(q.seq_id)}
        owners = {"gpu": gpu, "cpu": cpu}
        later = [(kind, a, b) for kind, pairs in self.runner.pending_block_ops for a, b in pairs] + list(then)
        for kind, a, b in reversed(later):
            src, dst = BLOCK_SPACES[kind]
            q = owners[dst].get(b)
            if q is not None:
                owners[src].setdefault(a, q)
        return owners

    def block_copy_owners(self, kind: str, pairs: list[tuple[int, int]]) -> list[int]:
        """The requests whose blocks the copies ``pairs`` of ``kind`` write (none: no live request needs them)."""
        owners = self._block_owners()[BLOCK_SPACES[kind][1]]
        return sorted({owners[b].request_id for _, b in pairs if b in owners})

    def drop_dead_block_ops(self, then=()) -> int:
        """Drop the pending copies no live sequence needs any more (their owner was aborted, finished or
        preempted by recompute), ``then`` (``(kind, src, dst)`` ops to queue after them) considered: a
        copy that fails forever for a request that is gone must not hold up the others. Returns how
        many were dropped."""
        owners = self._block_owners(then)
        return self.runner.keep_block_ops(lambda kind, a, b: b in owners[BLOCK_SPACES[kind][1]])

    def stalled(self) -> RuntimeError:
        """The error when requests wait but nothing could be scheduled."""
        a = self.scheduler.allocator
        return RuntimeError(
            "the scheduler could schedule nothing although requests wait: the pool "
            f"({a.num_blocks} blocks, {a.num_free_blocks} free) or "
            f"max_num_seqs={self.scheduler.max_num_seqs} is too small for the next request"
        )

    def live_output_tokens(self) -> int:
        """Output tokens of the live requests' sequences so far."""
        return sum(r.samples.num_output_tokens() for r in self.requests.values())

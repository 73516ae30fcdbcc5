"""Async scheduling: the host schedules and prepares step N+1 while the device runs step N.

What you will learn
-------------------
A synchronous step is ``schedule -> prepare -> forward -> sample -> wait for the tokens -> update``:
while the host schedules, prepares and updates, the GPU idles (1.14 ms of a ~5.8 ms step on the
H200 for nano-vllm's workload, ``benchmarks/records/h200/engine_bench_nanovllm.json``). With the host one step
ahead, a step costs ``max(host, GPU)`` instead of their sum. One call of :meth:`AsyncScheduling.step`:

1. **placeholders** -- step N is in flight: every sequence that samples in it gets a placeholder
   token (its id is still on the device) and its computed count moves to the end of its chunk, as if
   step N were done. The placeholder is ``-1 - j``: "row ``j`` of step N's sampled tokens";
2. **schedule step N+1** with the scheduler as it is: a placeholder needs a slot like any token, and
   the memory manager reserves it by count (``append_slots``) -- the id reaches it later, with
   ``mark_computed``, which hashes and publishes a block only once its ids are known;
3. **launch step N+1**: block copies, ``prepare`` (the placeholders go into the packed input ids,
   and the runner resolves them on the device, ``ids = where(ids < 0, tokens_N[-1 - ids], ids)`` --
   a gather by row, no host round trip, :func:`~paged_edu.engine.runner.fill_placeholders`; SGLang
   resolves its "future" token ids the same way: ``FutureMap`` in
   ``sglang/srt/managers/overlap_utils.py``) -- the forward pass and sampling, whose tokens stay on
   the device and start a ``non_blocking`` copy into pinned memory, marked by a CUDA event;
4. **step N's tokens**: the host waits on step N's event (the GPU has usually long finished it) and
   :meth:`Scheduler.update` puts the real ids in -- a leading decode's replaces its placeholder in
   place, the other chunks' placeholders are taken back and their ids appended -- publishes the
   blocks they complete, and finishes sequences on a stop token or ``max_tokens``.

Each call emits one :class:`~paged_edu.engine.outputs.StepMetrics` for the step it launched; its
``phase_times`` keep the synchronous names (the wait for step N's tokens is booked under
``"sample"``, ``"update"`` is step N's) and ``num_finished`` counts the sequences step N finished.

A sequence that stopped at step N was already scheduled in step N+1: that row's token is
discarded (``update`` skips a finished sequence) and its slot is given back with its blocks when it
finishes, as vLLM does. Blocks freed at step N reach waiting requests one step later than in a
synchronous engine and prefix-cache hits on blocks step N completes come a step later too, so the
two engines may batch differently; greedy tokens are the same (the tests check it, token for token).

vLLM's version is ``AsyncScheduler`` (``vllm/v1/core/sched/async_scheduler.py``):
``_update_after_schedule`` adds one to ``request.num_output_placeholders`` for every token
scheduled before its id exists, and ``_update_request_with_output`` takes it back when the id
arrives and caches blocks only up to ``num_computed_tokens - num_output_placeholders``.

When the host does not run ahead (correctness first)
----------------------------------------------------
Step N's tokens are read *before* step N+1 is scheduled -- a synchronous step -- when:

* a swapped sequence waits (``scheduler.swapped``): a swap-in publishes the sequence's blocks and
  re-allocates them from its token ids, which must all be known;
* the pool might not hold a slot for every running sequence: the scheduler would preempt, and a
  preempted sequence is freed or copied out with a placeholder whose stop check never ran (a
  sequence that ended at step N must not be recomputed and continue). The test is conservative:
  one free block per running sequence that needs a slot;
* the step in flight forks ``n > 1`` samples: the children are made in ``update``, from the drawn
  ids, so the next step waits for them (a sample aborted while its fork is in flight drops its
  token; each sample draws from its own stream, so the others keep theirs);
* the last step: nothing more to schedule, so the call only reads the step in flight.

From idle
---------
A call that finds nothing in flight and no sequence running -- a request arriving at an idle engine,
as every request does on a server at 1 req/s -- has no device work to hide the next step's host work
behind. Run ahead, it would return nothing: its prompt step's first token would wait for the next
call to schedule and launch step N+1 (the host work of a whole step) before being read. So such a
call reads the step it launched, if that step draws a token, before it returns -- the request's first
token leaves the engine one step's host time sooner -- and the next call starts from a step no
longer in flight, the running sequences then keep the host one step ahead as usual (one synchronous
call per stretch of busy time; ``num_idle_reads`` counts them). On a CPU, where the "device" runs
inside the launch, the call that ran ahead also ran step N+1's forward pass before the read: a lone
request's first token came in 3.5 ms instead of 2.1 (``benchmarks/bench_ttft.py --smoke``, tiny model).
On an H100 the device's prompt step (1.5 ms at 96 tokens) hides step N+1's launch anyway: 1.955 against
1.946 ms, the same within noise (``benchmarks/records/h100/ttft_ab_99b8dd3_log.txt``); what it buys
there is a first token that no longer depends on the next step's host work.

Three cases that might look as if they need one do not. Prefix-cache hits: a block is published
only once its ids are read and its K/V computed, so no hit can ever rest on a placeholder (a block
that step N completes is hit from step N+2 on, one step later than synchronously). Stop
conditions: ``stop_token_ids`` and ``max_tokens`` are both checked when the ids are read, and the
row a finished sequence had in step N+1 is discarded. Aborts: an abort between two calls ends the
request with the tokens read so far (those of the step in flight are discarded with its rows),
which is what a synchronous engine gives when the same abort follows the same tokens.

A step whose launch raises is undone as in the synchronous engine
(:class:`~paged_edu.engine.step.StepFailed`); the step in flight stays in flight and is read by
the next call, and outputs read before the failure are returned then.
"""

from __future__ import annotations

from itertools import islice

import torch

from paged_edu.engine.outputs import RequestOutput, StepMetrics
from paged_edu.engine.step import LaunchedStep, StepPhases
from paged_edu.sched.scheduler_output import SchedulerOutput
from paged_edu.sched.sequence import Sequence, SequenceStatus

__all__ = ["AsyncScheduling"]


class AsyncScheduling:
    """The steps of an ``Engine(..., async_scheduling=True)``: the phases of
    :class:`~paged_edu.engine.step.StepPhases` one step ahead, one step in flight between calls.
    What is here is only their order and the placeholder bookkeeping."""

    def __init__(self, phases: StepPhases) -> None:
        self.phases = phases
        self.in_flight: LaunchedStep | None = None
        self.num_sync_steps = 0  # calls that read the step in flight before scheduling (see the module)
        self.num_idle_reads = 0  # calls from idle that read the step they launched (see "From idle")
        self._held: list[tuple[Sequence, int, bool]] = []  # (seq, chunk start, placeholder?) of the step held
        self._held_decodes: tuple[list[Sequence], list[int]] = ([], [])  # its leading decodes held in bulk
        self._unreported: list[RequestOutput] = []  # read before a launch failed: returned next call
        self._num_finished = 0  # sequences finished by the reads of this call (for its StepMetrics)

    # -- one call --------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> tuple[list[RequestOutput], StepMetrics | None]:
        p = self.phases
        p.begin()
        outputs, self._unreported = self._unreported, []
        prev = self.in_flight
        if prev is not None and not self._can_run_ahead(prev):
            self.num_sync_steps += 1
            outputs += self._read(prev)
            prev = None
        if prev is not None:
            self._hold(prev)  # 1. placeholders
        idle = prev is None and not p.scheduler.running  # nothing on the device, nothing to run ahead of
        sched = p.schedule()  # 2. step N+1
        if sched.is_empty:
            if prev is None:
                if p.scheduler.has_unfinished():
                    raise p.stalled()
                return outputs, None
            outputs += self._read(prev)  # the last step
            return outputs, self._close(sched)
        if prev is not None and (sched.preempted or sched.blocks_to_swap_in):
            raise RuntimeError("async scheduling ran ahead into a preemption or a swap-in (a bug: see _can_run_ahead)")
        try:  # 3. launch step N+1 (its placeholders read step N's tokens: the last step launched)
            with p.undone_on_failure(sched):
                current = p.launch(sched)
        except BaseException:  # undone; the step in flight stays in flight
            if prev is not None:
                self._release()
            self._unreported = outputs
            raise
        if prev is not None:  # 4. step N's tokens
            outputs += self._read(prev)
        elif idle and current.plan.emitting:  # from idle: read the step just launched (see "From idle")
            self.num_idle_reads += 1
            self.in_flight = current  # (an interrupt in the wait leaves it in flight, read by the next call)
            outputs += self._read(current)
            return outputs, self._close(sched)
        if any(seq.status is SequenceStatus.RUNNING for seq in sched.chunk_seqs()):
            self.in_flight = current
        # else every sequence of the step ended at step N: nothing in it is read (its rows are discarded)
        return outputs, self._close(sched)

    # -- the pieces ------------------------------------------------------------------------------
    def _can_run_ahead(self, prev: LaunchedStep) -> bool:
        """May step N+1 be scheduled before step N's tokens are read? (The module lists why not.)"""
        s = self.phases.scheduler
        a = s.allocator
        if s.swapped or prev.plan.forks:
            return False
        free = a.num_free_blocks
        if len(s.running) <= free:  # each running sequence takes at most one block for one slot
            return True
        pending = {seq.seq_id for _, seq, _ in prev.plan.emitting}
        need = sum(a.num_tokens(q.seq_id) < q.num_tokens + (q.seq_id in pending) for q in s.running)
        return need <= free

    def _hold(self, prev: LaunchedStep) -> None:
        """Step N as if done: computed counts to the chunks' ends, a placeholder per sampled token."""
        running, held = SequenceStatus.RUNNING, self._held
        s = prev.sched  # its chunks as columns (a decode step makes no ScheduledSeq)
        num = self._hold_decodes(s.decode_seqs, s.decode_starts)  # the leading decodes: in bulk
        if num == len(s.decode_seqs) and not s.chunks:  # (a step of decodes: nothing left)
            return
        j = num - 1  # the row of step N's tokens: the plan lists the emitting chunks in this order
        columns = s.chunk_seqs(), s.chunk_starts(), s.chunk_counts(), s.chunk_emits()
        for seq, start, n, emits in islice(zip(*columns), num, None):
            j += emits
            if seq.status is not running:  # finished at step N-1 or aborted: its row is discarded
                continue
            if emits:
                seq.append_token(-1 - j)  # "row j of step N's tokens"
            held.append((seq, start, emits))
            seq.num_computed_tokens = start + n

    def _hold_decodes(self, seqs: list[Sequence], starts: list[int]) -> int:
        """The loop of :meth:`_hold` for step N's leading decodes -- every chunk, in most steps -- in bulk:
        decode ``i`` (one token computed at ``starts[i]``, drawing row ``i``) gets the placeholder
        ``-1 - i``; returns how many it held, up to the first sequence not running (the loop takes it
        and the rest). They are kept as two lists (``_held_decodes``), no tuple a sequence.

        Speed: one tight pass, no call or tuple per decode: ``_hold`` 57 -> 30 us and ``_release`` 26 -> 19
        us a step at 256 decodes (perf_counter around them); ``bench_host --graph-path --async-scheduling``'s
        schedule phase 0.1245 -> 0.100 ms, the step 0.5725 -> 0.5185 ms with the decodes' tokens as a list
        (medians of 6 interleaved runs, this project's 2-core CPU: ``benchmarks/records/cpu/host_ab_decode_tokens.json``).
        ``_release`` has since left the step's path (``update`` replaces the placeholders: :meth:`_read`).
        """
        running = SequenceStatus.RUNNING
        placeholder = 0  # -1 - i for decode i: -1, -2, ...
        for seq, start in zip(seqs, starts):
            if seq.status is not running:
                break  # finished at step N-1 or aborted: the loop takes it and the rest
            placeholder -= 1
            seq.output_token_ids.append(placeholder)  # Sequence.append_token, inlined
            seq.num_tokens += 1
            seq.num_computed_tokens = start + 1
        num = -placeholder
        self._held_decodes = (seqs, starts) if num == len(seqs) else (seqs[:num], starts[:num])
        return num

    def _release(self) -> None:
        """Take the placeholders back: the sequences are as step N left them, before its update."""
        seqs, starts = self._held_decodes
        for seq, start in zip(seqs, starts):  # the leading decodes held in bulk (each has a placeholder)
            seq.take_back_token(start)
        self._held_decodes = ([], [])
        self._release_chunks()

    def _release_chunks(self) -> None:
        """:meth:`_release` for the chunks held one by one (all but the leading decodes)."""
        for seq, start, placeholder in self._held:
            if placeholder:
                seq.take_back_token(start)
            else:
                seq.num_computed_tokens = start
        self._held.clear()

    def _read(self, step: LaunchedStep) -> list[RequestOutput]:
        """Wait for a step's tokens, then ``update``: put the ids in (each held leading decode's replaces
        its placeholder in place; the other chunks' placeholders are taken back first), publish the
        blocks they complete, finish sequences; returns the requests that finished.

        Speed: a held decode's placeholder replaced by ``update`` (``output[-1] = token``) rather than
        taken back here and the token appended there: one pass over the decodes instead of two. At 256
        decodes (``bench_host --graph-path --async-scheduling``, this project's 2-core CPU, 8 interleaved
        rounds against 358dc8c) the update phase, which held the take-back, 0.1665 -> 0.155 ms (faster in 6,
        one tie; 0.180 -> 0.1525 in 6 of 6 in an A/B of the change alone); the step's other phases vary by
        more than that between runs (``benchmarks/records/cpu/host_ab_held_decodes.json``).
        """
        p = self.phases
        tokens = p.wait(step)  # (an interrupt in the wait leaves the step in flight, to read again)
        self.in_flight = None
        num_held = len(self._held_decodes[0])  # (the step read is the one held: its decodes come first)
        self._release_chunks()  # the other chunks' placeholders, if the step was held
        outputs, num_finished = p.update(step, tokens, num_held)
        self._held_decodes = ([], [])  # update replaced their placeholders
        self._num_finished += num_finished
        return outputs

    def discard(self) -> list[RequestOutput]:
        """Forget the step in flight (:meth:`Engine.reset`): its tokens are never read. Returns the
        outputs read before a failed launch and not reported yet."""
        self._release()
        self.in_flight = None
        outputs, self._unreported = self._unreported, []
        return outputs

    def _close(self, sched: SchedulerOutput) -> StepMetrics | None:
        """The call's :class:`StepMetrics`: ``sched`` is the step it launched, ``num_finished`` the
        sequences its reads finished; the wait for step N's tokens is booked under ``"sample"``."""
        metrics = self.phases.close(sched, self._num_finished)
        self._num_finished = 0
        return metrics

"""What the engine hands back: finished requests and the metrics stream.

* :class:`RequestOutput` -- a finished request: its ``n`` samples (new tokens only), why each
  stopped (``"length"``, ``"stop"`` or ``"abort"``) and its :class:`RequestMetrics`;
* :class:`StepMetrics` -- one event per engine step: queue lengths, tokens, KV usage, and
  ``phase_times``, where the step's time went (lesson 5's plot);
* :class:`RequestState` -- a live request as the engine tracks it until all its samples are done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged_edu.engine.sampling import SamplingParams
from paged_edu.sched.parallel_sampling import ParallelSamples
from paged_edu.sched.sequence import SequenceStatus
from paged_edu.sim.costmodel import StepShape

__all__ = ["RequestMetrics", "RequestOutput", "RequestState", "StepMetrics", "step_metrics"]


@dataclass(slots=True)
class RequestMetrics:
    """Latency and size of one finished request (times in seconds since the engine started)."""

    request_id: int
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_prompt_tokens: int
    num_output_tokens: int  # all samples together
    num_cached_tokens: int  # prompt tokens served by the prefix cache
    num_preemptions: int
    inter_token_latencies: list[float] = field(default_factory=list)
    kind: str = "request"

    @property
    def ttft(self) -> float | None:
        """Time to first token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def mean_itl(self) -> float | None:
        """Mean inter-token latency over every sample's consecutive tokens."""
        itl = self.inter_token_latencies
        return sum(itl) / len(itl) if itl else None

    @property
    def latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


@dataclass(slots=True)
class StepMetrics:
    """What one engine step did and the state it left (one event of the stream)."""

    step: int
    time: float  # seconds since the engine started, at the step's end
    duration: float  # seconds spent in the step
    num_running: int
    num_waiting: int
    num_swapped: int
    num_batched_tokens: int
    num_prefill_tokens: int
    num_decode_seqs: int
    num_preempted: int  # this step
    num_preemptions: int  # since the start
    num_finished: int  # sequences finished this step
    kv_usage: float  # fraction of GPU blocks held by live sequences
    num_used_blocks: int
    num_tokens_in_cache: int  # computed tokens of live sequences (a shared block counts once per sequence)
    prefix_hit_rate: float  # cached / queried prompt tokens since the start
    # seconds per phase of the step: "schedule", "prepare", "forward", "sample", "update" (host wall
    # time; exact per phase only with Engine(sync_timing=True), else GPU work lands where it syncs)
    phase_times: dict[str, float] = field(default_factory=dict)
    # Who this step preempted, as (request_id, seq_id, "swap" | "recompute"), youngest-admitted first
    # (the scheduler's victim order), and the request ids it computed tokens for -- a preempted
    # request's resumption is the next step that schedules it again (lesson 6's timeline).
    preempted: list[tuple[int, int, str]] = field(default_factory=list)
    scheduled_request_ids: list[int] = field(default_factory=list)
    num_blocks_swapped_out: int = 0  # this step, GPU -> CPU
    num_blocks_swapped_in: int = 0  # this step, CPU -> GPU
    # seconds the host waited for the device (the copy of the sampled tokens): duration - device_wait
    # is the step's host time, GPU time excluded (what the host could not overlap with the GPU)
    device_wait: float = 0.0
    # Each scheduled chunk's shape, in the scheduler's order: chunk i computed chunk_counts[i] new
    # tokens on top of chunk_starts[i] cached ones; num_emitting of them sampled a token (``shape``).
    chunk_starts: list[int] = field(default_factory=list)
    chunk_counts: list[int] = field(default_factory=list)
    num_emitting: int = 0
    kind: str = "step"

    @property
    def shape(self) -> StepShape:
        """The step's chunks as the cost model prices them (``CostModel.roofline().step_time(m.shape)``)."""
        return StepShape.of_chunks(self.chunk_starts, self.chunk_counts, self.num_emitting)


@dataclass(slots=True)
class RequestOutput:
    """A finished request: its ``n`` samples (new tokens only) and its metrics."""

    request_id: int
    prompt_token_ids: list[int]
    outputs: list[list[int]]  # by sample index
    finish_reasons: list[str]
    metrics: RequestMetrics


@dataclass(slots=True)
class RequestState:
    """A live request: its prompt, its params and its samples (the record its sequences share)."""

    request_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    samples: ParallelSamples

    @property
    def done(self) -> bool:
        return self.samples.done

    def output(self) -> RequestOutput:
        """The finished request: every sample's tokens (``[]`` for one aborted before its fork)."""
        by_index = self.samples.in_order()
        samples = [s for s in by_index if s is not None]
        metrics = RequestMetrics(
            request_id=self.request_id,
            arrival_time=self.arrival_time,
            first_scheduled_time=min(
                (s.first_scheduled_time for s in samples if s.first_scheduled_time is not None), default=None
            ),
            first_token_time=min((s.first_token_time for s in samples if s.first_token_time is not None), default=None),
            finish_time=max((s.finish_time for s in samples if s.finish_time is not None), default=None),
            num_prompt_tokens=len(self.prompt_token_ids),
            num_output_tokens=sum(len(s.output_token_ids) for s in samples),
            num_cached_tokens=samples[0].num_cached_tokens,
            num_preemptions=sum(s.num_preemptions for s in samples),
            inter_token_latencies=[x for s in samples for x in s.inter_token_latencies],
        )
        outputs, reasons = [], []
        for seq in by_index:
            outputs.append(list(seq.output_token_ids) if seq is not None else [])
            reasons.append(seq.finish_reason if seq is not None else "abort")
        return RequestOutput(self.request_id, self.prompt_token_ids, outputs, reasons, metrics)


def step_metrics(
    step: int,
    sched,
    scheduler,
    now: float,
    duration: float,
    num_finished: int,
    phase_times: dict[str, float],
    device_wait: float = 0.0,
) -> StepMetrics:
    """The :class:`StepMetrics` of a step that ran ``sched`` (a ``SchedulerOutput``) and left ``scheduler`` so."""
    stats = scheduler.stats()
    # This runs every step a view is subscribed (256 chunks a step at high load): columns built by
    # comprehensions and counted by list methods, no Python loop body per chunk. (A comprehension, not
    # ``map(attrgetter(...))``: over 256 chunks 2.6 against 5.3 us a column on Python 3.11, this CPU.)
    # The chunks' columns: a decode step's come from the scheduler's two lists, no ScheduledSeq made.
    seqs, starts, counts = sched.chunk_seqs(), sched.chunk_starts(), sched.chunk_counts()
    decodes, prefill_tokens = sched.decodes_and_prefill_tokens()
    emitting = sched.chunk_emits().count(True)
    in_cache = sum([s.num_computed_tokens for s in scheduler.running])
    return StepMetrics(
        step=step,
        time=now,
        duration=duration,
        num_running=stats["running"],
        num_waiting=stats["waiting"],
        num_swapped=stats["swapped"],
        num_batched_tokens=sched.num_batched_tokens,
        num_prefill_tokens=prefill_tokens,
        num_decode_seqs=decodes,
        num_preempted=len(sched.preempted),
        num_preemptions=stats["preemptions"],
        num_finished=num_finished,
        kv_usage=stats["kv_usage"],
        num_used_blocks=scheduler.allocator.num_used_blocks,
        num_tokens_in_cache=in_cache,
        prefix_hit_rate=stats["prefix_hit_rate"],
        phase_times=phase_times,
        preempted=[
            (s.request_id, s.seq_id, "swap" if s.status is SequenceStatus.SWAPPED else "recompute")
            for s in sched.preempted
        ],
        scheduled_request_ids=sorted({s.request_id for s in seqs}),
        num_blocks_swapped_out=len(sched.blocks_to_swap_out),
        num_blocks_swapped_in=len(sched.blocks_to_swap_in),
        device_wait=device_wait,
        chunk_starts=starts,
        chunk_counts=counts,
        num_emitting=emitting,
    )

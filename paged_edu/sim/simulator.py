"""A serving simulator: the real scheduler and allocator, with a cost model in place of the GPU.

Iteration-level serving (continuous batching) as the engine does it, at scales no single GPU run
affords. Each step:

1. requests that have arrived join the scheduler's waiting queue;
2. :meth:`Scheduler.schedule` -- the *same* scheduler the engine uses -- picks the decodes and
   prefill chunks and asks the memory manager for slots;
3. the :class:`~paged_edu.sim.costmodel.CostModel` says how long the step would take on the GPU, and
   the clock advances by that much;
4. every sequence that emitted a token gets one (the request's own ``output`` ids when the trace
   gives them, else a made-up id: the simulator knows each request's output length in advance) and :meth:`Scheduler.update` finishes the ones that are done.

Memory managers (:mod:`paged_edu.sim.managers`, each a
:class:`~paged_edu.sched.memory_manager.MemoryManager`)::

    contiguous-max     reserve L_max slots per request          (FasterTransformer, Orca (Max))
    contiguous-pow2    reserve prompt + next power of 2 of the output (Orca (Pow2))
    contiguous-oracle  reserve exactly the tokens it will store   (Orca (Oracle))
    paged              BlockAllocator, block size B, no prefix caching   (vLLM)
    paged-prefix       BlockAllocator with prefix caching
    paged-radix        RadixAllocator: the radix-tree prefix cache

Every manager gets the same pool of ``num_kv_slots`` token slots (paged: ``num_kv_slots // B``
blocks). The contiguous ones place their reservations by first fit in one address space
(:class:`paged_edu.core.contiguous.ContiguousAllocator`); a request with ``n`` samples reserves ``n``
ranges' worth at admission, the way a system without block sharing must.

The memory breakdown follows the PagedAttention paper's Fig. 2 (Kwon et al., SOSP 2023). Sampled
every few steps, every slot of the pool is one of:

* ``token_states`` -- holds the K/V of a token;
* ``reserved`` -- allocated to a request that will write a token there later;
* ``internal_frag`` -- allocated but never written (past the request's end, or a finished
  sample's share of a family's range);
* ``external_frag`` -- free, but a waiting request cannot be admitted because no gap is large
  enough (contiguous managers only);
* ``other`` -- free while requests wait for another reason (the step's token budget,
  ``max_num_seqs``, or too few free slots in total);
* idle -- free while nobody waits: not waste, left out of the fractions.

``kv_utilization`` is ``token_states / allocated`` summed over the sampled steps (a time average);
``kv_utilization_final`` is ``sum(s) / sum(slots held)`` over sequences at the moment they finish,
``s`` being the tokens whose K/V was stored (the last sampled token is never stored).
"""

from __future__ import annotations

import time
from heapq import heappop, heappush
from collections.abc import KeysView
from dataclasses import dataclass, field, replace

from paged_edu.core.validation import FieldTypeError, FieldValueError, integer
from paged_edu.sched.scheduler import Scheduler
from paged_edu.sched.scheduler_output import SchedulerOutput
from paged_edu.sched.parallel_sampling import ParallelSamples
from paged_edu.sched.sequence import Sequence, SequenceStatus
from paged_edu.sim.costmodel import CostModel, StepShape
from paged_edu.sim.managers import build_manager, check_holds_a_block
from paged_edu.sim.results import RequestRecord, SimConfig, SimResult
from paged_edu.sim.request import Request, prompt_token_ids

__all__ = ["MadeUpTokens", "Server", "prepare", "simulate", "step_shape"]

_OUTPUT_TOKEN_BASE = 1 << 40  # sampled ids live far above any prompt id: no accidental cache hit


def step_shape(out: SchedulerOutput, block_size: int | None = None, count_blocks: bool = False) -> StepShape:
    """What the cost model needs of one scheduled step: each chunk's new and cached tokens, the copies.

    With ``count_blocks``, also the KV blocks the kernel walks: ``sum ceil((c_i + n_i) / B)`` for a
    paged cache of block size ``block_size``, one span per chunk for a contiguous one (``None``).
    """
    chunks, starts = out.chunks, out.decode_starts  # the leading decodes: one token each, on top of its start
    shape = StepShape.of_chunks(
        starts + [item.start for item in chunks] if chunks else starts,
        [1] * len(starts) + [item.num_new_tokens for item in chunks],
        len(starts) + sum([item.emits_token for item in chunks]),
        swapped_blocks=len(out.blocks_to_swap_out) + len(out.blocks_to_swap_in),
        copied_blocks=len(out.blocks_to_copy),
    )
    if count_blocks:  # a contiguous cache (block_size None) is one span per chunk
        shape.num_blocks_read = (
            len(starts) + len(chunks)
            if block_size is None
            else sum(-(-(start + 1) // block_size) for start in starts)
            + sum(-(-(item.start + item.num_new_tokens) // block_size) for item in chunks)
        )
    return shape


class MadeUpTokens:
    """The "model output": a token for every sequence whose chunk emits one.

    The simulator knows each request's output length, not its text, so a sequence's tokens are one
    made-up id, unique to it and far above every prompt id (blocks of different sequences never
    hash alike), made once and then reused (a run of a million tokens holds a few thousand ints).
    A sequence that forks ``n`` parallel samples at its first token gets ``n`` tokens.

    A request that names its reply (``Request.output``, e.g. a chat turn whose reply the next turn's
    prompt quotes) gets those ids instead, the k-th emitted token being ``output[k]`` (a recomputed
    sequence resumes where its ``output_token_ids`` left off), so its blocks hash as the next prompt's.
    """

    def __init__(self) -> None:
        self._token_of: dict[int, int] = {}  # seq_id -> its made-up token
        self._reply_of: dict[int, list[int]] = {}  # seq_id -> the reply the request names

    def set_reply(self, seq_id: int, reply: list[int]) -> None:
        self._reply_of[seq_id] = reply

    def token(self, seq_id: int) -> int:
        token = self._token_of.get(seq_id)
        if token is None:
            token = self._token_of[seq_id] = _OUTPUT_TOKEN_BASE + seq_id * 8
        return token

    def for_step(self, out: SchedulerOutput) -> dict[int, int | list[int]]:
        tokens: dict[int, int | list[int]] = {}
        token_of, reply_of = self._token_of, self._reply_of
        emitting = out.decode_seqs + [item.seq for item in out.chunks if item.emits_token]  # in the step's order
        for seq in emitting:
            seq_id = seq.seq_id
            if reply_of and seq_id in reply_of:
                tokens[seq_id] = reply_of[seq_id][len(seq.output_token_ids)]
                continue
            first = token_of.get(seq_id) or self.token(seq_id)
            # Samples fork at a sequence's first token, never later: only then ask how many to draw
            # (the property, per token, cost 110 ns of the ~2 us a scheduled chunk takes; now 30).
            n = 1 if seq.output_token_ids else seq.samples.num_tokens_to_sample
            tokens[seq_id] = first if n == 1 else [first + j for j in range(n)]
        return tokens

    def forget(self, seq_id: int) -> None:
        self._token_of.pop(seq_id, None)
        self._reply_of.pop(seq_id, None)


@dataclass(slots=True)
class _Meters:
    """Running sums the result is made of: batch sizes every step, memory every few steps."""

    breakdown: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("token_states", "reserved", "internal_frag", "external_frag", "other", "idle"), 0
        )
    )
    util_tokens: int = 0
    util_allocated: int = 0
    live_len_sum: int = 0
    live_len_n: int = 0
    shared_used: int = 0
    shared_unshared: int = 0
    max_concurrent: int = 0
    batched_sum: int = 0

    def after_step(self, running: list[Sequence]) -> None:
        self.batched_sum += len(running)
        self.max_concurrent = max(self.max_concurrent, len(running))

    def snapshot(self, manager, scheduler: Scheduler) -> None:
        """Every slot of the pool in one category (the paper's Fig. 2), and how much sharing saves."""
        running = scheduler.running
        allocated, tokens, reserved, internal = manager.snapshot(running)
        self.breakdown["token_states"] += tokens
        self.breakdown["reserved"] += reserved
        self.breakdown["internal_frag"] += internal
        self.util_tokens += tokens
        self.util_allocated += allocated
        self.live_len_sum += sum(map(manager.num_tokens, [seq.seq_id for seq in running]))
        self.live_len_n += len(running)
        if scheduler.waiting:
            free, fragmented = manager.free_for(scheduler.waiting[0])
            self.breakdown["external_frag" if fragmented else "other"] += free
        else:
            self.breakdown["idle"] += manager.capacity_slots - allocated
        used, unshared = manager.sharing(running)
        self.shared_used += used
        self.shared_unshared += unshared


def _check_fits(requests: list[Request], config: SimConfig, manager, scheduler: Scheduler, num_slots: int) -> None:
    """Refuse, before anything runs, a request that could never be served by this server."""
    for r in requests:
        if r.total_len - 1 > config.max_seq_len:  # the last sampled token is never stored
            raise FieldValueError(
                "max_seq_len",
                f"a request of {r.prompt_len} + {r.output_len} tokens exceeds max_seq_len={config.max_seq_len}",
            )
        scheduler.check_fits(r.prompt_len, r.output_len, r.n)
        if manager.slots_to_admit(r.prompt_len, r.total_len, r.n) > num_slots:
            raise FieldValueError(
                "num_kv_slots", f"a request of {r.total_len} tokens x {r.n} samples cannot fit in {num_slots} KV slots"
            )


def _check_pool(num_slots: int, cost: CostModel) -> int:
    """A pool the GPU could never hold is refused before anything is allocated."""
    gpu, model = cost.gpu, cost.model
    try:
        num_slots = integer("num_kv_slots", num_slots, low=1)
    except FieldTypeError:  # e.g. 1e4 from a config file: say what a pool size is
        raise FieldTypeError(
            "num_kv_slots", f"num_kv_slots must be a positive int (a count of token slots), got {num_slots!r}"
        ) from None
    if num_slots * model.kv_bytes_per_token > gpu.memory_bytes:
        raise FieldValueError(
            "num_kv_slots",
            f"num_kv_slots={num_slots:,} needs {num_slots * model.kv_bytes_per_token / 1e9:,.1f} GB of KV cache for "
            f"{model.name}, more than the {gpu.name}'s {gpu.memory_bytes / 1e9:.1f} GB "
            f"(at most {gpu.memory_bytes // model.kv_bytes_per_token:,} slots)",
        )
    return num_slots


@dataclass(slots=True)
class Server:
    """One simulated server, built and checked by :func:`prepare`, run once by :func:`simulate`."""

    config: SimConfig
    num_kv_slots: int
    cost: CostModel  # the cost model with the manager's block size (swapped and copied blocks are this big)
    manager: object  # a MemoryManager of sim.managers
    scheduler: Scheduler


def prepare(requests: list[Request], config: SimConfig, cost: CostModel) -> Server:
    """The server ``simulate`` runs, built once and checked against every request.

    Everything that makes the run impossible -- no requests, a pool the GPU could not hold, a
    request that could never be admitted -- raises here, before the run starts: a
    :class:`~paged_edu.core.validation.FieldValueError` whose ``.field`` names the setting at fault.
    """
    if not requests:
        raise FieldValueError("requests", "simulate needs at least one request")
    num_slots = config.num_kv_slots
    if num_slots is None:
        num_slots = cost.kv_capacity_tokens(config.gpu_memory_utilization)
    num_slots = _check_pool(num_slots, cost)
    check_holds_a_block(config.manager, num_slots, config.block_size)
    manager = build_manager(config.manager, num_slots, config.block_size, config.max_seq_len)  # config checked it
    scheduler = Scheduler(
        manager,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        enable_chunked_prefill=config.enable_chunked_prefill,
        preemption_mode=config.preemption_mode,
        num_cpu_blocks=config.num_cpu_blocks,
        policy=config.policy,
    )
    _check_fits(requests, config, manager, scheduler, num_slots)
    return Server(config, num_slots, replace(cost, block_size=manager.block_size), manager, scheduler)


def simulate(
    requests: list[Request],
    config: SimConfig | None = None,
    cost_model: CostModel | None = None,
    progress=None,
    *,
    server: Server | None = None,
) -> SimResult:
    """Serve ``requests`` with one memory manager; return what was measured.

    ``progress`` is an optional callable ``progress(num_requests_finished_now)`` (a tqdm's
    ``update``) called as requests finish. ``server``: the :class:`Server` that
    ``prepare(requests, config, cost_model)`` built, to run instead of building (and checking) it
    again; it is used up by the run.
    """
    wall0 = time.perf_counter()
    if server is None:
        server = prepare(requests, config or SimConfig(), cost_model or CostModel())
    config, num_slots, cost, manager, scheduler = (
        server.config,
        server.num_kv_slots,
        server.cost,
        server.manager,
        server.scheduler,
    )
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_time)
    prompts = prompt_token_ids(requests)

    # Every sample of a request carries the first sample's seq_id as its request_id.
    owner: dict[int, int] = {}  # request_id -> request index
    records: list[RequestRecord | None] = [None] * len(requests)
    beams = _BeamForks()
    meters = _Meters()
    model = MadeUpTokens()
    now, step, next_arrival, num_done, preemptions = 0.0, 0, 0, 0, 0
    count_blocks = cost.per_block_s > 0  # the per-block kernel cost is off by default
    block_size = None if config.manager.startswith("contiguous") else manager.block_size

    while num_done < len(requests):
        # 1. Arrivals join the waiting queue.
        while next_arrival < len(order) and requests[order[next_arrival]].arrival_time <= now:
            i = order[next_arrival]
            seq = _sequence_for(requests[i], prompts[i], scheduler, manager, beams)
            if requests[i].output is not None:
                model.set_reply(seq.seq_id, requests[i].output)
            owner[seq.seq_id] = i
            scheduler.add(seq, validate=False)  # prepare checked that every request fits
            next_arrival += 1
        if not scheduler.has_unfinished():
            now = requests[order[next_arrival]].arrival_time
            continue

        # 2. Schedule.
        out = scheduler.schedule()
        preemptions += len(out.preempted)
        if out.is_empty:
            if not scheduler.running and next_arrival < len(order):
                now = requests[order[next_arrival]].arrival_time
                continue
            raise RuntimeError(
                f"the scheduler is stuck at t={now:.3f}s: nothing can run with {len(scheduler.waiting)} waiting "
                f"and {len(scheduler.running)} running (is the pool too small for one request?)"
            )

        # 3. The cost model says how long the step takes on the GPU.
        now += cost.step_time(step_shape(out, block_size, count_blocks))
        step += 1

        # 4. Tokens in, finished sequences out; beam branches fork when they are due.
        sampled = model.for_step(out)
        finished = scheduler.update(out, sampled, now)
        meters.after_step(scheduler.running)
        beams.fork_due(scheduler, model, out.started, sampled.keys(), step)
        for seq in finished:
            model.forget(seq.seq_id)
        for samples in ParallelSamples.completed(finished):
            i = owner[samples.request_id]
            records[i] = _request_record(requests[i], samples.in_order(), manager)
            num_done += 1
            if progress is not None:
                progress(1)

        # 5. A memory snapshot every few steps.
        if step % config.sample_every == 0:
            meters.snapshot(manager, scheduler)

    done = [rec for rec in records if rec is not None]
    return SimResult(
        config=config,
        num_kv_slots=num_slots,
        requests=done,
        makespan_s=now - requests[order[0]].arrival_time,
        num_steps=step,
        num_output_tokens=sum(r.num_samples * r.output_len for r in done),
        max_concurrent=meters.max_concurrent,
        mean_batched=meters.batched_sum / step if step else 0.0,
        preemptions=preemptions,
        prefix_hit_rate=manager.stats.hit_rate,
        preempted_hit_rate=manager.stats.preempted_hit_rate,
        hit_rate_counting_readmissions=manager.stats.hit_rate_counting_readmissions,
        prefix_hit_rate_per_salt={
            salt: manager.stats.hit_rate_of(salt) for salt in manager.stats.per_salt if salt is not None
        },
        fragmentation_refusals=len(manager.fragmented),
        breakdown=meters.breakdown,
        kv_utilization=meters.util_tokens / meters.util_allocated if meters.util_allocated else 0.0,
        sharing_saving=1 - meters.shared_used / meters.shared_unshared if meters.shared_unshared else 0.0,
        sim_wall_s=time.perf_counter() - wall0,
        assumptions=cost.assumptions(),
        live_lengths_mean=meters.live_len_sum / meters.live_len_n if meters.live_len_n else 0.0,
    )


def _sequence_for(r: Request, prompt: list[int], scheduler: Scheduler, manager, beams: "_BeamForks") -> Sequence:
    """The sequence a request starts as, its final length told to the manager.

    Parallel samples fork from it at its first token. A beam request starts as one sequence that
    forks its other branches later (see :class:`_BeamForks`) -- with room for them reserved against
    ``max_num_seqs`` from admission, as the parallel samples have. A one-token beam forks every
    branch at its first token: parallel sampling (a beam parent would finish at that token before
    its branches could fork from it).
    """
    beam = r.fork == "beam" and r.n > 1 and r.output_len > 1
    seq = Sequence(
        scheduler.new_seq_id(),
        prompt,
        r.output_len,
        arrival_time=r.arrival_time,
        num_samples=1 if beam else r.n,
        num_pending_forks=r.n - 1 if beam else 0,
        cache_salt=r.cache_salt,
    )
    manager.expect(seq.seq_id, r.prompt_len + r.output_len - 1, r.n, r.prompt_len)
    if beam:  # sample j forks from sample 0 after j/n of the output
        beams.add(seq, [max(1, r.output_len * j // r.n) for j in range(r.n - 1, 0, -1)])
    return seq


class _BeamForks:
    """Beam-style trees: a new branch forks from sample 0 when it reaches the next fork point.

    The child shares every block of sample 0 (prompt and output so far) and replaces the token
    sample 0 has just sampled with its own, so the two diverge from here (copy-on-write).

    Each beam still to fork waits in a heap under the earliest step it could reach its next fork
    point: a parent samples at most one token a step, so ``p - len(output)`` steps from now at the
    soonest. A step looks only at the heap's top -- the parents due now, or whose bound was too low
    (not scheduled, or preempted, in a step between) and go back with a new one. A parent not running
    leaves the heap and comes back when the scheduler starts it again (``SchedulerOutput.started``).
    So each beam is touched when it starts, when it forks, and when its bound fails, never in the
    steps between. Looking at every beam still to fork each step cost O(beams waiting) a step,
    quadratic when they arrive at once: 8,000 beam requests (n = 4, ShareGPT-like) took 107 s of CPU on
    this project's 2-core CPU; then at the parents that sampled (a set intersection with the step's
    tokens, and a loop over the ~64 running parents): 1.21 s for 10,000 beams
    (``benchmarks/bench_simulator.py --only beam``, phase timers on a loaded machine); with the heap
    0.64 s, nearly all of it the 30,000 forks themselves. Same results (``tests/sim/test_beam_forks.py``).
    """

    def __init__(self) -> None:
        # sample 0's seq_id -> (sample 0, fork points, the next one last)
        self._due: dict[int, tuple[Sequence, list[int]]] = {}
        self._heap: list[tuple[int, int]] = []  # (earliest step of its next fork, sample 0's seq_id)
        self._in_heap: set[int] = set()  # the parents in the heap: running, or not known to have stopped

    def add(self, parent: Sequence, fork_points: list[int]) -> None:
        self._due[parent.seq_id] = (parent, fork_points)

    def _push(self, parent: Sequence, points: list[int], step: int, wait: int) -> None:
        """Into the heap, under the step it could reach its next fork point ``points[-1]`` at the
        soonest (one token a step), and at least ``wait`` steps after ``step``."""
        heappush(self._heap, (step + max(wait, points[-1] - len(parent.output_token_ids)), parent.seq_id))
        self._in_heap.add(parent.seq_id)

    def fork(self, scheduler: Scheduler, model: MadeUpTokens, parent: Sequence, points: list[int]) -> None:
        """Fork a branch for each fork point ``parent`` has reached, popping them off ``points``: right
        after ``parent`` sampled a token, before that token is placed (its slot not reserved yet)."""
        while points and len(parent.output_token_ids) >= points[-1]:
            points.pop()
            child = Sequence(
                scheduler.new_seq_id(),
                parent.prompt_token_ids,
                parent.max_new_tokens,
                arrival_time=parent.arrival_time,
                request_id=parent.request_id,
                sample_index=len(points) + 1,
                cache_salt=parent.cache_salt,
            )
            scheduler.fork(parent, child)
            child.output_token_ids[-1] = model.token(child.seq_id)  # its own branch

    def fork_due(
        self, scheduler: Scheduler, model: MadeUpTokens, started: list[Sequence], sampled: KeysView[int], step: int
    ) -> None:
        """Fork the branches due now, after step ``step`` whose scheduled sequences ``started`` running
        and whose tokens (their ids: ``sampled``) the scheduler has taken."""
        due, heap, in_heap = self._due, self._heap, self._in_heap
        for seq in started:  # a parent (re)starts: into the heap, due this step at the soonest
            if seq.seq_id in due and seq.seq_id not in in_heap:
                self._push(seq, due[seq.seq_id][1], step, 0)
        ready = []
        while heap and heap[0][0] <= step:
            ready.append(heappop(heap)[1])
        for parent_id in sorted(ready):  # in the order the beams were added: children's ids follow
            parent, points = due[parent_id]
            if parent.status is SequenceStatus.FINISHED:
                raise RuntimeError(f"beam request {parent.request_id} finished before all its branches forked")
            if parent.status is not SequenceStatus.RUNNING:  # preempted: back when it starts again
                in_heap.discard(parent_id)
                continue
            if (
                parent_id in sampled
                and len(parent.output_token_ids) >= points[-1]
                and scheduler.allocator.num_tokens(parent_id) == parent.num_tokens - 1
            ):
                self.fork(scheduler, model, parent, points)
            if points:
                self._push(parent, points, step, 1)
            else:
                del due[parent_id]
                in_heap.discard(parent_id)


def _request_record(r: Request, seqs: list[Sequence], manager) -> RequestRecord:
    stored, held = [], []
    for s in seqs:
        tokens, slots = manager.last_free.pop(s.seq_id, (0, 0))
        stored.append(tokens)
        held.append(slots)
    return RequestRecord(
        arrival_time=r.arrival_time,
        prompt_len=r.prompt_len,
        output_len=r.output_len,
        num_samples=r.n,
        first_token_time=min(s.first_token_time for s in seqs),
        finish_time=max(s.finish_time for s in seqs),
        num_preemptions=sum(s.num_preemptions for s in seqs),
        stored_tokens=stored,
        held_slots=held,
    )

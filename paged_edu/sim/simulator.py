"""A serving simulator: the real scheduler and allocator, with a cost model in place of the GPU.

Iteration-level serving (continuous batching) as the engine does it, at scales no single GPU run
affords. Each step:

1. requests that have arrived join the scheduler's waiting queue;
2. :meth:`Scheduler.schedule` -- the *same* scheduler the engine uses -- picks the decodes and
   prefill chunks and asks the memory manager for slots;
3. the :class:`~paged_edu.sim.costmodel.CostModel` says how long the step would take on the GPU, and
   the clock advances by that much;
4. every sequence that emitted a token gets one (a made-up id: the simulator knows each request's
   output length in advance) and :meth:`Scheduler.update` finishes the ones that are done.

Memory managers (:mod:`paged_edu.sim.managers`, all with the allocator methods the scheduler
calls)::

    contiguous-max     reserve L_max slots per request          (FasterTransformer, Orca (Max))
    contiguous-pow2    reserve prompt + next power of 2 of the output (Orca (Pow2))
    contiguous-oracle  reserve exactly the tokens it will store   (Orca (Oracle))
    paged              BlockAllocator, block size B, no prefix caching   (vLLM)
    paged-prefix       BlockAllocator with prefix caching

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

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from operator import mul

from paged_edu.sim.costmodel import CostModel
from paged_edu.sim.managers import BLOCK_SIZES, MANAGERS, ContiguousManager, PagedManager, make_manager
from paged_edu.engine.scheduler import Scheduler
from paged_edu.engine.sequence import Sequence, SequenceStatus
from paged_edu.sim.workloads import L_MAX, Request

__all__ = [
    "BLOCK_SIZES",
    "MANAGERS",
    "ContiguousManager",
    "PagedManager",
    "SimConfig",
    "SimResult",
    "compare",
    "format_table",
    "latency_vs_rate",
    "make_manager",
    "simulate",
]

_OUTPUT_TOKEN_BASE = 1 << 40  # sampled ids live far above any prompt id: no accidental cache hit


# ----------------------------------------------------------------------------------------------
# Configuration and results
# ----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class SimConfig:
    """One simulated server: a memory manager, a pool size, and the scheduler's knobs."""

    manager: str = "paged"
    block_size: int = 16
    num_kv_slots: int | None = None  # None: what the cost model's GPU holds after the weights
    gpu_memory_utilization: float = 0.9
    max_seq_len: int = L_MAX
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"
    num_cpu_blocks: int = 0
    sample_every: int = 4  # steps between memory snapshots

    def __post_init__(self) -> None:
        if self.manager not in MANAGERS:
            raise ValueError(f"unknown manager {self.manager!r}; choose one of {MANAGERS}")
        if not isinstance(self.sample_every, int) or self.sample_every < 1:
            raise ValueError(f"sample_every must be a positive int, got {self.sample_every!r}")

    @property
    def label(self) -> str:
        return self.manager if self.manager.startswith("contiguous") else f"{self.manager} B={self.block_size}"


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request (its samples together)."""

    arrival_time: float
    prompt_len: int
    output_len: int
    num_samples: int
    first_token_time: float
    finish_time: float
    num_preemptions: int
    stored_tokens: list[int]  # per sample, K/V slots written by the end
    held_slots: list[int]  # per sample, slots it held at the end

    @property
    def ttft(self) -> float:
        return self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float:
        return self.finish_time - self.arrival_time

    @property
    def normalized_latency(self) -> float:
        """End-to-end latency per output token (the paper's s/token)."""
        return self.latency / self.output_len


@dataclass(slots=True)
class SimResult:
    """Everything one simulation measured; :meth:`record` is the JSON line."""

    config: SimConfig
    num_kv_slots: int
    requests: list[RequestRecord]
    makespan_s: float
    num_steps: int
    num_output_tokens: int
    max_concurrent: int
    mean_batched: float
    preemptions: int
    prefix_hit_rate: float
    fragmentation_refusals: int  # sequences refused at least once although enough slots were free
    breakdown: dict[str, float]  # slot-steps per category (idle included)
    kv_utilization: float
    sharing_saving: float
    sim_wall_s: float
    assumptions: dict = field(default_factory=dict)
    live_lengths_mean: float = 0.0  # mean stored tokens of a live sequence over snapshots

    @property
    def kv_utilization_final(self) -> float:
        stored = sum(sum(r.stored_tokens) for r in self.requests)
        held = sum(sum(r.held_slots) for r in self.requests)
        return stored / held if held else 0.0

    def breakdown_fractions(self) -> dict[str, float]:
        """The paper's Fig. 2: shares of the memory that was allocated or wanted (idle left out)."""
        keys = ("token_states", "reserved", "internal_frag", "external_frag", "other")
        total = sum(self.breakdown[k] for k in keys)
        return {k: (self.breakdown[k] / total if total else 0.0) for k in keys}

    def record(self) -> dict:
        ttft = [r.ttft for r in self.requests]
        norm = [r.normalized_latency for r in self.requests]
        paged = not self.config.manager.startswith("contiguous")
        return {
            "manager": self.config.manager,
            "block_size": self.config.block_size if paged else None,
            "num_kv_slots": self.num_kv_slots,
            "num_requests": len(self.requests),
            "kv_utilization": self.kv_utilization,
            "kv_utilization_final": self.kv_utilization_final,
            "max_concurrent": self.max_concurrent,
            "mean_batched": self.mean_batched,
            "throughput_tokens_per_s": self.num_output_tokens / self.makespan_s if self.makespan_s else 0.0,
            "throughput_requests_per_s": len(self.requests) / self.makespan_s if self.makespan_s else 0.0,
            "ttft_p50_s": _percentile(ttft, 50),
            "ttft_p99_s": _percentile(ttft, 99),
            "norm_latency_p50_s": _percentile(norm, 50),
            "norm_latency_p99_s": _percentile(norm, 99),
            "norm_latency_mean_s": sum(norm) / len(norm) if norm else 0.0,
            "preemptions": self.preemptions,
            "prefix_hit_rate": self.prefix_hit_rate,
            "fragmentation_refusals": self.fragmentation_refusals,
            "sharing_saving": self.sharing_saving,
            "memory_breakdown": self.breakdown_fractions(),
            "makespan_s": self.makespan_s,
            "num_steps": self.num_steps,
            "num_output_tokens": self.num_output_tokens,
            "sim_wall_s": self.sim_wall_s,
            "config": asdict(self.config),
            "cost_model": self.assumptions,
        }


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) without numpy."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# ----------------------------------------------------------------------------------------------
# The simulation loop
# ----------------------------------------------------------------------------------------------


def _prompt_tokens(requests: list[Request]) -> list[list[int]]:
    """Token ids for every prompt: the trace's own, or unique ids plus each group's shared prefix."""
    groups: dict[str, list[int]] = {}
    next_id = 1
    prompts = []
    for r in requests:
        if r.prompt is not None:
            prompts.append(r.prompt)
            continue
        head: list[int] = []
        if r.prefix_group is not None and r.prefix_len:
            shared = groups.get(r.prefix_group)
            if shared is None or len(shared) < r.prefix_len:
                extra = r.prefix_len - (len(shared) if shared else 0)
                shared = (shared or []) + list(range(next_id, next_id + extra))
                next_id += extra
                groups[r.prefix_group] = shared
            head = shared[: r.prefix_len]
        tail = r.prompt_len - len(head)
        prompts.append(head + list(range(next_id, next_id + tail)))
        next_id += tail
    return prompts


def simulate(
    requests: list[Request],
    config: SimConfig | None = None,
    cost_model: CostModel | None = None,
    progress=None,
) -> SimResult:
    """Serve ``requests`` with one memory manager; return what was measured.

    ``progress`` is an optional callable ``progress(num_requests_finished_now)`` (a tqdm's
    ``update``) called as requests finish.
    """
    config = config or SimConfig()
    cost = cost_model or CostModel()
    if not requests:
        raise ValueError("simulate needs at least one request")
    wall0 = time.perf_counter()
    num_slots = config.num_kv_slots
    if num_slots is None:
        num_slots = cost.kv_capacity_tokens(config.gpu_memory_utilization)
    manager = make_manager(config.manager, num_slots, config.block_size, config.max_seq_len)
    for r in requests:
        if r.total_len - 1 > config.max_seq_len:
            raise ValueError(
                f"a request of {r.prompt_len} + {r.output_len} tokens exceeds max_seq_len={config.max_seq_len}"
            )
        if r.n > config.max_num_seqs:
            raise ValueError(f"a request of {r.n} samples can never run at once with max_num_seqs={config.max_num_seqs}")
        if isinstance(manager, ContiguousManager):  # n sub-ranges of what the policy reserves
            need = r.n * max(r.total_len, manager.reserve_for(r.total_len - 1, r.prompt_len, r.prompt_len))
        else:
            need = r.n * r.prompt_len
        if need > num_slots:
            raise ValueError(f"a request of {r.total_len} tokens x {r.n} samples cannot fit in {num_slots} KV slots")
    scheduler = Scheduler(
        manager,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        enable_chunked_prefill=config.enable_chunked_prefill,
        preemption_mode=config.preemption_mode,
        num_cpu_blocks=config.num_cpu_blocks,
    )
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_time)
    prompts = _prompt_tokens(requests)
    arrivals = [requests[i].arrival_time for i in order]

    # Per request: its finished sequences. Every sample of a request carries the first sample's
    # seq_id as its request_id, which maps back to the request.
    done_seqs: list[list[Sequence]] = [[] for _ in requests]
    owner: dict[int, int] = {}  # request_id -> request index
    beam_forks: dict[int, list[int]] = {}  # first sample's seq_id -> output lengths to fork at
    beam_parents: dict[int, Sequence] = {}
    records: list[RequestRecord | None] = [None] * len(requests)

    # Cost-model constants hoisted out of the loop (the per-step arithmetic is inlined below).
    m, g = cost.model, cost.gpu
    w_flops = 2.0 * m.num_params
    head_flops = 2.0 * m.d_model * m.vocab_size
    attn_flops = 4.0 * m.num_layers * m.num_q_heads * m.head_dim
    inv_compute = 1.0 / (g.peak_flops * cost.compute_efficiency)
    inv_memory = 1.0 / (g.hbm_bandwidth * cost.memory_efficiency)
    weight_bytes = m.weight_bytes
    kv_bytes = m.kv_bytes_per_token
    overhead, per_seq = cost.step_overhead_s, cost.per_seq_overhead_s

    breakdown = dict.fromkeys(("token_states", "reserved", "internal_frag", "external_frag", "other", "idle"), 0)
    util_tokens = util_allocated = 0  # summed over snapshots
    live_len_sum = live_len_n = 0
    shared_used = shared_unshared = 0
    max_concurrent = 0
    batched_sum = 0
    preemptions = 0
    sample_every = config.sample_every
    now = 0.0
    step = 0
    next_arrival = 0
    num_requests = len(requests)
    num_done = 0
    paged = manager.kind == "paged"
    sampler = _Sampler()

    while num_done < num_requests:
        # 1. Arrivals.
        while next_arrival < num_requests and arrivals[next_arrival] <= now:
            i = order[next_arrival]
            r = requests[i]
            # A one-token beam forks every branch at its first token: parallel sampling (a beam
            # parent would finish at that token before its branches could fork from it).
            beam = r.fork == "beam" and r.n > 1 and r.output_len > 1
            seq = Sequence(
                scheduler.new_seq_id(), prompts[i], r.output_len, arrival_time=r.arrival_time,
                num_samples=1 if beam else r.n,
            )
            final = r.prompt_len + r.output_len - 1
            if paged:
                manager.expect(seq.seq_id, final)
            else:
                manager.expect(seq.seq_id, final, r.n, r.prompt_len)
            if beam:  # sample j forks from sample 0 after j/n of the output
                beam_forks[seq.seq_id] = [max(1, r.output_len * j // r.n) for j in range(r.n - 1, 0, -1)]
                beam_parents[seq.seq_id] = seq
            owner[seq.seq_id] = i
            if seq.num_samples > 1:
                sampler.fork_at_first_token[seq.seq_id] = seq.num_samples
            scheduler.add(seq)
            next_arrival += 1
        if not (scheduler.running or scheduler.waiting or scheduler.swapped):
            now = arrivals[next_arrival]
            continue

        # 2. Schedule.
        out = scheduler.schedule()
        if out.preempted:
            preemptions += len(out.preempted)
        scheduled = out.scheduled
        if not scheduled:
            if not scheduler.running and next_arrival < num_requests:
                now = arrivals[next_arrival]
                continue
            raise RuntimeError(
                f"the scheduler is stuck at t={now:.3f}s: nothing can run with {len(scheduler.waiting)} waiting "
                f"and {len(scheduler.running)} running (is the pool too small for one request?)"
            )

        # 3. The step's cost: FLOPs and bytes summed over the scheduled chunks (n_i new tokens on
        #    top of c_i cached ones), written as list sums because this loop runs millions of times.
        starts = [item.start for item in scheduled]  # c_i
        counts = [item.num_new_tokens for item in scheduled]  # n_i
        new_tokens = out.num_batched_tokens  # sum n_i
        context = sum(starts)
        squares = sum([n * n for n in counts]) if len(counts) != new_tokens else new_tokens
        pairs = sum(map(mul, counts, starts)) + (squares + new_tokens) // 2  # sum n c + n (n + 1) / 2
        emitting = len(scheduled)
        if squares != new_tokens:  # some prefill chunks: those ending inside the prompt emit nothing
            for item in scheduled:
                seq = item.seq
                if item.start + item.num_new_tokens < len(seq.prompt_token_ids) + len(seq.output_token_ids):
                    emitting -= 1
        t_c = (w_flops * new_tokens + head_flops * emitting + attn_flops * pairs) * inv_compute
        t_m = (weight_bytes + kv_bytes * (context + new_tokens)) * inv_memory
        dt = (t_c if t_c > t_m else t_m) + overhead + per_seq * len(scheduled)
        if out.block_ops:
            swapped = len(out.blocks_to_swap_out) + len(out.blocks_to_swap_in)
            block_bytes = kv_bytes * manager.block_size
            dt += swapped * block_bytes / g.pcie_bandwidth + 2 * len(out.blocks_to_copy) * block_bytes * inv_memory
        now += dt
        step += 1

        # 4. Tokens in, finished sequences out.
        finished = scheduler.update(scheduled, sampler, now)

        running = scheduler.running
        num_running = len(running)
        batched_sum += num_running
        if num_running > max_concurrent:
            max_concurrent = num_running

        if beam_forks:
            _beam_forks(scheduler, beam_forks, beam_parents)

        for seq in finished:
            i = owner[seq.request_id]
            seqs = done_seqs[i]
            seqs.append(seq)
            if len(seqs) == requests[i].n:
                records[i] = _request_record(requests[i], seqs, manager)
                num_done += 1
                if progress is not None:
                    progress(1)

        # 5. Memory snapshot every few steps.
        if step % sample_every == 0:
            allocated, tokens, reserved, internal = manager.snapshot(running)
            breakdown["token_states"] += tokens
            breakdown["reserved"] += reserved
            breakdown["internal_frag"] += internal
            util_tokens += tokens
            util_allocated += allocated
            for seq in running:
                live_len_sum += seq.num_placed_tokens
            live_len_n += num_running
            waiting = scheduler.waiting
            if waiting:
                free, fragmented = manager.free_for(waiting[0])
                breakdown["external_frag" if fragmented else "other"] += free
            else:
                breakdown["idle"] += manager.capacity_slots - allocated
            used, unshared = manager.sharing(running)
            shared_used += used
            shared_unshared += unshared

    done = [rec for rec in records if rec is not None]
    makespan = now - arrivals[0]
    cache = getattr(manager, "stats", None)
    return SimResult(
        config=config,
        num_kv_slots=num_slots,
        requests=done,
        makespan_s=makespan,
        num_steps=step,
        num_output_tokens=sum(r.num_samples * r.output_len for r in done),
        max_concurrent=max_concurrent,
        mean_batched=batched_sum / step if step else 0.0,
        preemptions=preemptions,
        prefix_hit_rate=cache.hit_rate if cache is not None else 0.0,
        fragmentation_refusals=len(getattr(manager, "fragmented", ())),
        breakdown=breakdown,
        kv_utilization=util_tokens / util_allocated if util_allocated else 0.0,
        sharing_saving=1 - shared_used / shared_unshared if shared_unshared else 0.0,
        sim_wall_s=time.perf_counter() - wall0,
        assumptions=cost.assumptions(),
        live_lengths_mean=live_len_sum / live_len_n if live_len_n else 0.0,
    )


class _Sampler(dict):
    """The "model output": a made-up token for whichever sequence :meth:`Scheduler.update` asks.

    A dict with ``__missing__`` so nothing is built per step. The token is unique per sequence
    (its id, far above every prompt id), so blocks of different sequences never hash alike. A
    sequence that forks ``n`` samples gets ``n`` tokens for its first output, as update expects.
    """

    def __init__(self) -> None:
        super().__init__()
        self.fork_at_first_token: dict[int, int] = {}

    def __missing__(self, seq_id: int):
        base = _OUTPUT_TOKEN_BASE + seq_id * 8
        n = self.fork_at_first_token.pop(seq_id, 0)
        if n:
            return [base + j for j in range(n)]
        self[seq_id] = base  # later steps hit the dict directly
        return base


def _beam_forks(scheduler: Scheduler, beam_forks: dict[int, list[int]], parents: dict[int, Sequence]) -> None:
    """Beam-style trees: a new branch forks from sample 0 when it reaches the next fork point.

    The child shares every block of sample 0 (prompt and output so far) and replaces the token
    sample 0 has just sampled with its own, so the two diverge from here (copy-on-write).
    """
    for parent_id in list(beam_forks):
        points = beam_forks[parent_id]
        parent = parents[parent_id]
        if parent.status is not SequenceStatus.RUNNING:
            if parent.status is SequenceStatus.FINISHED:
                raise RuntimeError(f"beam request {parent.request_id} finished before all its branches forked")
            continue
        # Fork right after a token was sampled and before it is placed, at the next fork point(s).
        if parent.num_placed_tokens != parent.num_tokens - 1:
            continue
        while points and len(parent.output_token_ids) >= points[-1]:
            points.pop()
            child = Sequence(
                scheduler.new_seq_id(), parent.prompt_token_ids, parent.max_new_tokens,
                arrival_time=parent.arrival_time, request_id=parent.request_id, sample_index=len(points) + 1,
            )
            scheduler.fork(parent, child)
            child.output_token_ids[-1] = _OUTPUT_TOKEN_BASE + child.seq_id * 8  # its own branch
        if not points:
            del beam_forks[parent_id]
            del parents[parent_id]


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


# ----------------------------------------------------------------------------------------------
# Comparisons, tables, sweeps
# ----------------------------------------------------------------------------------------------


def default_configs(block_sizes=BLOCK_SIZES, managers=MANAGERS, **kwargs) -> list[SimConfig]:
    """One config per (manager, block size): contiguous managers once, paged ones per ``B``."""
    configs = []
    for name in managers:
        if name.startswith("contiguous"):
            configs.append(SimConfig(manager=name, **kwargs))
        else:
            configs.extend(SimConfig(manager=name, block_size=b, **kwargs) for b in block_sizes)
    return configs


@contextlib.contextmanager
def _progress_bar(show: bool, total: int, unit: str, desc: str):
    """A tqdm bar while the ``with`` body runs, closed however it ends; ``None`` when not ``show``."""
    if not show:
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit=unit, desc=desc, leave=False)
    try:
        yield bar
    finally:
        bar.close()


def compare(requests: list[Request], configs: list[SimConfig] | None = None, cost_model: CostModel | None = None,
            progress: bool = False) -> list[SimResult]:
    """Simulate the same requests under every config (default: every manager and block size)."""
    configs = configs if configs is not None else default_configs()
    results = []
    with _progress_bar(progress, len(configs) * len(requests), "req", "simulating") as bar:
        for config in configs:
            if bar is not None:
                bar.set_postfix_str(config.label)
            results.append(simulate(requests, config, cost_model, bar.update if bar is not None else None))
    return results


TABLE_COLUMNS = (
    # (header, record key, format)
    ("manager", "label", "{}"),
    ("KV util", "kv_utilization", "{:.1%}"),
    ("util@end", "kv_utilization_final", "{:.1%}"),
    ("peak seqs", "max_concurrent", "{}"),
    ("mean batch", "mean_batched", "{:.1f}"),
    ("tok/s", "throughput_tokens_per_s", "{:,.0f}"),
    ("req/s", "throughput_requests_per_s", "{:.2f}"),
    ("TTFT p50", "ttft_p50_s", "{:.3f}"),
    ("TTFT p99", "ttft_p99_s", "{:.3f}"),
    ("s/tok p50", "norm_latency_p50_s", "{:.4f}"),
    ("s/tok p99", "norm_latency_p99_s", "{:.4f}"),
    ("preempt", "preemptions", "{}"),
    ("prefix hit", "prefix_hit_rate", "{:.1%}"),
    ("saved", "sharing_saving", "{:.1%}"),
)
BREAKDOWN_COLUMNS = (
    ("tokens", "token_states"), ("reserved", "reserved"), ("int.frag", "internal_frag"),
    ("ext.frag", "external_frag"), ("other", "other"),
)


def format_table(results: list[SimResult], markdown: bool = True) -> str:
    """The seed's missing table, one row per (manager, block size), plus the Fig. 2 breakdown."""
    headers = [c[0] for c in TABLE_COLUMNS] + [c[0] for c in BREAKDOWN_COLUMNS]
    rows = []
    for res in results:
        rec = res.record()
        rec["label"] = res.config.label
        row = [fmt.format(rec[key]) for _, key, fmt in TABLE_COLUMNS]
        row += [f"{rec['memory_breakdown'][key]:.1%}" for _, key in BREAKDOWN_COLUMNS]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    def line(cells):
        body = " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return f"| {body} |" if markdown else body
    out = [line(headers)]
    if markdown:
        out.append("|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|")
    out += [line(r) for r in rows]
    return "\n".join(out)


def latency_vs_rate(build, rates, configs: list[SimConfig], cost_model: CostModel | None = None,
                    progress: bool = False) -> list[dict]:
    """Mean normalised latency (s/token) against request rate, one curve per config.

    ``build(rate)`` returns the requests for that rate (same seed, so only the arrivals change).
    Returns one dict per (config, rate) with the record's main numbers.
    """
    points = []
    with _progress_bar(progress, len(rates) * len(configs), "run", "rate sweep") as bar:
        for rate in rates:
            requests = build(rate)
            for config in configs:
                rec = simulate(requests, config, cost_model).record()
                points.append({
                    "label": config.label, "manager": config.manager, "block_size": rec["block_size"],
                    "rate": rate, "norm_latency_mean_s": rec["norm_latency_mean_s"],
                    "norm_latency_p50_s": rec["norm_latency_p50_s"], "ttft_p50_s": rec["ttft_p50_s"],
                    "throughput_requests_per_s": rec["throughput_requests_per_s"],
                    "mean_batched": rec["mean_batched"], "kv_utilization": rec["kv_utilization"],
                })
                if bar is not None:
                    bar.update(1)
    return points

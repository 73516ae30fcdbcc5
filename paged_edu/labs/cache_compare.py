"""Lesson 8: the block-hash prefix cache against the radix tree, and FCFS against LPM, measured.

Three caches -- vLLM's chained block hashes (``paged-prefix``, B = 16), SGLang's radix tree
(``paged-radix``) at B = 16 and token-granular at B = 1 -- under two admission orders (FCFS, and
longest-cached-prefix-first, SGLang's LPM), on the prefix-sharing workloads of
:mod:`paged_edu.sim.prefix_workloads` (multi-turn chat, few-shot prompts, agent-call trees), in two
scenarios:

* ``roomy`` -- the H200's whole pool (what OPT-13B leaves at ``gpu_memory_utilization`` 0.9),
  requests arriving at 20/s: no queue forms;
* ``tight`` -- 6,144 token slots, every request at t = 0: a queue forms, the cache must evict.

Each cell is one run of the simulator (the engine's scheduler, the real allocators, the roofline
cost model; OPT-13B on the H200). What differs between the caches is only *which* tokens hit and
*which* blocks are evicted; what differs between the policies only *which* waiting request is
admitted next. :func:`lookup_cost` times the caches' lookup itself, next to the allocator
benchmark's figures (:data:`BENCH_ALLOCATOR`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from paged_edu.sched.policy import POLICIES
from paged_edu.sim.costmodel import CostModel
from paged_edu.sim.results import SimConfig
from paged_edu.sim.simulator import simulate
from paged_edu.sim.workloads import make_workload

__all__ = [
    "BENCH_ALLOCATOR",
    "CACHES",
    "SCENARIOS",
    "WORKLOADS",
    "CacheRow",
    "checks",
    "compare_caches",
    "granularity",
    "lookup_cost",
    "markdown_table",
    "readmission_effect",
    "run_cell",
    "run_setting",
]

WORKLOADS = ("multiturn", "fewshot", "agents")
CACHES = (("paged-prefix", 16), ("paged-radix", 16), ("paged-radix", 1))
SCENARIOS = {"roomy": {"num_kv_slots": None, "rate": 20.0}, "tight": {"num_kv_slots": 6144, "rate": math.inf}}

# `python benchmarks/bench_allocator.py` (10,000 requests, block size 16, --repeat 1), as recorded in
# the radix-cache work (notes/radix.md): operations per second on this 2-core machine.
BENCH_ALLOCATOR = {
    "command": "python benchmarks/bench_allocator.py --repeat 1",
    "block hashes (BlockAllocator)": {"appends_per_s": 1.65e6, "admissions_per_s": 13.5e3, "hit_rate": 0.616},
    "radix tree (RadixAllocator)": {"appends_per_s": 0.73e6, "admissions_per_s": 9.7e3, "hit_rate": 0.616},
}


@dataclass(frozen=True, slots=True)
class CacheRow:
    """One simulated cell: a workload, a scenario, a cache, a policy, and what was measured."""

    workload: str
    scenario: str
    manager: str
    block_size: int
    policy: str
    hit_rate: float  # prefix-cache hits / prompt tokens looked up
    kv_slots_in_use: float  # mean token slots held by running sequences (memory snapshots)
    kv_utilization: float  # share of those slots holding a token
    throughput: float  # output tokens/s
    ttft_p50: float
    ttft_p99: float
    preemptions: int
    hit_rate_counting_readmissions: float = 0.0  # re-admissions of preempted sequences pooled in

    @property
    def cache(self) -> str:
        return f"{'hash' if self.manager == 'paged-prefix' else 'radix'} B={self.block_size}"


def run_cell(
    workload: str,
    scenario: str,
    manager: str,
    block_size: int,
    policy: str,
    num_requests: int = 200,
    seed: int = 0,
    cost: CostModel | None = None,
    **workload_kwargs,
) -> CacheRow:
    """Simulate one cell of a named scenario (``workload_kwargs`` go to the workload, e.g. ``user_len=40``)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {sorted(SCENARIOS)}, got {scenario!r}")
    s = SCENARIOS[scenario]
    return run_setting(
        workload,
        s["num_kv_slots"],
        s["rate"],
        manager,
        block_size,
        policy,
        num_requests,
        seed,
        cost,
        scenario,
        **workload_kwargs,
    )


def run_setting(
    workload: str,
    num_kv_slots: int | None,
    rate: float,
    manager: str,
    block_size: int,
    policy: str,
    num_requests: int = 200,
    seed: int = 0,
    cost: CostModel | None = None,
    label: str = "custom",
    **workload_kwargs,
) -> CacheRow:
    """Simulate ``workload`` on a pool of ``num_kv_slots`` token slots (None: the GPU's whole pool),
    arriving at ``rate`` requests/s (``math.inf``: all at t = 0)."""
    requests = make_workload(workload, num_requests, rate, seed, **workload_kwargs)
    config = SimConfig(manager=manager, block_size=block_size, num_kv_slots=num_kv_slots, policy=policy)
    res = simulate(requests, config, cost or CostModel())
    rec = res.record()
    b = res.breakdown
    snapshots = max(res.num_steps // config.sample_every, 1)
    in_use = (b["token_states"] + b["reserved"] + b["internal_frag"]) / snapshots
    return CacheRow(
        workload,
        label,
        manager,
        block_size,
        policy,
        res.prefix_hit_rate,
        in_use,
        res.kv_utilization,
        rec["throughput_tokens_per_s"],
        rec["ttft_p50_s"],
        rec["ttft_p99_s"],
        res.preemptions,
        res.hit_rate_counting_readmissions,
    )


def compare_caches(
    num_requests: int = 200,
    seed: int = 0,
    workloads=WORKLOADS,
    scenarios=tuple(SCENARIOS),
    caches=CACHES,
    policies=POLICIES,
    cost: CostModel | None = None,
) -> list[CacheRow]:
    """Every (workload, scenario, cache, policy) cell, in that order."""
    return [
        run_cell(w, s, m, b, p, num_requests, seed, cost)
        for w in workloads
        for s in scenarios
        for m, b in caches
        for p in policies
    ]


def markdown_table(rows: list[CacheRow]) -> str:
    head = (
        "| workload | scenario | cache | policy | hit rate | KV slots in use | throughput (tok/s) | TTFT p50 (s) "
        "| TTFT p99 (s) | preemptions |\n|---|---|---|---|---:|---:|---:|---:|---:|---:|"
    )
    lines = [
        f"| {r.workload} | {r.scenario} | {r.cache} | {r.policy} | {r.hit_rate:.3f} | {r.kv_slots_in_use:,.0f} | "
        f"{r.throughput:,.0f} | {r.ttft_p50:.3f} | {r.ttft_p99:.3f} | {r.preemptions} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def _index(rows: list[CacheRow]) -> dict:
    return {(r.workload, r.scenario, r.manager, r.block_size, r.policy): r for r in rows}


def readmission_effect(rows: list[CacheRow], scenario: str = "tight") -> list[dict]:
    """How much of each comparison under pressure was preempted sequences finding their own blocks again.

    Per workload: radix B=16 - hash B=16 (FCFS) and LPM - FCFS (hash B=16), in hit rate, as the lesson counts
    it (first admissions only: prefix reuse) and as a counter that pools re-admissions in would.
    """
    at = _index(rows)
    out = []
    for w in sorted({r.workload for r in rows if r.scenario == scenario}):
        hash_f, radix_f = at[(w, scenario, "paged-prefix", 16, "fcfs")], at[(w, scenario, "paged-radix", 16, "fcfs")]
        hash_l = at[(w, scenario, "paged-prefix", 16, "lpm")]
        out.append(
            dict(
                workload=w,
                radix_minus_hash=radix_f.hit_rate - hash_f.hit_rate,
                radix_minus_hash_pooled=radix_f.hit_rate_counting_readmissions - hash_f.hit_rate_counting_readmissions,
                lpm_minus_fcfs=hash_l.hit_rate - hash_f.hit_rate,
                lpm_minus_fcfs_pooled=hash_l.hit_rate_counting_readmissions - hash_f.hit_rate_counting_readmissions,
                fcfs_hit_rate=hash_f.hit_rate,
                fcfs_hit_rate_pooled=hash_f.hit_rate_counting_readmissions,
            )
        )
    return out


def checks(rows: list[CacheRow]) -> list[tuple[str, bool, str]]:
    """The claims the lesson makes of the table, each as (claim, holds, the numbers).

    1. roomy: hash B=16 and radix B=16 hit exactly alike (both hit the longest cached whole-block
       prefix, and nothing is evicted);
    2. tight: neither B=16 cache hits more everywhere (radix - hash takes both signs: only the
       eviction order differs);
    3. roomy: token granularity never hits less (radix B=1 >= radix B=16);
    4. roomy: LPM changes nothing (every measured number equal to FCFS's: no queue to reorder).
    """
    at = _index(rows)
    out, gaps = [], []
    for (w, s, m, b, p), r in sorted(at.items()):
        if m == "paged-radix" and b == 16:
            h = at[(w, s, "paged-prefix", 16, p)]
            if s == "roomy":
                out.append(
                    (
                        f"{w}/roomy/{p}: hash B=16 and radix B=16 hit alike",
                        r.hit_rate == h.hit_rate,
                        f"{h.hit_rate:.3f} vs {r.hit_rate:.3f}",
                    )
                )
            else:
                gaps.append((r.hit_rate - h.hit_rate, f"{w}/{p}"))
        if s == "roomy" and m == "paged-radix" and b == 1:
            coarse = at[(w, s, "paged-radix", 16, p)]
            out.append(
                (
                    f"{w}/roomy/{p}: radix B=1 hits at least as much as B=16",
                    r.hit_rate >= coarse.hit_rate,
                    f"{r.hit_rate:.3f} vs {coarse.hit_rate:.3f}",
                )
            )
        if s == "roomy" and p == "lpm":
            f = at[(w, s, m, b, "fcfs")]
            same = (r.hit_rate, r.throughput, r.ttft_p50, r.ttft_p99, r.preemptions) == (
                f.hit_rate,
                f.throughput,
                f.ttft_p50,
                f.ttft_p99,
                f.preemptions,
            )
            out.append((f"{w}/roomy/{m} B={b}: LPM == FCFS", same, f"TTFT p50 {f.ttft_p50:.4f} vs {r.ttft_p50:.4f}"))
    if gaps:
        signs = {g > 0 for g, _ in gaps if g != 0}
        widest = max(gaps, key=lambda g: abs(g[0]))
        out.append(
            (
                "tight: neither B=16 cache hits more everywhere",
                signs == {True, False},
                f"radix - hash from {min(gaps)[0]:+.3f} to {max(gaps)[0]:+.3f} (widest: {widest[1]})",
            )
        )
    return out


def granularity(
    num_requests: int = 200, seed: int = 0, user_len: int = 40, reply_len: int = 56, cost: CostModel | None = None
) -> list[CacheRow]:
    """Multi-turn chat whose turns end inside a block (user and reply lengths not multiples of 16),
    roomy, FCFS: where B = 1 hits what B = 16 cannot (the shared conversation's last partial block)."""
    return [
        run_cell("multiturn", "roomy", m, b, "fcfs", num_requests, seed, cost, user_len=user_len, reply_len=reply_len)
        for m, b in CACHES
    ]


def lookup_cost(
    num_prompts: int = 32, prompt_len: int = 1024, shared_len: int = 512, repeats: int = 20, seed: int = 0
) -> dict[str, float]:
    """Microseconds per prefix lookup (``num_cached_tokens_for``, which changes nothing) once
    ``num_prompts`` prompts of ``prompt_len`` tokens sharing ``shared_len`` leading tokens are cached:
    the hash chain hashes every full block of the query; the radix tree walks its edges.
    A wall-clock timing: it varies from run to run and machine to machine."""
    import random

    from paged_edu.core.allocator import BlockAllocator
    from paged_edu.core.radix_cache import RadixAllocator

    rng = random.Random(seed)
    shared = [rng.randrange(1, 50_000) for _ in range(shared_len)]
    prompts = [shared + [rng.randrange(1, 50_000) for _ in range(prompt_len - shared_len)] for _ in range(num_prompts)]
    out = {}
    for label, make in (
        ("hash B=16", lambda n: BlockAllocator(n, 16)),
        ("radix B=16", lambda n: RadixAllocator(n, 16)),
        ("hash B=1", lambda n: BlockAllocator(n, 1)),
        ("radix B=1", lambda n: RadixAllocator(n, 1)),
    ):
        block = int(label.split("B=")[1])
        cache = make(num_prompts * prompt_len // block + 64)
        for i, p in enumerate(prompts):
            cache.allocate(i, p)
            cache.free(i)
        start = time.perf_counter()
        for _ in range(repeats):
            for p in prompts:
                cache.num_cached_tokens_for(p)
        out[label] = (time.perf_counter() - start) / (repeats * num_prompts) * 1e6
    return out

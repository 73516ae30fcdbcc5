"""Soak: many requests through the engine, looking for what leaks (issue 23, item 5).

    nice -n 10 python benchmarks/soak_engine.py                      # 100,000 requests
    python benchmarks/soak_engine.py --num-requests 2000 --out /tmp/soak.json

A probe, not a timed test. The requests are split over four engines -- the hash-chain and the radix
prefix cache, each under preemption by recompute and by swap -- on a tiny random Llama (2 layers,
hidden 64: a step takes milliseconds on a CPU), with a pool small enough that sequences are
preempted all the time. The workload mixes everything that ends a request early or makes a step
fail: prompts that share one of a few system prompts, cache salts from a few tenants, greedy and
seeded parallel sampling (``n`` up to 3), aborts of whole requests and of single samples (before
and after the fork), and faults injected at every phase of a step
(:func:`~paged_edu.engine.faults.inject_fault`; the step is retried).

Every ``num_requests / checkpoints`` requests the engine is drained (no request left) and
measured at rest:

* **blocks**: every block is free or evictable-cached (``free_block_ids + evictable == num_blocks``),
  every cached block is evictable, no sequence is left in the allocator, and the cache's
  store / evict / clear events, replayed (:class:`~paged_edu.labs.cache_contents.CacheContents`),
  name exactly the cached blocks;
* **swap blocks**: every CPU block is back in the free list;
* **held objects**: every container the engine, scheduler, runner, sampler and allocator hold
  that is empty at rest (requests, queues, sequences, random streams, pending copies, deferred
  aborts) is empty; every other container (the prefix index's maps, the statistics) does not grow
  from the first half of the run to the second;
* **gc objects by type**: after ``gc.collect()``, the count of every ``paged_edu`` type does not grow;
* **RSS**: the process's resident memory.

A leak is an "empty at rest" item left at a checkpoint; a container (or type) that grows -- larger
at every checkpoint than at the one before, or at the end larger than anywhere in the first half by
more than the pool's block count (what a structure bounded by the pool can move by); or RSS growth
past ``RSS_SLACK_MB`` from the first checkpoint to the last. Prints a table; writes ``benchmarks/records/<card>/soak_engine.json`` unless ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch

torch.set_num_threads(1)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from paged_edu.core.radix_cache import RadixAllocator  # noqa: E402
from paged_edu.engine import Engine, StepFailed  # noqa: E402
from paged_edu.engine.faults import PHASES, inject_fault  # noqa: E402
from paged_edu.engine.sampling import SamplingParams  # noqa: E402
from paged_edu.labs.cache_contents import CacheContents  # noqa: E402
from paged_edu.labs.engine_lab import tiny_model  # noqa: E402
from record import provenance, write_record  # noqa: E402

VOCAB = 64
NUM_BLOCKS, BLOCK_SIZE, NUM_CPU_BLOCKS = 40, 4, 64
TENANTS = (None, "t0", "t1", "t2", "t3")
RSS_SLACK_MB = 32.0
# What the engine holds only while requests are live: empty at every checkpoint.
EMPTY_AT_REST = {
    "engine": ("_requests", "_deferred_aborts", "_aborted_outputs"),
    "scheduler": ("waiting", "running", "swapped", "_live", "_forking"),
    "runner": ("_pending",),
    "sampler": ("_generators", "_drawn", "_taken"),
    "allocator": ("_seqs", "_copies", "_cache_events"),
}
CONFIGS = ("hash-recompute", "hash-swap", "radix-recompute", "radix-swap")


def build(model, config: str) -> Engine:
    cache, mode = config.split("-")
    allocator = RadixAllocator(NUM_BLOCKS, BLOCK_SIZE, cache_when_computed=True) if cache == "radix" else None
    return Engine(
        model,
        num_blocks=NUM_BLOCKS,
        block_size=BLOCK_SIZE,
        preemption_mode=mode,
        num_cpu_blocks=NUM_CPU_BLOCKS if mode == "swap" else 0,
        max_num_seqs=16,
        max_num_batched_tokens=48,  # prompts of up to 27 tokens: chunked now and then
        allocator=allocator,
    )


def watched(engine: Engine) -> dict:
    """The objects whose containers are measured, by name."""
    a = engine.allocator
    return dict(
        engine=engine,
        scheduler=engine.scheduler,
        runner=engine.runner,
        sampler=engine.sampler,
        allocator=a,
        pool=a.pool,
        index=a.index,
        tree=getattr(a.index, "tree", None),  # the radix cache's (its candidate heap, its namespaces)
        stats=a.stats,
    )


def container_sizes(engine: Engine) -> dict[str, int]:
    """``"owner.attribute" -> len()`` of every container attribute of the watched objects."""
    sizes = {}
    for owner, obj in watched(engine).items():
        if obj is None:
            continue
        names = getattr(obj, "__dict__", None) or {s: None for s in getattr(type(obj), "__slots__", ())}
        for name in names:
            value = getattr(obj, name, None)
            if isinstance(value, (dict, list, set, tuple, frozenset)) or type(value).__name__ in ("deque", "array"):
                sizes[f"{owner}.{name}"] = len(value)
    return sizes


def gc_counts() -> dict[str, int]:
    """Live objects of every ``paged_edu`` type, after a full collection."""
    gc.collect()
    counts = {}
    for cls, n in Counter(map(type, gc.get_objects())).items():
        module = cls.__dict__.get("__module__")  # (a metaclass's __module__ is a descriptor)
        if isinstance(module, str) and module.startswith("paged_edu"):
            counts[f"{module}.{cls.__qualname__}"] = n
    return counts


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def at_rest(engine: Engine, contents: CacheContents) -> dict[str, int]:
    """What is held although no request is live: every value is a leak (the last: cached blocks
    that the cache's store / evict / clear events, replayed, do not account for, or the reverse)."""
    a, sched = engine.allocator, engine.scheduler
    cached = {b for b in range(a.num_blocks) if a.index.is_cached(b)}
    held = {
        "blocks": a.num_blocks - len(a.pool.free_block_ids) - a.num_evictable_blocks,
        "blocks cached but not evictable": a.num_cached_blocks - a.num_evictable_blocks,
        "swap blocks": sched.num_cpu_blocks - len(sched.free_cpu_blocks),
        "unapplied block ops": engine.runner.num_unapplied_block_ops,
        "cached blocks unlike the replayed events": len(cached ^ set(contents.cached)),
    }
    objects = watched(engine)
    for owner, names in EMPTY_AT_REST.items():
        for name in names:
            held[f"{owner}.{name}"] = len(getattr(objects[owner], name))
    return held


class Workload:
    """Random requests, aborts and faults, from one seed."""

    def __init__(self, seed: int, fault_rate: float, abort_rate: float) -> None:
        self.rng = random.Random(seed)
        self.systems = [[self.rng.randrange(VOCAB) for _ in range(n)] for n in (8, 13, 16)]
        self.fault_rate, self.abort_rate = fault_rate, abort_rate

    def request(self) -> tuple[list[int], SamplingParams, str | None]:
        rng = self.rng
        prompt = rng.choice(self.systems) + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 12))]
        if rng.random() < 0.6:
            params = SamplingParams(max_tokens=rng.randrange(1, 9))
        else:
            seed = rng.choice([None, rng.randrange(2**31)])
            params = SamplingParams(
                max_tokens=rng.randrange(1, 9), temperature=1.0, top_p=0.9, seed=seed, n=rng.choice([1, 2, 3])
            )
        return prompt, params, rng.choice(TENANTS)

    def armed(self) -> bool:
        return self.rng.random() < self.fault_rate


def soak_one(model, config: str, num_requests: int, checkpoints: int, work: Workload, tamper=None) -> dict:
    """Drive ``num_requests`` requests through one engine; the measurements at each checkpoint."""
    engine = build(model, config)
    contents = CacheContents(engine.allocator)  # the cache as an outside observer sees it
    undo = [inject_fault(engine, phase, work.armed) for phase in PHASES]
    if tamper is not None:
        tamper(engine)
    rng = work.rng
    live: dict[int, int] = {}  # request id -> n
    counts = Counter()
    samples = []
    per_checkpoint = max(num_requests // checkpoints, 1)
    t0 = time.perf_counter()
    try:
        submitted = 0
        while submitted < num_requests:
            batch = min(rng.randrange(1, 6), num_requests - submitted, per_checkpoint - submitted % per_checkpoint)
            prompts, params, salts = zip(*(work.request() for _ in range(batch)))
            for rid, p in zip(engine.add_requests(prompts, params, cache_salts=salts), params):
                live[rid] = p.n
            submitted += batch
            counts["requests"] += batch
            drain = submitted % per_checkpoint == 0 or submitted == num_requests
            while engine.has_unfinished() and (drain or len(engine.scheduler.waiting) > 4):
                step(engine, rng, work, live, counts)
            if drain:
                step(engine, rng, work, live, counts)  # reports aborts done since the last step
                assert not live, f"requests never reported: {sorted(live)[:10]}"
                if rng.random() < 0.25:
                    engine.allocator.reset_prefix_cache()
                    counts["cache resets"] += 1
                samples.append(measure(engine, contents, submitted, time.perf_counter() - t0))
                print(
                    f"  {config}: {submitted:,} requests, {samples[-1]['seconds']:.0f} s, "
                    f"RSS {samples[-1]['rss_mb']:.1f} MB",
                    flush=True,
                )
    finally:
        for u in undo:
            u()
        engine.close()  # its pool back before the next configuration's engine is built
    return dict(config=config, samples=samples, counts=dict(counts), seconds=time.perf_counter() - t0)


def step(engine: Engine, rng: random.Random, work: Workload, live: dict, counts: Counter) -> None:
    if live and rng.random() < work.abort_rate:
        rid = rng.choice(list(live))
        index = rng.randrange(live[rid]) if live[rid] > 1 and rng.random() < 0.7 else None
        try:
            done = engine.abort_request(rid, sample_index=index)
        except ValueError as exc:  # that sample finished already: refused, nothing changed
            if "already finished" not in str(exc):
                raise
            counts["aborts refused (sample done)"] += 1
        else:
            counts["sample aborts" if index is not None else "request aborts"] += 1
            if done is not None:
                del live[rid]
                counts["finished"] += 1
    try:
        outputs = engine.step()
    except StepFailed:
        counts["failed steps"] += 1
        return
    counts["steps"] += 1
    for out in outputs:
        if live.pop(out.request_id, None) is not None:  # (an abort that completed it reported it already)
            counts["finished"] += 1


def measure(engine: Engine, contents: CacheContents, submitted: int, seconds: float) -> dict:
    held = at_rest(engine, contents)
    contents.events.clear()  # the probe keeps the replayed contents, not their history
    return dict(
        requests=submitted,
        seconds=round(seconds, 2),
        rss_mb=round(rss_mb(), 1),
        at_rest=held,
        containers=container_sizes(engine),
        gc=gc_counts(),
        preemptions=engine.scheduler.num_preemptions,
        steps=engine.step_count,
        failed_steps=engine.num_failed_steps,
        blocks_swapped_out=engine.num_blocks_swapped_out,
        blocks_copied=engine.num_blocks_copied,
        cached_blocks=engine.allocator.num_cached_blocks,
    )


def growth(series: list[dict]) -> dict[str, int]:
    """Keys that grow, by how much from the first checkpoint to the last: those larger at every
    checkpoint than at the one before (from the second on: the first may still be filling the
    cache), or whose last value exceeds the first half's largest by more than the pool (what a
    structure bounded by the pool can move by)."""
    out = {}
    for key in set().union(*series):
        values = [s.get(key, 0) for s in series]
        steady = values[1:]
        rising = len(steady) >= 4 and all(b > a for a, b in zip(steady, steady[1:]))
        if rising or values[-1] - max(values[: max(len(values) // 2, 1)]) > NUM_BLOCKS:
            out[key] = values[-1] - values[0]
    return out


def leaks(run: dict) -> dict[str, dict]:
    """Every leak the samples of one engine show (empty: none)."""
    samples = run["samples"]
    held = {}
    for s in samples:
        for key, value in s["at_rest"].items():
            if value:
                held[key] = max(held.get(key, 0), value)
    return dict(
        at_rest=held,
        containers=growth([s["containers"] for s in samples]),
        gc=growth([s["gc"] for s in samples]),
    )


def soak(
    num_requests: int,
    checkpoints: int = 10,
    seed: int = 0,
    fault_rate: float = 0.01,
    abort_rate: float = 0.05,
    tamper=None,
    configs=CONFIGS,
) -> dict:
    """The whole probe: ``num_requests`` split over ``configs``; returns the record (leaks counted)."""
    model = tiny_model(seed=seed, vocab_size=VOCAB)
    work = Workload(seed, fault_rate, abort_rate)
    rss = [("start", rss_mb())]
    runs = []
    gc.collect()
    gc.freeze()  # what exists now (torch, transformers, the model) is neither collected nor counted again
    try:
        for i, config in enumerate(configs):
            share = num_requests // len(configs) + (i < num_requests % len(configs))
            runs.append(soak_one(model, config, share, checkpoints, work, tamper))
            runs[-1]["leaks"] = leaks(runs[-1])
            rss.append((config, rss_mb()))
    finally:
        gc.unfreeze()
    rss_series = [s["rss_mb"] for r in runs for s in r["samples"]]
    rss_growth = rss_series[-1] - rss_series[0]
    num_leaks = sum(len(v) for r in runs for v in r["leaks"].values()) + (rss_growth > RSS_SLACK_MB)
    return dict(
        num_requests=num_requests,
        checkpoints_per_engine=checkpoints,
        seed=seed,
        fault_rate=fault_rate,
        abort_rate=abort_rate,
        pool=dict(num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, num_cpu_blocks=NUM_CPU_BLOCKS),
        rss_slack_mb=RSS_SLACK_MB,
        seconds=round(sum(r["seconds"] for r in runs), 1),
        rss_mb=dict(rss_at=rss, first_checkpoint=rss_series[0], last_checkpoint=rss_series[-1], growth=rss_growth),
        num_leaks=num_leaks,
        runs=runs,
    )


def table(rec: dict) -> str:
    lines = [
        f"{'engine':16} {'requests':>9} {'steps':>8} {'failed':>7} {'preempt':>8} {'aborts':>7} "
        f"{'s':>7} {'RSS MB first..last':>19} {'leaks':>6}"
    ]
    for r in rec["runs"]:
        s0, s1, c = r["samples"][0], r["samples"][-1], r["counts"]
        n = sum(len(v) for v in r["leaks"].values())
        aborts = c.get("request aborts", 0) + c.get("sample aborts", 0)
        lines.append(
            f"{r['config']:16} {c['requests']:>9,} {s1['steps']:>8,} {s1['failed_steps']:>7,} "
            f"{s1['preemptions']:>8,} {aborts:>7,} {r['seconds']:>7.1f} "
            f"{s0['rss_mb']:>9.1f}..{s1['rss_mb']:<8.1f} {n:>6}"
        )
        for kind, found in r["leaks"].items():
            for key, value in found.items():
                lines.append(f"    LEAK {kind}: {key} ({value})")
    m = rec["rss_mb"]
    lines.append(
        f"total {rec['num_requests']:,} requests in {rec['seconds']:.1f} s; RSS {m['first_checkpoint']:.1f} -> "
        f"{m['last_checkpoint']:.1f} MB (growth {m['growth']:+.1f}, slack {RSS_SLACK_MB}); leaks: {rec['num_leaks']}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-requests", type=int, default=100_000)
    ap.add_argument("--checkpoints", type=int, default=10, help="drain-and-measure points per engine")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fault-rate", type=float, default=0.01, help="chance each step phase raises")
    ap.add_argument("--abort-rate", type=float, default=0.05, help="chance of an abort before each step")
    ap.add_argument("--out", help="the JSON record (default: benchmarks/records/<card>/soak_engine.json)")
    args = ap.parse_args(argv)
    head = provenance("soak_engine.py", argv)
    rec = soak(args.num_requests, args.checkpoints, args.seed, args.fault_rate, args.abort_rate)
    print(table(rec))
    write_record({**head, **rec}, args.out, "soak_engine.json")
    return rec


if __name__ == "__main__":
    rec = main()
    sys.exit(1 if rec["num_leaks"] else 0)

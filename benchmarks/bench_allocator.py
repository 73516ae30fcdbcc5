"""Allocator benchmark: replay a serving trace and print operations per second.

The trace (seeded): 10,000 requests, each a 256-token system prompt (one of 4 variants, so prefix
caching matters) plus 20-300 user tokens, then 50-400 decode tokens; at most 64 running at once;
block size 16. The same trace as ``shared/guides/cpu-anchors.md`` describes, so the figures compare
with its anchors (nano-vllm's BlockManager: 0.91 M appends/s, 10.7 k admissions/s).

    python benchmarks/bench_allocator.py [--requests 10000] [--repeat 3] [--clock wall|cpu]
                                         [--json benchmarks/records/<card>/allocator_bench.json]

An *append* is one decode token placed as the scheduler places it (:mod:`paged_edu.sched.scheduler`):
``append_slots(seq_id)`` reserves its slot by count, and each time a block fills, one
``mark_computed(seq_id, n, ids)`` hands over the ids of the tokens placed since the last one, so the
full block is hashed and published (the work nano-vllm's ``may_append`` does as a block fills).

Each configuration is replayed ``--repeat`` times, round robin; the best time is reported (machines
are noisy).
``--clock cpu`` times with ``time.process_time`` (this process's CPU time) instead of the wall
clock: on a machine shared with other work it measures the allocator rather than the waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from paged_edu import BlockAllocator  # noqa: E402
from paged_edu.labs.seed_allocator import SeedAllocator  # noqa: E402
from paged_edu.core.radix_cache import RadixAllocator  # noqa: E402
from record import provenance, record_path  # noqa: E402


class SeedHarness:
    """The seed document's allocator behind the same calls, as a same-run yardstick for speed.

    Only its timings mean something: its per-block hashes and stale cache entries make its hit
    rate and block counts wrong (lesson 3 shows why), so those columns are left blank.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.inner = SeedAllocator(num_blocks, block_size)
        self.lengths: dict[int, int] = {}

    def allocate(self, seq_id, tokens):
        self.lengths[seq_id] = len(tokens)
        return self.inner.allocate_prompt(seq_id, tokens)

    def append_slots(self, seq_id):
        n = self.lengths[seq_id]
        self.lengths[seq_id] = n + 1
        block = self.inner.append_token_slot(seq_id, n)
        return [block * self.inner.block_size + n % self.inner.block_size]

    def mark_computed(self, seq_id, num_computed_tokens, token_ids=None):
        pass  # the seed hashes nothing after admission

    def free(self, seq_id):
        del self.lengths[seq_id]
        self.inner.free_request(seq_id)

    @property
    def num_used_blocks(self):
        return 0  # not meaningful: see the class docstring


def make_trace(num_requests: int, seed: int = 0):
    rng = random.Random(seed)
    system_prompts = [[rng.randrange(32000) for _ in range(256)] for _ in range(4)]
    trace = []
    for _ in range(num_requests):
        prompt = system_prompts[rng.randrange(4)] + [rng.randrange(32000) for _ in range(rng.randint(20, 300))]
        decode = [rng.randrange(32000) for _ in range(rng.randint(50, 400))]
        trace.append((prompt, decode))
    return trace


def replay(
    trace,
    *,
    subscribe: bool,
    max_running: int = 64,
    num_blocks: int = 8192,
    block_size: int = 16,
    seed: bool = False,
    radix: bool = False,
    clock=time.perf_counter,
):
    if radix:
        a = RadixAllocator(num_blocks, block_size)
    else:
        a = SeedHarness(num_blocks, block_size) if seed else BlockAllocator(num_blocks, block_size)
    events = [0]
    if subscribe:

        def on_event(event):
            events[0] += 1

        a.subscribe(on_event)
    running: list[list] = []  # [seq_id, decode tokens, next index, prompt length]
    next_req = 0
    t_admit = t_append = 0.0
    appends = peak_blocks = 0
    while next_req < len(trace) or running:
        t0 = clock()
        while next_req < len(trace) and len(running) < max_running:
            prompt, decode = trace[next_req]
            a.allocate(next_req, prompt)
            running.append([next_req, decode, 0, len(prompt)])
            next_req += 1
        t1 = clock()
        t_admit += t1 - t0
        append_slots, mark_computed = a.append_slots, a.mark_computed
        for entry in running:
            append_slots(entry[0])  # the slot, by count
            entry[2] += 1
            n = entry[3] + entry[2]
            if n % block_size == 0:  # a block is full: the ids since the last full block (or the prompt)
                i = entry[2]
                mark_computed(entry[0], n, entry[1][max(0, i - block_size) : i])
        appends += len(running)
        t2 = clock()
        t_append += t2 - t1
        used = a.num_used_blocks
        if used > peak_blocks:
            peak_blocks = used
        done = [e for e in running if e[2] == len(e[1])]
        if done:
            t3 = clock()
            for entry in done:
                a.free(entry[0])
            running = [e for e in running if e[2] < len(e[1])]
            t_admit += clock() - t3  # frees are counted with admissions (per-request work)
    return {
        "admissions": len(trace),
        "appends": appends,
        "admit_s": t_admit,
        "append_s": t_append,
        "peak_blocks": peak_blocks,
        "hit_rate": None if seed else a.stats.hit_rate,
        "events": events[0],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument(
        "--json",
        help="the record: the table's rows, the command, the commit, the machine "
        "(default: benchmarks/records/<card>/allocator_bench.json)",
    )
    args = parser.parse_args(argv)
    args.json = args.json or str(record_path("allocator_bench.json"))
    trace = make_trace(args.requests)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rows = []
    configs = (
        ("no subscriber", False, False, False),
        ("event stream on (1 subscriber)", True, False, False),
        ("the seed's allocator (defective; same run, for scale)", False, True, False),
        ("radix-tree prefix cache (RadixAllocator)", False, False, True),
    )
    # Round robin over the configurations, so that a change in the machine's load between
    # replays touches every configuration alike; keep each one's best replay.
    best: dict[str, dict] = {}
    for _ in range(args.repeat):
        for label, subscribe, seed, radix in configs:
            r = replay(trace, subscribe=subscribe, seed=seed, radix=radix, clock=clock)
            if label not in best or r["admit_s"] + r["append_s"] < best[label]["admit_s"] + best[label]["append_s"]:
                best[label] = r
    for label, *_ in configs:
        r = best[label]
        r["label"] = label
        r["appends_per_s"] = r["appends"] / r["append_s"]
        r["admissions_per_s"] = r["admissions"] / r["admit_s"]
        rows.append(r)
    print(
        f"{args.requests:,} requests, {rows[0]['appends']:,} appends, block size 16, at most 64 running, "
        f"best of {args.repeat}, {args.clock} clock, Python {sys.version.split()[0]}"
    )
    print("| configuration | appends/s | admissions/s (incl. free) | peak blocks | prefix hit rate (tokens) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        blocks = f"{r['peak_blocks']:,}" if r["hit_rate"] is not None else "–"
        hits = f"{r['hit_rate']:.1%}" if r["hit_rate"] is not None else "–"
        print(
            f"| {r['label']} | {r['appends_per_s'] / 1e6:.2f} M | {r['admissions_per_s'] / 1e3:.1f} k | "
            f"{blocks} | {hits} |"
        )
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    record = {
        **provenance(
            "bench_allocator.py",
            argv,
            note=f"best of {args.repeat}, {args.clock} clock; the CPU may be shared with other work",
        ),
        "requests": args.requests,
        "repeat": args.repeat,
        "clock": args.clock,
        "rows": rows,
    }
    with open(args.json, "w") as f:
        json.dump(record, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""Does a change to the scheduler, the allocator or the simulator leave every simulated result as it was?

Runs 19 seeded workloads/modes -- beam trees (paged, prefix, radix, contiguous, a small pool that
preempts, swap), parallel samples, ShareGPT, chat, multi-turn and agent traces over every memory
manager, one with the per-block cost -- and writes every field of each result, every request's
record included (the wall time left out), to JSON. Run it in two checkouts and compare the files:

    cd /path/to/main   && PYTHONPATH=$PWD python scripts/sim_same_results.py dump /tmp/before.json
    cd /path/to/branch && PYTHONPATH=$PWD python scripts/sim_same_results.py dump /tmp/after.json
    python scripts/sim_same_results.py compare /tmp/before.json /tmp/after.json   # exit 1 if any differs

Larger runs than ``tests/sim/test_same_results.py`` (whose digests of every scheduling decision were
recorded before the simulator's speed work), too slow for the test suite: a few minutes on one core.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

from paged_edu.sim import workloads
from paged_edu.sim.costmodel import CostModel
from paged_edu.sim.results import SimConfig
from paged_edu.sim.simulator import simulate


def _beam(num, rate, seed, n=4):
    return lambda: workloads.parallel(num, rate, seed, n=n, fork="beam")


# name -> (requests, config, cost model or None for the default)
CASES = {
    "beam1500": (_beam(1500, math.inf, 0), SimConfig(manager="paged"), None),
    "beam800_prefix": (_beam(800, 10.0, 1), SimConfig(manager="paged-prefix"), None),
    "beam600_small_pool": (_beam(600, math.inf, 2, n=3), SimConfig(manager="paged", num_kv_slots=60_000), None),
    "beam600_swap": (
        _beam(600, math.inf, 2, n=3),
        SimConfig(manager="paged", num_kv_slots=60_000, preemption_mode="swap", num_cpu_blocks=4_000),
        None,
    ),
    "beam400_radix": (_beam(400, math.inf, 3), SimConfig(manager="paged-radix"), None),
    "beam300_contig": (_beam(300, math.inf, 3), SimConfig(manager="contiguous-oracle"), None),
    "par500": (lambda: workloads.parallel(500, 20.0, 0, n=4), SimConfig(manager="paged"), None),
    "par500_prefix": (lambda: workloads.parallel(500, 20.0, 0, n=4), SimConfig(manager="paged-prefix"), None),
    "par500_small": (
        lambda: workloads.parallel(500, math.inf, 0, n=4),
        SimConfig(manager="paged", num_kv_slots=50_000),
        None,
    ),
    "sg500_paged": (lambda: workloads.sharegpt(500, 20.0, 0), SimConfig(manager="paged"), None),
    "sg500_prefix": (lambda: workloads.sharegpt(500, 20.0, 0), SimConfig(manager="paged-prefix"), None),
    "sg500_small_prefix": (
        lambda: workloads.sharegpt(500, math.inf, 0),
        SimConfig(manager="paged-prefix", num_kv_slots=40_000),
        None,
    ),
    "sg500_cmax": (lambda: workloads.sharegpt(500, 20.0, 0), SimConfig(manager="contiguous-max"), None),
    "sg500_corac": (lambda: workloads.sharegpt(500, 20.0, 0), SimConfig(manager="contiguous-oracle"), None),
    "chat400_prefix": (lambda: workloads.chat(400, 20.0, 0, num_groups=3), SimConfig(manager="paged-prefix"), None),
    "chat400_radix": (lambda: workloads.chat(400, 20.0, 0, num_groups=3), SimConfig(manager="paged-radix"), None),
    "multiturn_prefix": (
        lambda: workloads.make_workload("multiturn", 200, 20.0, 0),
        SimConfig(manager="paged-prefix"),
        None,
    ),
    "agents_radix": (lambda: workloads.make_workload("agents", 200, 20.0, 0), SimConfig(manager="paged-radix"), None),
    "sg300_per_block": (
        lambda: workloads.sharegpt(300, math.inf, 0),
        SimConfig(manager="paged-prefix", num_kv_slots=30_000),
        CostModel(per_block_s=1e-7),
    ),
}


def everything(result) -> dict:
    """Every field of a :class:`~paged_edu.sim.results.SimResult` but its wall time, as JSON-able data."""
    fields = dataclasses.asdict(result)
    del fields["sim_wall_s"]
    return fields


def dump(path: str) -> None:
    out = {}
    for name, (requests, config, cost) in CASES.items():
        try:
            out[name] = everything(simulate(requests(), config, cost))
            print(name, out[name]["num_steps"], "steps", flush=True)
        except Exception as exc:  # a failure is a result too: compared like the others
            out[name] = f"{type(exc).__name__}: {exc}"
            print(name, out[name], flush=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=0, sort_keys=True, default=str)


def compare(before_path: str, after_path: str) -> int:
    with open(before_path, encoding="utf-8") as f:
        before = json.load(f)
    with open(after_path, encoding="utf-8") as f:
        after = json.load(f)
    differ = 0
    for name in sorted(before.keys() | after.keys()):
        a, b = before.get(name), after.get(name)
        if json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True):  # as text: NaN equals NaN
            continue
        differ += 1
        fields = (
            sorted(k for k in (a.keys() | b.keys()) if a.get(k) != b.get(k))
            if isinstance(a, dict) and isinstance(b, dict)
            else "all"
        )
        print(f"DIFFERS {name}: {fields}")
    print(f"{len(before)} cases, {differ} differ (every result field and request record compared)")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("dump", help="run every case, write the results").add_argument("out")
    cmp = sub.add_parser("compare", help="compare two dumps; exit 1 if any case differs")
    cmp.add_argument("before")
    cmp.add_argument("after")
    args = parser.parse_args(argv)
    if args.command == "dump":
        dump(args.out)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())

"""The simulator's speed work changes nothing it reports (issue 44 item 9): seeded runs of every mode
against digests recorded before that work.

Each case runs a seeded workload through :func:`~paged_edu.sim.simulator.simulate` and hashes two
things: every decision the scheduler made, step by step (each chunk it scheduled -- sequence, new
tokens, start, whether it emits -- the sequences it preempted, the block copies in order), and
everything the run reports (:class:`~paged_edu.sim.results.SimResult` but its wall time: every
request's record, the memory breakdown, the hit rates, the cost model's assumptions). The oracle is
the code before the speed work: the digests below were recorded at commit 56aba71 (run this file,
``python tests/sim/test_same_results.py``, to print them for the code checked out). Headline counts
sit beside each digest so that a failure says what moved.

The cases cover every memory manager, prefix caching off, on (hash chain) and radix, parallel
sampling and beam trees, preemption by recompute, swap and auto, chunked prefill off, the ``lpm``
policy, cache salts, requests that name their replies, and the per-block cost (which counts blocks).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import sys

import pytest

from paged_edu.sim import prefix_workloads, workloads
from paged_edu.sim.costmodel import CostModel
from paged_edu.sim.results import SimConfig
from paged_edu.sim.simulator import prepare, simulate


def _mixed(num: int, rate: float, seed: int) -> list:
    """Alpaca-like requests, a third of them beam trees, a third parallel samples (n = 2 or 3)."""
    requests = workloads.alpaca(num, rate, seed)
    for i, r in enumerate(requests):
        r.n, r.fork = (1, "parallel") if i % 3 == 0 else (2 + i % 2, "beam" if i % 3 == 1 else "parallel")
    return requests


def _salted(num: int, rate: float, seed: int) -> list:
    return workloads.assign_tenants(workloads.chat(num, rate, seed, system_prompt_len=64, num_groups=2), 3)


# (name, requests, config, cost model): small pools, so that most cases preempt
CASES = [
    ("paged sharegpt", lambda: workloads.sharegpt(120, 20.0, 0), SimConfig(num_kv_slots=12_000), None),
    (
        "paged beam inf (the benchmark's workload)",
        lambda: workloads.parallel(60, math.inf, 1, n=4, fork="beam"),
        SimConfig(num_kv_slots=30_000),
        None,
    ),
    (
        "paged parallel, swap",
        lambda: workloads.parallel(40, 30.0, 2, n=3),
        SimConfig(num_kv_slots=6_000, preemption_mode="swap", num_cpu_blocks=300),
        None,
    ),
    (
        "paged-prefix mixed, auto",
        lambda: _mixed(90, math.inf, 3),
        SimConfig(manager="paged-prefix", block_size=8, num_kv_slots=1_600, preemption_mode="auto", num_cpu_blocks=60),
        None,
    ),
    (
        "paged-prefix chat, salted, no chunking",
        lambda: _salted(60, 40.0, 4),
        SimConfig(
            manager="paged-prefix",
            num_kv_slots=9_000,
            enable_chunked_prefill=False,
            max_num_batched_tokens=4096,
            sample_every=1,
        ),
        None,
    ),
    (
        "paged-radix multiturn (named replies), lpm",
        lambda: prefix_workloads.multiturn(60, 50.0, 5),
        SimConfig(manager="paged-radix", num_kv_slots=4_000, policy="lpm"),
        None,
    ),
    (
        "paged-radix agents, per-block cost",
        lambda: prefix_workloads.agents(50, math.inf, 6),
        SimConfig(manager="paged-radix", block_size=32, num_kv_slots=6_000, max_num_seqs=16),
        CostModel(per_block_s=2e-9),
    ),
    (
        "paged-prefix fewshot, per-block cost, recompute",
        lambda: prefix_workloads.fewshot(60, math.inf, 7),
        SimConfig(manager="paged-prefix", num_kv_slots=3_000, max_num_batched_tokens=512),
        CostModel(per_block_s=2e-9),
    ),
    (
        "contiguous-max mixed",
        lambda: _mixed(40, 10.0, 8),
        SimConfig(manager="contiguous-max", num_kv_slots=40_000),
        None,
    ),
    (
        "contiguous-pow2 sharegpt",
        lambda: workloads.sharegpt(80, math.inf, 9),
        SimConfig(manager="contiguous-pow2", num_kv_slots=20_000),
        None,
    ),
    (
        "contiguous-oracle mixed, swap",
        lambda: _mixed(60, math.inf, 10),
        SimConfig(manager="contiguous-oracle", num_kv_slots=3_000, preemption_mode="swap", num_cpu_blocks=2_000),
        None,
    ),
]

# name -> (steps, output tokens, preemptions, sha256 of the decisions, sha256 of the result), at 56aba71
ORACLE = {
    "paged sharegpt": (
        2425,
        39543,
        101,
        "e31e6e8768c51b27a1f3f0960aece054d21feab35bf17e877c1fb943319d60e3",
        "2908232128c944a7da0996b16f6d90e051547491c4f10495857a4b9316ca51c4",
    ),
    "paged beam inf (the benchmark's workload)": (
        1122,
        67488,
        0,
        "36f77d8c0da5deb0d0de59ee84a91cfaca27d94c293fd2f719c6579260336d53",
        "58ab14bc40783fae0407924fa92f0ea964940e235d38c42242c478b497d01d4a",
    ),
    "paged parallel, swap": (
        4002,
        40908,
        237,
        "f2222d46edeb0d5cb2e264649966d3c110abdc284cf68ecbf48772d8f20a71d8",
        "5c30b2920f61f3663bf984e040979c8ade07451fef38012a57859d904cd8d55c",
    ),
    "paged-prefix mixed, auto": (
        534,
        11427,
        279,
        "ec621c94dc81ba8f6fd6dce571c5df90edd5a32bea826f6300ad3655a0b12362",
        "2fff40e6052b9ca5dfd34581d031986d7e34e37c13768548d844ffd6d1364f31",
    ),
    "paged-prefix chat, salted, no chunking": (
        1929,
        24306,
        63,
        "580266fb0cedae0c8aca256959b2d5319f159e3eb7fe636016fa2b82ff12d1ff",
        "0f1928524edd5f36be55483da84304fb8cea1d31bc34d738d4d6dbb92128e5ac",
    ),
    "paged-radix multiturn (named replies), lpm": (
        587,
        5760,
        13,
        "54cac924b94f7382fa3cba6dc5b6fb35885e1f78724d6a5835f30e0a4a686f07",
        "d95acf58ed0d504bfa9faa607eec710e7ce9b0fdccbb58c27b81c591506f0367",
    ),
    "paged-radix agents, per-block cost": (
        309,
        3903,
        0,
        "63c7b84d4a9b644ee7e97888ad6bd3535f5bfe3aa781d7cf66b157344b653719",
        "76ca296f26245de51a7063344a558b4f84d92128176ff1907121e07dc6f6a4e9",
    ),
    "paged-prefix fewshot, per-block cost, recompute": (
        829,
        4647,
        13,
        "13a5540bba2a3a9e10f72d70ad8547f879b7e49dec8cf90b4e94944a46080b7c",
        "a3e5414dbbf21722a7e273dc685a6afaa1ce256a1a2ee9970b401eef587008da",
    ),
    "contiguous-max mixed": (
        525,
        4320,
        0,
        "977837bdb6970601da06b5b0cc1671520e3162bf1a492b59961a408c05f75533",
        "a5df049a232567bafa76a5c50210fe6aeca676d4dcd21990fa903bbe0b6f9634",
    ),
    "contiguous-pow2 sharegpt": (
        2907,
        32617,
        0,
        "4d91019eeeda3a1da77e4a4fa1d111717fd2f101746be0bdad86c6ddedd4916b",
        "8a79609dd1ce4b8796f751357bc16b2dab94f85deaf62aff9c754c88a0a333bc",
    ),
    "contiguous-oracle mixed, swap": (
        335,
        6343,
        0,
        "9c5e3dd9cb618dd27802f243ff1b8edbdbf8f316e745bd76da451e9c7e89d14a",
        "4522cd60651e2c3339b4085c5b39359857c50858687e7e95337aab5401281fd9",
    ),
}


def run(requests, config: SimConfig, cost: CostModel | None) -> tuple[int, int, int, str, str]:
    """One seeded run: its headline counts and the digests of its decisions and of its result."""
    server = prepare(requests, config, cost or CostModel())
    decisions = hashlib.sha256()
    schedule = server.scheduler.schedule

    def recorded():
        out = schedule()
        chunks = [(item.seq.seq_id, item.num_new_tokens, item.start, item.emits_token) for item in out.scheduled]
        decisions.update(repr((chunks, [seq.seq_id for seq in out.preempted], out.block_ops)).encode())
        return out

    server.scheduler.schedule = recorded
    result = simulate(requests, server=server)
    reported = dataclasses.asdict(result)
    del reported["sim_wall_s"]
    digest = hashlib.sha256(repr(reported).encode()).hexdigest()
    return result.num_steps, result.num_output_tokens, result.preemptions, decisions.hexdigest(), digest


@pytest.mark.parametrize("name, requests, config, cost", CASES, ids=[c[0] for c in CASES])
def test_a_seeded_run_reports_what_it_did_before_the_speed_work(name, requests, config, cost):
    got = run(requests(), config, cost)
    assert got[:3] == ORACLE[name][:3], "steps, output tokens, preemptions"
    assert got[3] == ORACLE[name][3], "the scheduler decided something else at some step"
    assert got[4] == ORACLE[name][4], "a reported result differs"


def test_the_cases_cover_every_mode():
    """Each mode the simulator has is exercised, and the small pools do preempt (recorded counts)."""
    configs = [c[2] for c in CASES]
    assert {c.manager for c in configs} == {
        "paged",
        "paged-prefix",
        "paged-radix",
        "contiguous-max",
        "contiguous-pow2",
        "contiguous-oracle",
    }
    assert {c.preemption_mode for c in configs} == {"recompute", "swap", "auto"}
    assert {c.policy for c in configs} == {"fcfs", "lpm"}
    assert not all(c.enable_chunked_prefill for c in configs)
    assert sum(ORACLE[name][2] > 0 for name, *_ in CASES) >= 6


def test_the_digests_see_a_one_step_change():
    """The comparison can fail: a pool one block smaller changes the decisions and the result."""
    name, requests, config, cost = CASES[0]
    got = run(requests(), dataclasses.replace(config, num_kv_slots=config.num_kv_slots - config.block_size), cost)
    assert got[3] != ORACLE[name][3] and got[4] != ORACLE[name][4]


if __name__ == "__main__":  # print the oracle for the code checked out
    for name, requests, config, cost in CASES:
        print(f"    {name!r}: {run(requests(), config, cost)!r},", file=sys.stdout, flush=True)

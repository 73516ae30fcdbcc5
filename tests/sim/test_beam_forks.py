"""Beam forks looked up per step, not rescanned (issue 44 item 9): the same results as the old scan.

The simulator's beam mode used to look at every beam request still to fork, at every step -- quadratic
at an infinite rate (8k requests: 107 s; 10k: not done in 600 s). Now each parent waits in a heap
under the earliest step it could fork, and a step looks only at the heap's top. The oracle is the old scan itself, kept here: :class:`ScanEveryStep` checks every parent every
step, so any parent the new lookup misses, or forks in another order, changes a result below.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from paged_edu.sched.sequence import SequenceStatus
from paged_edu.sim import simulator, workloads
from paged_edu.sim.request import Request
from paged_edu.sim.results import SimConfig


class ScanEveryStep(simulator._BeamForks):
    """The scan before issue 44: every parent still to fork, every step, in the order they were added."""

    calls = 0

    def fork_due(self, scheduler, model, started, sampled, step) -> None:
        ScanEveryStep.calls += 1
        for parent_id, (parent, points) in list(self._due.items()):
            if parent.status is SequenceStatus.FINISHED:
                raise RuntimeError(f"beam request {parent.request_id} finished before all its branches forked")
            if (
                parent.status is not SequenceStatus.RUNNING
                or scheduler.allocator.num_tokens(parent.seq_id) != parent.num_tokens - 1
            ):
                continue
            self.fork(scheduler, model, parent, points)  # the branching itself is not what is compared
            if not points:
                del self._due[parent_id]


def outcome(result) -> dict:
    """Everything a run measured, but the wall time it took."""
    out = dataclasses.asdict(result)
    del out["sim_wall_s"]
    return out


def beams(num: int, rate: float, seed: int, n: int = 4) -> list[Request]:
    """Beam requests (Alpaca-like lengths: short runs), a few parallel-sampling and single ones among them."""
    requests = workloads.parallel(num, rate, seed, n=n, fork="beam", dataset="alpaca")
    for i, r in enumerate(requests[::3]):  # a few parallel-sampling and single requests in between
        r.fork = "parallel" if i % 2 else r.fork
        r.n = 1 if i % 5 == 0 else r.n
    return requests


CASES = [
    # (name, requests, config): pools small enough to preempt, chunked and not, recompute and swap
    ("paged inf", lambda: beams(40, math.inf, 0), SimConfig(manager="paged", block_size=16, num_kv_slots=1_200)),
    (
        "paged-prefix swap",
        lambda: beams(40, 50.0, 1),
        SimConfig(manager="paged-prefix", block_size=8, num_kv_slots=800, preemption_mode="swap", num_cpu_blocks=400),
    ),
    (
        "paged-radix recompute, no chunking",
        lambda: beams(30, math.inf, 2, n=3),
        SimConfig(
            manager="paged-radix",
            block_size=16,
            num_kv_slots=900,
            enable_chunked_prefill=False,
            max_num_batched_tokens=4096,
        ),
    ),
    (
        "paged few seqs",
        lambda: beams(30, 20.0, 3, n=2),
        SimConfig(manager="paged", block_size=32, num_kv_slots=3_000, max_num_seqs=6),
    ),
    ("contiguous-oracle", lambda: beams(30, math.inf, 4), SimConfig(manager="contiguous-oracle", num_kv_slots=2_000)),
    ("contiguous-max", lambda: beams(20, 10.0, 5), SimConfig(manager="contiguous-max", num_kv_slots=20_000)),
    (
        "sharegpt lengths, 60 at once",
        lambda: workloads.parallel(60, math.inf, 6, n=4, fork="beam"),
        SimConfig(manager="paged-prefix", block_size=16, num_kv_slots=40_000),
    ),
]


@pytest.mark.parametrize("name, requests, config", CASES, ids=[c[0] for c in CASES])
def test_beam_forks_match_the_scan_of_every_parent_every_step(name, requests, config, monkeypatch):
    fast = simulator.simulate(requests(), config)
    ScanEveryStep.calls = 0
    monkeypatch.setattr(simulator, "_BeamForks", ScanEveryStep)
    slow = simulator.simulate(requests(), config)
    assert ScanEveryStep.calls == slow.num_steps > 0  # the oracle ran, every step
    assert outcome(fast) == outcome(slow)
    assert sum(r.num_samples for r in fast.requests) > len(fast.requests)  # branches did fork
    if name.startswith("paged") and name != "paged few seqs":
        assert fast.preemptions > 0  # the small pools did preempt


def test_the_comparison_sees_a_late_fork():
    """The comparison can fail: a lookup that looks only every other step forks some branches a step
    late, and the run differs from the scan's (or ends in the scan's own error, a parent finished
    before its branches forked)."""

    class EveryOtherStep(simulator._BeamForks):
        steps = 0

        def fork_due(self, scheduler, model, started, sampled, step):
            EveryOtherStep.steps += 1
            super().fork_due(scheduler, model, started, sampled if EveryOtherStep.steps % 2 else {}.keys(), step)

    config = SimConfig(manager="paged", block_size=16, num_kv_slots=20_000)
    original = simulator._BeamForks
    try:
        simulator._BeamForks = ScanEveryStep
        scan = simulator.simulate(beams(20, math.inf, 0), config)
        simulator._BeamForks = EveryOtherStep
        try:
            late = outcome(simulator.simulate(beams(20, math.inf, 0), config))
        except RuntimeError as exc:
            late = str(exc)
    finally:
        simulator._BeamForks = original
    assert late != outcome(scan)

"""The soak probe (benchmarks/soak_engine.py) on a few hundred requests: no leak, and a leak is seen.

The same code as the 100,000-request run whose record is ``benchmarks/records/cpu/soak_engine.json``: four engines
(hash / radix cache x recompute / swap) under aborts, salts, preemptions and injected faults,
drained and measured at ten checkpoints each. Then engines made to leak on purpose -- a request
state kept, one block never released, random streams never dropped, cache events lost -- must each
be caught.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import soak_engine  # noqa: E402

NUM_REQUESTS = 400


def test_the_soak_finds_no_leak_and_exercises_every_path():
    rec = soak_engine.soak(NUM_REQUESTS, fault_rate=0.05, abort_rate=0.2)  # enough of both in a short run
    for run in rec["runs"]:
        assert run["leaks"] == {"at_rest": {}, "containers": {}, "gc": {}}, (run["config"], run["leaks"])
        last, counts = run["samples"][-1], run["counts"]
        assert counts["requests"] == counts["finished"] == NUM_REQUESTS // 4, run["config"]
        assert last["failed_steps"] > 0 and last["preemptions"] > 0, run["config"]
        assert counts.get("sample aborts", 0) > 0 and counts.get("request aborts", 0) > 0, run["config"]
        assert (last["blocks_swapped_out"] > 0) == run["config"].endswith("swap"), run["config"]
    assert rec["num_leaks"] == 0


def keep_finished_requests(engine):
    engine.kept = []
    real = engine.phases.finish_request

    def finish(request):
        engine.kept.append(request)
        return real(request)

    engine.phases.finish_request = finish


def lose_one_block(engine):
    pool, real, lost = engine.allocator.pool, engine.allocator.pool.release, []

    def release(block_ids):
        block_ids = list(block_ids)
        if not lost and block_ids:
            lost.append(block_ids.pop())  # its ref count never drops: the block is gone for good
        real(block_ids)

    pool.release = release


def drop_cache_events(engine):
    a = engine.allocator
    a._deliver_cache_events = a._cache_events.clear  # the stores and evictions never reach a subscriber


def keep_random_streams(engine):
    engine.sampler.remove = lambda request_id, sample_index: None
    engine.sampler.remove_request = lambda request_id, num_samples: None


@pytest.mark.parametrize(
    "tamper, kind, key",
    [
        (keep_finished_requests, "containers", "engine.kept"),
        (keep_finished_requests, "gc", "paged_edu.engine.outputs.RequestState"),
        (lose_one_block, "at_rest", "blocks"),
        (keep_random_streams, "at_rest", "sampler._generators"),
        (drop_cache_events, "at_rest", "cached blocks unlike the replayed events"),
    ],
)
def test_the_soak_catches_a_leak(tamper, kind, key):
    rec = soak_engine.soak(NUM_REQUESTS, tamper=tamper, configs=("hash-recompute",))
    [run] = rec["runs"]
    assert key in run["leaks"][kind], run["leaks"]
    assert rec["num_leaks"] > 0

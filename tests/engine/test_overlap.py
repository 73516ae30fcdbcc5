"""Async scheduling (issue 22, item 2): the host one step ahead of the device, the same tokens.

The oracle is the synchronous engine on the same model and requests: every configuration --
prefix caching by hash and by radix tree, chunked prefill, preemption by recompute and by swap,
stop tokens, ``max_tokens``, aborts mid-run, seeded ``n > 1`` samples (which fall back to
synchronous steps) -- must give exactly its tokens and leave no block, CPU block or stream behind.
A spy on the scheduler shows the overlap itself: step N+1 is scheduled before step N's tokens are
read (the synchronous engine fails that check). A fault injected into any phase of an async step
loses nothing.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.radix_cache import RadixAllocator
from paged_edu.core.validation import FieldTypeError
from paged_edu.engine import Engine, StepFailed, StepMetrics
from paged_edu.engine.faults import PHASES, InjectedFault, inject_fault
from paged_edu.engine import runner as runner_module
from paged_edu.engine.sampling import SamplingParams
from paged_edu.labs.engine_lab import tiny_model

VOCAB = 512
BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=7, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def prompts():
    """24 prompts of 1 to 40 tokens; half share a 13-token system prompt (not block-aligned)."""
    rng = random.Random(11)
    system = [rng.randrange(VOCAB) for _ in range(13)]
    out = []
    for i in range(24):
        own = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 28))]
        out.append(system + own if i % 2 else own)
    return out


@pytest.fixture(scope="module")
def params(model, prompts):
    """Mixed ``max_tokens``; a third of the requests stop on a token they really generate."""
    free = Engine(model, num_blocks=512, block_size=BLOCK_SIZE).generate(prompts, max_new_tokens=16)
    rng = random.Random(2)
    out = []
    for i, tokens in enumerate(free):
        stop = (tokens[rng.randrange(2, 12)],) if i % 3 == 0 else ()  # hit part-way (or earlier)
        out.append(SamplingParams(max_tokens=rng.randrange(1, 17), stop_token_ids=stop))
    return out


def allocator(kind: str, num_blocks: int, block_size: int = BLOCK_SIZE):
    if kind == "radix":
        return RadixAllocator(num_blocks, block_size, cache_when_computed=True)
    return BlockAllocator(num_blocks, block_size, enable_prefix_caching=kind == "hash", cache_when_computed=True)


CONFIGS = {
    "hash": dict(num_blocks=256),
    "radix": dict(num_blocks=256, allocator="radix"),
    "no-cache": dict(num_blocks=256, allocator="none"),
    "chunked": dict(num_blocks=256, max_num_batched_tokens=16),
    "recompute": dict(num_blocks=24, preemption_mode="recompute"),
    "swap": dict(num_blocks=24, preemption_mode="swap"),
    "radix-recompute": dict(num_blocks=24, allocator="radix", max_num_batched_tokens=24),
    "few-seqs": dict(num_blocks=256, max_num_seqs=5),
}

SAMPLED = [  # seeded n > 1 samples beside greedy requests
    SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=10 * i, n=1 + i % 3)
    if i % 2
    else SamplingParams(max_tokens=6 + i % 5)
    for i in range(12)
]


def build(model, config: str, async_scheduling: bool, **extra) -> Engine:
    kwargs = dict(CONFIGS[config], block_size=BLOCK_SIZE, **extra)
    kind = kwargs.pop("allocator", "hash")
    return Engine(model, allocator=allocator(kind, kwargs["num_blocks"]), async_scheduling=async_scheduling, **kwargs)


def assert_no_leaks(engine: Engine) -> None:
    a = engine.allocator
    assert not engine.has_unfinished()
    assert engine.overlap is None or engine.overlap.in_flight is None
    assert a.num_used_blocks == 0 and a.num_free_blocks == a.num_blocks and a.seq_ids == []
    assert len(engine.scheduler.free_cpu_blocks) == engine.scheduler.num_cpu_blocks
    assert engine.runner.num_unapplied_block_ops == 0
    assert len(engine.sampler) == 0 and not engine.sampler._taken and not engine._requests


def outputs_of(engine: Engine, prompts, params) -> list:
    return [(o.outputs, o.finish_reasons) for o in engine.run(prompts, params)]


_sync: dict = {}


def sync_outputs(model, prompts, params, config: str) -> list:
    if config not in _sync:
        engine = build(model, config, False)
        _sync[config] = outputs_of(engine, prompts, params)
        assert_no_leaks(engine)
    return _sync[config]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_async_is_token_identical_to_sync(model, prompts, params, config):
    expected = sync_outputs(model, prompts, params, config)
    engine = build(model, config, True)
    assert outputs_of(engine, prompts, params) == expected
    assert_no_leaks(engine)
    assert engine.num_generated_tokens == sum(len(o) for outs, _ in expected for o in outs)  # none discarded counted
    ahead = engine.step_count - engine.overlap.num_sync_steps
    assert ahead > engine.step_count // 4, (ahead, engine.step_count)  # most steps really ran ahead
    reasons = {r for _, rs in expected for r in rs}
    assert reasons == {"stop", "length"}  # both stop conditions were handled late


def test_steps_schedule_ahead_of_the_tokens(model, prompts, params):
    """Spy: step N+1's schedule() comes before update() reads step N's tokens -- not so when synchronous."""

    def order(async_scheduling: bool) -> list[str]:
        engine = build(model, "hash", async_scheduling)
        calls: list[str] = []
        sched, update = engine.scheduler.schedule, engine.scheduler.update
        engine.scheduler.schedule = lambda: (calls.append("schedule"), sched())[1]
        engine.scheduler.update = lambda *a: (calls.append("update"), update(*a))[1]
        outputs_of(engine, prompts[:8], params[:8])
        return calls

    def ahead(calls: list[str]) -> int:
        """Updates that read a step's tokens after the next step was scheduled."""
        count = scheduled = read = 0
        for call in calls:
            if call == "schedule":
                scheduled += 1
            else:
                read += 1
                count += scheduled > read  # step `read` is updated after step `read + 1` was scheduled
        return count

    sync, overlapped = order(False), order(True)
    assert ahead(sync) == 0  # the synchronous engine never does: this test fails on it
    assert sync.count("update") == overlapped.count("update")
    assert ahead(overlapped) >= overlapped.count("update") - 2  # every step but the first and the last


def test_from_idle_the_first_token_leaves_the_call_that_computed_it(model, prompts):
    """A request that finds the engine idle gets its first token from the first ``step()`` -- as from a
    synchronous engine -- and the calls after it run ahead again; a second request joining a running
    one waits for the usual one-step lag (the engine was not idle)."""
    greedy = SamplingParams(max_tokens=6)
    sync, engine = build(model, "hash", False), build(model, "hash", True)
    expected = outputs_of(sync, prompts[:2], [greedy] * 2)

    def first_tokens(e: Engine, rid: int) -> int:
        return sum(len(q.output_token_ids) for q in e.scheduler.running if q.request_id == rid)

    rid = engine.add_request(prompts[0], greedy)
    engine.step()
    assert first_tokens(engine, rid) == 1  # read in the call that launched it: fails when it ran ahead
    assert engine.overlap.num_idle_reads == 1 and engine.overlap.in_flight is None
    engine.step()
    assert engine.overlap.in_flight is not None  # running now: the host is one step ahead again
    other = engine.add_request(prompts[1], greedy)
    engine.step()
    assert first_tokens(engine, other) == 0  # joined a busy engine: its prompt step is read next call
    engine.step()
    assert first_tokens(engine, other) == 1 and engine.overlap.num_idle_reads == 1
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: (o.outputs, o.finish_reasons) for o in engine.step()})
    assert [done[rid], done[other]] == expected
    assert_no_leaks(engine)


def test_input_ids_come_from_the_device_not_the_host(model, prompts, params, monkeypatch):
    """The next step's placeholder ids are filled in on the device from the tokens in flight."""
    engine = build(model, "hash", True)
    runner, seen = engine.runner, []
    real = runner.forward

    def forward(batch):
        seen.append(runner.input_ids(batch).clone())
        return real(batch)

    runner.forward = forward
    assert outputs_of(engine, prompts[:6], params[:6]) == sync_outputs(model, prompts, params, "hash")[:6]
    assert all((ids >= 0).all() for ids in seen)  # no placeholder reached the model
    filled = []
    real_fill = runner_module.fill_placeholders
    monkeypatch.setattr(
        runner_module,
        "fill_placeholders",
        lambda ids, tokens, host_ids: (filled.append(int((ids < 0).sum())), real_fill(ids, tokens, host_ids)),
    )
    outputs_of(engine, prompts[:6], params[:6])
    assert sum(filled) > 0


@pytest.mark.parametrize("layout", ["in order", "shuffled", "gaps", "all placeholders", "none"])
def test_fill_placeholders_matches_a_gather_by_hand(layout):
    """Each way of filling (one copy when rows 0..k-1 point at tokens 0..k-1; one gather when every
    row is a placeholder; the general gather) against ``tokens[-1 - id]`` row by row."""
    rng = np.random.default_rng(0)
    tokens = torch.tensor(rng.integers(100, 200, size=8))  # (8,) step N's tokens
    k = 6
    if layout == "in order":
        ids = list(range(-1, -1 - k, -1)) + [5, 7]
    elif layout == "shuffled":
        ids = (-1 - rng.permutation(k)).tolist() + [5, 7]
    elif layout == "gaps":  # a sequence of step N finished: its row is skipped
        ids = [-1, -2, -4, -5, 9, -8]
    elif layout == "all placeholders":  # every row continues, one finished (the one gather)
        ids = [-1, -3, -4, -6]
    else:
        ids = [3, 4, 5]
    host = np.array(ids, dtype=np.int64)
    device = torch.tensor(ids)
    runner_module.fill_placeholders(device, tokens, host)
    expected = [int(tokens[-1 - i]) if i < 0 else i for i in ids]
    assert device.tolist() == expected


@pytest.mark.parametrize("config", ["hash", "recompute", "swap"])
def test_aborts_mid_run_match_sync(model, prompts, params, config):
    """Abort a request once it has m tokens (and a waiting one at once): the same as synchronously."""
    limits = {3: 2, 8: 5, 13: 1, 20: 4}  # request index -> abort once it has this many tokens

    def run(async_scheduling: bool) -> dict:
        engine = build(model, config, async_scheduling)
        long = [SamplingParams(max_tokens=16, stop_token_ids=p.stop_token_ids) for p in params]
        ids = engine.add_requests(prompts, long)
        engine.abort_request(ids[-1])  # waiting, never ran
        results, aborted = {}, set()
        while engine.has_unfinished():
            for out in engine.step():
                results[out.request_id] = (out.outputs, out.finish_reasons)
            for seq in list(engine.scheduler.running):
                i = seq.request_id
                if i in limits and i not in aborted and len(seq.output_token_ids) >= limits[i]:
                    aborted.add(i)
                    out = engine.abort_request(i)
                    results[i] = (out.outputs, out.finish_reasons)
        assert_no_leaks(engine)
        return results

    sync, overlapped = run(False), run(True)
    assert overlapped == sync
    assert sum(r == ["abort"] for _, r in sync.values()) == 1 + len(limits)  # (or fewer if one stopped first)


def test_parallel_sampling_falls_back_and_matches_sync(model, prompts):
    """Seeded ``n > 1`` requests beside greedy ones: forks are read at once; the samples are the same."""
    for config in ("hash", "recompute", "swap"):
        engine = build(model, config, True)
        got = outputs_of(engine, prompts[:12], SAMPLED)
        assert got == outputs_of(build(model, config, False), prompts[:12], SAMPLED), config
        assert engine.num_generated_tokens == sum(len(o) for outs, _ in got for o in outs)
        assert engine.step_count > engine.overlap.num_sync_steps
        assert_no_leaks(engine)


@pytest.mark.parametrize("sample", [0, 1])
def test_a_sample_aborted_while_its_fork_is_in_flight_ends_empty(model, prompts, sample):
    """The fork's tokens are drawn; an abort of one sample before they are read drops its token only:
    the same as an abort before the fork in a synchronous engine (each sample has its own stream)."""
    params = [SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=3), SamplingParams(max_tokens=9)]

    def run(async_scheduling: bool) -> dict:
        engine = build(model, "chunked", async_scheduling)
        ids = engine.add_requests(prompts[1:3], params)
        results = {}
        if not async_scheduling:
            engine.abort_request(ids[0], sample)
        while engine.has_unfinished():
            results.update({o.request_id: o.outputs for o in engine.step()})
            flight = async_scheduling and engine.overlap.in_flight
            if flight and flight.plan.forks and not engine._requests[ids[0]].samples.has_ended(sample):
                engine.abort_request(ids[0], sample)
        assert_no_leaks(engine)
        return results

    sync, overlapped = run(False), run(True)
    assert overlapped == sync and sync[0][sample] == [] and all(sync[0][i] for i in range(3) if i != sample)


@pytest.mark.parametrize("seed", range(16))
def test_random_configurations_match_sync(model, seed):
    """A seeded fuzz: pool, block size, budget, chunking, limits, preemption mode, cache, n > 1 and
    aborts (of a one-sample request, once it has k tokens) drawn at random; async == sync, no leak."""
    rng = random.Random(seed)
    block_size = rng.choice([2, 4, 8])
    shared = [rng.randrange(VOCAB) for _ in range(rng.randrange(0, 12))]
    prompts = [
        (shared if rng.random() < 0.5 else []) + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 30))]
        for _ in range(rng.randrange(2, 14))
    ]
    params = [
        SamplingParams(max_tokens=rng.randrange(1, 12), temperature=1.0, seed=i, n=rng.randrange(1, 4))
        if rng.random() < 0.25
        else SamplingParams(max_tokens=rng.randrange(1, 16), stop_token_ids=tuple(rng.sample(range(VOCAB), 4)))
        for i in range(len(prompts))
    ]
    need = max(-(-(len(p) + sp.max_tokens) // block_size) * sp.n for p, sp in zip(prompts, params))
    num_blocks = rng.randrange(need + 1, need + 40)
    kind, chunked = rng.choice(["hash", "radix", "none"]), rng.random() < 0.8
    kwargs = dict(
        preemption_mode=rng.choice(["recompute", "swap", "auto"]),
        max_num_batched_tokens=rng.choice([8, 16, 64, 2048]) if chunked else 2048,
        enable_chunked_prefill=chunked,
        max_num_seqs=max(rng.choice([2, 4, 256]), max(p.n for p in params)),
    )
    aborts = {rng.randrange(len(prompts)): rng.randrange(1, 6) for _ in range(rng.randrange(0, 3))}

    def run(async_scheduling: bool) -> dict:
        a = allocator(kind, num_blocks, block_size)
        engine = Engine(
            model,
            num_blocks=num_blocks,
            block_size=block_size,
            allocator=a,
            async_scheduling=async_scheduling,
            **kwargs,
        )
        engine.add_requests(prompts, params)
        results, aborted = {}, set()
        while engine.has_unfinished():
            results.update({o.request_id: (o.outputs, o.finish_reasons) for o in engine.step()})
            s = engine.scheduler
            for seq in [*s.running, *s.waiting, *s.swapped]:
                i = seq.request_id
                if params[i].n == 1 and i not in aborted and len(seq.output_token_ids) >= aborts.get(i, 99):
                    aborted.add(i)
                    out = engine.abort_request(i)
                    results[i] = (out.outputs, out.finish_reasons)
        assert_no_leaks(engine)
        return results

    assert run(True) == run(False)


def test_metrics_and_outputs_reach_subscribers(model, prompts, params):
    engine = build(model, "hash", True)
    events: list = []
    engine.subscribe(events.append)
    results = outputs_of(engine, prompts, params)
    steps = [e for e in events if isinstance(e, StepMetrics)]
    assert len(steps) == engine.step_count
    assert sum(e.num_emitting for e in steps) >= sum(map(len, (o for o, _ in results)))
    assert {e.request_id for e in events if not isinstance(e, StepMetrics)} == set(range(len(prompts)))
    assert all(set(e.phase_times) <= {"schedule", "prepare", "forward", "sample", "update"} for e in steps)
    assert sum(e.num_finished for e in steps) == sum(len(o) for o, _ in results)


def test_async_scheduling_is_a_flag(model):
    with pytest.raises(FieldTypeError, match="async_scheduling"):
        Engine(model, num_blocks=16, async_scheduling="yes")
    assert Engine(model, num_blocks=16).overlap is None  # off by default


# ----------------------------------------------------------------------------------------------
# Faults: an async step that fails half-way loses nothing
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
@pytest.mark.parametrize("config", ["hash", "recompute", "swap", "chunked"])
@pytest.mark.parametrize("phase", list(PHASES))
def test_a_failed_async_step_is_undone_and_the_run_is_token_identical(model, prompts, params, config, phase, kind):
    if kind == "sampled":  # seeded n > 1: forks and copy-on-write copies
        prompts, params = prompts[:12], SAMPLED
        expected = dict(enumerate(outputs_of(build(model, config, False), prompts, params)))
    else:
        expected = dict(enumerate(sync_outputs(model, prompts, params, config)))
    fired_any = False
    for occurrence in (1, 4):
        engine = build(model, config, True)
        for obj in (engine.model, *engine.model.layers):  # a patch a failed test left on the shared model
            obj.__dict__.pop("forward", None)
        engine.model.__dict__.pop("compute_logits", None)
        calls = {"n": 0}

        def armed() -> bool:
            calls["n"] += 1
            return calls["n"] == occurrence

        remove = inject_fault(engine, phase, armed)
        try:
            ids = engine.add_requests(prompts, params)
            outputs, failures = {}, []
            while engine.has_unfinished():
                try:
                    outputs.update({o.request_id: (o.outputs, o.finish_reasons) for o in engine.step()})
                except StepFailed as exc:
                    failures.append(exc)
        finally:
            remove()
        assert sorted(outputs) == ids and outputs == expected
        assert len(failures) == (calls["n"] >= occurrence) == engine.num_failed_steps
        for failure in failures:
            fired_any = True
            assert failure.phase == PHASES[phase] and isinstance(failure.__cause__, InjectedFault)
        assert_no_leaks(engine)
    if not fired_any:
        pytest.skip(f"{config} makes no {phase} copy")


# ----------------------------------------------------------------------------------------------
# The benchmarks' switch
# ----------------------------------------------------------------------------------------------


def test_benchmarks_record_which_mode_ran(tmp_path):
    """``bench_host --async-scheduling`` and ``bench_engine --workload nanovllm --async-scheduling both``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_engine
    import bench_host

    rec = bench_host.main(["--running", "8", "--steps", "6", "--async-scheduling", "--out", str(tmp_path / "h.json")])
    assert rec["async_scheduling"] is True and rec["running"] == 8
    argv = ["--workload", "nanovllm", "--smoke", "--num-requests", "4", "--async-scheduling", "both"]
    rec = bench_engine.main(argv + ["--out", str(tmp_path / "nv")])
    sync, overlapped = rec["engine"], rec["engine_async_scheduling"]
    assert sync["async_scheduling"] is False and overlapped["async_scheduling"] is True
    assert sync["useful_tokens"] == overlapped["useful_tokens"] == rec["workload"]["output_tokens"]
    assert overlapped["num_sync_steps"] < overlapped["num_steps"] and sync["num_sync_steps"] == sync["num_steps"]
    assert rec["yardstick"]["async_scheduling"] is False
    assert rec["yardstick_async_scheduling"]["speedup_over_sync"] == pytest.approx(
        overlapped["tokens_per_s"] / sync["tokens_per_s"]
    )
    with pytest.raises(SystemExit):  # "both" is the nanovllm workload's
        bench_engine.main(["--smoke", "--async-scheduling", "both"])


# ----------------------------------------------------------------------------------------------
# On a GPU: CUDA graphs and the device-side gather
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_async_scheduling_with_cuda_graphs_is_token_identical(prompts, params):
    model = tiny_model(device="cuda", seed=7, vocab_size=VOCAB)
    sampled = [SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=i, n=1 + i % 2) for i in range(6)]
    for config in ("hash", "chunked", "recompute", "swap", "radix"):
        runs = {}
        for async_scheduling in (False, True):
            engine = build(model, config, async_scheduling, cuda_graphs=True)
            assert engine.graphs is not None, engine.graph_error
            runs[async_scheduling] = (outputs_of(engine, prompts, params), outputs_of(engine, prompts[:6], sampled))
            assert engine.num_graph_steps > 0
            assert_no_leaks(engine)
            if async_scheduling:  # (a tight pool or a swapped sequence makes steps synchronous)
                assert engine.overlap.num_sync_steps <= (2 if config in ("hash", "chunked", "radix") else 70), config
        assert runs[True] == runs[False], config
    torch.cuda.synchronize()

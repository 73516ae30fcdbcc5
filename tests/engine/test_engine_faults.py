"""A step that fails half-way loses nothing (issue 23, item 4).

A fault is injected once, at one phase of one step -- a block copy (swap-out, copy-on-write,
swap-in; half of the batch copied, then a raise, as a copy that dies part-way), ``prepare``, the
forward pass (after the first layer has written its K/V), or sampling. The step must raise
:class:`StepFailed` naming the phase, and the engine must go on: every request finishes with the
tokens of the same run without the fault (the oracle), and no block, CPU block, pending copy or
random stream is left behind. Greedy and seeded parallel sampling (``n > 1``: the fork, the
copy-on-write of the shared tail), under preemption by recompute and by swap.
"""

from __future__ import annotations

import random

import pytest

from paged_edu.engine import Engine, StepFailed
from paged_edu.engine.faults import PHASES, InjectedFault, inject_fault
from paged_edu.engine.sampling import SamplingParams
from paged_edu.labs.engine_lab import tiny_model

VOCAB = 512


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=7, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(3)
    system = [rng.randrange(VOCAB) for _ in range(13)]  # shared, not block-aligned
    return [system + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 12))] for _ in range(4)]


CONFIGS = {
    "roomy": dict(num_blocks=64, block_size=4),
    "recompute": dict(num_blocks=10, block_size=4, preemption_mode="recompute"),
    "swap": dict(num_blocks=10, block_size=4, preemption_mode="swap", num_cpu_blocks=64),
    "chunked": dict(num_blocks=64, block_size=4, max_num_batched_tokens=8),
}
GREEDY = [SamplingParams(max_tokens=10)] * 4
SAMPLED = [SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=10 * i, n=1 + i % 3) for i in range(4)]


def inject(engine: Engine, phase: str, occurrence: int) -> dict:
    """Make ``phase`` raise once, the ``occurrence``-th time it runs (1 = the first)."""
    state = {"fired": 0, "calls": 0}

    def armed() -> bool:
        state["calls"] += 1
        if state["calls"] != occurrence:
            return False
        state["fired"] = engine.step_count + 1  # the step it fired in, plus one (0 = not yet)
        return True

    inject_fault(engine, phase, armed)
    return state


def drive(engine: Engine, prompts, params) -> tuple[dict, list[StepFailed]]:
    """Step until every request is done, retrying a step that failed; outputs by request id."""
    ids = engine.add_requests(prompts, params)
    outputs, failures = {}, []
    while engine.has_unfinished():
        try:
            done = engine.step()
        except StepFailed as exc:
            failures.append(exc)
            continue
        outputs.update({o.request_id: (o.outputs, o.finish_reasons) for o in done})
    assert sorted(outputs) == ids
    return outputs, failures


def assert_nothing_leaked(engine: Engine) -> None:
    a = engine.allocator
    assert a.num_used_blocks == 0 and a.num_free_blocks == a.num_blocks and a.seq_ids == []
    assert len(engine.scheduler.free_cpu_blocks) == engine.scheduler.num_cpu_blocks
    assert engine.runner.num_unapplied_block_ops == 0
    assert len(engine.sampler) == 0 and not engine.sampler._taken and not engine._requests


def build(model, config):
    engine = Engine(model, **CONFIGS[config])
    # a fresh model each time would be slow; undo any patch a previous test left on the shared one
    for obj in (engine.model, *engine.model.layers):
        obj.__dict__.pop("forward", None)
    engine.model.__dict__.pop("compute_logits", None)
    return engine


_reference: dict = {}


def reference(model, prompts, config, kind):
    key = (config, kind)
    if key not in _reference:
        engine = build(model, config)
        outputs, failures = drive(engine, prompts, GREEDY if kind == "greedy" else SAMPLED)
        assert not failures
        _reference[key] = (outputs, engine)
    return _reference[key][0]


def has_op(model, prompts, config, kind, phase) -> bool:
    _, engine = _reference[(config, kind)]
    counts = {
        "swap_out": engine.num_blocks_swapped_out,
        "swap_in": engine.num_blocks_swapped_in,
        "copy": engine.num_blocks_copied,
    }
    return counts.get(phase, 1) > 0


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("phase", list(PHASES))
def test_a_failed_step_is_undone_and_the_run_is_token_identical(model, prompts, config, kind, phase):
    expected = reference(model, prompts, config, kind)
    if not has_op(model, prompts, config, kind, phase):
        pytest.skip(f"{config}/{kind} makes no {phase} copy")
    for occurrence in (1, 3):
        engine = build(model, config)
        state = inject(engine, phase, occurrence)
        outputs, failures = drive(engine, prompts, GREEDY if kind == "greedy" else SAMPLED)
        if not state["fired"]:  # fewer than 3 steps make this copy
            assert occurrence > 1 and not failures and outputs == expected
            continue
        (failure,) = failures
        assert failure.phase == PHASES[phase] and isinstance(failure.__cause__, InjectedFault)
        assert failure.step == state["fired"] - 1 and failure.request_ids
        assert engine.num_failed_steps == 1
        assert outputs == expected  # every request, every sample: as if nothing had failed
        assert_nothing_leaked(engine)


def test_a_fault_that_persists_leaves_the_engine_serving_the_others(model, prompts):
    """A request that fails every step it runs in: the caller aborts it; the rest finish as without it."""
    engine = build(model, "recompute")
    expected = reference(model, prompts, "recompute", "greedy")
    ids = engine.add_requests(prompts, GREEDY)
    poison = ids[2]
    real = engine.runner.prepare

    def prepare(sched, *args):
        if any(seq.request_id == poison for seq in sched.chunk_seqs()):
            raise InjectedFault("this request's input breaks the kernel")
        return real(sched, *args)

    engine.runner.prepare = prepare
    outputs = {}
    while engine.has_unfinished():
        try:
            outputs.update({o.request_id: (o.outputs, o.finish_reasons) for o in engine.step()})
        except StepFailed as exc:
            assert poison in exc.request_ids and "retry" in str(exc)
            engine.abort_request(poison)
    assert outputs.pop(poison)[1] == ["abort"]
    assert outputs == {i: v for i, v in expected.items() if i != poison}
    assert_nothing_leaked(engine)


def test_the_sampler_gives_back_the_draws_of_a_failed_step():
    from paged_edu.engine.sampling import Sampler

    def draws(fail_after: int | None) -> list[float]:
        s = Sampler(0)
        s.add(0, SamplingParams(temperature=1.0, seed=5, n=2))
        out = []
        for k in range(Sampler.PREFETCH + 3):  # across a prefetch refill
            u = (s.uniform(0, 0), s.uniform(0, 1))
            if fail_after is not None and k == fail_after:
                s.rollback()
                continue
            s.commit()
            out.append(u)
        return out

    clean = draws(None)
    for k in (0, Sampler.PREFETCH - 1, Sampler.PREFETCH):
        assert draws(k) == clean[: Sampler.PREFETCH + 2]


# ----------------------------------------------------------------------------------------------
# Aborting a sample of n > 1 before the fork (issue 23: the request was lost, or a bare KeyError)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("aborts", [(0,), (2,), (1, 2), (0, 1, 2)])
@pytest.mark.parametrize("steps_before", [0, 2])
def test_abort_a_sample_before_a_fork_that_comes_steps_later(model, aborts, steps_before):
    """The prompt takes 4 chunked steps, so the fork comes steps after the abort: the aborted samples
    end empty, the others finish with the tokens of a run without the abort, nothing is left."""
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=1, n=3)
    prompt, other = list(range(1, 30)), list(range(40, 60))

    def run(abort: bool):
        engine = Engine(model, num_blocks=64, block_size=4, max_num_batched_tokens=8)
        ids = engine.add_requests([other, prompt], [SamplingParams(max_tokens=4), params])
        outputs = {}
        for _ in range(steps_before):
            outputs.update({o.request_id: o for o in engine.step()})
        for k in aborts if abort else ():
            done = engine.abort_request(ids[1], sample_index=k)
            assert (done is None) == (k != aborts[-1] or len(aborts) < 3)  # the last of all 3 completes it
        while engine.has_unfinished():
            outputs.update({o.request_id: o for o in engine.step()})
        assert sorted(outputs) == ids
        assert_nothing_leaked(engine)
        return outputs[ids[0]].outputs, outputs[ids[1]]

    other_clean, clean = run(False)
    other_out, out = run(True)
    assert other_out == other_clean
    for k in range(3):
        if k in aborts:
            assert out.outputs[k] == [] and out.finish_reasons[k] == "abort"
        else:
            assert out.outputs[k] == clean.outputs[k] and out.finish_reasons[k] == "length"


@pytest.mark.parametrize("aborted", [0, 1])
def test_abort_a_sample_of_a_request_that_ends_in_the_step_that_forks_it(model, aborted):
    """Found by the soak (benchmarks/soak_engine.py): with ``max_tokens=1`` the fork's step finishes
    every sample; the request ended with the first and the aborted child then raised a bare KeyError."""
    engine = Engine(model, num_blocks=64, block_size=4, max_num_batched_tokens=8)
    [rid] = engine.add_requests([list(range(1, 13))], [SamplingParams(max_tokens=1, temperature=1.0, seed=2, n=2)])
    engine.step()  # the first chunk of three: no fork yet
    assert engine.abort_request(rid, sample_index=aborted) is None
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    [out] = outputs
    assert out.finish_reasons[aborted] == "abort" and out.outputs[aborted] == []
    assert out.finish_reasons[1 - aborted] == "length" and len(out.outputs[1 - aborted]) == 1
    assert_nothing_leaked(engine)


# ----------------------------------------------------------------------------------------------
# A subscriber that calls back into the engine (issue 23: the next waiting request was dropped)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("event_kind", ["allocate", "append"])
def test_a_subscriber_that_aborts_from_inside_a_step_drops_nothing(model, prompts, event_kind):
    """A callback aborts request 1 the first time it sees ``event_kind`` (an allocator event during
    ``schedule()``); every other request ends as in a run without it. (The engine's own events come
    after the step's state is committed: an abort from them runs at once, see test_engine.py.)"""
    expected = reference(model, prompts, "recompute", "greedy")
    engine = build(model, "recompute")
    ids = engine.add_requests(prompts, GREEDY)
    calls = []

    def callback(event):
        if event.kind == event_kind and not calls:
            calls.append(engine.abort_request(ids[1]))  # deferred: None now, the request ends after the step
            with pytest.raises(RuntimeError, match="inside a step"):
                engine.add_request(prompts[0], GREEDY[0])
            with pytest.raises(RuntimeError, match="inside a step"):
                engine.step()

    engine.allocator.subscribe(callback)
    outputs = {}
    while engine.has_unfinished():
        outputs.update({o.request_id: (o.outputs, o.finish_reasons) for o in engine.step()})
    assert calls == [None]
    assert outputs.pop(ids[1])[1] == ["abort"]
    assert outputs == {i: v for i, v in expected.items() if i != ids[1]}
    assert not engine.subscriber_errors  # (a failed pytest.raises in an allocator callback is not isolated)
    assert_nothing_leaked(engine)


# ----------------------------------------------------------------------------------------------
# A block copy that fails forever: the error names its owner, an abort unwedges the engine
# ----------------------------------------------------------------------------------------------


def owners_of(engine: Engine, kind: str, pairs) -> set[int]:
    """The requests whose blocks ``pairs`` write, read off the allocator's tables and the swap space
    (a copy or swap-in writes a GPU block of a running sequence; a swap-out a CPU block of a swapped one)."""
    s = engine.scheduler
    if kind == "swap_out":
        holders = [(q, s.swap_space.blocks_of(q.seq_id)) for q in s.swapped]
    else:
        holders = [(q, engine.allocator.block_table(q.seq_id)) for q in s.running]
    return {q.request_id for _, dst in pairs for q, blocks in holders if dst in blocks}


PERSISTENT = {  # the copy kind -> a configuration and requests that make it
    "copy": ("roomy", SAMPLED),  # n > 1: the fork's copy-on-write copies
    "swap_out": ("swap", GREEDY),
    "swap_in": ("swap", GREEDY),
}


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("kind", list(PERSISTENT))
def test_a_copy_that_always_fails_names_its_owner_and_an_abort_unwedges_the_engine(
    model, prompts, kind, async_scheduling
):
    """One pair fails every time it is copied. StepFailed names the requests whose blocks the failing
    copy writes (the retry goes pair by pair: then exactly the pair's owner), not every request of
    the step; aborting them drops their queued copies: the others finish as without the fault, a new
    request is served token for token as by a fault-free engine, and nothing is left behind."""
    from paged_edu.engine.faults import inject_persistent_copy_fault

    config, params = PERSISTENT[kind]
    expected = reference(model, prompts, config, "greedy" if params is GREEDY else "sampled")
    engine = Engine(model, **CONFIGS[config], async_scheduling=async_scheduling)
    state, remove = inject_persistent_copy_fault(engine, kind)
    try:
        ids = engine.add_requests(prompts, params)
        outputs, aborted, failures = {}, set(), []
        while engine.has_unfinished():
            try:
                outputs.update({o.request_id: (o.outputs, o.finish_reasons) for o in engine.step()})
            except StepFailed as exc:
                failures.append(exc)
                assert exc.phase == "block copies" and isinstance(exc.__cause__, InjectedFault)
                assert set(exc.request_ids) == owners_of(engine, kind, state["batches"][-1]) != set()
                if len(state["batches"][-1]) == 1:  # retried alone: the pair's owner, and only it
                    assert len(exc.request_ids) == 1
                if len(failures) == 1:
                    continue  # a fault may pass: retry once first
                for rid in exc.request_ids:
                    if rid not in aborted:
                        aborted.add(rid)
                        out = engine.abort_request(rid)
                        if out is not None:
                            outputs[rid] = (out.outputs, out.finish_reasons)
                assert len(failures) < 20, "the engine stays wedged"
        for out in engine.step():  # (aborted requests are reported by the next step too)
            outputs[out.request_id] = (out.outputs, out.finish_reasons)
        assert failures and aborted and len(aborted) < len(ids)  # not every request of the step
        assert sorted(outputs) == ids
        assert {i: v for i, v in outputs.items() if i not in aborted} == {
            i: v for i, v in expected.items() if i not in aborted
        }
        assert_nothing_leaked(engine)
        new = [5, 6, 7, 8, 9, 10, 11]
        want = Engine(model, **CONFIGS[config]).generate([new], max_new_tokens=6)
        assert engine.generate([new], max_new_tokens=6) == want  # served, with the fault still there
        assert_nothing_leaked(engine)
    finally:
        remove()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_reset_empties_an_engine_mid_run_and_it_serves_again(model, prompts, async_scheduling):
    """``Engine.reset()``: every live request ended as an abort (returned), no queued copy, no step in
    flight, no cached block; the next requests get a fresh engine's tokens."""
    from paged_edu.engine.faults import inject_persistent_copy_fault

    engine = Engine(model, **CONFIGS["roomy"], async_scheduling=async_scheduling)
    state, remove = inject_persistent_copy_fault(engine, "copy")
    ids = engine.add_requests(prompts, SAMPLED)
    with pytest.raises(StepFailed):
        for _ in range(100):  # the fork's copy-on-write copy comes within a few steps
            engine.step()
    assert engine.runner.num_unapplied_block_ops > 0
    remove()
    ended = engine.reset()
    assert sorted(o.request_id for o in ended) == ids
    assert all(r == "abort" for o in ended for r in o.finish_reasons)
    assert engine.overlap is None or engine.overlap.in_flight is None
    assert engine.allocator.num_cached_blocks == 0 and engine.step() == []
    assert_nothing_leaked(engine)
    fresh = Engine(model, **CONFIGS["roomy"])
    assert [o.outputs for o in engine.run(prompts, SAMPLED)] == [o.outputs for o in fresh.run(prompts, SAMPLED)]
    assert_nothing_leaked(engine)


def test_a_failure_no_request_owns_says_so():
    from paged_edu.engine import StepFailed as Failed

    err = Failed(7, "block copies", [], RuntimeError("device lost"))
    assert err.request_ids == [] and "reset()" in str(err) and "no live request" in str(err)
    assert "abort_request" in str(Failed(7, "forward", [3], RuntimeError("x")))

"""A timed engine run (paged_edu.labs.timed_run): what bench_engine and the speed ladder both time with.

Oracles: an untimed engine on the same requests (the same schedule, step by step), the steps classified
and priced here by hand (prompt tokens and decodes per step, the cost model on each step's chunks,
duration less device wait), and a stand-in compile counter whose count jumps at a known step.
"""

from __future__ import annotations

import numpy as np
import pytest

from paged_edu.cache.sizing import dtype_name
from paged_edu.core.hardware import GPUS
from paged_edu.engine import Engine, SamplingParams, StepMetrics
from paged_edu.labs import timed_run as tr
from paged_edu.labs.batching import sharegpt_requests
from paged_edu.labs.engine_lab import tiny_model
from paged_edu.sim.costmodel import CostModel, StepShape

KW = dict(num_blocks=256, block_size=16, max_num_seqs=4, max_num_batched_tokens=48)


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(seed=0)
    prompts, outputs = sharegpt_requests(6, 0, model.config.vocab_size, 0.05)
    return model, prompts, outputs


def _untimed_steps(model, prompts, outputs) -> list[StepMetrics]:
    engine = Engine(model, **KW)
    steps: list[StepMetrics] = []
    engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepMetrics) and e.num_batched_tokens else None)
    engine.run(prompts, [SamplingParams(max_tokens=o) for o in outputs], use_tqdm=False)
    return steps


def test_the_timed_run_serves_the_schedule_of_an_untimed_one(setup):
    model, prompts, outputs = setup
    run = tr.timed_run(model, prompts, outputs, KW)
    expected = _untimed_steps(model, prompts, outputs)
    key = lambda m: (m.step, m.num_prefill_tokens, m.num_decode_seqs, m.chunk_starts, m.chunk_counts)  # noqa: E731
    assert [key(m) for m in run.steps] == [key(m) for m in expected]
    assert run.useful_tokens == sum(outputs) and run.tokens_per_s == pytest.approx(sum(outputs) / run.seconds)
    assert (run.triton_variants_compiled_in_window, run.graph_captures_in_window) == (0, 0)
    assert run.compiled is None  # not counted per step unless asked
    decode = [m.num_prefill_tokens == 0 for m in expected]
    mixed = [m.num_prefill_tokens > 0 and m.num_decode_seqs > 0 for m in expected]
    assert run.decode.tolist() == decode and run.mixed.tolist() == mixed
    assert any(decode) and any(mixed) and not all(d or x for d, x in zip(decode, mixed))  # a prefill-only step too


def test_step_speed_prices_the_same_steps_by_hand(setup):
    model, prompts, outputs = setup
    run = tr.timed_run(model, prompts, outputs, KW)
    spec = model.config.geometry(dtype_name(model.dtype))
    speed = tr.step_speed(run, tr.roofline_model(spec), roofline_gpus=("a100-80gb",))
    by_hand = CostModel(model=spec, gpu=GPUS["h200"]).roofline()
    roof = [by_hand.step_time(StepShape.of_chunks(m.chunk_starts, m.chunk_counts, m.num_emitting)) for m in run.steps]
    decode = [m for m, r in zip(run.steps, roof) if m.num_prefill_tokens == 0]
    assert speed["roofline_decode_step_ms"] == round(
        1e3 * float(np.mean([r for m, r in zip(run.steps, roof) if m.num_prefill_tokens == 0])), 4
    )
    assert speed["roofline_run_s"] == round(sum(roof), 4) and speed["roofline_gpu"] == GPUS["h200"].name
    assert speed["mean_decode_step_ms"] == round(1e3 * float(np.mean([m.duration for m in decode])), 4)
    assert speed["host_ms_per_decode_step"] == round(
        1e3 * float(np.mean([m.duration - m.device_wait for m in decode])), 4
    )
    assert (speed["num_decode_steps"], speed["num_mixed_steps"]) == (len(decode), int(run.mixed.sum()))
    a100 = CostModel(model=spec, gpu=GPUS["a100-80gb"]).roofline()
    assert speed["roofline_run_s_by_gpu"]["a100-80gb"] == pytest.approx(sum(a100.step_time(m.shape) for m in run.steps))
    assert speed["steps_that_compiled"] is None  # (not counted per step)
    rows = speed["decode_by_concurrency"]  # KW's 4 sequences at most: one group, every decode step
    assert [r["num_seqs"] for r in rows] == ["1-63"] and rows[0]["steps"] == len(decode)
    assert rows[0]["host_ms"] == speed["host_ms_per_decode_step"] and rows[0]["step_ms"] == speed["mean_decode_step_ms"]


def test_by_concurrency_groups_steps_by_sequences_decoded():
    num_seqs = np.array([1, 63, 64, 300, 512, 200, 7])
    mask = np.array([True, True, True, True, True, False, True])
    t = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 9.0]) * 1e-3  # seconds
    rows = tr.by_concurrency(num_seqs, mask, host=t)
    assert rows == [
        dict(num_seqs="1-63", steps=3, host_ms=4.0),  # 1, 2 and 9 ms; 63 is in the first group, 64 is not
        dict(num_seqs="64-127", steps=1, host_ms=3.0),
        dict(num_seqs="256-383", steps=1, host_ms=4.0),  # 200 (masked out) leaves 128-255 empty: no row
        dict(num_seqs="384-512", steps=1, host_ms=5.0),
    ]
    assert tr.near_running(np.array([223, 224, 256, 288, 289])).tolist() == [False, True, True, True, False]


def test_a_compile_inside_the_window_is_booked_to_its_step(setup, monkeypatch):
    """A stand-in counter whose count jumps at the read after the first mixed step k (the first read is
    before the window, then one after each step: read k + 2)."""
    model, prompts, outputs = setup
    k = next(
        i for i, m in enumerate(_untimed_steps(model, prompts, outputs)) if m.num_prefill_tokens and m.num_decode_seqs
    )

    def counter():  # (timed_run makes one after its warm-up)
        reads = []

        def count():
            reads.append(1)
            return int(len(reads) >= k + 2)

        return count

    monkeypatch.setattr(tr, "compiled_variant_counter", counter)
    run = tr.timed_run(model, prompts, outputs, KW, count_compiles_per_step=True)
    assert np.flatnonzero(run.compiled).tolist() == [k] and run.triton_variants_compiled_in_window == 1
    speed = tr.step_speed(run, tr.roofline_model(model.config.geometry("fp32")))
    assert (speed["steps_that_compiled"], speed["mixed_steps_that_compiled"]) == (1, 1)
    others = [m.duration for i, m in enumerate(run.steps) if run.mixed[i] and i != k]
    assert speed["mean_mixed_step_ms_without_compiles"] == round(1e3 * float(np.mean(others)), 4)


def test_without_per_step_counting_the_window_reads_the_counter_only_at_its_ends(setup, monkeypatch):
    model, prompts, outputs = setup
    reads = []
    monkeypatch.setattr(tr, "compiled_variant_counter", lambda: lambda: reads.append(1) or len(reads))
    run = tr.timed_run(model, prompts, outputs, KW)
    assert len(reads) == 2 and run.triton_variants_compiled_in_window == 1  # before and after: 2 - 1


def test_the_timeline_run_sees_the_timed_runs_steps(setup):
    model, prompts, outputs = setup
    run = tr.timed_run(model, prompts, outputs, KW, record_timeline=True)
    assert [r.step for r in run.engine.timeline] == [m.step for m in run.steps]
    out = tr.timeline_run(model, prompts, outputs, KW, timed_tokens_per_s=1000.0)
    assert (out["num_steps"], out["num_decode_steps"]) == (len(run.steps), int(run.decode.sum()))
    assert out["tokens_per_s_vs_timed_run"] == pytest.approx(out["tokens_per_s"] / 1000.0)


def test_a_timed_run_without_a_timeline_has_none_to_read(setup):
    model, prompts, outputs = setup
    with pytest.raises(RuntimeError, match="records no timeline"):
        tr.timed_run(model, prompts[:2], outputs[:2], KW).engine.timeline


def test_frozen_heap_freezes_inside_and_always_unfreezes():
    import gc

    from paged_edu.labs.timing import frozen_heap

    assert gc.get_freeze_count() == 0
    with frozen_heap():
        assert gc.get_freeze_count() > 0  # the heap alive at entry: never rescanned inside
    assert gc.get_freeze_count() == 0
    with pytest.raises(KeyError), frozen_heap():
        raise KeyError("a failing run")
    assert gc.get_freeze_count() == 0

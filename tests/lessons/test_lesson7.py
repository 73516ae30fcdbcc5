"""Lesson 7: the benchmark table, the per-block kernel cost, the simulator explorer, exercises 7.1-7.3."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest

from paged_edu.core.memory import eta_paged_bound
from paged_edu.labs import benchmark_table as bt
from paged_edu.lessons import exercises as ex
from paged_edu.lessons.exercises import lesson7 as ex7
from paged_edu.sim import workloads
from paged_edu.sim.block_cost import fit_per_block_cost
from paged_edu.sim.costmodel import CostModel, StepShape
from paged_edu.sim.results import SimConfig
from paged_edu.sim.simulator import simulate


@pytest.fixture(scope="module")
def table():
    return {r.config.label: r for r in bt.benchmark_table("sharegpt", 120, rate=3.0, seed=0)}


def test_table_cells_against_the_simulator_and_the_bounds(table):
    reqs = bt.workload("sharegpt", 120, 3.0, 0)
    stored = [s - 1 for s in bt.final_lengths(reqs)]
    assert table["contiguous-max"].kv_utilization_final == pytest.approx(
        bt.contiguous_max_utilization(stored), abs=1e-12
    )
    for b in (8, 16, 32, 64, 128):
        res = table[f"paged B={b}"]
        for req in res.requests:
            for tokens, held in zip(req.stored_tokens, req.held_slots):
                assert tokens / held >= eta_paged_bound(tokens, b) - 1e-12
        # A cell is the simulator's record, re-run independently.
        again = simulate(reqs, SimConfig(manager="paged", block_size=b), bt.paper_cost_model()).record()
        assert again["ttft_p99_s"] == res.record()["ttft_p99_s"]
    rows = {r["configuration"]: r for r in bt.table_rows(list(table.values()))}
    assert rows["paged B=16"]["memory efficiency"] == f"{table['paged B=16'].kv_utilization:.1%}"
    # Paging holds more tokens per slot and serves faster than every contiguous reservation here.
    for m in ("contiguous-max", "contiguous-pow2", "contiguous-oracle"):
        assert table["paged B=16"].kv_utilization > table[m].kv_utilization
    assert table["contiguous-max"].kv_utilization < 0.3


def _shape(b, context=512, seqs=32):
    s = StepShape()
    for _ in range(seqs):
        s.add(context, 1, True)
    s.num_blocks_read = seqs * math.ceil((context + 1) / b)
    return s


def test_per_block_cost_default_off_leaves_results_unchanged():
    cost = CostModel()
    assert cost.per_block_s == 0
    reqs = workloads.sharegpt(60, 2.0, 0)
    a = simulate(reqs, SimConfig(block_size=8), cost).record()
    b = simulate(reqs, SimConfig(block_size=8), replace(cost, per_block_s=0.0)).record()
    for key in ("makespan_s", "ttft_p99_s", "num_steps", "preemptions"):
        assert a[key] == b[key]
    # With the cost off, the block count in a shape changes nothing.
    assert cost.step_time(_shape(8)) == cost.step_time(_shape(128))


def test_per_block_cost_on_makes_small_blocks_slower():
    cost = replace(CostModel(), per_block_s=1e-9)
    assert cost.step_time(_shape(8)) > cost.step_time(_shape(16)) > cost.step_time(_shape(128))
    extra = cost.step_time(_shape(8)) - CostModel().step_time(_shape(8))
    m = cost.model
    assert extra == pytest.approx(1e-9 * m.num_layers * m.num_kv_heads * _shape(8).num_blocks_read)
    rows = bt.block_size_sweep("sharegpt", 80, math.inf, 0, per_block_s=2e-9)
    on = [r["latency_on_s"] - r["latency_off_s"] for r in rows]
    assert all(d > 0 for d in on) and on[0] > on[-1]
    with pytest.raises(ValueError, match="per_block_s"):
        CostModel(per_block_s=-1.0)


def test_per_block_fit_recovers_a_planted_cost():
    def bench(per_block, fixed):
        cases = []
        for n, s in ((1, 8192), (8, 2048), (64, 4096), (16, 32768)):
            blocks = n * math.ceil(s / 16) * 8
            ceiling = 1e-3 * n * s
            cases.append(
                {
                    "case": f"{n}x{s}",
                    "num_seqs": n,
                    "seq_len": s,
                    "ceiling_us": ceiling,
                    "impls": {"triton": {"us": ceiling / 2 + fixed + per_block * blocks * 1e6}},
                }
            )
        return {"geometry": {"block_size": 16, "num_kv_heads": 8}, "cases": cases}

    fit = fit_per_block_cost(bench(3e-10, 5.0))
    assert fit.per_block_s == pytest.approx(3e-10, rel=1e-6) and fit.fixed_s == pytest.approx(5e-6, rel=1e-6)
    assert bt.kernel_block_fit().per_block_s >= 0
    with pytest.raises(ValueError, match="at least 2"):
        fit_per_block_cost({"geometry": {"block_size": 16, "num_kv_heads": 8}, "cases": []})


def test_explorer_callbacks_redraw():
    from paged_edu.viz.sim_explorer import SimExplorer

    e = SimExplorer(num_requests=60, seed=0)
    first = (tuple(e.memory.data[0].x), tuple(e.ttft.data[0].y), e.summary.value)
    e.manager.value = "contiguous-max"
    assert e.result.config.manager == "contiguous-max"
    assert tuple(e.memory.data[0].x) != first[0] and e.summary.value != first[2]
    assert e.memory.data[0].x[0] == pytest.approx(100 * e.result.breakdown_fractions()["token_states"])
    e.manager.value = "paged"
    e.block_size.value = 128
    assert e.result.config.block_size == 128
    before = e.result.record()["makespan_s"]
    e.rate.value = 0.5
    assert e.result.record()["makespan_s"] != before
    e.dataset.value = "alpaca"
    assert max(r.prompt_len for r in e.result.requests) < 400
    e.gpu.value = "h200"
    assert e.result.num_kv_slots > bt.paper_cost_model("a100-40gb").kv_capacity_tokens()
    assert sorted(e.ttft.data[0].y) == list(e.ttft.data[0].y)
    assert e.widget() is not None


def test_exercise_7_1_right_and_wrong():
    assert ex.check("7.1", ex.reference("7.1"))
    lengths = ex7.lengths()
    assert ex.check("7.1", sum(lengths) / (len(lengths) * 2048))
    prompts, outputs = ex7._prompts_outputs()
    v = ex.check("7.1", sum(prompts) / (len(prompts) * 2048))
    assert not v and "prompts only" in str(v)
    v = ex.check("7.1", 100 * ex.reference("7.1"))
    assert not v and "percentage" in str(v)


def test_exercise_7_2_right_and_wrong():
    right = ex.reference("7.2")()
    assert right["paged"] is not None and right["contiguous-max"] is not None
    assert right["contiguous-max"] < right["paged"]
    assert ex.check("7.2", dict(right))
    v = ex.check("7.2", {"paged": right["contiguous-max"], "contiguous-max": right["paged"]})
    assert not v and "swapped" in str(v)
    v = ex.check("7.2", {"paged": right["paged"], "contiguous-max": 4.0})
    assert not v and "contiguous-max" in str(v)
    assert not ex.check("7.2", [1, 2])


def test_exercise_7_3_right_and_wrong():
    lengths = ex7.lengths()
    assert ex.check("7.3", 2048 / (sum(math.ceil(s / 16) * 16 for s in lengths) / len(lengths)))
    v = ex.check("7.3", 2048 * len(lengths) / sum(lengths))
    assert not v and "rounding" in str(v)
    v = ex.check("7.3", 1 / ex.reference("7.3"))
    assert not v and "inverted" in str(v)
    assert bt.simulated_batch_ratio(bt.workload("sharegpt", 120, math.inf, 0), bt.paper_cost_model()) > 1


def test_sim_vs_real_same_schedule():
    torch = pytest.importorskip("torch")
    from paged_edu.labs.engine_lab import tiny_model
    from paged_edu.labs.sim_vs_real import error_table, sim_vs_real

    torch.set_num_threads(1)
    r = sim_vs_real(tiny_model(), num_requests=8, num_blocks=12, max_num_seqs=8)
    assert r["measured"]["num_steps"] == r["simulated"]["num_steps"]
    assert r["measured"]["preemptions"] == r["simulated"]["preemptions"]
    assert r["simulated"]["tokens_per_s"] > 0 and "tokens_per_s" in error_table(r)


def test_sim_vs_real_tests_the_fit_on_another_trace():
    """Issue 21: the fit is judged on a trace it was not fitted on, and stated without a GPU's constants."""
    torch = pytest.importorskip("torch")
    from paged_edu.labs.engine_lab import tiny_model
    from paged_edu.labs.sim_vs_real import describe_fit, sim_vs_real

    torch.set_num_threads(1)
    r = sim_vs_real(tiny_model(), num_requests=6, num_blocks=12, max_num_seqs=8, seed=0)
    assert (r["seed"], r["fit_seed"]) == (0, 1) and r["fit_steps"] >= 3
    text = describe_fit(r["cost"])
    assert "TFLOP/s" not in text and "x 0.00" not in text and "GFLOP/s" in text
    with pytest.raises(ValueError, match="another trace"):
        sim_vs_real(tiny_model(), num_requests=6, seed=2, fit_seed=2)


@pytest.mark.gpu
def test_sim_vs_real_on_a_gpu_fits_warm_steps():
    """On a GPU the first run compiles the Triton kernels; the lesson's fit must see warm steps only
    (the first H200 run, before the untimed warm-up, fitted 17 ms of overhead to 1.5 s of steps)."""
    torch = pytest.importorskip("torch")
    from paged_edu.labs.engine_lab import tiny_model
    from paged_edu.labs.sim_vs_real import sim_vs_real

    r = sim_vs_real(tiny_model("cuda", torch.bfloat16), num_requests=24)
    assert r["measured"]["num_steps"] == r["simulated"]["num_steps"]
    # Bounds a busy host's noise does not cross, which a cold fit misses many times over. On the H200
    # (benchmarks/records/h200/sim_vs_real_probe_0298cf0.txt): warm, the fitted overhead was 0.3-0.6 of the median
    # step, the median step error 0.25-0.58 (0.62 in a whole GPU suite run, which failed the bound of 0.5
    # this test had), the throughput ratio 0.86-1.10 -- and 6.2 in the first run on an empty Triton cache,
    # whose measured trace was not warmed then (sim_vs_real warms both traces now); with the warm-up
    # removed and an empty cache: an overhead 68 times the median step, a median error of 105, a ratio of 0.05.
    median_step = statistics.median(r["step_durations"])
    assert r["cost"].step_overhead_s < 5 * median_step, (r["cost"].step_overhead_s, median_step)
    assert r["step_rel_error_p50"] < 1.0, r["step_rel_error_p50"]
    assert 0.5 < r["simulated"]["tokens_per_s"] / r["measured"]["tokens_per_s"] < 2.0

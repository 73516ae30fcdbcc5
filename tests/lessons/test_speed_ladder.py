"""Lesson 9's library: the speed ladder (paged_edu.labs.speed_ladder), its benchmark, its views and its
exercises.

Oracles: the engine's own StepMetrics (a rung's tokens and steps), the cost model priced here by hand
(the roofline of the same steps), a pipeline simulated step by step (overlap costs max, synchronous
sum), and the stored H200 records read directly (the exercises' tempting wrong answers).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from paged_edu import data
from paged_edu.labs import speed_ladder as sl
from paged_edu.labs.batching import sharegpt_requests
from paged_edu.labs.engine_lab import tiny_model
from paged_edu.lessons import exercises as ex

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ladder():
    model = tiny_model(seed=0)
    prompts, outputs = sharegpt_requests(6, 0, model.config.vocab_size, 0.05)
    kw = dict(num_blocks=256, block_size=16, max_num_seqs=8, max_num_batched_tokens=64)
    return model, prompts, outputs, sl.run_ladder(model, prompts, outputs, kw, window=8)


def test_the_rungs_in_order_and_what_a_cpu_can_run():
    assert [name for name, _ in sl.RUNGS] == [
        "eager",
        "+ CUDA graphs",
        "+ fused kernels",
        "+ overlap",
        "+ graphs for mixed steps",
    ]
    kws = [kw for _, kw in sl.RUNGS]
    for before, after in zip(kws, kws[1:]):  # each rung adds to (or changes one option of) the one before
        assert len(set(after.items()) - set(before.items())) == 1
    assert sl.rung_blocker(kws[0], "cpu") is None
    assert "CUDA" in sl.rung_blocker(kws[1], "cpu") and "CUDA" in sl.rung_blocker(
        kws[2] | {"cuda_graphs": False}, "cpu"
    )
    assert sl.rung_blocker(kws[3], "cuda") is None
    assert "no option bogus" in sl.rung_blocker({"bogus": 1}, "cuda")


def test_the_ladder_on_a_cpu(ladder):
    model, prompts, outputs, rungs = ladder
    assert [r["rung"] for r in rungs] == [n for n, _ in sl.RUNGS]
    eager, *rest = rungs
    assert all("skipped" in r for r in rest) and "skipped" not in eager
    assert eager["useful_tokens"] == sum(outputs)
    assert eager["tokens_per_s"] == pytest.approx(eager["useful_tokens"] / eager["wall_s"])
    assert eager["num_decode_steps"] + eager["num_mixed_steps"] <= eager["num_steps"]
    assert eager["forward_modes"] == {"eager": eager["num_steps"]}
    json.dumps(rungs)  # JSON-able as it is
    # The roofline of the steps, priced by hand: the cost model's roofline on each step's chunks.
    from paged_edu.cache.sizing import dtype_name
    from paged_edu.core.hardware import GPUS
    from paged_edu.sim.costmodel import CostModel

    cost = CostModel(model=model.config.geometry(dtype_name(model.dtype)), gpu=GPUS["h200"])
    assert cost.roofline().compute_efficiency == 1.0 and eager["roofline_gpu"] == GPUS["h200"].name
    assert eager["roofline_tokens_per_s"] == pytest.approx(eager["useful_tokens"] / eager["roofline_run_s"])
    steps = eager["steps"]
    assert len(steps["step"]) == len(steps["duration_ms"]) == len(steps["roofline_ms"]) <= 400
    assert all(d > 0 and r > 0 for d, r in zip(steps["duration_ms"], steps["roofline_ms"]))
    window = eager["window"]
    assert 0 < len(window) <= 8
    for w in window:
        assert w["host_ms"][0] <= w["device_ms"][0] <= w["device_ms"][1] <= w["host_ms"][1]
    for a, b in zip(window, window[1:]):
        assert a["device_ms"][1] <= b["device_ms"][0] and b["step"] == a["step"] + 1
    assert "skipped" in sl.rung_table(rungs) and "| eager |" in sl.rung_table(rungs)


def test_bench_ladder_on_a_cpu_writes_its_record(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_ladder import main

    argv = ["--device", "cpu", "--num-requests", "4", "--out", str(tmp_path / "ladder")]
    rec = main(argv)
    assert json.loads((tmp_path / "ladder.json").read_text()) == json.loads(json.dumps(rec))
    assert rec["command"] == "python benchmarks/bench_ladder.py " + " ".join(argv)
    assert rec["device_name"] == "cpu" and rec["workload"]["num_requests"] == 4
    assert rec["rungs"][0]["useful_tokens"] == rec["workload"]["output_tokens"]


def test_no_stored_ladder_until_the_h200_writes_it(monkeypatch):
    assert sl.load_stored_ladder("no_such_ladder.json") is None
    assert sl.load_stored_ladder("engine_bench.json")["engine"]  # a stored file is read as it is
    monkeypatch.setattr(sl, "load_stored_ladder", lambda name=sl.STORED_LADDER: None)
    split = sl.stored_decode_split()
    engine = data.load_json("engine_bench.json")["engine"]
    assert (split["host_ms"], split["device_ms"]) == (
        engine["host_ms_per_decode_step"],
        engine["device_wait_ms_per_decode_step"],
    )
    assert split["overlap_step_ms"] is None and "engine_bench.json" in split["source"]


def test_a_stored_ladder_feeds_the_prediction(monkeypatch, ladder):
    *_, rungs = ladder
    fused = dict(rungs[0], rung="+ fused kernels", host_ms_per_decode_step=0.5, device_ms_per_decode_step=1.5)
    overlap = dict(rungs[0], rung="+ overlap", mean_decode_step_ms=1.6)
    stored = dict(command="python benchmarks/bench_ladder.py", commit="abc", rungs=[rungs[0], fused, overlap])
    monkeypatch.setattr(sl, "load_stored_ladder", lambda name=sl.STORED_LADDER: stored)
    split = sl.stored_decode_split()
    assert (split["host_ms"], split["device_ms"], split["overlap_step_ms"]) == (0.5, 1.5, 1.6)
    assert ex.check("9.1", 1.5) and not ex.check("9.1", 2.0)


@pytest.mark.parametrize("host, device", [(1.0, 3.0), (3.0, 1.0), (2.0, 2.0), (0.0, 1.5)])
def test_overlap_costs_the_max_and_synchronous_the_sum(host, device):
    n = 20
    sync = sl.overlap_schedule(host, device, n, overlap=False)
    over = sl.overlap_schedule(host, device, n, overlap=True)
    assert sync[-1]["device"][1] == pytest.approx(n * (host + device))
    # Steady state: after the pipeline fills, one step per max(host, device).
    period = over[-1]["device"][1] - over[-2]["device"][1]
    assert period == pytest.approx(max(host, device))
    for s in over:  # a step's device work never starts before its launch, and one step at a time
        assert s["device"][0] >= s["host"][1] - 1e-12
    for a, b in zip(over, over[1:]):
        assert b["device"][0] >= a["device"][1] - 1e-12
    for k in range(2, n):  # never more than one step ahead: step k's host waits for step k-2's tokens
        assert over[k]["host"][0] >= over[k - 2]["device"][1] - 1e-12
    with pytest.raises(ValueError, match="num_steps"):
        sl.overlap_schedule(1.0, 1.0, 0, overlap=True)


def test_the_overlap_explorer_redraws_from_a_preset():
    from paged_edu.viz.overlap_explorer import OverlapExplorer

    e = OverlapExplorer({"a": (1.0, 2.0), "b": (3.0, 0.5)}, num_steps=4)
    assert e.fig.data[1].base[-1] == pytest.approx(3 * 3.0 + 1.0)  # synchronous device bar of step 3
    e.preset.value = "b"
    assert (e.host.value, e.device.value) == (3.0, 0.5)
    assert e.fig.data[0].base[-1] == pytest.approx(3 * 3.5)  # synchronous host of step 3: 3 steps of 3.5 ms
    assert "max = 3.00 ms" in e.fig.layout.title.text
    with pytest.raises(ValueError, match="at least one"):
        OverlapExplorer({})


# -- exercises 9.1-9.3: tempting wrong answers computed here, from the stored records ------------------


def _split():
    stored = sl.load_stored_ladder()
    if stored is None:
        e = data.load_json("engine_bench.json")["engine"]
        return e["host_ms_per_decode_step"], e["device_wait_ms_per_decode_step"]
    fused = next(r for r in stored["rungs"] if r["rung"] == "+ fused kernels")
    return fused["host_ms_per_decode_step"], fused["device_ms_per_decode_step"]


def test_9_1_refuses_the_sum_and_the_min():
    host, device = _split()
    assert ex.check("9.1", max(host, device))
    assert "the sum" in str(ex.check("9.1", host + device))
    assert "the shorter" in str(ex.check("9.1", min(host, device)))


def test_9_2_refuses_the_weights_alone_and_85_percent():
    from paged_edu.core.hardware import GPUS, MODELS

    m, bw = MODELS["smollm2-135m"], GPUS["h200"].hbm_bandwidth
    head = 576 * 49152 * 2  # the tied embedding matrix, bf16
    kv = 256 * 513 * (2 * 30 * 3 * 64 * 2)  # 256 sequences x (512 + 1) tokens x K and V of 30 layers x 3 heads x 64
    right = 1e3 * (m.matmul_weight_bytes + head + kv) / bw
    assert ex.check("9.2", right)
    assert ex.check("9.2", float(f"{right:.3g}"))
    assert "the weights only" in str(ex.check("9.2", 1e3 * (m.matmul_weight_bytes + head) / bw))
    assert "85 %" in str(ex.check("9.2", float(f"{right / 0.85:.4g}")))
    assert "without the LM head" in str(ex.check("9.2", float(f"{1e3 * (m.matmul_weight_bytes + kv) / bw:.4g}")))


def test_9_3_refuses_the_unfused_kernels_and_wall_time():
    row = next(r for r in data.load_json("layer_bench.json")["rows"] if r["batch"] == 1)
    fused, unfused = row["fused_profile"], row["unfused_profile"]
    assert ex.check("9.3", fused["gpu_busy_us"] / fused["kernels_per_step"])
    assert "unfused" in str(ex.check("9.3", unfused["gpu_busy_us"] / unfused["kernels_per_step"]))
    assert "wall time" in str(ex.check("9.3", row["fused_us"] / fused["kernels_per_step"]))
    assert not ex.check("9.3", math.nan)


@pytest.mark.gpu
def test_gpu_ladder_runs_every_rung_this_engine_has():
    """On CUDA every rung runs on the same requests with every token; the graph rungs replay decode graphs,
    the eager rung none; the last rung replays mixed-step graphs."""
    import torch

    model = tiny_model("cuda", torch.bfloat16, seed=0)
    prompts, outputs = sharegpt_requests(32, 0, model.config.vocab_size, 0.1)
    kw = dict(num_blocks=1024, block_size=16, max_num_seqs=64, max_num_batched_tokens=512)
    by = {r["rung"]: r for r in sl.run_ladder(model, prompts, outputs, kw)}
    for name in ("eager", "+ CUDA graphs", "+ fused kernels", "+ overlap"):
        assert "skipped" not in by[name] and by[name]["useful_tokens"] == sum(outputs), name
    assert "graph" not in by["eager"]["forward_modes"]
    assert by["+ CUDA graphs"]["forward_modes"].get("graph", 0) > 0
    mixed = by["+ graphs for mixed steps"]
    assert mixed["forward_modes"].get("mixed graph", 0) > 0, mixed["forward_modes"]


def test_a_rung_whose_timeline_misses_a_step_is_refused(monkeypatch):
    """The ladder's guard: the timeline and the step metrics must list the same steps."""
    from paged_edu.engine.timeline import Timeline

    real = Timeline.close

    def close_but_skip_step_2(self, step, *args):
        if step == 2:
            return self.discard()
        return real(self, step, *args)

    monkeypatch.setattr(Timeline, "close", close_but_skip_step_2)
    model = tiny_model(seed=0)
    prompts, outputs = sharegpt_requests(4, 0, model.config.vocab_size, 0.05)
    kw = dict(num_blocks=128, block_size=16, max_num_seqs=8, max_num_batched_tokens=64)
    with pytest.raises(RuntimeError, match="a step is missing"):
        sl.run_rung(model, prompts, outputs, dict(sl.RUNGS[0][1]), kw)


def test_a_stored_ladder_without_its_fused_rung_falls_back(monkeypatch, ladder):
    *_, rungs = ladder
    stored = dict(command="c", commit="x", rungs=[rungs[0], dict(rung="+ fused kernels", skipped="failed")])
    monkeypatch.setattr(sl, "load_stored_ladder", lambda name=sl.STORED_LADDER: stored)
    assert "engine_bench.json" in sl.stored_decode_split()["source"]

"""Lesson 9's library: the speed ladder (paged_edu.labs.speed_ladder), its benchmark, the step-timeline
model (paged_edu.labs.step_timeline), its views and its exercises.

Oracles: the engine's own StepMetrics (a rung's tokens and steps), the cost model priced here by hand
(the roofline of the same steps), schedules worked out by hand (overlap costs max, synchronous sum), the
stored records read directly (the exercises' tempting wrong answers), and the stored ladders' own
measurements (the model's predictions, held to its stated tolerance).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from paged_edu import data
from paged_edu.labs import speed_ladder as sl
from paged_edu.labs import step_timeline as st
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
    assert sum(eager["decode_batches"].values()) == eager["num_decode_steps"]
    assert all(int(b) >= 1 for b in eager["decode_batches"])
    assert all(len(v) == len(steps["step"]) for v in steps.values())
    for d, n, p in zip(steps["decode"], steps["num_decodes"], steps["num_prefill_tokens"]):
        assert d == (p == 0) and n >= 0
    assert all(x >= 0 for p in sl.PHASES for x in steps[f"{p}_ms"])
    window = eager["window"]
    assert 0 < len(window) <= 8 and all(set(w["phases_ms"]) == set(sl.PHASES) for w in window)
    for w in window:
        assert w["host_ms"][0] <= w["device_ms"][0] <= w["device_ms"][1] <= w["host_ms"][1]
    for a, b in zip(window, window[1:]):
        assert a["device_ms"][1] <= b["device_ms"][0] and b["step"] == a["step"] + 1
    assert "skipped" in sl.rung_table(rungs) and "| eager |" in sl.rung_table(rungs)


def test_bench_ladder_on_a_cpu_writes_its_record(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_ladder import main

    argv = ["--device", "cpu", "--num-requests", "4", "--probe-batches", "1,2", "--probe-context", "24"]
    argv += ["--out", str(tmp_path / "ladder")]
    rec = main(argv)
    assert json.loads((tmp_path / "ladder.json").read_text()) == json.loads(json.dumps(rec))
    assert rec["command"] == "python benchmarks/bench_ladder.py " + " ".join(argv)
    assert rec["device_name"] == "cpu" and rec["card"] == "cpu" and rec["workload"]["num_requests"] == 4
    assert rec["commit"] and rec["date_utc"] and rec["probe"] == {"batches": [1, 2], "context": 24}
    eager = rec["rungs"][0]
    assert eager["useful_tokens"] == rec["workload"]["output_tokens"]
    probes = eager["profile"]["batches"]
    assert sorted(probes) == ["1", "2"]
    for b, p in probes.items():  # every timed probe step decoded exactly b sequences
        assert p["steps"] == 6 and p["step_ms"] > 0 and set(p["host_ms"]) == set(sl.PHASES) and p["device_span_ms"] > 0


def test_the_record_goes_to_its_card(monkeypatch):
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_ladder import default_out

    cuda = torch.device("cuda")
    assert default_out(cuda, "NVIDIA H200").name == "speed_ladder_h200.json"
    assert default_out(cuda, "NVIDIA H100 80GB HBM3").name == "speed_ladder_h100.json"
    assert default_out(cuda, "NVIDIA A100-SXM4-80GB").parent.name == "build"
    assert sl.card_of("NVIDIA H100 80GB HBM3") == "h100" and sl.card_of("Tesla T4") is None


def test_no_stored_ladder_for_a_card_without_one(monkeypatch):
    assert sl.load_stored_ladder("no_such_ladder.json") is None and sl.load_stored_ladder("a100") is None
    assert sl.load_stored_ladder("engine_bench.json")["engine"]  # a stored file is read as it is
    monkeypatch.setattr(sl, "load_stored_ladder", lambda card="h200": None)
    with pytest.raises(LookupError, match="no stored ladder"):
        sl.stored_decode_split()


def test_every_stored_ladder_names_its_card_commit_and_date():
    for card, name in sl.STORED_LADDERS.items():
        rec = sl.load_stored_ladder(card)
        if rec is None:
            continue
        assert sl.card_of(rec["device_name"]) == card, name
        assert len(str(rec["commit"])) >= 7 and "dirty" not in str(rec["commit"]) and rec["date_utc"][:4] == "2026"
        assert [r["rung"] for r in rec["rungs"]] == [n for n, _ in sl.RUNGS] and not any(
            "skipped" in r for r in rec["rungs"]
        )


def test_a_stored_ladder_feeds_the_prediction(monkeypatch, ladder):
    *_, rungs = ladder
    fused = dict(rungs[0], rung="+ fused kernels", host_ms_per_decode_step=0.5, device_ms_per_decode_step=1.5)
    overlap = dict(rungs[0], rung="+ overlap", mean_decode_step_ms=1.6)
    stored = dict(
        command="python benchmarks/bench_ladder.py",
        commit="abc",
        date_utc="2026-12-06",
        device_name="x",
        rungs=[rungs[0], fused, overlap],
    )
    monkeypatch.setattr(sl, "load_stored_ladder", lambda card="h200": stored)
    split = sl.stored_decode_split()
    assert (split["host_ms"], split["device_ms"], split["overlap_step_ms"]) == (0.5, 1.5, 1.6)
    assert ex.check("9.1", 1.5) and not ex.check("9.1", 2.0)


@pytest.mark.parametrize("pre, device, post", [(1.0, 3.0, 0.5), (3.0, 1.0, 0.5), (2.0, 2.0, 0.0), (0.0, 1.5, 0.0)])
def test_overlap_costs_the_max_and_synchronous_the_sum(pre, device, post):
    n = 20
    sync = st.sync_schedule([pre] * n, [device] * n, [post] * n)
    over = st.async_schedule([pre] * n, [device] * n, [post] * n)
    assert sync[-1][2] == pytest.approx(n * (pre + device) + (n - 1) * post)
    # Steady state: after the pipeline fills, one step per max(host, device).
    period = over[-1][2] - over[-2][2]
    assert period == pytest.approx(max(pre + post, device))
    for h0, d0, d1 in over:  # a step's device work never starts before its launch
        assert d0 >= h0 + pre - 1e-12 and d1 == pytest.approx(d0 + device)
    for a, b in zip(over, over[1:]):  # one step at a time on the device
        assert b[1] >= a[2] - 1e-12
    for k in range(2, n):  # never more than one step ahead: step k's host waits for step k-2's tokens
        assert over[k][0] >= over[k - 2][2] + post - 1e-12


def test_a_schedule_worked_out_by_hand():
    # pre 1, device 3, post 0.5. Step 0: host 0, device 1-4. The host launches step 1 at 1..2: device 4-7;
    # it then reads step 0 (ends 4) and updates: step 2's host starts 4.5, launched 5.5, device 7-10;
    # then it reads step 1 (ends 7) + 0.5: step 3's host starts 7.5.
    assert st.async_schedule([1.0] * 4, [3.0] * 4, [0.5] * 4) == [(0, 1, 4), (1, 4, 7), (4.5, 7, 10), (7.5, 10, 13)]
    assert st.sync_schedule([1.0] * 3, [3.0] * 3, [0.5] * 3) == [(0, 1, 4), (4.5, 5.5, 8.5), (9, 10, 13)]
    with pytest.raises(ValueError, match="one entry per step"):
        st.schedule([1.0], [1.0, 2.0], [0.0], overlap=True)


def _probe(busy_us, kernels, host, span_ms, launches=1.0):
    return dict(
        by_kind={
            "gemm": {"kernels": kernels / 2, "us": busy_us / 2},
            "other": {"kernels": kernels / 2, "us": busy_us / 2},
        },
        kernels_per_step=kernels,
        gpu_busy_us=busy_us,
        launches_per_step=launches,
        host_ms=host,
        device_span_ms=span_ms,
    )


def _synthetic_record():
    """A ladder of two rungs whose probes were made from known parts: eager launches of 20 us, a graph replay
    of 30 us, host bookkeeping 100 + 2 us per sequence (75 % before the launch), 60 kernels, 1 us gaps."""

    def host(b, launch_ms):
        total = 0.1 + 0.002 * b
        return dict(schedule=0.25 * total, prepare=0.5 * total, forward=launch_ms, sample=0.0, update=0.25 * total)

    eager = {str(b): _probe(300 + b, 60, host(b, 60 * 0.020), 1.2, launches=60) for b in (1, 64)}
    # a synchronous step's span holds its replay call (30 us), then the kernels and their 59 gaps
    graph = {str(b): _probe(300 + b, 60, host(b, 0.030), (30 + 300 + b + 59) / 1e3) for b in (1, 64)}
    rungs = [
        dict(rung="eager", engine_kwargs=dict(cuda_graphs=False), profile={"batches": eager}),
        dict(rung="+ CUDA graphs", engine_kwargs=dict(cuda_graphs=True), profile={"batches": graph}),
    ]
    return dict(device_name="NVIDIA H200", commit="abc1234", rungs=rungs)


def test_the_model_reads_its_inputs_from_the_probes():
    rec = _synthetic_record()
    eager, graph = (st.costs_for_rung(rec, r, num_layers=2) for r in rec["rungs"])
    assert eager.launch_us == pytest.approx(20.0) and graph.graph_launch_us == pytest.approx(30.0)
    assert graph.host_fixed_us == pytest.approx(100.0) and graph.host_per_seq_us == pytest.approx(2.0)
    assert graph.pre_share == pytest.approx(0.75) and graph.kernel_gap_us == pytest.approx(1.0)
    assert graph.source["independent"]
    # A graph step by hand at batch 1: pre 0.75 * 102 + replay 30, then 60 kernels of 301/60 us 1 us apart,
    # then the update 0.25 * 102.
    t = st.simulate(graph, 1, graphs=True, overlap=False)
    assert t.step_us == pytest.approx(0.75 * 102 + 30 + 301 + 59 + 0.25 * 102)
    assert t.num_kernels == 60 and t.num_launches == 1 and t.busy_us == pytest.approx(301)
    # Eagerly every kernel waits for its launch (20 us > its 5 us): the chain ends at 59 launches + the last kernel.
    e = st.simulate(eager, 1, graphs=False, overlap=False)
    assert e.num_launches == 60 and e.device_us == pytest.approx(20 + 59 * 20 + 301 / 60 - 20, rel=1e-6)
    # With the host one step ahead a device-bound step costs the device's span.
    assert st.step_us(graph, 64, graphs=True, overlap=True) == pytest.approx(364 + 59)


def test_the_model_predicts_a_ladder_made_from_its_own_parts():
    rec = _synthetic_record()
    for r, graphs in zip(rec["rungs"], (False, True)):
        costs = st.costs_for_rung(rec, r, num_layers=2)
        r["decode_batches"] = {"1": 3, "64": 1}
        r["mean_decode_step_ms"] = (
            3 * st.step_us(costs, 1, graphs=graphs, overlap=False) + st.step_us(costs, 64, graphs=graphs, overlap=False)
        ) / 4e3
    assert all(abs(p["error"]) < 1e-9 for p in st.predict_ladder(rec))


def test_kernels_per_layer_scales_the_small_kernels_only():
    costs = st.costs_for_rung(_synthetic_record(), _synthetic_record()["rungs"][1], num_layers=2)
    base = costs.kernels(1)
    more = st.with_knobs(costs, kernels_per_layer=40.0).kernels(1)
    assert len(base) == 60 and len(more) == 80
    assert sum(us for k, us in more if k == "gemm") == pytest.approx(sum(us for k, us in base if k == "gemm"))


def test_the_model_predicts_every_stored_ladder_within_its_tolerance():
    """The stated tolerance (step_timeline.TOLERANCE): every rung's mean decode step of every stored record."""
    seen = 0
    for card in sl.STORED_LADDERS:
        rec = sl.load_stored_ladder(card)
        if rec is None:
            continue
        seen += 1
        pred = st.predict_ladder(rec)
        assert [p["rung"] for p in pred] == [r["rung"] for r in rec["rungs"]]
        for p, r in zip(pred, rec["rungs"]):
            assert p["measured_ms"] == r["mean_decode_step_ms"] and p["num_decode_steps"] == r["num_decode_steps"]
            assert abs(p["error"]) <= st.TOLERANCE, (card, p["rung"], p["predicted_ms"], p["measured_ms"])
    assert seen >= 1


def test_the_step_timeline_explorer_redraws_from_its_knobs():
    from paged_edu.viz.step_timeline_explorer import StepTimelineExplorer

    rec = _synthetic_record()
    presets = {r["rung"]: (st.costs_for_rung(rec, r, num_layers=2), *st.rung_options(r)) for r in rec["rungs"]}
    e = StepTimelineExplorer(presets, batch=1)
    assert not e.graphs.value and e.launch.value == pytest.approx(20.0)
    eager_step = e.timeline.step_us
    e.preset.value = "+ CUDA graphs"
    assert e.graphs.value and e.timeline.step_us < eager_step
    assert f"{e.timeline.step_us / 1e3:.3f} ms" in e.fig.layout.title.text
    device_bars = e.fig.data[3].x + e.fig.data[6].x  # gemm and other kernels, 3 steps
    assert len(device_bars) == 3 * 60
    before = e.timeline.step_us
    e.overlap.value = True
    assert e.timeline.step_us < before and "host one step ahead" in e.fig.layout.title.text
    with pytest.raises(ValueError, match="at least one"):
        StepTimelineExplorer({})


# -- exercises 9.1-9.3: tempting wrong answers computed here, from the stored records ------------------


def _split():
    stored = json.loads((ROOT / "paged_edu/data/speed_ladder_h200.json").read_text())
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
    sheet = 1e3 * (m.matmul_weight_bytes + head + kv) / 4.8e12  # the H200 datasheet's 4.8 TB/s
    verdict = str(ex.check("9.2", float(f"{sheet:.4g}")))
    assert "datasheet" in verdict and "copy ceiling" in verdict


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
    by = {r["rung"]: r for r in sl.run_ladder(model, prompts, outputs, kw, probe_batches=(4,), probe_context=32)}
    for name in ("eager", "+ CUDA graphs", "+ fused kernels", "+ overlap"):
        assert "skipped" not in by[name] and by[name]["useful_tokens"] == sum(outputs), name
    assert "graph" not in by["eager"]["forward_modes"]
    assert by["+ CUDA graphs"]["forward_modes"].get("graph", 0) > 0
    mixed = by["+ graphs for mixed steps"]
    assert mixed["forward_modes"].get("mixed graph", 0) > 0, mixed["forward_modes"]
    # The probes saw the kernels: eagerly one launch per kernel, with a graph a replay and (almost) no launches.
    eager, graph = by["eager"]["profile"]["batches"]["4"], by["+ CUDA graphs"]["profile"]["batches"]["4"]
    assert eager["kernels_per_step"] > 20 and eager["launches_per_step"] >= 0.9 * eager["kernels_per_step"]
    assert graph["graph_launches_per_step"] >= 1 and graph["launches_per_step"] < 0.2 * eager["launches_per_step"]
    assert (
        graph["gpu_busy_us"] > 0 and sum(v["kernels"] for v in graph["by_kind"].values()) == graph["kernels_per_step"]
    )
    for p in st.predict_ladder(dict(device_name="cuda", commit="x", rungs=list(by.values()))):
        assert p["predicted_ms"] > 0 and math.isfinite(p["error"]), p


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


# -- exercises 9.4-9.6: the wrong answers written out here ---------------------------------------------


def _sync_by_hand(pre, device, post):
    out, host = [], 0.0
    for p, d, q in zip(pre, device, post):
        d0 = host + p if not out else max(host + p, out[-1][2])
        out.append((host, d0, d0 + d))
        host = d0 + d + q
    return out


def _greedy_host(pre, device, post):  # the host never waits for tokens
    out, host, free = [], 0.0, 0.0
    for p, d, q in zip(pre, device, post):
        d0 = max(host + p, free)
        free = d0 + d
        out.append((host, d0, free))
        host += p + q
    return out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_sync_by_hand, "the synchronous order"),
        (_greedy_host, "one step ahead, never more"),
        (lambda pre, device, post: [(0.0, 0.0, d) for d in device], "expected"),
        (lambda pre, device, post: None, "return a list"),
        (lambda pre, device, post: 1 / 0, "ZeroDivisionError"),
    ],
)
def test_9_4_names_the_schedule_it_was_given(wrong, words):
    verdict = ex.check("9.4", wrong)
    assert not verdict and words in str(verdict), str(verdict)


def test_9_4_sets_the_reference_beside_the_engine_recording():
    from paged_edu.lessons.exercises import lesson9 as ex9

    verdict = str(ex.check("9.4", st.async_schedule))
    rec = ex9.recorded_steps()
    assert "engine recorded" in verdict and rec["steps"] == sorted(rec["steps"]) and len(rec["steps"]) >= 8
    # The reference's device idle time on the recorded steps is within 0.1 ms of what the engine recorded;
    # the synchronous order's is not.
    gaps = lambda f: sorted(ex9._predicted_gaps(f(rec["pre"], rec["device"], rec["post"])))  # noqa: E731
    recorded = sorted(rec["gaps"])[len(rec["gaps"]) // 2]
    assert abs(gaps(st.async_schedule)[len(rec["gaps"]) // 2] - recorded) < 0.1
    assert abs(gaps(_sync_by_hand)[len(rec["gaps"]) // 2] - recorded) > 0.2


def _norm_variant(weight=True, residual=True, eps=True, swap=False, centre=False):
    import torch

    def fn(x, r, w, e):
        s = x + r if residual else x
        c = s - s.mean(-1, keepdim=True) if centre else s
        y = c / torch.sqrt((c * c).mean(-1, keepdim=True) + (e if eps else 0.0))
        y = w * y if weight else y
        return (x + r, y) if swap else (y, x + r)

    return fn


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_norm_variant(weight=False), "without the weight"),
        (_norm_variant(residual=False), "x normalised alone"),
        (_norm_variant(centre=True), "LayerNorm"),
        (_norm_variant(swap=True), "swapped"),
        (_norm_variant(eps=False), "eps"),
        (lambda x, r, w, e: (x, r), "differ from the reference"),
        (lambda x, r, w, e: x, "return two tensors"),
    ],
)
def test_9_5_names_what_the_kernel_got_wrong(wrong, words):
    verdict = ex.check("9.5", wrong)
    assert not verdict and words in str(verdict), str(verdict)


def test_9_5_passes_a_plain_pytorch_answer_and_a_triton_one():
    assert ex.check("9.5", _norm_variant())  # the math is what is checked, not how it is launched
    import triton
    import triton.language as tl
    import torch

    @triton.jit
    def kernel(x_ptr, r_ptr, w_ptr, y_ptr, ro_ptr, N, eps, BLOCK_N: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_N)
        mask = cols < N
        s = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0) + tl.load(
            r_ptr + row * N + cols, mask=mask, other=0.0
        )
        tl.store(ro_ptr + row * N + cols, s, mask=mask)
        y = s * tl.rsqrt(tl.sum(s * s, axis=0) / N + eps) * tl.load(w_ptr + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row * N + cols, y, mask=mask)

    def mine(x, r, w, eps):
        y, ro = torch.empty_like(x), torch.empty_like(x)
        kernel[(x.shape[0],)](x, r, w, y, ro, x.shape[1], eps, BLOCK_N=triton.next_power_of_2(x.shape[1]))
        return y, ro

    assert ex.check("9.5", mine)

    def unmasked(x, r, w, eps):  # a block of exactly N lanes: wrong when N is not a power of two
        y, ro = torch.empty_like(x), torch.empty_like(x)
        kernel[(x.shape[0],)](x, r, w, y, ro, x.shape[1], eps, BLOCK_N=max(16, 1 << (x.shape[1].bit_length() - 1)))
        return y, ro

    assert "power of two" in str(ex.check("9.5", unmasked))


def test_9_6_refuses_the_launches_alone_and_microseconds():
    from paged_edu.lessons.exercises import lesson9 as ex9

    c = ex9.launch_costs()
    n, each, graph = c["launches"], c["launch_us"], c["graph_launch_us"]
    assert ex.check("9.6", (n * each - graph) / 1e3)
    assert "microseconds" in str(ex.check("9.6", n * each - graph))
    assert "n - 1 launches" in str(ex.check("9.6", float(f"{(n - 1) * each / 1e3:.4g}")))
    if graph:  # a record with probes: the replay call is not free
        assert "subtract it" in str(ex.check("9.6", float(f"{n * each / 1e3:.4g}")))


def test_kernels_are_booked_by_kind_as_the_model_reads_them():
    from types import SimpleNamespace

    from paged_edu.labs.timing import kernel_kind, kernel_table

    names = {
        "paged_decode_kernel": "attention",
        "rotary_store_decode_kernel": "attention",
        "merge_splits_kernel": "attention",
        "_paged_prefill_kernel": "attention",
        "_add_rms_norm_kernel": "fused",
        "_store_kv_kernel": "fused",
        "_skinny_matmul_kernel": "gemm",
        "nvjet_sm90_tst_24x64_64x16_4x2_h_bz_TNN": "gemm",
        "void at::native::vectorized_elementwise_kernel<4, at::native": "other",
    }
    assert {n: kernel_kind(n) for n in names} == names and set(names.values()) == set(st.KINDS)
    events = [SimpleNamespace(name=n, device_time=2.0) for n in names] * 2  # two steps
    table = kernel_table(events, n=2)
    assert table["kernels_per_step"] == len(names) and table["gpu_busy_us"] == 2.0 * len(names)
    assert table["by_kind"]["gemm"] == {"kernels": 2.0, "us": 4.0}


def test_a_stored_ladder_says_how_much_engine_code_changed_after_it():
    """Lesson 9 says whether the H200 record measured the code you run: the count and the last commit
    match git's own listing of the commits that touched the engine, kernels or models after it."""
    import subprocess

    record = sl.load_stored_ladder("h200")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the lesson says it cannot tell")
    listed = subprocess.run(
        ["git", "log", "--no-merges", "--format=%h", f"{record['commit']}..HEAD", "--", *sl.ENGINE_CODE],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    age = sl.code_changes_since(record)
    assert age is not None
    assert age["commits"] == len(listed)
    if listed:
        assert age["last"] == listed[0]
    assert sl.code_changes_since({**record, "commit": "0" * 40}) is None  # a commit this history lacks
    assert sl.code_changes_since({**record, "commit": None}) is None

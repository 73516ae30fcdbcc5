"""Every figure a lesson draws has titled axes and only the palette's colours (issue 21, "All").

Each builder the lessons call (``paged_edu.viz``: the figure functions and the widgets' figures) is
built here from small inputs, as the notebooks build it, and walked by :func:`figure_problems`:

* every **shown** cartesian axis that a trace draws on needs a title (a name, with its unit where it
  has one); axes hidden on purpose (``visible=False``: the block grids and diagrams) are diagrams,
  not plots;
* every colour -- a trace's marker, line, fill, bar and colour scale, a shape's fill and outline, an
  annotation's font -- must be one of :mod:`paged_edu.viz.palette`'s (white and black included);
  a trace with no colour at all would take plotly's default colourway, outside the palette.

The oracle is the palette module itself; the test can fail (see
``test_the_checker_finds_a_missing_title_and_a_foreign_colour``).
"""

from __future__ import annotations

import math
import re

import plotly.graph_objects as go
import pytest
import torch

from paged_edu.viz import palette as P

PALETTE = {
    c.upper()
    for c in (
        *P.OKABE_ITO.values(),
        *P.SEQ_COLORS,
        *P.CODES,
        P.FREE,
        P.IDLE,
        P.EVICTABLE,
        P.SHARED,
        P.GOOD,
        P.BAD,
        P.ACCENT,
        P.NEUTRAL,
        *(c for _, c in P.DIVERGING),
        *(c for _, c in P.SEQUENTIAL),
        "#FFFFFF",
        "#000000",
    )
}
_NAMED = {"white": "#FFFFFF", "black": "#000000"}
# Trace types that draw in colour without a colour of their own (a table, an invisible legend stub, ...).
_COLOURLESS_OK = {"table"}


def _norm(color) -> str | None:
    if not isinstance(color, str):
        return None
    c = _NAMED.get(color.strip().lower(), color.strip())
    if re.fullmatch(r"#[0-9A-Fa-f]{3}", c):
        c = "#" + "".join(ch * 2 for ch in c[1:])
    return c.upper()


def _colours(obj, path: str):
    """(path, value) of every colour-valued property under a plotly object or dict."""
    items = obj.to_plotly_json().items() if hasattr(obj, "to_plotly_json") else obj.items()
    for key, value in items:
        here = f"{path}.{key}"
        if isinstance(value, dict):
            yield from _colours(value, here)
        elif key == "colorscale":
            if isinstance(value, str):
                yield here, value
            else:
                for _, c in value or []:
                    yield here, c
        elif "color" in key and key not in ("coloraxis", "colorbar", "showscale"):
            values = value if isinstance(value, (list, tuple)) else [value]
            for c in values:
                if isinstance(c, str):
                    yield here, c


def _axes_drawn_on(fig: go.Figure) -> list[str]:
    """The cartesian axes (``xaxis``, ``yaxis2``, ...) that some trace draws on."""
    axes = set()
    for t in fig.data:
        if t.type in ("table", "pie", "indicator", "sankey"):
            continue
        for letter in "xy":
            ref = getattr(t, f"{letter}axis", None) or letter
            axes.add(f"{letter}axis{ref[1:]}")
    return sorted(axes)


def figure_problems(fig: go.Figure) -> list[str]:
    """What a figure lacks: an axis title on a shown axis, a colour in the palette."""
    problems = []
    layout = fig.layout
    for name in _axes_drawn_on(fig):
        axis = layout[name]
        if axis.visible is False:
            continue
        if not (axis.title and axis.title.text and axis.title.text.strip()):
            problems.append(f"{name} has no title")
    for i, t in enumerate(fig.data):
        found = list(_colours(t, f"data[{i}]({t.name or t.type})"))
        for where, c in found:
            if _norm(c) not in PALETTE:
                problems.append(f"{where} = {c!r} is not a palette colour")
        if not found and t.type not in _COLOURLESS_OK:
            problems.append(f"data[{i}]({t.name or t.type}) has no colour: plotly's default colourway")
    for i, shape in enumerate(layout.shapes or ()):
        for where, c in _colours(shape, f"shapes[{i}]"):
            if _norm(c) not in PALETTE:
                problems.append(f"{where} = {c!r} is not a palette colour")
    for i, ann in enumerate(layout.annotations or ()):
        for where, c in _colours(ann, f"annotations[{i}]"):
            if _norm(c) not in PALETTE:
                problems.append(f"{where} = {c!r} is not a palette colour")
    return problems


# -- the builders the lessons call, on small inputs ---------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from paged_edu.labs.engine_lab import tiny_model

    return tiny_model(seed=0)


def _lesson1(tiny):
    from paged_edu.core.contiguous import ContiguousAllocator
    from paged_edu.core.hardware import MODELS
    from paged_edu.viz import memory_figures as F
    from paged_edu.viz.widgets import KVMemoryCalculator

    contig = ContiguousAllocator(num_slots=64, max_seq_len=16)
    contig.allocate("a", [1, 2, 3, 4, 5])
    contig.allocate("b", [6, 7, 8])
    return {
        "contiguous_figure": F.contiguous_figure(contig, cols=16),
        "kv_memory_figure": F.kv_memory_figure(MODELS["llama-3-8b"], 4096, 8, 10**11),
        "KVMemoryCalculator.fig": KVMemoryCalculator(preset="Llama-3-8B", seq_len=8192, batch=8).fig,
    }


def _lesson2(tiny):
    from paged_edu.core.allocator import BlockAllocator
    from paged_edu.viz import figures as F
    from paged_edu.viz import memory_figures as M
    from paged_edu.viz.widgets import BlockTableWidget

    a = BlockAllocator(num_blocks=16, block_size=4)
    a.allocate("a", list(range(10)))
    a.allocate("b", list(range(100, 105)))
    w = BlockTableWidget(num_blocks=16, block_size=4, kv=False)
    w.add_request(6)
    return {
        "logical_physical_figure": F.logical_physical_figure(a),
        "utilisation_figure": M.utilisation_figure({16: ([10, 20], [0.625, 0.625])}, s_max=64, naive_l_max=64),
        "BlockTableWidget.grid": w.grid,
        "BlockTableWidget.table": w.table,
        "block_grid_figure": F.block_grid_figure(a),
        "block_table_figure": F.block_table_figure(a),
    }


def _lesson3(tiny):
    from paged_edu.core.allocator import BlockAllocator
    from paged_edu.labs.experiments import cow_experiment
    from paged_edu.labs.kv_view import KVView
    from paged_edu.viz import tensor_figures as F
    from paged_edu.viz.widgets import PrefixSharingWidget

    kv = KVView(BlockAllocator(num_blocks=16, block_size=4), seed=0)
    w = PrefixSharingWidget(num_blocks=12, block_size=4, system_len=10, kv=False)
    w.add_chat(3)
    return {
        "cow_heatmap_figure": F.cow_heatmap_figure(cow_experiment(kv, [1, 2, 3, 4, 5, 6], new_token=7)),
        "PrefixSharingWidget.grid": w.grid,
        "PrefixSharingWidget.table": w.table,
    }


def _lesson4(tiny):
    from paged_edu.labs import kernel_ladder as ladder
    from paged_edu.labs.softmax_stepper import OnlineSoftmaxStepper
    from paged_edu.viz.kernel_figures import ladder_figure, split_figure, stored_split_points
    from paged_edu.viz.softmax_stepper import SoftmaxStepperWidget

    stored = ladder.stored_gpu_figures()
    sweep = stored_split_points(ladder.stored_gpu_figures("kernel_sweep.json"), "1x8192")
    stepper = SoftmaxStepperWidget(OnlineSoftmaxStepper(40, block_size=8, seed=0))
    stepper.next_block()
    return {
        "ladder_figure": ladder_figure(stored["cases"], "stored"),
        "split_figure": split_figure([sweep], "stored"),
        "SoftmaxStepperWidget.fig": stepper.fig,
    }


def _lesson5(tiny):
    from paged_edu.engine import Engine
    from paged_edu.labs import batching as Bt
    from paged_edu.labs.sim_vs_real import h200_engine_summary
    from paged_edu.viz import engine_figures as EF
    from paged_edu.viz.engine_dashboard import ChunkedPrefillExplorer, EngineDashboard

    static, cont = Bt.compare_batching(tiny, Bt.make_requests(5, seed=4), kv_slots=120, block_size=8)
    prof = Bt.phase_profile(tiny, Bt.make_requests(2, seed=5), num_blocks=16, block_size=8)
    dash = EngineDashboard(Engine(tiny, num_blocks=16, block_size=4), max_tokens=3)
    dash.add_request()
    dash.step(2)
    chunks = ChunkedPrefillExplorer(tiny, budget=32, long_prompt_len=60)
    return {
        "batching_bars_figure": EF.batching_bars_figure(static, cont),
        "timeline_figure": EF.timeline_figure(static, cont),
        "phase_figure": EF.phase_figure(prof),
        "h200_step_figure": EF.h200_step_figure(
            h200_engine_summary(), h200_engine_summary("engine_bench_before_fused_kernels.json")
        ),
        "EngineDashboard.grid": dash.grid,
        "EngineDashboard.table": dash.table,
        "EngineDashboard.metrics": dash.metrics,
        "ChunkedPrefillExplorer.fig": chunks.fig,
    }


def _lesson6(tiny):
    from paged_edu.labs import preemption as P6
    from paged_edu.viz.preemption_explorer import PreemptionExplorer, remedy_figure

    prompts = P6.pressure_prompts(4, 16, tiny.config.vocab_size, seed=0)
    rows = P6.remedy_rows(
        tiny, prompts, 10, {"swap": {"mode": "swap"}, "recompute": {"mode": "recompute"}}, max_new_tokens=16
    )
    return {
        "PreemptionExplorer.fig": PreemptionExplorer(tiny, prompts, max_new_tokens=16, num_blocks=10).fig,
        "remedy_figure": remedy_figure(rows),
    }


def _lesson7(tiny):
    from paged_edu.labs import benchmark_table as bt
    from paged_edu.labs import paper_figures as PF
    from paged_edu.sim.compare import compare, latency_vs_rate
    from paged_edu.sim.results import SimConfig
    from paged_edu.viz import sim_figures as SF
    from paged_edu.viz.sim_explorer import SimExplorer

    cost = bt.paper_cost_model("a100-40gb")
    configs = [SimConfig(manager=m) for m in PF.MAIN]
    saturated = compare(bt.workload("sharegpt", 40, math.inf, 0), configs, cost)
    points = latency_vs_rate(lambda r: bt.workload("sharegpt", 30, r, 0), [0.5, 2.0], configs, cost)
    explorer = SimExplorer(num_requests=40, seed=0)
    return {
        "memory_breakdown_figure": SF.memory_breakdown_figure(saturated),
        "batched_figure": SF.batched_figure(saturated),
        "latency_rate_figure": SF.latency_rate_figure(points),
        "sharing_figure": SF.sharing_figure(PF.sharing_rows(cost, 30, 0, SimConfig(manager="paged"))),
        "block_latency_figure": SF.block_latency_figure(bt.block_size_sweep("sharegpt", 40, math.inf, 0), "t"),
        "block_size_figure": SF.block_size_figure(saturated),
        "SimExplorer.memory": explorer.memory,
        "SimExplorer.ttft": explorer.ttft,
    }


def _lesson8(tiny):
    from paged_edu.labs import cache_compare as cc
    from paged_edu.viz.cache_figures import cache_compare_figure
    from paged_edu.viz.flags_explorer import FlagsExplorer

    flags = FlagsExplorer(num_requests=40, seed=0)
    return {
        "cache_compare_figure": cache_compare_figure(cc.compare_caches(24, seed=0)),
        "FlagsExplorer.memory": flags.memory,
        "FlagsExplorer.ttft": flags.ttft,
    }


def _lesson9(tiny):
    from paged_edu.labs import speed_ladder as sl
    from paged_edu.labs.batching import sharegpt_requests
    from paged_edu.viz import speed_figures as SF
    from paged_edu.labs import step_timeline as st
    from paged_edu.viz.step_timeline_explorer import StepTimelineExplorer

    prompts, outputs = sharegpt_requests(4, 0, tiny.config.vocab_size, 0.05)
    kw = dict(num_blocks=128, block_size=16, max_num_seqs=8, max_num_batched_tokens=64)
    rungs = sl.run_ladder(tiny, prompts, outputs, kw, window=6)
    stored = sl.load_stored_ladder("h200")
    presets = {r["rung"]: (st.costs_for_rung(stored, r), *st.rung_options(r)) for r in stored["rungs"]}
    explorer = StepTimelineExplorer(presets)
    explorer.preset.value = "+ overlap"
    return {
        "ladder_speed_figure": SF.ladder_speed_figure(rungs, "live CPU run"),
        "host_device_figure": SF.host_device_figure(rungs[0]),
        "step_roofline_figure": SF.step_roofline_figure(rungs),
        "step_timeline_figure": SF.step_timeline_figure(
            st.simulate(presets["eager"][0], 8, graphs=False, overlap=False)
        ),
        "model_vs_ladder_figure": SF.model_vs_ladder_figure(st.predict_ladder(stored), "stored"),
        "StepTimelineExplorer.fig": explorer.fig,
    }


def _lesson10(tiny):
    from paged_edu.labs.tile_plan import tile_plan
    from paged_edu.viz import kernel_maps as KM

    explorer = KM.TilePlanExplorer(ctx=8, q_len=8, block_q=4, tile=4)
    explorer.tile.value = 8
    return {
        "store_map_figure": KM.store_map_figure([4, 10, -1], 3, 4),
        "tile_plan_figure": KM.tile_plan_figure(tile_plan(5, 6, 2, 4)),
        "TilePlanExplorer.fig": explorer.fig,
    }


def _lesson11(tiny):
    from types import SimpleNamespace

    from paged_edu.viz.serving_views import RouterView, itl_histogram_figure

    index = SimpleNamespace(snapshots=[("chat A", {1: "chat A", 2: "chat A"}), ("chat B", {1: "chat A", 3: "chat B"})])
    view = RouterView(index, cols=4)
    view.show(0)
    window = [(0.001, 0), (0.005, 3), (0.01, 9), (float("inf"), 10)]
    return {
        "RouterView.fig": view.fig,
        "itl_histogram_figure": itl_histogram_figure({"light": window, "heavy": window}, "ITL"),
    }


LESSONS = {
    "01": _lesson1,
    "02": _lesson2,
    "03": _lesson3,
    "04": _lesson4,
    "05": _lesson5,
    "06": _lesson6,
    "07": _lesson7,
    "08": _lesson8,
    "09": _lesson9,
    "10": _lesson10,
    "11": _lesson11,
}


@pytest.mark.parametrize("lesson", sorted(LESSONS))
def test_every_figure_a_lesson_draws_has_titled_axes_and_palette_colours(lesson, tiny):
    torch.manual_seed(0)
    figures = LESSONS[lesson](tiny)
    bad = {name: p for name, fig in figures.items() if (p := figure_problems(go.Figure(fig)))}
    assert not bad, "\n".join(f"{name}: {'; '.join(p)}" for name, p in bad.items())


def test_the_checker_finds_a_missing_title_and_a_foreign_colour():
    fig = go.Figure(go.Bar(x=[1, 2], y=[3, 4], marker_color="#123456"))
    fig.update_layout(xaxis_title="block size B (tokens)")
    assert figure_problems(fig) == [
        "yaxis has no title",
        "data[0](bar).marker.color = '#123456' is not a palette colour",
    ]
    fig.update_layout(yaxis_title="latency (s)")
    fig.update_traces(marker_color=P.SEQ_COLORS[0])
    assert figure_problems(fig) == []
    fig.add_scatter(x=[1], y=[2])
    assert figure_problems(fig) == ["data[1](scatter) has no colour: plotly's default colourway"]
    hidden = go.Figure(go.Heatmap(z=[[0, 1]], colorscale=P.COLORSCALE))
    hidden.update_xaxes(visible=False).update_yaxes(visible=False)
    assert figure_problems(hidden) == []
    assert figure_problems(
        go.Figure(go.Heatmap(z=[[0, 1]], colorscale="Viridis"), layout={"xaxis": {"visible": False}})
    )


def test_every_figure_builder_of_viz_is_built_above():
    """A new ``*_figure`` function in ``paged_edu.viz`` must join LESSONS (directly or through its widget)."""
    import importlib
    import inspect
    import pkgutil

    import paged_edu.viz

    names = set()
    for info in pkgutil.walk_packages(paged_edu.viz.__path__, "paged_edu.viz."):
        mod = importlib.import_module(info.name)
        names |= {
            n
            for n, f in vars(mod).items()
            if n.endswith("_figure") and inspect.isfunction(f) and f.__module__ == mod.__name__
        }
    source = "".join(inspect.getsource(f) for f in LESSONS.values())
    through = {
        "kv_memory_figure": "KVMemoryCalculator",
        "engine_metrics_figure": "EngineDashboard",
        "chunked_prefill_figure": "ChunkedPrefillExplorer",
        "stepper_figure": "SoftmaxStepperWidget",
    }
    missing = sorted(n for n in names if n not in source and through.get(n, "\0") not in source)
    assert names and not missing, f"figure builders no lesson test builds: {missing}"

"""Figures of the engine at work (lesson 5): pure functions of measured runs, no widgets.

* :func:`timeline_figure` -- who is in the batch at each step, static against continuous batching;
* :func:`batching_bars_figure` -- useful tokens per second and KV slots holding a token, side by side;
* :func:`chunked_prefill_figure` -- tokens per step, decodes and prompt chunks, under the budget;
* :func:`phase_figure` -- where each step's time goes, against the cost model's roofline;
* :func:`engine_metrics_figure` -- the dashboard's live gauges over steps.

Each ``*_data`` function returns what its figure draws, so a widget can update a ``FigureWidget``
in place and a test can compare.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from paged_edu.viz import palette as P
from paged_edu.viz.palette import SEQ_COLORS

__all__ = [
    "batching_bars_figure",
    "chunked_prefill_data",
    "chunked_prefill_figure",
    "engine_metrics_data",
    "engine_metrics_figure",
    "phase_figure",
    "timeline_figure",
    "PHASE_COLORS",
]

# Timeline codes (paged_edu.labs.batching): waiting, useful, wasted (finished, still computed), done.
_TIMELINE_COLORS = [P.FREE, P.GOOD, P.BAD, "#FFFFFF"]
_TIMELINE_SCALE = [[v, c] for k, c in enumerate(_TIMELINE_COLORS) for v in (k / 4, (k + 1) / 4)]
PHASE_COLORS = {
    "schedule": P.OKABE_ITO["reddish purple"],
    "prepare": P.OKABE_ITO["blue"],
    "forward": P.GOOD,
    "sample": P.OKABE_ITO["orange"],
    "update": P.BAD,
}


def timeline_figure(*runs, max_rows: int = 40) -> go.Figure:
    """One panel per run: rows are requests, columns steps; bluish green = computed and useful,
    vermillion = finished but still computed (static batching's padding), grey = waiting, white = done."""
    fig = make_subplots(
        rows=len(runs),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12,
        subplot_titles=[
            f"{r.name}: {r.num_steps} steps, {r.wasted_fraction:.0%} of computed tokens wasted" for r in runs
        ],
    )
    for k, run in enumerate(runs, start=1):
        z = run.timeline[:max_rows]
        fig.add_trace(
            go.Heatmap(
                z=z,
                zmin=-0.5,
                zmax=3.5,
                colorscale=_TIMELINE_SCALE,
                showscale=False,
                xgap=1,
                ygap=1,
                hovertemplate="request %{y}, step %{x}<extra></extra>",
            ),
            k,
            1,
        )
        fig.update_yaxes(autorange="reversed", title_text="request (arrival order)", row=k, col=1)
        fig.update_xaxes(title_text="engine step", row=k, col=1)
    fig.update_layout(
        height=180 + 220 * len(runs),
        margin={"t": 60, "l": 60, "r": 20, "b": 40},
        title="Who is in the batch at each step (bluish green: useful, vermillion: finished but still computed, "
        "grey: waiting)",
    )
    return fig


def batching_bars_figure(*runs) -> go.Figure:
    """Useful output tokens per second, and the KV slots of the budget holding a live token."""
    names = [r.name for r in runs]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("useful output tokens / s", "KV slots holding a token"))
    colors = [P.IDLE, P.GOOD, P.OKABE_ITO["blue"]][: len(runs)]
    fig.add_trace(
        go.Bar(
            x=names,
            y=[r.tokens_per_s for r in runs],
            marker_color=colors,
            text=[f"{r.tokens_per_s:,.0f}" for r in runs],
            textposition="auto",
        ),
        1,
        1,
    )
    fig.add_trace(
        go.Bar(
            x=names,
            y=[100 * r.kv_holding_token for r in runs],
            marker_color=colors,
            text=[f"{100 * r.kv_holding_token:.0f}%" for r in runs],
            textposition="auto",
        ),
        1,
        2,
    )
    fig.update_yaxes(title_text="useful output tokens / s", row=1, col=1)
    fig.update_yaxes(title_text="KV slots holding a token (%)", range=[0, 100], row=1, col=2)
    fig.update_xaxes(title_text="batching")
    fig.update_layout(height=340, showlegend=False, margin={"t": 50, "b": 40})
    return fig


def chunked_prefill_data(trace: dict) -> dict[str, list]:
    return {
        "x": trace["step"],
        "decode": trace["decode_tokens"],
        "prefill": trace["prefill_tokens"],
        "budget": [trace["budget"]] * len(trace["step"]),
        "done": trace["long_done"],
    }


def chunked_prefill_figure(trace: dict) -> go.Figure:
    """Stacked tokens per step (decodes, prompt chunks) under ``max_num_batched_tokens``."""
    d = chunked_prefill_data(trace)
    fig = go.Figure(
        [
            go.Bar(x=d["x"], y=d["decode"], name="decode tokens (one per running request)", marker_color=SEQ_COLORS[1]),
            go.Bar(x=d["x"], y=d["prefill"], name="prefill tokens (prompt chunks)", marker_color=SEQ_COLORS[0]),
            go.Scatter(
                x=d["x"],
                y=d["budget"],
                mode="lines",
                name="max_num_batched_tokens",
                line={"dash": "dash", "color": P.SHARED},
            ),
        ]
    )
    fig.update_layout(
        barmode="stack",
        height=340,
        xaxis_title="engine step",
        yaxis_title="tokens in the step",
        title=f"A {trace['long_prompt_len']}-token prompt arrives in step 2 while 3 requests decode",
        margin={"t": 50, "b": 40},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def phase_figure(profile: dict, phases=tuple(PHASE_COLORS)) -> go.Figure:
    """Milliseconds per step by phase (stacked bars) and the roofline for the same batch (a line)."""
    x = profile["step"]
    fig = go.Figure(
        [go.Bar(x=x, y=[1e3 * t for t in profile[p]], name=p, marker_color=PHASE_COLORS[p]) for p in phases]
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[1e3 * t for t in profile["roofline"]],
            mode="lines+markers",
            name=f"roofline on {profile['gpu']} (same batch)",
            line={"color": P.SHARED, "dash": "dot"},
        )
    )
    fig.update_layout(
        barmode="stack",
        height=380,
        xaxis_title="engine step",
        yaxis_title="time in the step (ms)",
        yaxis_type="log",
        title="Where each step's time goes (log scale)",
        margin={"t": 50, "b": 40},
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def engine_metrics_data(history: list) -> dict[str, list]:
    """From a list of :class:`~paged_edu.engine.StepMetrics`: the gauges the dashboard plots."""
    return {
        "x": [m.step for m in history],
        "kv_usage": [m.kv_usage for m in history],
        "hit_rate": [m.prefix_hit_rate for m in history],
        "tokens": [m.num_batched_tokens for m in history],
        "running": [m.num_running for m in history],
    }


def engine_metrics_figure(history: list, *, stacked: bool = False) -> go.Figure:
    """KV usage and prefix hit rate, and tokens and sequences per step, against the engine step: side
    by side, or one above the other (``stacked``, for a narrow column)."""
    d = engine_metrics_data(history)
    at = ((1, 1), (2, 1)) if stacked else ((1, 1), (1, 2))
    fig = make_subplots(
        rows=2 if stacked else 1,
        cols=1 if stacked else 2,
        vertical_spacing=0.3 if stacked else 0.1,
        subplot_titles=("KV usage and prefix hit rate", "tokens and sequences per step"),
    )
    fig.add_trace(
        go.Scatter(x=d["x"], y=d["kv_usage"], mode="lines+markers", name="KV usage", line_color=P.OKABE_ITO["blue"]),
        *at[0],
    )
    fig.add_trace(
        go.Scatter(x=d["x"], y=d["hit_rate"], mode="lines+markers", name="prefix hit rate", line_color=P.GOOD),
        *at[0],
    )
    fig.add_trace(
        go.Bar(x=d["x"], y=d["tokens"], name="tokens in the step", marker_color=P.OKABE_ITO["sky blue"]), *at[1]
    )
    fig.add_trace(
        go.Scatter(x=d["x"], y=d["running"], mode="lines+markers", name="running", line_color=P.OKABE_ITO["orange"]),
        *at[1],
    )
    fig.update_yaxes(range=[0, 1.02], title_text="fraction", row=at[0][0], col=at[0][1])
    fig.update_yaxes(title_text="tokens / seqs", row=at[1][0], col=at[1][1])
    fig.update_xaxes(title_text="engine step", title_standoff=4)
    fig.update_annotations(font_size=13)  # the subplot titles
    fig.update_layout(
        height=330 if stacked else 300,
        margin={"t": 40, "b": 40, "l": 50, "r": 10},
        legend={"orientation": "h", "y": -0.22 if stacked else -0.3, "entrywidth": 0.5, "entrywidthmode": "fraction"},
    )
    return fig


def h200_step_figure(now: dict, before: dict) -> go.Figure:
    """The mean decode step of the stored H200 engine benchmarks (``sim_vs_real.h200_engine_summary``
    of the run ``now`` and of one ``before`` it): the host's work and the wait for the GPU, stacked,
    next to the cost model's roofline for the same batches."""
    names = ["roofline (same batches)", "engine now", "engine before"]
    host, wait = now["host_ms_per_decode_step"], now["device_wait_ms_per_decode_step"]
    fig = go.Figure(
        [
            go.Bar(
                y=names,
                x=[now["roofline_decode_step_ms"], 0, 0],
                orientation="h",
                name="roofline",
                marker_color=P.SHARED,
            ),
            go.Bar(
                y=names,
                x=[0, wait, 0],
                orientation="h",
                name="waiting for the GPU",
                marker_color=PHASE_COLORS["forward"],
            ),
            go.Bar(
                y=names,
                x=[0, host, 0],
                orientation="h",
                name="host work (schedule, prepare, launch, update)",
                marker_color=PHASE_COLORS["prepare"],
            ),
            go.Bar(
                y=names,
                x=[0, 0, before["mean_decode_step_ms"]],
                orientation="h",
                name="before (not split)",
                marker_color=P.IDLE,
            ),
        ]
    )
    fig.update_layout(
        barmode="stack",
        height=260,
        xaxis_title="ms per decode step",
        yaxis_title="run",
        margin={"t": 50, "b": 40},
        title=f"Mean decode step on the {now['device']}: {now['tokens_per_s']:,.0f} vs "
        f"{before['tokens_per_s']:,.0f} useful tok/s",
        legend={"orientation": "h", "y": -0.45},
    )
    return fig

"""Figures of the speed ladder (lesson 9): pure functions of :func:`paged_edu.labs.speed_ladder.run_ladder`'s
records, stored or measured.

* :func:`ladder_speed_figure` -- useful tokens/s per rung, beside the roofline's tokens/s for the same steps;
* :func:`host_device_figure` -- a window of consecutive steps as a Gantt chart: one row of host intervals
  (schedule, prepare, launch), one row of device intervals (forward pass to sampling); the white
  between two device bars is the GPU waiting for the host;
* :func:`step_roofline_figure` -- each step's time against the roofline of its exact chunks;
* :func:`step_timeline_figure` -- the step-timeline model's steps (:func:`paged_edu.labs.step_timeline.simulate`):
  the host's phases in one row, every kernel in the other, coloured by kind;
* :func:`model_vs_ladder_figure` -- the model's mean decode step per rung beside the ladder's measured one.
"""

from __future__ import annotations

import plotly.graph_objects as go

from paged_edu.labs.step_timeline import KINDS, StepTimeline
from paged_edu.viz import palette as P

__all__ = [
    "host_device_figure",
    "ladder_speed_figure",
    "model_vs_ladder_figure",
    "step_roofline_figure",
    "step_timeline_data",
    "step_timeline_figure",
    "step_timeline_title",
]

HOST, DEVICE = P.OKABE_ITO["blue"], P.GOOD


def _ran(rungs: list[dict]) -> list[dict]:
    return [r for r in rungs if "skipped" not in r]


def ladder_speed_figure(rungs: list[dict], source: str) -> go.Figure:
    """Useful tokens/s of every rung that ran, and the roofline's tokens/s for the same steps (a line:
    the ceiling). ``source`` says where the numbers come from (a stored H200 run, a live CPU run)."""
    ran = _ran(rungs)
    names = [r["rung"] for r in ran]
    fig = go.Figure(
        [
            go.Bar(x=names, y=[r["tokens_per_s"] for r in ran], name="measured", marker_color=DEVICE),
            go.Scatter(
                x=names,
                y=[r["roofline_tokens_per_s"] for r in ran],
                mode="lines+markers",
                name="roofline (full efficiency, per-chunk shapes, LM head included)",
                line={"color": P.SHARED, "dash": "dash"},
            ),
        ]
    )
    fig.update_layout(
        title=f"The speed ladder: useful tokens per second per rung ({source})",
        xaxis_title="rung (each adds one mechanism)",
        yaxis_title="useful tokens / s",
        yaxis_type="log",
        hovermode="x",  # a rung's measured and roofline figures together, from anywhere above it
        height=380,
        legend={"orientation": "h", "y": -0.3},
        margin={"t": 60},
    )
    return fig


def host_device_figure(rung: dict, num_steps: int = 12) -> go.Figure:
    """``num_steps`` consecutive steps of one rung's ``window``: host bars above, device bars below, on
    one clock (ms from the first bar). A decode step's device bar is bluish green, a mixed step's orange."""
    window = rung["window"][:num_steps]
    t0 = min(min(w["host_ms"][0], w["device_ms"][0]) for w in window) if window else 0.0
    fig = go.Figure()
    for row, key, color in (("host", "host_ms", HOST), ("device", "device_ms", DEVICE)):
        for kind, decode in (("decode step", True), ("mixed step", False)):
            steps = [w for w in window if w["decode"] == decode]
            if not steps:
                continue
            fig.add_trace(
                go.Bar(
                    y=[row] * len(steps),
                    x=[w[key][1] - w[key][0] for w in steps],
                    base=[w[key][0] - t0 for w in steps],
                    orientation="h",
                    name=f"{row}: {kind}",
                    marker={
                        "color": color if decode or row == "host" else P.OKABE_ITO["orange"],
                        "line": {"color": "#FFFFFF", "width": 1},
                    },
                    text=[str(w["step"]) for w in steps],
                    hovertemplate="step %{text}: %{base:.3f} + %{x:.3f} ms<extra></extra>",
                )
            )
    fig.update_layout(
        title=f"{rung['rung']}: host and device, step by step (gaps in the device row: the GPU idles)",
        xaxis_title="time (ms)",
        yaxis_title="who works",
        barmode="overlay",
        height=260,
        legend={"orientation": "h", "y": -0.45},
        yaxis={"categoryorder": "array", "categoryarray": ["device", "host"]},
        margin={"t": 50},
    )
    return fig


def step_roofline_figure(rungs: list[dict]) -> go.Figure:
    """Each step's time (ms, log) against its roofline time (ms, log) for every rung that ran; the
    diagonal is the roofline itself: the distance above it is how far a step is from the ceiling."""
    ran = _ran(rungs)
    colors = [P.IDLE, P.OKABE_ITO["orange"], P.OKABE_ITO["reddish purple"], P.OKABE_ITO["blue"], P.GOOD]
    fig = go.Figure()
    lo, hi = float("inf"), 0.0
    for k, r in enumerate(ran):
        s = r["steps"]
        lo = min([lo, *s["roofline_ms"]])
        hi = max([hi, *s["duration_ms"]])
        fig.add_trace(
            go.Scatter(
                x=s["roofline_ms"],
                y=s["duration_ms"],
                mode="markers",
                name=r["rung"],
                marker={"color": colors[k % len(colors)], "size": 4, "opacity": 0.6},
            )
        )
    if ran:
        fig.add_trace(
            go.Scatter(
                x=[lo, hi],
                y=[lo, hi],
                mode="lines",
                name="step time = roofline",
                line={"color": P.SHARED, "dash": "dot"},
            )
        )
    fig.update_layout(
        title="Each step against its roofline (full efficiency, per-chunk shapes, LM head included)",
        xaxis_title="roofline time of the step (ms)",
        yaxis_title="measured step time (ms)",
        xaxis_type="log",
        yaxis_type="log",
        height=420,
        legend={"orientation": "h", "y": -0.25},
        margin={"t": 60},
    )
    return fig


HOST_PHASES = {  # the model's host phases -> colour
    "schedule + prepare": P.OKABE_ITO["blue"],
    "launch": P.OKABE_ITO["sky blue"],
    "update": P.OKABE_ITO["reddish purple"],
}
KIND_COLORS = {"gemm": P.GOOD, "attention": P.OKABE_ITO["orange"], "fused": P.OKABE_ITO["vermillion"], "other": P.IDLE}
TIMELINE_TRACES = [("host", phase) for phase in HOST_PHASES] + [("device", kind) for kind in KINDS]


def step_timeline_data(t: StepTimeline) -> list[dict]:
    """Per trace of :data:`TIMELINE_TRACES`: the bars' starts (``base``, ms), lengths (``x``) and labels."""
    rows = []
    for row, name in TIMELINE_TRACES:
        items = [h for h in t.host if h[1] == name] if row == "host" else [d for d in t.device if d[1] == name]
        rows.append(
            dict(
                base=[a / 1e3 for _, _, a, _ in items],
                x=[(b - a) / 1e3 for _, _, a, b in items],
                text=[f"step {k}" for k, *_ in items],
            )
        )
    return rows


def step_timeline_title(t: StepTimeline) -> str:
    order = "host one step ahead" if t.overlap else "synchronous"
    how = "one graph replay" if t.graphs else f"{t.num_launches:,} launches"
    return (
        f"batch {t.batch:g}, {order}, {how}: a step every {t.step_us / 1e3:.3f} ms "
        f"(host {t.host_us / 1e3:.3f}, device {t.device_us / 1e3:.3f} ms, of it busy {t.busy_us / 1e3:.3f}; "
        f"{t.num_kernels:,} kernels) -> {t.tokens_per_s:,.0f} tok/s"
    )


def step_timeline_figure(t: StepTimeline) -> go.Figure:
    """A few steps of the model: the host's phases above, each kernel below, on one clock (ms)."""
    fig = go.Figure()
    for (row, name), data in zip(TIMELINE_TRACES, step_timeline_data(t)):
        color = HOST_PHASES.get(name) or KIND_COLORS[name]
        fig.add_trace(
            go.Bar(
                y=[row] * len(data["x"]),
                x=data["x"],
                base=data["base"],
                text=data["text"],
                textposition="none",
                orientation="h",
                name=f"{row}: {name}",
                marker={"color": color, "line": {"width": 0}},
                hovertemplate="%{text}: %{base:.3f} + %{x:.4f} ms<extra>" + name + "</extra>",
            )
        )
    fig.update_layout(
        title={"text": step_timeline_title(t), "font": {"size": 13}},
        xaxis_title="time (ms)",
        yaxis_title="who works",
        barmode="overlay",
        height=300,
        legend={"orientation": "h", "y": -0.35},
        yaxis={"categoryorder": "array", "categoryarray": ["device", "host"]},
        margin={"t": 60},
    )
    return fig


def model_vs_ladder_figure(predictions: list[dict], source: str) -> go.Figure:
    """The step-timeline model's mean decode step per rung (:func:`~paged_edu.labs.step_timeline.predict_ladder`)
    beside the ladder's measured one; each bar's label is the model's error."""
    names = [p["rung"] for p in predictions]
    fig = go.Figure(
        [
            go.Bar(x=names, y=[p["measured_ms"] for p in predictions], name="measured", marker_color=DEVICE),
            go.Bar(
                x=names,
                y=[p["predicted_ms"] for p in predictions],
                name="the model",
                marker_color=HOST,
                text=[f"{p['error']:+.0%}" for p in predictions],
                textposition="outside",
            ),
        ]
    )
    fig.update_layout(
        title=f"Mean decode step per rung: the step-timeline model against the ladder ({source})",
        xaxis_title="rung",
        yaxis_title="mean decode step (ms, log)",
        yaxis_type="log",
        barmode="group",
        height=380,
        legend={"orientation": "h", "y": -0.3},
        margin={"t": 60},
    )
    return fig

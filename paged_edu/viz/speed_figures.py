"""Figures of the speed ladder (lesson 9): pure functions of :func:`paged_edu.labs.speed_ladder.run_ladder`'s
records, stored or measured.

* :func:`ladder_speed_figure` -- useful tokens/s per rung, beside the roofline's tokens/s for the same steps;
* :func:`host_device_figure` -- a window of consecutive steps as a Gantt chart: one row of host intervals
  (schedule, prepare, launch), one row of device intervals (forward pass to sampling); the white
  between two device bars is the GPU waiting for the host;
* :func:`step_roofline_figure` -- each step's time against the roofline of its exact chunks;
* :func:`overlap_figure` -- the same steps synchronous and overlapped, from a host / device split
  (:func:`~paged_edu.labs.speed_ladder.overlap_schedule`): sum against max.
"""

from __future__ import annotations

import plotly.graph_objects as go

from paged_edu.labs.speed_ladder import overlap_schedule
from paged_edu.viz import palette as P

__all__ = ["host_device_figure", "ladder_speed_figure", "overlap_data", "overlap_figure", "step_roofline_figure"]

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


OVERLAP_ROWS = ("synchronous: host", "synchronous: device", "overlapped: host", "overlapped: device")


def overlap_data(host_ms: float, device_ms: float, num_steps: int = 6) -> list[dict]:
    """Per row of :data:`OVERLAP_ROWS`: the bars' starts (``base``), lengths (``x``) and step labels."""
    rows = []
    for overlap in (False, True):
        steps = overlap_schedule(host_ms, device_ms, num_steps, overlap)
        for side in ("host", "device"):
            rows.append(
                dict(
                    base=[s[side][0] for s in steps],
                    x=[s[side][1] - s[side][0] for s in steps],
                    text=[str(s["step"]) for s in steps],
                )
            )
    return rows


def overlap_title(host_ms: float, device_ms: float) -> str:
    return (
        f"host {host_ms:.2f} ms + device {device_ms:.2f} ms per step: synchronous {host_ms + device_ms:.2f} ms "
        f"a step, overlapped max = {max(host_ms, device_ms):.2f} ms"
    )


def overlap_figure(host_ms: float, device_ms: float, num_steps: int = 6) -> go.Figure:
    """``num_steps`` steps of ``host_ms`` host work and ``device_ms`` device work, synchronous (host, then
    device) and overlapped (the host one step ahead), on one time axis."""
    fig = go.Figure()
    for name, row in zip(OVERLAP_ROWS, overlap_data(host_ms, device_ms, num_steps)):
        fig.add_trace(
            go.Bar(
                y=[name] * len(row["x"]),
                x=row["x"],
                base=row["base"],
                text=row["text"],
                orientation="h",
                name=name,
                showlegend=False,
                marker={"color": HOST if name.endswith("host") else DEVICE, "line": {"color": "#FFFFFF", "width": 1}},
                hovertemplate="step %{text}: %{base:.2f} + %{x:.2f} ms<extra></extra>",
            )
        )
    fig.update_layout(
        title=overlap_title(host_ms, device_ms),
        xaxis_title="time (ms)",
        yaxis_title="schedule: who works",
        barmode="overlay",
        height=300,
        yaxis={"categoryorder": "array", "categoryarray": list(reversed(OVERLAP_ROWS))},
        margin={"t": 50},
    )
    return fig

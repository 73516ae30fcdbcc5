"""Lesson 4's kernel figures: the ladder loop -> torch -> Triton, and time against the number of KV splits.

Pure functions from measured rows (:mod:`paged_edu.labs.kernel_ladder`, or the stored
``paged_edu/data/kernel_bench.json`` / ``kernel_sweep.json``) to plotly figures.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from paged_edu.viz import palette as P

__all__ = ["ladder_figure", "split_figure", "stored_split_points"]

COLORS = {
    "loop": P.IDLE,
    "seed": P.IDLE,
    "torch": P.OKABE_ITO["blue"],
    "triton": P.OKABE_ITO["orange"],
    "ceiling": P.OKABE_ITO["bluish green"],
}


def ladder_figure(rows: list[dict], title: str) -> go.Figure:
    """Bars of µs per decode call (log scale) per case and implementation; the copy ceiling as a marker."""
    fig = go.Figure()
    cases = [r["case"] for r in rows]
    impls = [i for i in ("loop", "seed", "torch", "triton") if any(i in r["impls"] for r in rows)]
    for impl in impls:
        fig.add_trace(
            go.Bar(x=cases, y=[r["impls"].get(impl, {}).get("us") for r in rows], name=impl, marker_color=COLORS[impl])
        )
    if all("ceiling_us" in r for r in rows):
        fig.add_trace(
            go.Scatter(
                x=cases,
                y=[r["ceiling_us"] / 2 for r in rows],
                mode="markers",
                name="K+V read at copy bandwidth",
                marker=dict(symbol="line-ew-open", size=30, color=COLORS["ceiling"]),
            )
        )
    fig.update_layout(
        barmode="group",
        yaxis_type="log",
        yaxis_title="µs per decode call (log)",
        xaxis_title="batch × context",
        title=title,
        height=380,
        width=820,
    )
    return fig


def split_figure(sweeps: list[dict], title: str) -> go.Figure:
    """Per case, µs and % of the copy ceiling against num_splits; the kernel's own choice marked."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per call", "% of copy ceiling"))
    for k, sweep in enumerate(sweeps):
        color = (
            P.OKABE_ITO["orange"],
            P.OKABE_ITO["blue"],
            P.OKABE_ITO["bluish green"],
            P.OKABE_ITO["reddish purple"],
        )[k % 4]
        xs = [p["splits"] for p in sweep["points"]]
        for col, key in ((1, "us"), (2, "pct_of_ceiling")):  # the case's legend entry: the first panel's
            y = [p[key] for p in sweep["points"]]
            legend = None if col == 1 else False
            trace = go.Scatter(
                x=xs, y=y, mode="lines+markers", name=sweep["case"], line=dict(color=color), showlegend=legend
            )
            fig.add_trace(trace, 1, col)
        chosen = [p for p in sweep["points"] if p["splits"] == sweep.get("chosen_splits")]
        if chosen:
            fig.add_trace(
                go.Scatter(
                    x=[chosen[0]["splits"]],
                    y=[chosen[0]["us"]],
                    mode="markers",
                    marker=dict(symbol="star", size=14, color=color),
                    name=f"{sweep['case']}: the kernel's choice",
                ),
                1,
                1,
            )
    for col in (1, 2):
        fig.update_xaxes(type="log", title_text="num_splits", row=1, col=col)
    fig.update_yaxes(type="log", title_text="time per call (µs)", row=1, col=1)
    fig.update_yaxes(title_text="share of the copy ceiling (%)", row=1, col=2)
    fig.update_layout(title=title, height=380, width=900)
    return fig


def stored_split_points(sweep_json: dict, case: str) -> dict | None:
    """From ``paged_edu/data/kernel_sweep.json``: the best time seen at each split count for ``case``.

    That file keeps only each case's 12 best configurations (tile, warps, stages, splits), so split
    counts whose best configuration ranked lower are missing, and each point may use another tile.
    """
    for row in sweep_json.get("cases", []):
        if row["case"] != case:
            continue
        best: dict[int, dict] = {}
        for r in row.get("sweep", []):
            if r["splits"] not in best or r["us"] < best[r["splits"]]["us"]:
                best[r["splits"]] = r
        points = [{"splits": n, "us": r["us"], "pct_of_ceiling": r["pct_of_ceiling"]} for n, r in sorted(best.items())]
        return {"case": case, "points": points, "chosen_splits": row.get("triton_config", {}).get("num_splits")}
    return None

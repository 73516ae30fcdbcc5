"""Memory figures of lessons 1 and 2: what a request costs, what a reservation wastes, how many fit.

Pure functions over library state (colours from :mod:`paged_edu.viz.palette`, a legend for each):

* :func:`kv_memory_figure` -- ``M_KV(s)`` of one request (a linear law, on linear axes) and the
  batch against the memory left for the cache;
* :func:`contiguous_figure` -- lesson 1's contiguous baseline, one square per token slot;
* :func:`utilisation_figure` -- measured ``eta_paged`` (:mod:`paged_edu.labs.utilisation`) against
  its bound ``1 - B/(s+B)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

from paged_edu.core.hardware import ModelGeometry
from paged_edu.core.memory import eta_paged_bound, kv_bytes
from paged_edu.viz.palette import (
    ACCENT,
    BAD,
    FREE,
    GOOD,
    IDLE,
    NEUTRAL,
    OKABE_ITO,
    STATE_LABELS,
    OwnerColors,
    code_heatmap,
    legend_traces,
    series_color,
)

__all__ = ["contiguous_data", "contiguous_figure", "kv_memory_figure", "utilisation_figure"]


def utilisation_figure(
    measured: dict[int, tuple[Sequence[int], Sequence[float]]],
    s_max: int = 512,
    naive_l_max: int | None = None,
    title: str = "KV utilisation: measured eta_paged vs the bound 1 - B/(s+B)",
) -> go.Figure:
    """``measured[B] = (s values, measured eta)``: markers; the bound ``1 - B/(s+B)`` as lines.

    With ``naive_l_max``, the contiguous baseline ``eta_naive = s / L_max`` is drawn too.
    """
    fig = go.Figure()
    s_curve = list(range(1, s_max + 1))
    for k, (B, (s_vals, etas)) in enumerate(sorted(measured.items())):
        color = series_color(k)
        fig.add_trace(
            go.Scatter(
                x=s_curve,
                y=[eta_paged_bound(s, B) for s in s_curve],
                mode="lines",
                name=f"bound B={B}",
                line={"color": color, "dash": "dash"},
            )
        )
        fig.add_trace(
            go.Scatter(
                x=list(s_vals),
                y=list(etas),
                mode="markers",
                name=f"measured B={B}",
                marker={"color": color, "size": 6, "opacity": 0.7},
            )
        )
    if naive_l_max:
        fig.add_trace(
            go.Scatter(
                x=s_curve,
                y=[min(1.0, s / naive_l_max) for s in s_curve],
                mode="lines",
                name=f"contiguous, L_max={naive_l_max}",
                line={"color": NEUTRAL},
            )
        )
    fig.update_layout(
        title=title,
        xaxis_title="sequence length s (tokens)",
        yaxis_title="eta = tokens / reserved slots (fraction)",
        yaxis_range=[0, 1.02],
        height=420,
        margin={"t": 50},
    )
    return fig


def kv_memory_figure(
    spec: ModelGeometry, seq_len: int, batch: int, gpu_bytes: int, weights_bytes: int = 0, max_len: int = 32768
) -> go.Figure:
    """Left: ``M_KV(s)`` of one request against ``s`` (linear: it is a linear law). Right: the
    batch's KV bytes against the memory left for the cache, coloured by whether it fits.

    Trace order (widgets update them in place): 0 the line, 1 the chosen ``s``, 2 the bars, then
    legend-only entries.
    """
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("KV bytes of one request", "KV for the batch vs memory for KV"))
    s_vals = [0] + [2**k for k in range(4, int(math.log2(max_len)) + 1)]
    fig.add_trace(
        go.Scatter(
            x=s_vals,
            y=[kv_bytes(spec, s) / 2**30 for s in s_vals],
            mode="lines+markers",
            name="M_KV(s)",
            line={"color": OKABE_ITO["blue"]},
        ),
        1,
        1,
    )
    fig.add_trace(
        go.Scatter(
            x=[seq_len],
            y=[kv_bytes(spec, seq_len) / 2**30],
            mode="markers",
            marker={"size": 12, "color": ACCENT, "symbol": "diamond"},
            name="the chosen s",
        ),
        1,
        1,
    )
    need = kv_bytes(spec, seq_len) * batch
    free = max(0, gpu_bytes - weights_bytes)
    fig.add_trace(
        go.Bar(
            x=["KV for the batch", "memory for KV"],
            y=[need / 2**30, free / 2**30],
            marker_color=[BAD if need > free else GOOD, NEUTRAL],
            name="GiB",
            showlegend=False,
        ),
        1,
        2,
    )
    for trace in legend_traces({GOOD: "the batch fits", BAD: "the batch does NOT fit", NEUTRAL: "memory for KV"}):
        fig.add_trace(trace, 1, 2)
    fig.update_xaxes(title_text="sequence length s (tokens)", row=1, col=1)
    fig.update_yaxes(title_text="M_KV(s) (GiB)", row=1, col=1)
    fig.update_yaxes(title_text="memory (GiB)", row=1, col=2)
    fig.update_xaxes(title_text="demand against supply", row=1, col=2)
    fig.update_layout(height=360, margin={"t": 40}, showlegend=True, legend={"orientation": "h", "y": -0.2})
    return fig


def contiguous_data(contig, cols: int = 64, colors: OwnerColors | None = None) -> dict[str, list]:
    """Slot-level view of a :class:`~paged_edu.core.contiguous.ContiguousAllocator`: a token (owner colour),
    reserved but idle (grey), or free (near white); the first slot of each reservation names its owner."""
    colors = OwnerColors() if colors is None else colors
    rows = math.ceil(contig.num_slots / cols)
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    for slot in range(contig.num_slots):
        r, c = divmod(slot, cols)
        z[r][c] = 0
    for seq_id in contig.seq_ids:
        code = colors.code(seq_id)
        start, size = contig.reservation(seq_id)
        used = contig.num_tokens(seq_id)
        for k in range(size):
            r, c = divmod(start + k, cols)
            z[r][c] = code if k < used else 3
        r, c = divmod(start, cols)
        text[r][c] = str(seq_id)
    return {"z": z, "text": text}


def contiguous_figure(contig, cols: int = 64, colors: OwnerColors | None = None, title: str | None = None) -> go.Figure:
    """The contiguous baseline's address space, one square per token slot, with a legend."""
    colors = OwnerColors() if colors is None else colors
    data = contiguous_data(contig, cols, colors)
    rows = len(data["z"])
    if title is None:
        title = (
            f"Contiguous reservations (L_max = {contig.max_seq_len}): used {contig.used_slots} of "
            f"{contig.reserved_slots} reserved slots"
        )
    fig = go.Figure(
        code_heatmap(
            z=data["z"],
            text=data["text"],
            texttemplate="%{text}",
            xgap=1,
            ygap=4,
            hovertemplate="slot %{x} of row %{y}<extra></extra>",
            textfont={"size": 10},
        )
    )
    owners = {colors.color(s): f"tokens of {s}" for s in contig.seq_ids}
    for trace in legend_traces({**owners, IDLE: STATE_LABELS[IDLE], FREE: STATE_LABELS[FREE]}):
        fig.add_trace(trace)
    fig.update_yaxes(
        autorange="reversed", showticklabels=False, showgrid=False, zeroline=False, title_text=f"row (slot // {cols})"
    )
    fig.update_xaxes(
        side="top", showticklabels=False, showgrid=False, zeroline=False, title_text=f"token slot mod {cols}"
    )
    fig.update_layout(
        title={"text": title, "font": {"size": 13}},
        height=150 + 40 * rows,
        plot_bgcolor="white",
        margin={"l": 40, "r": 10, "t": 80, "b": 10},
        legend={"orientation": "h", "y": -0.05},
    )
    return fig

"""Figures of the serving simulator, next to the PagedAttention paper's numbers.

Pure functions from simulator results to plotly figures, plus :func:`write_all`, which saves every
figure of the simulations in :mod:`paged_edu.labs.paper_figures` (PNG through kaleido when a Chromium is found, HTML always
works) with the data behind it as JSON.

Paper numbers quoted for comparison (Kwon et al., SOSP 2023; OPT-13B on an A100-40GB):

* Fig. 2 -- share of KV memory holding token states: Orca (Max) 20.4%, Orca (Pow2) 26.8%,
  Orca (Oracle) 38.2%, vLLM 96.3%.
* Fig. 13a -- mean batched requests on ShareGPT: 7.00, 9.81, 13.62, 30.42.
* Fig. 15 -- memory saved by sharing: parallel sampling 6.1-9.8% (Alpaca), 16.2-30.5%
  (ShareGPT); beam search 37.6-55.2% (Alpaca), 44.3-66.3% (ShareGPT).
"""

from __future__ import annotations

import json
import os

import plotly.graph_objects as go

from paged_edu.labs.paper_figures import paper_figure_runs
from paged_edu.sim.costmodel import CostModel
from paged_edu.sim.results import SimResult
from paged_edu.viz import palette as P

__all__ = [
    "PAPER_BATCHED_SHAREGPT",
    "PAPER_TOKEN_STATES",
    "batched_figure",
    "block_latency_figure",
    "block_size_figure",
    "latency_rate_figure",
    "memory_breakdown_figure",
    "sharing_figure",
    "write_all",
]

PAPER_TOKEN_STATES = {"contiguous-max": 0.204, "contiguous-pow2": 0.268, "contiguous-oracle": 0.382, "paged": 0.963}
PAPER_BATCHED_SHAREGPT = {"contiguous-max": 7.00, "contiguous-pow2": 9.81, "contiguous-oracle": 13.62, "paged": 30.42}
PAPER_SAVING = {  # Fig. 15, (low, high) over n = 2..6 / beam width 2..6
    ("alpaca", "parallel"): (0.061, 0.098),
    ("alpaca", "beam"): (0.376, 0.552),
    ("sharegpt", "parallel"): (0.162, 0.305),
    ("sharegpt", "beam"): (0.443, 0.663),
}
PAPER_NAMES = {
    "contiguous-max": "Orca (Max)",
    "contiguous-pow2": "Orca (Pow2)",
    "contiguous-oracle": "Orca (Oracle)",
    "paged": "vLLM (paged)",
}
CATEGORIES = (
    ("token_states", "token states", P.OKABE_ITO["blue"]),
    ("reserved", "reserved", P.OKABE_ITO["yellow"]),
    ("internal_frag", "internal frag.", P.BAD),
    ("external_frag", "external frag.", P.OKABE_ITO["reddish purple"]),
    ("other", "other (free while requests wait)", P.IDLE),
)


def _name(res: SimResult) -> str:
    m = res.config.manager
    return PAPER_NAMES.get(m, m) + ("" if m.startswith("contiguous") else f" B={res.config.block_size}")


def memory_breakdown_figure(results: list[SimResult], title: str = "") -> go.Figure:
    """Stacked bars of the Fig. 2 breakdown per manager, the paper's token-state share as markers."""
    names = [_name(r) for r in results]
    fig = go.Figure()
    for key, label, color in CATEGORIES:
        fig.add_bar(
            y=names,
            x=[r.breakdown_fractions()[key] * 100 for r in results],
            name=label,
            orientation="h",
            marker_color=color,
        )
    paper = [PAPER_TOKEN_STATES.get(r.config.manager) for r in results]
    fig.add_scatter(
        y=names,
        x=[p * 100 if p is not None else None for p in paper],
        mode="markers",
        marker=dict(symbol="diamond", size=12, color=P.OKABE_ITO["black"]),
        name="paper: token states (Fig. 2)",
    )
    fig.update_layout(
        barmode="stack",
        title=title or "Where the KV memory goes (simulated vs. the paper's Fig. 2)",
        xaxis_title="% of KV memory allocated or wanted",
        height=380,
        width=900,
        legend=dict(orientation="h", y=-0.25),
        margin=dict(l=160),
    )
    fig.update_yaxes(autorange="reversed", title_text="memory manager")
    return fig


def batched_figure(results: list[SimResult], title: str = "") -> go.Figure:
    """Mean batched requests per manager, simulated and as the paper reports (Fig. 13a)."""
    names = [_name(r) for r in results]
    fig = go.Figure()
    fig.add_bar(
        x=names,
        y=[r.mean_batched for r in results],
        name="simulated",
        text=[f"{r.mean_batched:.1f}" for r in results],
        textposition="outside",
        marker_color=P.OKABE_ITO["blue"],
    )
    fig.add_bar(
        x=names,
        y=[PAPER_BATCHED_SHAREGPT.get(r.config.manager) for r in results],
        name="paper (Fig. 13a)",
        text=[f"{PAPER_BATCHED_SHAREGPT.get(r.config.manager, 0):.1f}" for r in results],
        textposition="outside",
        marker_color=P.IDLE,
    )
    fig.update_layout(
        title=title or "Requests batched per step (ShareGPT-like, saturated)",
        barmode="group",
        xaxis_title="memory manager",
        yaxis_title="mean batched requests",
        height=400,
        width=800,
    )
    return fig


def latency_rate_figure(points: list[dict], title: str = "", cap: float = 1.0) -> go.Figure:
    """Normalised latency (s/token) against request rate, one curve per manager (the paper's Fig. 12)."""
    fig = go.Figure()
    for k, label in enumerate(dict.fromkeys(p["label"] for p in points)):
        pts = [p for p in points if p["label"] == label]
        fig.add_scatter(
            line_color=P.series_color(k),
            x=[p["rate"] for p in pts],
            y=[min(p["norm_latency_mean_s"], cap) for p in pts],
            mode="lines+markers",
            name=PAPER_NAMES.get(pts[0]["manager"], pts[0]["manager"])
            + ("" if pts[0]["block_size"] is None else f" B={pts[0]['block_size']}"),
        )
    fig.update_layout(
        title=title or "Normalised latency vs. request rate (cf. the paper's Fig. 12)",
        xaxis_title="request rate (req/s)",
        yaxis_title=f"mean normalised latency (s/token, capped at {cap})",
        height=450,
        width=800,
    )
    return fig


def block_size_figure(results: list[SimResult], title: str = "") -> go.Figure:
    """Measured per-sequence utilisation against the bound ``1 - B/(s+B)`` as B grows."""
    paged = [r for r in results if r.config.manager == "paged"]
    sizes = [r.config.block_size for r in paged]
    util = [r.kv_utilization_final * 100 for r in paged]
    stored = [s for r in paged[:1] for req in r.requests for s in req.stored_tokens]
    bound = [100 * sum(s / (s + b) for s in stored) / len(stored) for b in sizes] if stored else []
    fig = go.Figure()
    fig.add_scatter(
        x=sizes,
        y=util,
        mode="lines+markers",
        name="measured: stored tokens / slots held at the end",
        line_color=P.series_color(0),
    )
    fig.add_scatter(
        x=sizes,
        y=[r.kv_utilization * 100 for r in paged],
        mode="lines+markers",
        name="measured: time-averaged KV util",
        line_color=P.series_color(1),
    )
    if bound:
        fig.add_scatter(
            x=sizes, y=bound, mode="lines", line=dict(dash="dash", color=P.NEUTRAL), name="mean bound 1 - B/(s+B)"
        )
    return _against_block_size(
        fig, sizes, title or "Paged utilisation falls as the block size grows", "KV slots holding a token (%)"
    )


def _against_block_size(fig: go.Figure, sizes: list[int], title: str, yaxis_title: str) -> go.Figure:
    """The layout of a figure against the block size ``B``: a log axis ticked at the sizes run."""
    fig.update_layout(
        title=title,
        xaxis_type="log",
        xaxis=dict(tickvals=sizes, title="block size B (tokens)"),
        yaxis_title=yaxis_title,
        height=400,
        width=800,
    )
    return fig


def sharing_figure(rows: list[dict], title: str = "") -> go.Figure:
    """Memory saved by block sharing for parallel sampling and beam-style forking (cf. Fig. 15)."""
    fig = go.Figure()
    series = [(d, f) for d in dict.fromkeys(r["dataset"] for r in rows) for f in ("parallel", "beam")]
    for k, (dataset, fork) in enumerate(series):
        pts = [r for r in rows if r["dataset"] == dataset and r["fork"] == fork]
        if not pts:
            continue
        color = P.series_color(k)
        fig.add_scatter(
            line_color=color,
            x=[r["n"] for r in pts],
            y=[r["saving"] * 100 for r in pts],
            mode="lines+markers",
            name=f"{dataset} {fork} (simulated)",
        )
        lo, hi = PAPER_SAVING.get((dataset, fork), (None, None))
        if lo is not None:
            fig.add_scatter(
                x=[pts[0]["n"], pts[-1]["n"]],
                y=[lo * 100, hi * 100],
                mode="markers",
                marker=dict(symbol="diamond-open", size=11, color=color),
                name=f"{dataset} {fork} (paper range)",
            )
    fig.update_layout(
        title=title or "Memory saved by sharing blocks (cf. the paper's Fig. 15)",
        xaxis_title="samples / beam width n",
        yaxis_title="% of blocks saved",
        height=420,
        width=800,
    )
    return fig


# ----------------------------------------------------------------------------------------------
# Running everything
# ----------------------------------------------------------------------------------------------


def _save(fig: go.Figure, path_stem: str, fmt: str, written: list[str]) -> None:
    if fmt in ("html", "both"):
        fig.write_html(path_stem + ".html", include_plotlyjs="cdn")
        written.append(path_stem + ".html")
    if fmt in ("png", "both"):
        try:
            fig.write_image(path_stem + ".png", scale=1.5)
            written.append(path_stem + ".png")
        except Exception as exc:  # kaleido needs a Chromium; HTML is the fallback
            if fmt == "png":
                fig.write_html(path_stem + ".html", include_plotlyjs="cdn")
                written.append(path_stem + ".html")
            print(f"  (PNG export failed: {type(exc).__name__}: {exc}; wrote HTML)")


def write_all(
    out_dir: str,
    cost: CostModel | None = None,
    num_requests: int = 1000,
    seed: int = 0,
    fmt: str = "both",
    server: dict | None = None,
    progress: bool = True,
    data_path: str | None = None,
) -> list[str]:
    """Run the simulations behind every figure (:func:`paged_edu.labs.paper_figures.paper_figure_runs`)
    and save the figures under ``out_dir``, with the data behind them as JSON (``data_path``, by default
    ``sim_figures_data.json`` in ``out_dir``); return the paths."""
    runs = paper_figure_runs(cost, num_requests, seed, server, progress)
    os.makedirs(out_dir, exist_ok=True)
    written: list[str] = []
    _save(memory_breakdown_figure(runs["saturated"]), os.path.join(out_dir, "sim_memory_breakdown"), fmt, written)
    _save(batched_figure(runs["saturated"]), os.path.join(out_dir, "sim_batched_requests"), fmt, written)
    _save(block_size_figure(runs["block_sizes"]), os.path.join(out_dir, "sim_block_size"), fmt, written)
    _save(latency_rate_figure(runs["latency_vs_rate"]), os.path.join(out_dir, "sim_latency_vs_rate"), fmt, written)
    _save(sharing_figure(runs["sharing"]), os.path.join(out_dir, "sim_sharing"), fmt, written)

    path = data_path or os.path.join(out_dir, "sim_figures_data.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(runs["data"], f, indent=1, default=str)
    written.append(path)
    return written


def block_latency_figure(rows: list[dict], title: str = "") -> go.Figure:
    """Fig. 18: mean normalised latency against block size, per-block kernel cost off and on."""
    sizes = [r["block_size"] for r in rows]
    fig = go.Figure()
    fig.add_scatter(
        x=sizes,
        y=[r["latency_off_s"] * 1e3 for r in rows],
        mode="lines+markers",
        name="roofline only (per-block cost off)",
        line_color=P.NEUTRAL,
    )
    fig.add_scatter(
        x=sizes,
        y=[r["latency_on_s"] * 1e3 for r in rows],
        mode="lines+markers",
        name=f"+ {rows[0]['per_block_s'] * 1e9:.3g} ns per block x layer x KV head" if rows else "on",
        line_color=P.ACCENT,
    )
    title = title or "Block size against latency (cf. the paper's Fig. 18)"
    return _against_block_size(fig, sizes, title, "mean normalised latency (ms/token)")

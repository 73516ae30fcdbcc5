"""Figures of the K/V tensors themselves: the values a copy-on-write copies (lesson 3).

Pure functions over the plain numbers :mod:`paged_edu.labs.experiments` returns; signed values
use the palette's blue-white-orange scale, centred on 0, with one shared colour bar.
"""

from __future__ import annotations

import plotly.graph_objects as go

from paged_edu.viz.palette import DIVERGING

__all__ = ["cow_heatmap_figure"]


def cow_heatmap_figure(result: dict, title: str | None = None) -> go.Figure:
    """``result`` from :func:`~paged_edu.labs.experiments.cow_experiment`: K of the shared block
    (source) and of its copy at each stage, as heat-maps of slots x dimensions."""
    from plotly.subplots import make_subplots

    stages = result["stages"]
    src, dst = result["src"], result["dst"]
    names = list(stages)
    titles = [f"{what} block {b}: {stage}" for stage in names for what, b in (("source", src), ("copy", dst))]
    fig = make_subplots(rows=len(names), cols=2, subplot_titles=titles, horizontal_spacing=0.08, vertical_spacing=0.12)
    values = [t for pair in stages.values() for t in pair]
    bound = max(float(t.abs().max()) for t in values) or 1.0
    for r, stage in enumerate(names, start=1):
        for c, tensor in enumerate(stages[stage], start=1):
            fig.add_trace(
                go.Heatmap(
                    z=tensor.tolist(),
                    zmin=-bound,
                    zmax=bound,
                    colorscale=DIVERGING,
                    showscale=(r, c) == (1, 2),
                    colorbar={"title": {"text": "K value"}},
                    hovertemplate="slot %{y}, dim %{x}: %{z:.3f}<extra></extra>",
                ),
                r,
                c,
            )
            fig.update_yaxes(title_text="slot in block", autorange="reversed", row=r, col=c, dtick=1)
            fig.update_xaxes(title_text="dimension (head 0)", row=r, col=c)
    if title is None:
        title = (
            f"Copy-on-write on the K tensor: block {src} -> {dst}, {result['bytes_copied']:,} bytes copied "
            f"(K and V); the child's new token lands in slot {result['slot_written']} of the copy"
        )
    fig.update_layout(
        title={"text": title, "font": {"size": 13}},
        height=230 * len(names) + 80,
        margin={"t": 80, "l": 60, "r": 20, "b": 40},
    )
    return fig

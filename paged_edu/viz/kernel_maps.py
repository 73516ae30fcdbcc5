"""Lesson 10's pictures of two kernels' addressing: where the K/V store writes, and which key tiles a paged
prefill program reads.

* :func:`store_map_figure` -- the cache's slots as a grid (one row per physical block, one column per
  offset), each coloured by the new token stored there (``slot_mapping``), the padding rows listed;
* :func:`tile_plan_figure` -- a chunk's new tokens (rows) against the keys (columns): read in a full tile
  (no mask), read in a diagonal tile and visible, read and masked, or never read
  (:func:`paged_edu.labs.tile_plan.tile_plan`);
* :class:`TilePlanExplorer` -- the second figure with sliders for the cached prefix, the chunk, the tile and
  the tokens per program. Tests set the widgets and read ``explorer.fig`` and ``explorer.plan``.
"""

from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go

from paged_edu.labs.tile_plan import DIAGONAL_MASKED, DIAGONAL_SEEN, FULL, SKIPPED, TilePlan, tile_plan
from paged_edu.viz import palette as P
from paged_edu.viz.widgets import _figure_widget

__all__ = ["TilePlanExplorer", "store_map_data", "store_map_figure", "tile_plan_data", "tile_plan_figure"]

PLAN_COLORS = {  # a cell's fate -> (colour, legend)
    SKIPPED: (P.FREE, "never read (a skipped tile)"),
    FULL: (P.GOOD, "read in a full tile: no mask"),
    DIAGONAL_SEEN: (P.OKABE_ITO["blue"], "read in a diagonal tile, visible"),
    DIAGONAL_MASKED: (P.OKABE_ITO["orange"], "read in a diagonal tile, masked to -inf"),
}


def _discrete_scale(colors: list[str]) -> list[list]:
    n = len(colors)
    return [[v, c] for k, c in enumerate(colors) for v in (k / n, (k + 1) / n)]


def store_map_data(slot_mapping: list[int], num_blocks: int, block_size: int) -> dict:
    """``z``: (num_blocks, block_size) the new token stored at each slot (None: untouched); ``padding``: the
    rows whose slot is -1."""
    z = [[None] * block_size for _ in range(num_blocks)]
    for token, slot in enumerate(slot_mapping):
        if slot >= 0:
            z[slot // block_size][slot % block_size] = token
    return {"z": z, "padding": [t for t, s in enumerate(slot_mapping) if s < 0]}


def store_map_figure(slot_mapping: list[int], num_blocks: int, block_size: int) -> go.Figure:
    """The cache after a store: which new token each slot received."""
    data = store_map_data(slot_mapping, num_blocks, block_size)
    text = [[f"t{v}" if v is not None else "" for v in row] for row in data["z"]]
    fig = go.Figure(
        go.Heatmap(
            z=[[(-1 if v is None else v) for v in row] for row in data["z"]],
            text=text,
            texttemplate="%{text}",
            colorscale=[[0.0, P.FREE], [1e-9, P.SEQ_COLORS[0]], [1.0, P.SEQ_COLORS[1]]],
            showscale=False,
            xgap=2,
            ygap=2,
            hovertemplate="block %{y}, offset %{x}: %{text}<extra></extra>",
        )
    )
    pad = ", ".join(f"t{t}" for t in data["padding"]) or "none"
    fig.update_layout(
        title=f"Where the store writes: token t goes to block slot // {block_size}, offset slot % {block_size} "
        f"(padding rows, slot -1, store nothing: {pad})",
        xaxis_title="offset in the block (slot % B)",
        yaxis_title="physical block (slot // B)",
        yaxis={"autorange": "reversed", "dtick": 1},
        xaxis={"dtick": 1},
        height=120 + 32 * num_blocks,
        margin={"t": 60},
    )
    return fig


def tile_plan_data(plan: TilePlan) -> dict:
    return {"z": plan.cells.tolist(), "title": _plan_title(plan)}


def _plan_title(plan: TilePlan) -> str:
    return (
        f"{plan.q_len} new tokens over {plan.ctx} cached, {plan.block_q} a program, tiles of {plan.tile} keys: "
        f"{plan.tiles_read} tiles read, {plan.tiles_masked} of them masked; {plan.keys_scored:,} scores for the "
        f"{plan.keys_needed:,} causal attention needs"
    )


def tile_plan_figure(plan: TilePlan) -> go.Figure:
    """Each new token (row) against each key position (column): what the prefill kernel does with it."""
    codes = sorted(PLAN_COLORS)
    fig = go.Figure(
        go.Heatmap(
            z=plan.cells.tolist(),
            zmin=min(codes) - 0.5,
            zmax=max(codes) + 0.5,
            colorscale=_discrete_scale([PLAN_COLORS[c][0] for c in codes]),
            showscale=False,
            xgap=1,
            ygap=1,
            hovertemplate="new token %{y}, key %{x}<extra></extra>",
        )
    )
    for trace in P.legend_traces({PLAN_COLORS[c][0]: PLAN_COLORS[c][1] for c in codes}):
        fig.add_trace(trace)
    fig.update_layout(
        title={"text": _plan_title(plan), "font": {"size": 13}},
        xaxis_title="key position t (the cached prefix first)",
        yaxis_title="new token j of the chunk",
        yaxis={"autorange": "reversed"},
        height=420,
        plot_bgcolor="white",
        legend={"orientation": "h", "y": -0.2},
        margin={"t": 60},
    )
    return fig


class TilePlanExplorer:
    """The tile plan of one chunk, redrawn as its sliders move."""

    def __init__(self, ctx: int = 20, q_len: int = 24, block_q: int = 8, tile: int = 8) -> None:
        style = {"description_width": "170px"}
        wide = W.Layout(width="420px")
        self.ctx = W.IntSlider(value=ctx, min=0, max=96, description="cached tokens (ctx)", style=style, layout=wide)
        self.q_len = W.IntSlider(value=q_len, min=1, max=64, description="new tokens (q_len)", style=style, layout=wide)
        self.block_q = W.Dropdown(options=[1, 4, 8, 16], value=block_q, description="tokens a program", style=style)
        self.tile = W.Dropdown(options=[4, 8, 16, 32], value=tile, description="keys a tile (TILE)", style=style)
        self.plan = tile_plan(ctx, q_len, block_q, tile)
        self.fig = _figure_widget(tile_plan_figure(self.plan))
        for w in (self.ctx, self.q_len, self.block_q, self.tile):
            w.observe(lambda _c: self.redraw(), names="value")

    def redraw(self) -> None:
        self.plan = tile_plan(self.ctx.value, self.q_len.value, self.block_q.value, self.tile.value)
        data = tile_plan_data(self.plan)
        with self.fig.batch_update():
            self.fig.data[0].z = data["z"]
            self.fig.layout.title.text = data["title"]

    def widget(self) -> W.Widget:
        return W.VBox([W.HBox([W.VBox([self.ctx, self.q_len]), W.VBox([self.tile, self.block_q])]), self.fig])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())

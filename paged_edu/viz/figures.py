"""Plotly figures of the paged cache, built from library state: pure functions, no widgets.

Each ``*_figure`` function returns a fresh ``go.Figure``; each ``*_data`` function returns the
arrays that figure shows, so a widget can refresh a live ``FigureWidget`` in place (and a test can
compare the two). Colours come from :mod:`paged_edu.viz.palette` (colour-blind safe) and every
figure carries a legend for them:

* one colour per sequence (stable while the sequence lives, see :class:`OwnerColors`), and the
  owner's name written in its blocks;
* near black for a block shared by several sequences (``ref_count > 1``);
* pale blue for an *evictable* block: ref count 0, but its KV is still in the prefix cache;
* near white for a free block that holds nothing reusable.

The memory figures of lessons 1 and 2 live in :mod:`paged_edu.viz.memory_figures`, the tensor
figures (K values, addresses) in :mod:`paged_edu.viz.tensor_figures`, the colours in
:mod:`paged_edu.viz.palette`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import plotly.graph_objects as go

from paged_edu.core.allocator import BlockAllocator
from paged_edu.viz.palette import (
    EVICTABLE,
    FREE,
    NEUTRAL,
    SEQ_COLORS,
    SHARED,
    STATE_LABELS,
    OwnerColors,
    code_heatmap,
    legend_traces,
    text_color,
)

__all__ = [
    "BlockInfo",
    "block_infos",
    "block_grid_data",
    "block_grid_figure",
    "block_table_data",
    "block_table_figure",
    "logical_physical_figure",
]

BLOCK_STATES = {FREE: STATE_LABELS[FREE], EVICTABLE: STATE_LABELS[EVICTABLE], SHARED: STATE_LABELS[SHARED]}


@dataclass(slots=True)
class BlockInfo:
    """What one physical block holds right now."""

    block_id: int
    ref_count: int
    owners: list[Hashable]  # live sequences whose block table holds it
    filled: int  # slots written (the largest over its owners)
    state: str  # "free", "evictable", "shared" or "owned"


def _tables(allocator) -> dict[Hashable, tuple[list[int], int]]:
    """``seq_id -> (block_table, num_tokens)`` for our allocator or the seed's."""
    if isinstance(allocator, BlockAllocator):
        return {s: (allocator.block_table(s), allocator.num_tokens(s)) for s in allocator.seq_ids}
    B = allocator.block_size  # SeedAllocator: it does not track lengths; blocks count as full
    return {s: (list(t), len(t) * B) for s, t in allocator.block_tables.items()}


def block_infos(allocator) -> list[BlockInfo]:
    """One :class:`BlockInfo` per physical block, in block-id order."""
    B = allocator.block_size
    owners: dict[int, list[Hashable]] = {}
    filled: dict[int, int] = {}
    for seq_id, (table, n) in _tables(allocator).items():
        for i, block_id in enumerate(table):
            owners.setdefault(block_id, []).append(seq_id)
            filled[block_id] = max(filled.get(block_id, 0), min(B, n - i * B))
    infos = []
    for b in range(allocator.num_blocks):
        rc = allocator.ref_count(b)
        if rc > 1:
            state = "shared"
        elif rc == 1:
            state = "owned"
        elif isinstance(allocator, BlockAllocator) and allocator.is_evictable(b):
            state = "evictable"
        else:
            state = "free"
        infos.append(BlockInfo(b, rc, owners.get(b, []), filled.get(b, 0), state))
    return infos


def block_grid_data(allocator, cols: int = 8, colors: OwnerColors | None = None) -> dict[str, list]:
    """``z`` (colour codes), ``text`` (id and ref count) and ``hover`` rows of the block grid."""
    colors = OwnerColors() if colors is None else colors
    rows = math.ceil(allocator.num_blocks / cols)
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    hover = [[""] * cols for _ in range(rows)]
    for info in block_infos(allocator):
        r, c = divmod(info.block_id, cols)
        if info.state == "owned":
            z[r][c] = colors.code(info.owners[0])
        else:
            z[r][c] = {"free": 0, "evictable": 1, "shared": 2}[info.state]
            for owner in info.owners:  # keep colours stable for owners of shared blocks
                colors.code(owner)
        owner = f"<br>{info.owners[0]}" if info.state == "owned" else ""
        text[r][c] = f"#{info.block_id}{owner}" + (f"<br>rc={info.ref_count}" if info.ref_count else "")
        who = ", ".join(map(str, info.owners)) or "-"
        hover[r][c] = (
            f"block {info.block_id}: {info.state}<br>ref_count {info.ref_count}<br>"
            f"owners {who}<br>filled {info.filled}/{allocator.block_size}"
        )
    return {"z": z, "text": text, "hover": hover}


def block_grid_figure(
    allocator,
    cols: int = 8,
    colors: OwnerColors | None = None,
    title: str = "Physical KV blocks (colour = owner, rc = ref count)",
) -> go.Figure:
    """The pool of physical blocks as a grid, coloured by owner, labelled with ref counts."""
    data = block_grid_data(allocator, cols, colors)
    rows = len(data["z"])
    fig = go.Figure(
        code_heatmap(
            z=data["z"],
            text=data["text"],
            customdata=data["hover"],
            texttemplate="%{text}",
            hovertemplate="%{customdata}<extra></extra>",
            xgap=3,
            ygap=3,
            textfont={"size": 10},
        )
    )
    for trace in legend_traces({**BLOCK_STATES, SEQ_COLORS[0]: "owned by one sequence (its name in the block)"}):
        fig.add_trace(trace)
    fig.update_yaxes(
        autorange="reversed", showticklabels=False, showgrid=False, zeroline=False, title_text=f"row (id // {cols})"
    )
    fig.update_xaxes(
        side="top", showticklabels=False, showgrid=False, zeroline=False, title_text=f"physical block id mod {cols}"
    )
    fig.update_layout(
        title=title,
        # 50 x 48 px a block (its id, owner and ref count on three lines) and the legend in two columns:
        # the pool of a lesson's widget fits beside its controls or its block tables in a laptop's
        # notebook (934 px wide at 1366 x 768)
        height=130 + 48 * rows,
        width=50 * cols + 60,
        margin={"l": 40, "r": 10, "t": 70, "b": 10},
        plot_bgcolor="white",
        legend={
            "orientation": "h",
            "y": -0.02,
            "yanchor": "top",
            "font": {"size": 10},
            "entrywidth": 0.5,
            "entrywidthmode": "fraction",
        },
    )
    return fig


def block_table_data(allocator, colors: OwnerColors | None = None, min_cols: int = 4) -> dict[str, list]:
    """One row per sequence: ``B(i)`` for each logical block ``i``; shared entries in slate."""
    colors = OwnerColors() if colors is None else colors
    tables = _tables(allocator)
    width = max([min_cols] + [len(t) for t, _ in tables.values()])
    z, text, y = [], [], []
    for seq_id, (table, n) in tables.items():
        own = colors.code(seq_id)
        z.append([(2 if allocator.ref_count(b) > 1 else own) for b in table] + [None] * (width - len(table)))
        text.append([str(b) for b in table] + [""] * (width - len(table)))
        y.append(f"{seq_id} ({n} tok)")
    return {"z": z, "text": text, "y": y, "x": [f"i={i}" for i in range(width)]}


def block_table_figure(
    allocator, colors: OwnerColors | None = None, title: str = "Block tables: logical block i -> physical block B(i)"
) -> go.Figure:
    """Each sequence's block table as a row of cells holding the physical block ids."""
    data = block_table_data(allocator, colors)
    fig = go.Figure(
        code_heatmap(
            z=data["z"] or [[None]],
            text=data["text"] or [[""]],
            x=data["x"],
            y=data["y"] or [""],
            texttemplate="%{text}",
            xgap=3,
            ygap=3,
            hovertemplate="%{y}, %{x}: B(i) = %{text}<extra></extra>",
        )
    )
    for trace in legend_traces({SHARED: STATE_LABELS[SHARED], SEQ_COLORS[0]: "the row's own block (row colour)"}):
        fig.add_trace(trace)
    fig.update_yaxes(autorange="reversed", showgrid=False, zeroline=False, title_text="sequence")
    fig.update_xaxes(
        side="top", showgrid=False, zeroline=False, title_text="logical block i (tokens i·B to i·B + B - 1)"
    )
    fig.update_layout(
        title=title,
        height=140 + 36 * max(1, len(data["y"])),
        plot_bgcolor="white",
        margin={"l": 80, "r": 20, "t": 110, "b": 10},
        legend={"font": {"size": 10}},
    )
    return fig


def logical_physical_figure(
    allocator,
    seq_ids: Iterable[Hashable] | None = None,
    title: str = "Logical token positions -> physical KV blocks",
    *,
    fixed_width: bool = False,
) -> go.Figure:
    """The seed's Figure 1: each sequence's contiguous logical blocks mapped to scattered physical ones.

    Top row: every sequence's logical blocks ``i = 0, 1, ...`` (tokens ``iB .. iB+B-1``), grouped by
    sequence. Bottom row: the physical pool in block-id order. A line joins logical block ``i`` of a
    sequence to ``B(i)``; a block shared by several sequences receives several lines.

    The figure follows the width of the column it is drawn in (a notebook's, the site's);
    ``fixed_width=True`` gives it 62 px a block instead, for an image file (``scripts/make_figures.py``).
    """
    B = allocator.block_size
    tables = _tables(allocator)
    seq_ids = list(tables) if seq_ids is None else list(seq_ids)
    colors = OwnerColors()
    for seq_id in seq_ids:
        colors.code(seq_id)
    shapes, annotations = [], []
    top, bottom = 3.0, 0.0  # y of the logical row and of the physical row

    def rect(x, y, color, label, font_color=SHARED):
        shapes.append(
            {
                "type": "rect",
                "x0": x,
                "x1": x + 0.9,
                "y0": y,
                "y1": y + 0.9,
                "fillcolor": color,
                "line": {"color": NEUTRAL, "width": 1},
            }
        )
        annotations.append(
            {"x": x + 0.45, "y": y + 0.45, "text": label, "showarrow": False, "font": {"size": 10, "color": font_color}}
        )

    fig = go.Figure()
    x = 0.0
    for seq_id in seq_ids:
        table, n = tables[seq_id]
        color = colors.color(seq_id)
        annotations.append(
            {
                "x": x + 0.45 * len(table),
                "y": top + 1.25,
                "text": f"<b>{seq_id}</b> ({n} tokens)",
                "showarrow": False,
                "font": {"color": color},
            }
        )
        lx, ly = [], []
        for i, b in enumerate(table):
            hi = min(n, (i + 1) * B) - 1
            rect(x, top, color, f"i={i}<br>t {i * B}-{hi}", text_color(color))
            lx += [x + 0.45, b + 0.45, None]
            ly += [top, bottom + 0.9, None]
            x += 1
        fig.add_trace(
            go.Scatter(x=lx, y=ly, mode="lines", name=str(seq_id), line={"color": color, "width": 2}, hoverinfo="skip")
        )
        x += 0.6  # gap between sequences
    for info in block_infos(allocator):
        color = {"free": FREE, "evictable": EVICTABLE, "shared": SHARED}.get(info.state)
        label = f"#{info.block_id}" + (f"<br>rc={info.ref_count}" if info.ref_count > 1 else "")
        fill = color or colors.color(info.owners[0])
        rect(info.block_id, bottom, fill, label, text_color(fill))
    width_units = max(x, allocator.num_blocks)
    annotations += [
        {"x": -0.3, "y": top + 0.45, "text": "<b>logical</b><br>(block table)", "showarrow": False, "xanchor": "right"},
        {
            "x": -0.3,
            "y": bottom + 0.45,
            "text": "<b>physical</b><br>(HBM pool)",
            "showarrow": False,
            "xanchor": "right",
        },
    ]
    subtitle = f"each line is a block-table entry B(i); B = {B} tokens per block; line colour = sequence"
    for trace in legend_traces(BLOCK_STATES):
        fig.add_trace(trace)
    fig.update_layout(
        title={"text": f"{title}<br><sup>{subtitle}</sup>"},
        shapes=shapes,
        annotations=annotations,
        height=360,
        width=int(62 * width_units + 200) if fixed_width else None,
        autosize=not fixed_width,
        plot_bgcolor="white",
        showlegend=True,
        legend={"orientation": "h", "y": -0.02, "yanchor": "top"},
        margin={"l": 110, "r": 20, "t": 50, "b": 10},
    )
    fig.update_xaxes(visible=False, range=[-0.2, width_units + 0.1])
    fig.update_yaxes(visible=False, range=[bottom - 0.2, top + 1.6])
    return fig

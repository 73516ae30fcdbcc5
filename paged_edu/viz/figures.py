"""Plotly figures built from library state: pure functions, no widgets, no side effects.

Each ``*_figure`` function returns a fresh ``go.Figure``; each ``*_data`` function returns the
arrays that figure shows, so a widget can refresh a live ``FigureWidget`` in place (and a test can
compare the two). Colours encode ownership everywhere:

* one colour per sequence (stable while the sequence lives, see :class:`OwnerColors`);
* dark slate for a block shared by several sequences (``ref_count > 1``);
* light blue for an *evictable* block: ref count 0, but its KV is still in the prefix cache;
* light grey for a free block that holds nothing reusable.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import plotly.graph_objects as go

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.memory import KVSpec, eta_paged_bound, kv_bytes

__all__ = [
    "FREE", "EVICTABLE", "SHARED", "IDLE", "SEQ_COLORS", "OwnerColors", "BlockInfo",
    "block_infos", "block_grid_data", "block_grid_figure",
    "block_table_data", "block_table_figure",
    "logical_physical_figure",
    "measure_eta_paged", "admit_until_full", "utilisation_figure",
    "kv_memory_figure",
    "contiguous_data", "contiguous_figure",
]

FREE = "#e8e8e8"
EVICTABLE = "#b9d3ea"
SHARED = "#34495e"
IDLE = "#fbe3b5"  # contiguous baseline: reserved for a request but holding no token
SEQ_COLORS = ("#e4572e", "#17a398", "#f3a712", "#6a4c93", "#8ac926",
              "#db3a8a", "#1982c4", "#9c6644", "#b5179e")
# Heatmap codes: 0 free, 1 evictable, 2 shared, 3 reserved-idle, 4 + k the k-th sequence colour.
_CODES = (FREE, EVICTABLE, SHARED, IDLE) + SEQ_COLORS
_SEQ0 = 4
_COLORSCALE = [[v, c] for k, c in enumerate(_CODES) for v in (k / len(_CODES), (k + 1) / len(_CODES))]


@dataclass(slots=True)
class OwnerColors:
    """Sequence id -> colour index, assigned on first sight and kept while the view lives."""

    index: dict[Hashable, int] = field(default_factory=dict)

    def code(self, seq_id: Hashable) -> int:
        if seq_id not in self.index:
            self.index[seq_id] = len(self.index)
        return _SEQ0 + self.index[seq_id] % len(SEQ_COLORS)

    def color(self, seq_id: Hashable) -> str:
        return _CODES[self.code(seq_id)]


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
        text[r][c] = f"#{info.block_id}" + (f"<br>rc={info.ref_count}" if info.ref_count else "")
        who = ", ".join(map(str, info.owners)) or "-"
        hover[r][c] = (f"block {info.block_id}: {info.state}<br>ref_count {info.ref_count}<br>"
                       f"owners {who}<br>filled {info.filled}/{allocator.block_size}")
    return {"z": z, "text": text, "hover": hover}


def block_grid_figure(allocator, cols: int = 8, colors: OwnerColors | None = None,
                      title: str = "Physical KV blocks (colour = owner, rc = ref count)") -> go.Figure:
    """The pool of physical blocks as a grid, coloured by owner, labelled with ref counts."""
    data = block_grid_data(allocator, cols, colors)
    rows = len(data["z"])
    fig = go.Figure(go.Heatmap(
        z=data["z"], text=data["text"], customdata=data["hover"], texttemplate="%{text}",
        hovertemplate="%{customdata}<extra></extra>", colorscale=_COLORSCALE,
        zmin=-0.5, zmax=len(_CODES) - 0.5, showscale=False, xgap=3, ygap=3,
        textfont={"size": 11},
    ))
    fig.update_yaxes(autorange="reversed", showticklabels=False, showgrid=False, zeroline=False)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_layout(title=title, height=70 + 48 * rows, width=60 * cols + 80,
                      margin={"l": 20, "r": 20, "t": 40, "b": 10}, plot_bgcolor="white")
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


def block_table_figure(allocator, colors: OwnerColors | None = None,
                       title: str = "Block tables: logical block i -> physical block B(i)") -> go.Figure:
    """Each sequence's block table as a row of cells holding the physical block ids."""
    data = block_table_data(allocator, colors)
    fig = go.Figure(go.Heatmap(
        z=data["z"] or [[None]], text=data["text"] or [[""]], x=data["x"], y=data["y"] or [""],
        texttemplate="%{text}", colorscale=_COLORSCALE, zmin=-0.5, zmax=len(_CODES) - 0.5,
        showscale=False, xgap=3, ygap=3, hovertemplate="%{y}, %{x}: B(i) = %{text}<extra></extra>",
    ))
    fig.update_yaxes(autorange="reversed", showgrid=False, zeroline=False)
    fig.update_xaxes(side="top", showgrid=False, zeroline=False)
    fig.update_layout(title=title, height=110 + 36 * max(1, len(data["y"])), plot_bgcolor="white",
                      margin={"l": 20, "r": 20, "t": 70, "b": 10})
    return fig


def logical_physical_figure(allocator, seq_ids: Iterable[Hashable] | None = None,
                            title: str = "Logical token positions -> physical KV blocks") -> go.Figure:
    """The seed's Figure 1: each sequence's contiguous logical blocks mapped to scattered physical ones.

    Top row: every sequence's logical blocks ``i = 0, 1, ...`` (tokens ``iB .. iB+B-1``), grouped by
    sequence. Bottom row: the physical pool in block-id order. A line joins logical block ``i`` of a
    sequence to ``B(i)``; a block shared by several sequences receives several lines.
    """
    B = allocator.block_size
    tables = _tables(allocator)
    seq_ids = list(tables) if seq_ids is None else list(seq_ids)
    colors = OwnerColors()
    for seq_id in seq_ids:
        colors.code(seq_id)
    shapes, annotations = [], []
    top, bottom = 3.0, 0.0  # y of the logical row and of the physical row

    def rect(x, y, color, label, font_color="#111"):
        shapes.append({"type": "rect", "x0": x, "x1": x + 0.9, "y0": y, "y1": y + 0.9, "fillcolor": color,
                       "line": {"color": "#555", "width": 1}})
        annotations.append({"x": x + 0.45, "y": y + 0.45, "text": label, "showarrow": False,
                            "font": {"size": 10, "color": font_color}})

    fig = go.Figure()
    x = 0.0
    for seq_id in seq_ids:
        table, n = tables[seq_id]
        color = colors.color(seq_id)
        annotations.append({"x": x + 0.45 * len(table), "y": top + 1.25, "text": f"<b>{seq_id}</b> ({n} tokens)",
                            "showarrow": False, "font": {"color": color}})
        lx, ly = [], []
        for i, b in enumerate(table):
            hi = min(n, (i + 1) * B) - 1
            rect(x, top, color, f"i={i}<br>t {i * B}-{hi}", "white")
            lx += [x + 0.45, b + 0.45, None]
            ly += [top, bottom + 0.9, None]
            x += 1
        fig.add_trace(go.Scatter(x=lx, y=ly, mode="lines", name=str(seq_id), line={"color": color, "width": 2},
                                 hoverinfo="skip"))
        x += 0.6  # gap between sequences
    for info in block_infos(allocator):
        color = {"free": FREE, "evictable": EVICTABLE, "shared": SHARED}.get(info.state)
        label = f"#{info.block_id}" + (f"<br>rc={info.ref_count}" if info.ref_count > 1 else "")
        rect(info.block_id, bottom, color or colors.color(info.owners[0]), label,
             "white" if info.state in ("shared", "owned") else "#111")
    width_units = max(x, allocator.num_blocks)
    annotations += [
        {"x": -0.3, "y": top + 0.45, "text": "<b>logical</b><br>(block table)", "showarrow": False, "xanchor": "right"},
        {"x": -0.3, "y": bottom + 0.45, "text": "<b>physical</b><br>(HBM pool)", "showarrow": False, "xanchor": "right"},
    ]
    subtitle = (f"each line is a block-table entry B(i); B = {B} tokens per block; "
                "grey = free, light blue = cached but free, slate = shared")
    fig.update_layout(title={"text": f"{title}<br><sup>{subtitle}</sup>"}, shapes=shapes, annotations=annotations, height=330,
                      width=int(62 * width_units + 200), plot_bgcolor="white", showlegend=False,
                      margin={"l": 110, "r": 20, "t": 50, "b": 10})
    fig.update_xaxes(visible=False, range=[-0.2, width_units + 0.1])
    fig.update_yaxes(visible=False, range=[bottom - 0.2, top + 1.6])
    return fig


def measure_eta_paged(lengths: Sequence[int], block_size: int, num_blocks: int | None = None) -> float:
    """Admit one prompt of each length into a real :class:`BlockAllocator`; return the measured
    ``eta_paged = sum(s) / (blocks in use * B)`` (distinct token ids, so no prefix is shared)."""
    total_blocks = sum(-(-s // block_size) for s in lengths)
    allocator = BlockAllocator(num_blocks or max(1, total_blocks), block_size, enable_prefix_caching=False)
    next_token = 0
    for k, s in enumerate(lengths):
        allocator.allocate(k, range(next_token, next_token + s))
        next_token += s
    return sum(lengths) / (allocator.num_used_blocks * block_size)


def admit_until_full(lengths: Sequence[int], num_slots: int, block_size: int | None = None,
                     max_seq_len: int | None = None) -> int:
    """How many requests of ``lengths`` (final lengths ``s``, admitted in order) fit in ``num_slots``.

    Paged (``block_size``): each takes ``ceil(s/B)`` blocks of a real :class:`BlockAllocator`.
    Contiguous (``max_seq_len``): each reserves ``L_max`` slots, so ``num_slots // L_max`` fit.
    """
    if (block_size is None) == (max_seq_len is None):
        raise ValueError("pass exactly one of block_size (paged) or max_seq_len (contiguous)")
    if max_seq_len is not None:
        return min(len(lengths), num_slots // max_seq_len)
    allocator = BlockAllocator(num_slots // block_size, block_size, enable_prefix_caching=False)
    next_token = 0
    for k, s in enumerate(lengths):
        if allocator.num_free_blocks < -(-s // block_size):
            return k
        allocator.allocate(k, range(next_token, next_token + s))
        next_token += s
    return len(lengths)


def utilisation_figure(measured: dict[int, tuple[Sequence[int], Sequence[float]]],
                       s_max: int = 512, naive_l_max: int | None = None,
                       title: str = "KV utilisation: measured eta_paged vs the bound 1 - B/(s+B)") -> go.Figure:
    """``measured[B] = (s values, measured eta)``: markers; the bound ``1 - B/(s+B)`` as lines.

    With ``naive_l_max``, the contiguous baseline ``eta_naive = s / L_max`` is drawn too.
    """
    fig = go.Figure()
    s_curve = list(range(1, s_max + 1))
    for k, (B, (s_vals, etas)) in enumerate(sorted(measured.items())):
        color = SEQ_COLORS[k % len(SEQ_COLORS)]
        fig.add_trace(go.Scatter(x=s_curve, y=[eta_paged_bound(s, B) for s in s_curve], mode="lines",
                                 name=f"bound B={B}", line={"color": color, "dash": "dash"}))
        fig.add_trace(go.Scatter(x=list(s_vals), y=list(etas), mode="markers", name=f"measured B={B}",
                                 marker={"color": color, "size": 6, "opacity": 0.7}))
    if naive_l_max:
        fig.add_trace(go.Scatter(x=s_curve, y=[min(1.0, s / naive_l_max) for s in s_curve], mode="lines",
                                 name=f"contiguous, L_max={naive_l_max}", line={"color": "#777"}))
    fig.update_layout(title=title, xaxis_title="sequence length s (tokens)", yaxis_title="eta",
                      yaxis_range=[0, 1.02], height=420, margin={"t": 50})
    return fig


def kv_memory_figure(spec: KVSpec, seq_len: int, batch: int, gpu_bytes: int, weights_bytes: int = 0,
                     max_len: int = 32768) -> go.Figure:
    """Left: ``M_KV(s)`` of one request against ``s``. Right: requests of ``seq_len`` tokens that fit."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("KV bytes of one request (GiB)",
                                                        "Memory for the batch (GiB)"))
    s_vals = [2**k for k in range(4, int(math.log2(max_len)) + 1)]
    fig.add_trace(go.Scatter(x=s_vals, y=[kv_bytes(spec, s) / 2**30 for s in s_vals], mode="lines+markers",
                             name="M_KV(s)"), 1, 1)
    fig.add_trace(go.Scatter(x=[seq_len], y=[kv_bytes(spec, seq_len) / 2**30], mode="markers",
                             marker={"size": 12, "color": "#e4572e"}, name="chosen s"), 1, 1)
    need = kv_bytes(spec, seq_len) * batch
    free = max(0, gpu_bytes - weights_bytes)
    fig.add_trace(go.Bar(x=["KV for the batch", "GPU memory for KV"], y=[need / 2**30, free / 2**30],
                         marker_color=["#e4572e" if need > free else "#17a398", "#669bbc"],
                         name="GiB", showlegend=False), 1, 2)
    fig.update_xaxes(type="log", title_text="sequence length s", row=1, col=1)
    fig.update_layout(height=340, margin={"t": 40}, showlegend=False)
    return fig


def contiguous_data(contig, cols: int = 64, colors: OwnerColors | None = None) -> dict[str, list]:
    """Slot-level view of a :class:`~paged_edu.core.contiguous.ContiguousAllocator`: a token (owner colour),
    reserved but idle (amber), or free (grey); the first slot of each reservation names its owner."""
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


def contiguous_figure(contig, cols: int = 64, colors: OwnerColors | None = None,
                      title: str | None = None) -> go.Figure:
    """The contiguous baseline's address space, one square per token slot."""
    data = contiguous_data(contig, cols, colors)
    rows = len(data["z"])
    if title is None:
        title = (f"Contiguous reservations (L_max = {contig.max_seq_len}): colour = tokens, amber = reserved but idle, "
                 f"grey = free; used {contig.used_slots} of {contig.reserved_slots} reserved slots")
    fig = go.Figure(go.Heatmap(z=data["z"], text=data["text"], texttemplate="%{text}", colorscale=_COLORSCALE,
                               zmin=-0.5, zmax=len(_CODES) - 0.5, showscale=False, xgap=1, ygap=4,
                               hovertemplate="slot %{x} of row %{y}<extra></extra>", textfont={"size": 10}))
    fig.update_yaxes(autorange="reversed", showticklabels=False, showgrid=False, zeroline=False)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_layout(title={"text": title, "font": {"size": 13}}, height=80 + 40 * rows, plot_bgcolor="white",
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig

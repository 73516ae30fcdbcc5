"""What every allocator widget shares: figure widgets refreshed in place, the allocator and its
real K/V tensors, an event log, the selected sequence, and the steps every button takes."""

from __future__ import annotations

import html

import ipywidgets as W
import plotly.graph_objects as go

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.block_events import BlockEvent
from paged_edu.core.block_pool import OutOfBlocksError
from paged_edu.labs.kv_view import KVView
from paged_edu.viz import figures as F
from paged_edu.viz.palette import BAD, GOOD, NEUTRAL, OwnerColors
from paged_edu.viz.widgets.figure import FigureWidget

__all__ = ["_AllocatorView", "_figure_widget", "_update_heatmap"]


def _figure_widget(fig: go.Figure) -> FigureWidget:
    return FigureWidget(fig)


def _update_heatmap(trace, data: dict) -> None:
    trace.z = data["z"] or [[None]]
    trace.text = data["text"] or [[""]]
    if "hover" in data:
        trace.customdata = data["hover"]
    if "y" in data:
        trace.y = data["y"] or [""]
        trace.x = data["x"]


class _AllocatorView:
    """Shared plumbing: an allocator, its KV view, the grid and table figures, an event log, the
    selected sequence, and the steps every button shares (guard, select, allocate, redraw)."""

    def __init__(self, allocator: BlockAllocator, kv: KVView | bool, *, device, dtype, seed: int, cols: int) -> None:
        if kv is True:  # real K/V tensors behind the allocator, made here
            kv = KVView(allocator, device=device, dtype=dtype, seed=seed)
        self.allocator = allocator
        self.kv = kv or None
        self.cols = cols
        self.colors = OwnerColors()
        self.events: list[BlockEvent] = []
        allocator.subscribe(self.events.append)
        self.grid = _figure_widget(F.block_grid_figure(allocator, cols, self.colors))
        self.table = _figure_widget(F.block_table_figure(allocator, self.colors))
        self.status = W.HTML()
        self.log = W.HTML()
        self.seq = W.Dropdown(options=[], description="sequence", style={"description_width": "90px"})

    # -- steps the callbacks share ---------------------------------------------------------------
    def _guard(self, action) -> None:
        """Run a button's action; an error it raises is shown in the status line, not thrown."""
        try:
            action()
        except (OutOfBlocksError, ValueError, KeyError) as exc:
            self.say(f"{type(exc).__name__}: {exc}", ok=False)

    def _selected(self, seq_id=None, error: str = "no sequence selected"):
        """``seq_id``, or the dropdown's sequence when it is None; ``ValueError(error)`` if neither."""
        seq_id = self.seq.value if seq_id is None else seq_id
        if seq_id is None:
            raise ValueError(error)
        return seq_id

    def _allocate(self, seq_id: str, tokens: list[int]) -> list[int]:
        """Blocks for a new prompt (its block table), and its K/V written when there are tensors."""
        table = self.allocator.allocate(seq_id, tokens)
        if self.kv is not None:
            self.kv.write_prompt(seq_id, tokens)
        return table

    def _computed(self, seq_id, token: int) -> None:
        """The token in ``seq_id``'s newest slot (reserved by ``append_slots``, a count) is ``token``:
        write its K/V when there are tensors, then tell the allocator -- the order a scheduler keeps,
        and what lets a full block be hashed and published."""
        if self.kv is not None:
            self.kv.write_last(seq_id, token)
        self.allocator.mark_computed(seq_id, self.allocator.num_tokens(seq_id), [token])

    def _after_change(self, select=None) -> None:
        """Offer the live sequences in the dropdown (selecting ``select``), then redraw."""
        ids = list(self.allocator.seq_ids)
        self.seq.options = ids
        if select is not None:
            self.seq.value = select
        elif self.seq.value not in ids:
            self.seq.value = ids[-1] if ids else None
        self.refresh()

    # -- view ------------------------------------------------------------------------------------
    def refresh(self) -> None:
        with self.grid.batch_update():
            _update_heatmap(self.grid.data[0], F.block_grid_data(self.allocator, self.cols, self.colors))
        table_data = F.block_table_data(self.allocator, self.colors)
        with self.table.batch_update():
            _update_heatmap(self.table.data[0], table_data)
            self.table.layout.height = 110 + 36 * max(1, len(table_data["y"]))
        lines = [
            f"{e.kind}: seq {e.seq_id!s}, blocks {e.block_ids}" + (f", slot {e.slot}" if e.slot >= 0 else "")
            for e in self.events[-6:]
        ]
        self.log.value = (
            f"<div style='font-family:monospace;font-size:12px;color:{NEUTRAL}'>"
            + "<br>".join(html.escape(x) for x in lines)
            + "</div>"
        )

    def say(self, message: str, ok: bool = True) -> None:
        color = GOOD if ok else BAD
        self.status.value = f"<span style='color:{color}'>{html.escape(message)}</span>"

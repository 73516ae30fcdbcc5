"""Lesson 8's cache view: the prefix cache drawn from its events, hash chain and radix tree side by side.

A thin view over :class:`~paged_edu.labs.cache_contents.CacheContents`: the same conversations are
served on each cache (:func:`~paged_edu.labs.cache_contents.serve_turns`), every ``store`` / ``evict`` /
``clear`` event is kept, and a slider replays them up to the chosen admission. One grid per cache
(a cell per physical block: coloured by the conversation whose prompt stored it, near white when
nothing is cached there) and one line per cache of how many blocks were cached after each admission.
Every control is also a method (:meth:`CacheContentsView.show`), so tests drive it headless.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable

import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from paged_edu.labs.cache_contents import CacheContents, chat_turns, serve_turns
from paged_edu.viz import palette as P
from paged_edu.viz.widgets.base import _figure_widget

__all__ = ["CacheContentsView", "cache_grid_data", "watch"]


def watch(allocators: dict, turns, max_live: int = 3) -> tuple[dict[str, CacheContents], dict[str, list[int]]]:
    """Serve ``turns`` on each allocator, recording its cache events: ``(contents, marks)``, where
    ``marks[name][k]`` is how many events that cache had sent after the ``k``-th admission."""
    contents, marks = {}, {}
    for name, allocator in allocators.items():
        c = contents[name] = CacheContents(allocator)
        marks[name] = [0]
        serve_turns(allocator, turns, max_live, on_admit=lambda _, c=c, m=marks[name]: m.append(len(c.events)))
    return contents, marks


def cache_grid_data(
    cached: dict[int, Hashable], num_blocks: int, cols: int, colors: P.OwnerColors, owner: Callable = str
) -> dict[str, list]:
    """``z`` (colour codes: free, or the owner's colour), ``text`` and ``hover`` rows of one cache's grid."""
    rows = math.ceil(num_blocks / cols)
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    hover = [[""] * cols for _ in range(rows)]
    for b in range(num_blocks):
        r, c = divmod(b, cols)
        if b in cached:
            who = owner(cached[b])
            z[r][c], text[r][c] = colors.code(who), f"#{b}<br>{who}"
            hover[r][c] = f"block {b}: cached<br>stored by {cached[b]}"
        else:
            z[r][c], text[r][c], hover[r][c] = 0, f"#{b}", f"block {b}: not cached"
    return {"z": z, "text": text, "hover": hover}


class CacheContentsView:
    """Hash chain vs radix tree: which blocks each cache holds, replayed from its events."""

    def __init__(
        self,
        num_blocks: int = 16,
        block_size: int = 4,
        *,
        num_chats: int = 6,
        num_turns: int = 3,
        max_live: int = 2,
        seed: int = 0,
        cols: int = 8,
    ) -> None:
        from paged_edu.core.allocator import BlockAllocator
        from paged_edu.core.radix_cache import RadixAllocator

        self.turns = chat_turns(num_chats, num_turns, system_len=2 * block_size, turn_len=block_size + 1, seed=seed)
        allocators = {
            "hash chain (vLLM)": BlockAllocator(num_blocks, block_size),
            "radix tree (SGLang)": RadixAllocator(num_blocks, block_size),
        }
        self.contents, self.marks = watch(allocators, self.turns, max_live)
        self.num_blocks, self.cols = num_blocks, cols
        self.colors = P.OwnerColors()
        self.owner = lambda seq_id: f"chat {seq_id[0]}"
        n = len(self.turns)
        self.slider = W.IntSlider(n, min=0, max=n, description="admissions", style={"description_width": "90px"})
        self.status = W.HTML()
        self.fig = _figure_widget(self._figure())
        self.slider.observe(lambda ch: self.show(ch["new"]), "value")
        self.ui = W.VBox([self.slider, self.status, self.fig])
        self.show(n)

    def cached_after(self, name: str, k: int) -> dict[int, Hashable]:
        """What cache ``name`` held after the first ``k`` admissions, from its events alone."""
        return self.contents[name].at(self.marks[name][k])

    def _figure(self) -> go.Figure:
        names = list(self.contents)
        rows = math.ceil(self.num_blocks / self.cols)
        fig = make_subplots(
            rows=len(names) + 1,
            cols=1,
            subplot_titles=[*names, "blocks in the cache"],
            row_heights=[rows] * len(names) + [3],
            vertical_spacing=0.08,
        )
        for i, name in enumerate(names, start=1):
            fig.add_trace(
                go.Heatmap(
                    z=[[0]],
                    texttemplate="%{text}",
                    hovertemplate="%{customdata}<extra></extra>",
                    colorscale=P.COLORSCALE,
                    zmin=-0.5,
                    zmax=len(P.CODES) - 0.5,
                    showscale=False,
                    xgap=3,
                    ygap=3,
                    textfont={"size": 9},
                    name=name,
                ),
                row=i,
                col=1,
            )
            fig.update_yaxes(autorange="reversed", showticklabels=False, showgrid=False, row=i, col=1)
            fig.update_xaxes(showticklabels=False, showgrid=False, row=i, col=1)
        last = len(names) + 1
        for k, name in enumerate(names):
            sizes = self.contents[name].sizes()
            fig.add_scatter(
                x=list(range(len(self.marks[name]))),
                y=[sizes[m] for m in self.marks[name]],
                mode="lines+markers",
                name=name,
                line={"color": P.series_color(k)},
                row=last,
                col=1,
            )
        for trace in P.legend_traces({P.FREE: "nothing cached in the block"}):
            fig.add_trace(trace, row=last, col=1)
        fig.add_scatter(
            x=[0, 0],
            y=[0, self.num_blocks],
            mode="lines",
            name="shown",
            line={"color": P.NEUTRAL, "dash": "dot"},
            row=last,
            col=1,
        )
        fig.update_xaxes(title_text="admissions (prompts served)", row=last, col=1)
        fig.update_yaxes(title_text="cached blocks", range=[0, self.num_blocks], row=last, col=1)
        fig.update_layout(
            height=160 * len(names) + 220,  # with its slider, on a laptop's screen (1366 x 768) whole
            width=62 * self.cols + 120,
            margin={"l": 60, "r": 20, "t": 40, "b": 40},
            plot_bgcolor="white",
            legend={"orientation": "h", "y": -0.12, "yanchor": "top"},
        )
        return fig

    def show(self, k: int) -> None:
        """Draw both caches after the first ``k`` admissions (the slider calls this)."""
        k = int(k)
        if not 0 <= k <= len(self.turns):
            raise ValueError(f"k must be in [0, {len(self.turns)}] admissions, got {k}")
        names = list(self.contents)
        with self.fig.batch_update():
            for i, name in enumerate(names):
                data = cache_grid_data(self.cached_after(name, k), self.num_blocks, self.cols, self.colors, self.owner)
                trace = self.fig.data[i]
                trace.z, trace.text, trace.customdata = data["z"], data["text"], data["hover"]
            self.fig.data[-1].x = [k, k]
        held = ", ".join(f"{name}: {len(self.cached_after(name, k))}" for name in names)
        who = f"after {k} of {len(self.turns)} prompts" + (
            f" (the last: chat {self.turns[k - 1][0][0]}, turn {self.turns[k - 1][0][1]})" if k else ""
        )
        self.status.value = f"{who} -- blocks cached: {held}"
        if self.slider.value != k:
            self.slider.value = k

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.ui)

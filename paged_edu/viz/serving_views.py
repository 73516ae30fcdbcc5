"""Lesson 11's views of a live server: the blocks a KV-aware router knows it caches, and the
inter-token-latency histogram the server exports.

* :class:`RouterView` -- a cell per block in a :class:`~paged_edu.labs.serving.RouterIndex` (the
  replica's prefix cache as its KV events tell it), coloured by the request that stored it; a
  dropdown and a slider step through the index after each request of the lesson. Its controls are
  also a method (:meth:`RouterView.show`), so tests drive it headless.
* :func:`itl_histogram_figure` -- ``vllm:inter_token_latency_seconds`` as bars: the share of
  inter-token gaps in each bucket, one series per run.
"""

from __future__ import annotations

import math

import ipywidgets as W
import plotly.graph_objects as go

from paged_edu.viz import palette as P
from paged_edu.viz.cache_contents import cache_grid_data
from paged_edu.viz.widgets.base import _figure_widget, _update_heatmap

__all__ = ["RouterView", "itl_histogram_figure"]


class RouterView:
    """The router's index of one replica after each labelled request (``index.snapshots``)."""

    def __init__(self, index, cols: int = 16) -> None:
        if not index.snapshots:
            raise ValueError("the index has no snapshot yet: call index.snapshot(label) after a request")
        self.snapshots = index.snapshots
        self.cols = cols
        largest = max(len(blocks) for _, blocks in self.snapshots)
        self.num_cells = max(cols, cols * math.ceil(largest / cols))
        self.colors = P.OwnerColors()
        labels = [label for label, _ in self.snapshots]
        self.dropdown = W.Dropdown(
            options=labels, value=labels[-1], description="after", layout=W.Layout(width="420px")
        )
        self.slider = W.IntSlider(len(labels) - 1, min=0, max=len(labels) - 1, description="request")
        self.status = W.HTML()
        self.fig = _figure_widget(self._figure())
        self.dropdown.observe(lambda ch: self.show(labels.index(ch["new"])), "value")
        self.slider.observe(lambda ch: self.show(ch["new"]), "value")
        self.ui = W.VBox([W.HBox([self.dropdown, self.slider]), self.status, self.fig])
        self.show(len(labels) - 1)

    def data(self, k: int) -> dict:
        """The grid after snapshot ``k``: cell ``i`` is the ``i``-th block the router knows, by who stored it."""
        _, blocks = self.snapshots[k]
        cells = dict(enumerate(blocks.values()))
        return cache_grid_data(cells, self.num_cells, self.cols, self.colors)

    def _figure(self) -> go.Figure:
        rows = self.num_cells // self.cols
        fig = go.Figure(
            P.code_heatmap(
                z=[[0]],
                texttemplate="%{text}",
                hovertemplate="%{customdata}<extra></extra>",
                xgap=2,
                ygap=2,
                textfont={"size": 8},
            )  # fmt: skip
        )
        fig.update_yaxes(autorange="reversed", visible=False)  # a diagram of cells, not a plot
        fig.update_xaxes(visible=False)
        fig.update_layout(
            title="Blocks the router knows this replica caches (from its KV events; colour = the request that stored it)",
            height=120 + 34 * rows,
            width=56 * self.cols + 80,
            margin={"l": 20, "r": 20, "t": 60, "b": 10},
            plot_bgcolor="white",
        )
        return fig

    def show(self, k: int) -> None:
        """Draw the index after snapshot ``k`` (the dropdown and the slider call this)."""
        k = int(k)
        if not 0 <= k < len(self.snapshots):
            raise ValueError(f"k must be in [0, {len(self.snapshots) - 1}], got {k}")
        label, blocks = self.snapshots[k]
        with self.fig.batch_update():
            _update_heatmap(self.fig.data[0], self.data(k))
        self.status.value = f"after <b>{label}</b>: the router knows {len(blocks)} cached blocks"
        if self.slider.value != k:
            self.slider.value = k
        if self.dropdown.value != label:
            self.dropdown.value = label

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.ui)


def itl_histogram_figure(runs: dict[str, list[tuple[float, float]]], title: str) -> go.Figure:
    """One bar series per run: the share of inter-token gaps in each bucket of the histogram, from its
    cumulative ``(upper bound, count)`` pairs (a window's: the difference of two scrapes)."""
    fig = go.Figure()
    for k, (name, cumulative) in enumerate(runs.items()):
        cumulative = sorted(cumulative)
        total = cumulative[-1][1] if cumulative else 0
        labels, shares, below = [], [], 0.0
        for upper, count in cumulative:
            labels.append("+Inf" if math.isinf(upper) else f"<= {upper * 1e3:g} ms")
            shares.append((count - below) / total if total else 0.0)
            below = count
        fig.add_bar(x=labels, y=shares, name=name, marker_color=P.series_color(k))
    fig.update_layout(
        title=title,
        barmode="group",
        xaxis_title="inter-token latency bucket (vllm:inter_token_latency_seconds)",
        yaxis_title="share of gaps",
        yaxis_tickformat=".0%",
        height=380,
        plot_bgcolor="white",
        legend={"orientation": "h", "y": -0.3},
    )
    return fig

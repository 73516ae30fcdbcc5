"""The overlap explorer (lesson 9): a host / device split per step, synchronous against overlapped.

Pick a measured split (a rung of the speed ladder, stored or run here) or set the host and device
milliseconds with the sliders; the figure (:func:`~paged_edu.viz.speed_figures.overlap_figure`)
redraws a few steps both ways: the synchronous engine pays ``host + device`` per step, the engine
with the host one step ahead ``max(host, device)``. Tests set ``explorer.preset.value`` or the
sliders and read ``explorer.fig``.
"""

from __future__ import annotations

import ipywidgets as W

from paged_edu.viz.speed_figures import overlap_data, overlap_figure, overlap_title
from paged_edu.viz.widgets import _figure_widget

__all__ = ["OverlapExplorer"]


class OverlapExplorer:
    """``splits``: ``{label: (host ms, device ms)}``, the presets; the first is shown first."""

    def __init__(self, splits: dict[str, tuple[float, float]], num_steps: int = 6) -> None:
        if not splits:
            raise ValueError("OverlapExplorer needs at least one (host ms, device ms) split")
        self.splits, self.num_steps = dict(splits), num_steps
        top = max(max(h, d) for h, d in self.splits.values())
        self.preset = W.Dropdown(options=list(self.splits), description="measured", layout=W.Layout(width="60%"))
        first = self.splits[self.preset.value]
        self.host = W.FloatSlider(value=first[0], min=0.0, max=2 * top, step=top / 200, description="host ms")
        self.device = W.FloatSlider(value=first[1], min=0.0, max=2 * top, step=top / 200, description="device ms")
        self.fig = _figure_widget(overlap_figure(first[0], first[1], num_steps))
        self.preset.observe(lambda _change: self._load(), names="value")
        for slider in (self.host, self.device):
            slider.observe(lambda _change: self.redraw(), names="value")

    def _load(self) -> None:
        h, d = self.splits[self.preset.value]
        self.host.value, self.device.value = h, d  # (each fires redraw)
        self.redraw()

    def redraw(self) -> None:
        h, d = self.host.value, self.device.value
        with self.fig.batch_update():
            for trace, row in zip(self.fig.data, overlap_data(h, d, self.num_steps)):
                trace.x, trace.base, trace.text = row["x"], row["base"], row["text"]
            self.fig.layout.title.text = overlap_title(h, d)

    def widget(self) -> W.Widget:
        return W.VBox([self.preset, W.HBox([self.host, self.device]), self.fig])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())

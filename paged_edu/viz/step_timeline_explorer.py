"""The step-timeline explorer (lesson 9): drive the model of :mod:`paged_edu.labs.step_timeline` by hand.

Pick a rung of a stored ladder (its kernels, host phases and launch costs, as the model reads them) and
change one input at a time: the batch size, the host's time per running sequence, the launch overhead of
one eager kernel, CUDA graphs on or off, the host one step ahead or not, the kernels per layer. The
figure (:func:`~paged_edu.viz.speed_figures.step_timeline_figure`) redraws a few steps: the host's phases
in one row, every kernel in the other; its title says the step time and the tokens per second. Tests set
the widgets' values and read ``explorer.fig`` and ``explorer.timeline``.
"""

from __future__ import annotations

import ipywidgets as W

from paged_edu.labs.step_timeline import StepCosts, StepTimeline, simulate, with_knobs
from paged_edu.viz.speed_figures import step_timeline_data, step_timeline_figure, step_timeline_title
from paged_edu.viz.widgets import _figure_widget

__all__ = ["StepTimelineExplorer"]


class StepTimelineExplorer:
    """``presets``: ``{label: (StepCosts, graphs, overlap)}`` -- each a rung as the model reads it; the first
    is shown first, at ``batch`` sequences."""

    def __init__(self, presets: dict[str, tuple[StepCosts, bool, bool]], batch: int = 32, num_steps: int = 3) -> None:
        if not presets:
            raise ValueError("StepTimelineExplorer needs at least one preset (StepCosts, graphs, overlap)")
        self.presets, self.num_steps = dict(presets), num_steps
        label = next(iter(self.presets))
        costs, graphs, overlap = self.presets[label]
        style = {"description_width": "150px"}
        wide = W.Layout(width="420px")
        self.preset = W.Dropdown(
            options=list(self.presets), value=label, description="rung", layout=W.Layout(width="60%")
        )
        self.batch = W.IntSlider(value=batch, min=1, max=256, description="batch (sequences)", style=style, layout=wide)
        self.host_per_seq = W.FloatSlider(
            min=0.0, max=20.0, step=0.1, description="host us / sequence", style=style, layout=wide
        )
        self.launch = W.FloatSlider(
            min=0.0, max=50.0, step=0.5, description="launch us / kernel", style=style, layout=wide
        )
        self.kernels_per_layer = W.FloatSlider(
            min=2.0, max=40.0, step=0.5, description="kernels per layer", style=style, layout=wide
        )
        self.graphs = W.ToggleButton(description="CUDA graphs")
        self.overlap = W.ToggleButton(description="async (host one step ahead)", layout=W.Layout(width="220px"))
        self._loading = False
        self._load(costs, graphs, overlap)
        self.timeline = self._simulate()
        self.fig = _figure_widget(step_timeline_figure(self.timeline))
        self.preset.observe(lambda _c: self.load_preset(), names="value")
        for w in (self.batch, self.host_per_seq, self.launch, self.kernels_per_layer, self.graphs, self.overlap):
            w.observe(lambda _c: self.redraw(), names="value")

    def _load(self, costs: StepCosts, graphs: bool, overlap: bool) -> None:
        self._loading = True
        try:
            self.costs = costs
            self.host_per_seq.value = round(costs.host_per_seq_us, 1)
            self.launch.value = round(costs.launch_us, 1)
            self.kernels_per_layer.value = round(costs.profile.kernels_per_layer(self.batch.value) * 2) / 2
            self.graphs.value, self.overlap.value = graphs, overlap
        finally:
            self._loading = False

    def load_preset(self) -> None:
        """The dropdown's rung: its costs and options into the widgets, then one redraw."""
        self._load(*self.presets[self.preset.value])
        self.redraw()

    def current_costs(self) -> StepCosts:
        """The preset's costs with the knobs' values (the kernels per layer only where moved off the profile's)."""
        profile_kpl = self.costs.profile.kernels_per_layer(self.batch.value)
        kpl = self.kernels_per_layer.value
        return with_knobs(
            self.costs,
            host_per_seq_us=self.host_per_seq.value,
            launch_us=self.launch.value,
            kernels_per_layer=None if abs(kpl - profile_kpl) < 0.26 else kpl,
        )

    def _simulate(self) -> StepTimeline:
        return simulate(
            self.current_costs(),
            self.batch.value,
            graphs=self.graphs.value,
            overlap=self.overlap.value,
            num_steps=self.num_steps,
        )

    def redraw(self) -> None:
        if self._loading:
            return
        self.timeline = t = self._simulate()
        with self.fig.batch_update():
            for trace, row in zip(self.fig.data, step_timeline_data(t)):
                trace.x, trace.base, trace.text = row["x"], row["base"], row["text"]
            self.fig.layout.title.text = step_timeline_title(t)

    def widget(self) -> W.Widget:
        knobs = W.VBox([self.batch, self.host_per_seq, self.launch, self.kernels_per_layer])
        return W.VBox([self.preset, W.HBox([knobs, W.VBox([self.graphs, self.overlap])]), self.fig])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())

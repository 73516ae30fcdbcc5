"""Lesson 6's preemption explorer: a thin view over :func:`paged_edu.labs.preemption.run_under_pressure`.

A slider sets the pool's KV blocks, a toggle the preemption mode (recompute / swap / auto); each
change reruns the same requests and redraws one timeline: every request's tokens (y = request,
x = time, colour = inter-token latency in engine steps, blue to vermillion), a vermillion cross
where it was preempted, a bluish-green triangle where it resumed. The text says who was preempted first and why (the most recently
admitted running sequence), what moved, and whether the output still equals the unpressured run.
Every control is also a method (:meth:`set`), so tests drive it headless.
"""

from __future__ import annotations

import html

import ipywidgets as W
import plotly.graph_objects as go

from paged_edu.labs.preemption import blocks_needed, output_mismatches, run_under_pressure
from paged_edu.sched.scheduler import PREEMPTION_MODES
from paged_edu.viz.widgets.base import _figure_widget
from paged_edu.viz import palette as P

__all__ = ["PreemptionExplorer", "remedy_figure", "timeline_data", "timeline_figure"]


def timeline_data(run) -> dict[str, list]:
    """Points of the timeline: tokens (with their step gap), preemptions, resumptions."""
    gaps = run.itl_steps()
    tok = {"x": [], "y": [], "c": []}
    for rid in sorted(run.token_times):
        times = run.token_times[rid]
        tok["x"] += times
        tok["y"] += [rid] * len(times)
        tok["c"] += [1] + gaps[rid]
    res = run.resumptions()
    return {
        "tokens": tok,
        "preempt": {
            "x": [p["time"] for p in res],
            "y": [p["request_id"] for p in res],
            "text": [p["how"] for p in res],
        },
        "resume": {
            "x": [p["resumed_time"] for p in res if p["resumed_time"] is not None],
            "y": [p["request_id"] for p in res if p["resumed_time"] is not None],
        },
    }


def timeline_figure(run) -> go.Figure:
    d = timeline_data(run)
    fig = go.Figure(
        [
            go.Scatter(
                x=d["tokens"]["x"],
                y=d["tokens"]["y"],
                mode="markers",
                name="token",
                marker={
                    "size": 6,
                    "color": d["tokens"]["c"],
                    "colorscale": P.SEQUENTIAL,
                    "cmin": 1,
                    "colorbar": {"title": "steps since<br>last token"},
                },
                hovertemplate="request %{y}, t=%{x:.3f}s, gap %{marker.color} steps<extra></extra>",
            ),
            go.Scatter(
                x=d["preempt"]["x"],
                y=d["preempt"]["y"],
                mode="markers",
                name="preempted",
                text=d["preempt"]["text"],
                marker={"symbol": "x", "size": 12, "color": P.BAD},
                hovertemplate="request %{y} preempted (%{text}) at %{x:.3f}s<extra></extra>",
            ),
            go.Scatter(
                x=d["resume"]["x"],
                y=d["resume"]["y"],
                mode="markers",
                name="resumed",
                marker={"symbol": "triangle-right", "size": 11, "color": P.GOOD},
                hovertemplate="request %{y} resumed at %{x:.3f}s<extra></extra>",
            ),
        ]
    )
    fig.update_layout(
        height=400,
        margin={"t": 50, "l": 60, "r": 20, "b": 80},
        xaxis_title="wall time since the run started (s)",
        yaxis_title="request id",
        yaxis={"autorange": "reversed", "dtick": 1},
        legend={"orientation": "h", "y": -0.3},
        title=f"{run.mode}, {run.num_blocks} blocks: {run.num_preemptions} preemptions",
    )
    return fig


class PreemptionExplorer:
    """Slider over ``num_blocks`` and a toggle over the preemption mode, on fixed requests."""

    def __init__(
        self,
        model,
        prompts,
        *,
        max_new_tokens: int = 32,
        block_size: int = 8,
        num_blocks: int | None = None,
        mode: str = "recompute",
    ) -> None:
        self.model, self.prompts = model, prompts
        self.max_new_tokens, self.block_size = max_new_tokens, block_size
        self.enough = blocks_needed(prompts, max_new_tokens, block_size)
        self.reference = self._run(self.enough, "recompute")
        smallest = -(-(len(max(prompts, key=len)) + max_new_tokens) // block_size)
        start = num_blocks if num_blocks is not None else max(smallest, self.enough // 3)
        self.blocks = W.IntSlider(
            start,
            min=smallest,
            max=self.enough,
            description="KV blocks",
            continuous_update=False,
            layout=W.Layout(width="520px"),
        )
        self.mode = W.ToggleButtons(options=PREEMPTION_MODES, value=mode, description="preemption")
        self.summary = W.HTML()
        self.run = self._run(start, mode)
        self.fig = _figure_widget(timeline_figure(self.run))
        self._syncing = False
        self.blocks.observe(lambda ch: None if self._syncing else self.set(num_blocks=ch["new"]), "value")
        self.mode.observe(lambda ch: None if self._syncing else self.set(mode=ch["new"]), "value")
        self.ui = W.VBox([self.blocks, self.mode, self.summary, self.fig])
        self._show()

    def _run(self, num_blocks: int, mode: str):
        return run_under_pressure(
            self.model, self.prompts, num_blocks, mode, max_new_tokens=self.max_new_tokens, block_size=self.block_size
        )

    def set(self, num_blocks: int | None = None, mode: str | None = None):
        """Rerun with a new pool size and/or mode; returns the new run (the widgets follow)."""
        num_blocks = self.blocks.value if num_blocks is None else num_blocks
        mode = self.mode.value if mode is None else mode
        if (self.blocks.value, self.mode.value) != (num_blocks, mode):
            self._syncing = True  # the observers fire on these assignments: let them pass
            try:
                self.blocks.value, self.mode.value = num_blocks, mode
            finally:
                self._syncing = False
        self.run = self._run(num_blocks, mode)
        self._show()
        return self.run

    def mismatches(self) -> list[int]:
        return output_mismatches(self.run, self.reference)

    def _show(self) -> None:
        run = self.run
        d = timeline_data(run)
        with self.fig.batch_update():
            for trace, key in zip(self.fig.data, ("tokens", "preempt", "resume")):
                trace.x, trace.y = d[key]["x"], d[key]["y"]
            self.fig.data[0].marker.color = d["tokens"]["c"]
            self.fig.data[1].text = d["preempt"]["text"]
            self.fig.layout.title.text = f"{run.mode}, {run.num_blocks} blocks: {run.num_preemptions} preemptions"
        bad = self.mismatches()
        lines = [
            f"{run.num_blocks} blocks of {run.block_size} tokens for {len(self.prompts)} requests that need "
            f"{self.enough} at full length; <b>{run.num_preemptions}</b> preemptions"
        ]
        if run.preemptions:
            p = run.preemptions[0]
            lines.append(
                f"first victim: request <b>{p['request_id']}</b> at step {p['step']} ({p['how']}) -- the most "
                "recently admitted running sequence goes first"
            )
        lines.append(
            f"blocks swapped out / in: {run.blocks_swapped_out} / {run.blocks_swapped_in} "
            f"({run.bytes_moved:,} bytes); prompt tokens computed: {run.prefill_tokens}"
        )
        lines.append(
            "output token-identical to the unpressured run"
            if not bad
            else f"<span style='color:{P.BAD}'>output DIFFERS for requests {bad}</span>"
        )
        self.summary.value = (
            "<div style='font-family:monospace;font-size:12px'>"
            + "<br>".join(
                html.escape(x).replace("&lt;b&gt;", "<b>").replace("&lt;/b&gt;", "</b>") if "span" not in x else x
                for x in lines
            )
            + "</div>"
        )


def remedy_figure(rows: list[dict]) -> go.Figure:
    """Troubleshooting 3's remedies: the longest stall (engine steps) and the preemptions of each case."""
    cases = [r["case"] for r in rows]
    fig = go.Figure(
        [
            go.Bar(x=cases, y=[r["max_gap_steps"] for r in rows], name="longest stall (steps)", marker_color=P.BAD),
            go.Bar(x=cases, y=[r["preemptions"] for r in rows], name="preemptions", marker_color=P.OKABE_ITO["blue"]),
        ]
    )
    fig.update_layout(
        barmode="group",
        height=380,
        xaxis_title="case (the remedy tried)",
        yaxis_title="engine steps / preemptions (count)",
        margin={"t": 50, "l": 60, "r": 20, "b": 140},
        title="Swap thrashing and its remedies (same requests, same pool)",
    )
    return fig

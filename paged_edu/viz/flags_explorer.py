"""The flags explorer (lesson 8): type a ``vllm serve`` command line, pick a model, a GPU and a
workload; the view translates the flags (:func:`paged_edu.labs.serving_flags.translate`) and
serves the workload with them in the simulator (:func:`~paged_edu.labs.serving_flags.simulate_flags`).

A thin view: the numbers come from one :class:`~paged_edu.labs.serving_flags.Translation` and
one :class:`~paged_edu.sim.results.SimResult`. A command line that vLLM would refuse shows the
error text in the status line and leaves the plots as they were -- a callback never raises. Every
control's callback is :meth:`FlagsExplorer.redraw`; tests set ``explorer.command.value`` etc. and
read ``explorer.translation``, ``explorer.result`` and ``explorer.error``.
"""

from __future__ import annotations

import html

import ipywidgets as W
import plotly.graph_objects as go

from paged_edu.core.hardware import GPUS, MODELS
from paged_edu.labs.serving_flags import simulate_flags, translate
from paged_edu.viz.palette import BAD, EVICTABLE, IDLE, OKABE_ITO
from paged_edu.viz.widgets import _figure_widget

__all__ = ["DEFAULT_COMMAND", "FlagsExplorer", "WORKLOADS"]

DEFAULT_COMMAND = "vllm serve meta-llama/Meta-Llama-3-8B-Instruct --gpu-memory-utilization 0.9"
WORKLOADS = ("multiturn", "fewshot", "agents", "sharegpt")
FROM_COMMAND = "as in the command"
PARTS = (("weights", IDLE), ("KV pool", OKABE_ITO["blue"]), ("the rest", EVICTABLE))


class FlagsExplorer:
    """Controls over one translation and one simulated run."""

    def __init__(
        self,
        command: str = DEFAULT_COMMAND,
        gpu: str = "h200",
        workload: str = "multiturn",
        num_requests: int = 200,
        rate: float = 20.0,
        seed: int = 0,
    ) -> None:
        self.rate, self.seed = rate, seed
        self.command = W.Text(
            value=command, description="command", continuous_update=False, layout=W.Layout(width="98%")
        )
        self.model = W.Dropdown(
            options=[FROM_COMMAND, *(m.name for m in MODELS.values())], value=FROM_COMMAND, description="model"
        )
        self.gpu = W.Dropdown(options=[(g.label, key) for key, g in GPUS.items()], value=gpu, description="GPU")
        self.workload = W.Dropdown(options=WORKLOADS, value=workload, description="workload")
        self.num_requests = W.IntSlider(value=num_requests, min=20, max=1000, step=20, description="requests")
        self.status = W.HTML()
        self.memory = _figure_widget(self._memory_figure())
        self.ttft = _figure_widget(self._ttft_figure())
        self.translation = self.result = self.error = None
        for control in (self.command, self.model, self.gpu, self.workload, self.num_requests):
            control.observe(lambda _change: self.redraw(), names="value")
        self.redraw()

    def redraw(self) -> None:
        """Translate and simulate with the controls' values; on a refused command line show why."""
        try:
            model = None if self.model.value == FROM_COMMAND else self.model.value
            t = translate(self.command.value, model, self.gpu.value)
            res = simulate_flags(t, self.workload.value, self.num_requests.value, self.rate, self.seed)
        except (ValueError, TypeError) as exc:
            self.error = str(exc)
            self.status.value = (
                f'<pre style="color:{BAD}; white-space:pre-wrap">refused: {html.escape(self.error)}</pre>'
            )
            return
        self.error, self.translation, self.result = None, t, res
        gpu = GPUS[t.gpu]
        gib = 2**30
        kv = t.num_blocks * t.block_bytes
        with self.memory.batch_update():
            for trace, value in zip(self.memory.data, (t.weight_bytes, kv, t.total_bytes - t.weight_bytes - kv)):
                trace.x = [value / gib]
            self.memory.layout.title.text = (
                f"{t.model} on {gpu.label}:<br>{t.num_blocks:,} blocks of "
                f"{t.flags.block_size} tokens, max concurrency {t.max_concurrency:.1f}x"
            )
        ttft = sorted(r.ttft for r in res.requests)
        with self.ttft.batch_update():
            self.ttft.data[0].x = [100 * (i + 1) / len(ttft) for i in range(len(ttft))]
            self.ttft.data[0].y = ttft
            self.ttft.layout.title.text = f"Time to first token, {self.workload.value}, {res.config.label}"
        rec = res.record()
        self.status.value = (
            f"<pre>{html.escape(t.describe())}</pre><b>simulated</b> {len(res.requests)} {self.workload.value} "
            f"requests at {self.rate:g}/s: {rec['throughput_tokens_per_s']:,.0f} tok/s, prefix hit rate "
            f"{rec['prefix_hit_rate']:.1%}, TTFT p50 {rec['ttft_p50_s']:.3f} s / p99 {rec['ttft_p99_s']:.3f} s, "
            f"{rec['preemptions']} preemptions, at most {rec['max_concurrent']} running"
        )

    def _memory_figure(self) -> go.Figure:
        fig = go.Figure()
        for name, color in PARTS:
            fig.add_bar(y=["GPU memory"], x=[0], orientation="h", name=name, marker_color=color)
        fig.update_layout(
            barmode="stack",
            xaxis_title="memory of one GPU (GiB)",
            yaxis_title="GPU",
            height=300,
            width=460,
            title={"text": "", "font": {"size": 13}},
            legend=dict(orientation="h", yanchor="top", y=-0.45),
        )
        return fig

    def _ttft_figure(self) -> go.Figure:
        fig = go.Figure()
        fig.add_scatter(x=[], y=[], mode="lines", name="TTFT", line_color=OKABE_ITO["blue"])
        fig.update_layout(
            xaxis_title="percentile of requests",
            yaxis_title="TTFT (s)",
            yaxis_type="log",
            height=300,
            width=460,
            title="",
        )
        return fig

    def widget(self) -> W.Widget:
        controls = W.HBox([W.VBox([self.model, self.gpu]), W.VBox([self.workload, self.num_requests])])
        # The two plots side by side, under the controls that change them: one laptop screen (1366 x 768).
        return W.VBox([self.command, controls, self.status, W.HBox([self.memory, self.ttft])])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())

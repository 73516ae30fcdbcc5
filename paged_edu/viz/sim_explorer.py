"""The simulator explorer (lesson 7): pick a memory manager, block size, request rate, workload and
GPU; the view re-runs :func:`paged_edu.sim.simulator.simulate` and redraws.

A thin view: every number comes from one :class:`~paged_edu.sim.results.SimResult`. Two plots --
where the KV memory goes (the paper's Fig. 2 categories) and each request's time to first token,
sorted -- and one line of the benchmark table. Every control's callback is :meth:`SimExplorer.redraw`,
so tests set ``explorer.manager.value`` etc. and read ``explorer.result``.
"""

from __future__ import annotations


import ipywidgets as W
import plotly.graph_objects as go

from paged_edu.labs.benchmark_table import paper_cost_model, workload
from paged_edu.sim.managers import BLOCK_SIZES, MANAGERS
from paged_edu.sim.results import SimConfig
from paged_edu.sim.simulator import simulate
from paged_edu.viz.sim_figures import CATEGORIES, PAPER_TOKEN_STATES
from paged_edu.viz.widgets import _figure_widget
from paged_edu.viz import palette as P

__all__ = ["SimExplorer"]

GPU_CHOICES = ("a100-40gb", "a100-80gb", "h200")


class SimExplorer:
    """Controls over one simulation; :attr:`result` is the latest :class:`SimResult`."""

    def __init__(self, num_requests: int = 500, seed: int = 0, rate: float = 3.0, per_block: bool = True) -> None:
        self.num_requests, self.seed, self.per_block = num_requests, seed, per_block
        self.manager = W.Dropdown(options=MANAGERS, value="paged", description="manager")
        self.block_size = W.Dropdown(options=BLOCK_SIZES, value=16, description="block size")
        self.rate = W.FloatSlider(value=rate, min=0.25, max=8.0, step=0.25, description="req/s")
        self.dataset = W.Dropdown(options=("sharegpt", "alpaca"), value="sharegpt", description="workload")
        self.gpu = W.Dropdown(options=GPU_CHOICES, value="a100-40gb", description="GPU")
        self.summary = W.HTML()
        self.memory = _figure_widget(self._memory_figure())
        self.ttft = _figure_widget(self._ttft_figure())
        self.result = None
        for control in (self.manager, self.block_size, self.rate, self.dataset, self.gpu):
            control.observe(lambda _change: self.redraw(), names="value")
        self.redraw()

    def config(self) -> SimConfig:
        return SimConfig(manager=self.manager.value, block_size=self.block_size.value)

    def redraw(self) -> None:
        """Simulate with the controls' values and update both plots and the summary."""
        cost = paper_cost_model(self.gpu.value, per_block=self.per_block)
        requests = workload(self.dataset.value, self.num_requests, self.rate.value, self.seed)
        res = simulate(requests, self.config(), cost)
        self.result = res
        rec = res.record()
        shares = res.breakdown_fractions()
        with self.memory.batch_update():
            self.memory.data[0].x = [shares[key] * 100 for key, _, _ in CATEGORIES]
            paper = PAPER_TOKEN_STATES.get(res.config.manager)
            self.memory.data[1].x = [paper * 100 if paper is not None else None]
            self.memory.layout.title.text = f"Where the KV memory goes: {res.config.label}"
        ttft = sorted(r.ttft for r in res.requests)
        with self.ttft.batch_update():
            self.ttft.data[0].x = [100 * (i + 1) / len(ttft) for i in range(len(ttft))]
            self.ttft.data[0].y = ttft
        self.summary.value = (
            f"<b>{res.config.label}</b> on {cost.gpu.name}, {self.dataset.value}, {self.rate.value:g} req/s, "
            f"{len(requests)} requests: {rec['throughput_tokens_per_s']:,.0f} tok/s, memory efficiency "
            f"{rec['kv_utilization']:.1%}, TTFT p50 {rec['ttft_p50_s']:.3f} s / p99 {rec['ttft_p99_s']:.3f} s, "
            f"{rec['norm_latency_p50_s']:.4f} s per output token (p50), mean batch {rec['mean_batched']:.1f}, "
            f"{rec['preemptions']} preemptions (simulated in {res.sim_wall_s:.2f} s)"
        )

    def _memory_figure(self) -> go.Figure:
        fig = go.Figure()
        fig.add_bar(
            y=[label for _, label, _ in CATEGORIES],
            x=[0] * len(CATEGORIES),
            orientation="h",
            marker_color=[color for *_, color in CATEGORIES],
            name="simulated",
        )
        fig.add_scatter(
            y=[CATEGORIES[0][1]],
            x=[None],
            mode="markers",
            name="paper (Fig. 2)",
            marker=dict(symbol="diamond", size=12, color=P.OKABE_ITO["black"]),
        )
        fig.update_layout(
            xaxis_title="% of KV memory allocated or wanted",
            xaxis_range=[0, 100],
            height=300,
            width=460,
            margin=dict(l=200),
            legend=dict(orientation="h", yanchor="top", y=-0.3),
        )
        fig.update_yaxes(autorange="reversed", title_text="where the KV memory goes")
        return fig

    def _ttft_figure(self) -> go.Figure:
        fig = go.Figure()
        fig.add_scatter(x=[], y=[], mode="lines", name="TTFT", line_color=P.OKABE_ITO["blue"])
        fig.add_hline(y=1.0, line_dash="dash", line_color=P.NEUTRAL, annotation_text="1 s")
        fig.update_layout(
            title="Time to first token, every request (sorted)",
            xaxis_title="percentile of requests",
            yaxis_title="TTFT (s)",
            yaxis_type="log",
            height=300,
            width=460,
        )
        return fig

    def widget(self) -> W.Widget:
        controls = W.HBox([W.VBox([self.manager, self.block_size, self.dataset]), W.VBox([self.rate, self.gpu])])
        # The two plots side by side, under the controls that change them: one laptop screen (1366 x 768).
        return W.VBox([controls, self.summary, W.HBox([self.memory, self.ttft])])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())

"""The online-softmax stepper widget (the seed's Figure 2, live): a thin view over
:class:`paged_edu.labs.softmax_stepper.OnlineSoftmaxStepper`.

Buttons: **next block** (``stepper.step()``), **run to the end**, **reset**, **shuffle physical blocks**
(``stepper.shuffle()``); a **query head** slider picks the head on show. The figure:

* top: the physical pool -- the sequence's blocks labelled with their logical index ``b``
  (processed, the one just processed, still to come), the other requests' blocks grey;
* middle left: the scores ``S_b`` of every slot processed so far, by logical position, with the
  masked tail of the last block (``M_b = -inf``, stale K of a previous occupant) in grey, and the
  running max ``m`` after each block; middle right: the normaliser ``l`` after each block;
* bottom left: ``o / l`` now against attention over the whole sequence, per head_dim coordinate;
  bottom right: the relative error of ``o / l`` after each block (log scale).

:func:`stepper_traces` computes what is drawn (pure data), :func:`stepper_figure` draws it, and the
widget's callbacks call the stepper and copy the new data into its ``FigureWidget``.
"""

from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from paged_edu.labs.softmax_stepper import OnlineSoftmaxStepper
from paged_edu.viz import palette as P
from paged_edu.viz.widgets.base import _figure_widget

__all__ = ["SoftmaxStepperWidget", "stepper_figure", "stepper_traces"]

# Pool colours: 0 another request's block, 1 ours still to come, 2 ours processed, 3 ours just processed.
POOL_COLORS = [
    [0.0, P.FREE],
    [0.25, P.FREE],
    [0.25, P.EVICTABLE],
    [0.5, P.EVICTABLE],
    [0.5, P.OKABE_ITO["blue"]],
    [0.75, P.OKABE_ITO["blue"]],
    [0.75, P.OKABE_ITO["orange"]],
    [1.0, P.OKABE_ITO["orange"]],
]
ERROR_FLOOR = 1e-12  # a log axis cannot show 0


def stepper_traces(stepper: OnlineSoftmaxStepper, head: int = 0) -> list[dict]:
    """The eight traces' data for query head ``head``: pool, S valid, S masked, m, l, truth, o/l, error."""
    if not 0 <= head < stepper.num_q_heads:
        raise ValueError(f"head must be in [0, {stepper.num_q_heads}), got {head}")
    B, hist = stepper.block_size, stepper.history
    table = stepper.block_table
    last = hist[-1]["b"] if hist else -1
    z, text = [], []
    for block_id in range(stepper.num_blocks):
        if block_id in table:
            b = table.index(block_id)
            z.append(3 if b == last else 2 if b < stepper.num_processed else 1)
            text.append(f"#{block_id}<br>b={b}")
        else:
            z.append(0)
            text.append(f"#{block_id}<br>other")
    valid_x, valid_y, masked_x, masked_y, m_x, m_y = [], [], [], [], [], []
    for r in hist:
        scores = r["scores"][head].tolist()
        for j, (s, ok) in enumerate(zip(scores, r["valid"].tolist())):
            (valid_x if ok else masked_x).append(r["b"] * B + j)
            (valid_y if ok else masked_y).append(s)
        m = float(r["m"][head])
        m_x += [r["b"] * B - 0.5, r["b"] * B + B - 0.5, None]
        m_y += [m, m, None]
    steps = [r["b"] for r in hist]
    out = stepper.output()[head].tolist() if hist else [None] * stepper.head_dim
    dims = list(range(stepper.head_dim))
    return [
        {"z": [z], "text": [text]},
        {"x": valid_x, "y": valid_y},
        {"x": masked_x, "y": masked_y},
        {"x": m_x, "y": m_y},
        {"x": steps, "y": [float(r["l"][head]) for r in hist]},
        {"x": dims, "y": stepper.truth[head].tolist()},
        {"x": dims, "y": out},
        {"x": steps, "y": [max(float(r["error"][head]), ERROR_FLOOR) for r in hist]},
    ]


def stepper_figure(stepper: OnlineSoftmaxStepper, head: int = 0) -> go.Figure:
    fig = make_subplots(
        rows=3,
        cols=2,
        specs=[[{"colspan": 2}, None], [{}, {}], [{}, {}]],
        row_heights=[0.16, 0.42, 0.42],
        vertical_spacing=0.15,
        subplot_titles=(
            "physical pool: the sequence's blocks b and B(b)",
            "scores S_b and running max m",
            "normaliser l after block b",
            "o / l now vs attention over the whole sequence",
            "relative error of o / l after block b",
        ),
    )
    data = stepper_traces(stepper, head)
    fig.add_trace(
        go.Heatmap(
            **data[0],
            zmin=0,
            zmax=3,
            colorscale=POOL_COLORS,
            showscale=False,
            texttemplate="%{text}",
            hoverinfo="text",
            xgap=2,
        ),
        1,
        1,
    )
    fig.add_trace(go.Bar(**data[1], name="S_b (valid slots)", marker_color=P.OKABE_ITO["blue"]), 2, 1)
    fig.add_trace(go.Bar(**data[2], name="masked tail (M_b = -inf)", marker_color=P.IDLE), 2, 1)
    fig.add_trace(
        go.Scatter(**data[3], mode="lines", name="running max m", line=dict(color=P.OKABE_ITO["vermillion"], width=3)),
        2,
        1,
    )
    fig.add_trace(
        go.Scatter(**data[4], mode="lines+markers", name="l", line=dict(color=P.OKABE_ITO["bluish green"])), 2, 2
    )
    fig.add_trace(
        go.Scatter(**data[5], mode="lines", name="attention over all tokens", line=dict(color=P.NEUTRAL)), 3, 1
    )
    fig.add_trace(
        go.Scatter(**data[6], mode="markers", name="o / l so far", marker=dict(color=P.OKABE_ITO["orange"], size=7)),
        3,
        1,
    )
    fig.add_trace(
        go.Scatter(**data[7], mode="lines+markers", name="error", line=dict(color=P.OKABE_ITO["reddish purple"])), 3, 2
    )
    n = stepper.num_logical_blocks
    fig.update_yaxes(visible=False, row=1, col=1)
    fig.update_xaxes(showticklabels=False, title_text="physical block id (the pool)", row=1, col=1)
    fig.update_yaxes(title_text="score (q·k / sqrt(d))", row=2, col=1)
    fig.update_yaxes(title_text="normaliser l", row=2, col=2)
    fig.update_yaxes(title_text="output value", row=3, col=1)
    fig.update_xaxes(title_text="logical position t", range=[-0.5, n * stepper.block_size - 0.5], row=2, col=1)
    for row, col in ((2, 2), (3, 2)):
        fig.update_xaxes(title_text="block b", range=[-0.5, n - 0.5], dtick=1, row=row, col=col)
    fig.update_yaxes(type="log", range=[-12.5, 1], title_text="relative error", row=3, col=2)
    fig.update_xaxes(title_text="head_dim coordinate", row=3, col=1)
    fig.update_layout(
        height=590,  # with the buttons above it, on a laptop's screen (1366 x 768) whole
        width=900,
        barmode="overlay",
        margin=dict(l=40, r=20, t=40, b=40),
        legend=dict(orientation="h", y=-0.08),
        title_text=None,
    )
    return fig


class SoftmaxStepperWidget:
    """Buttons and a head slider over an :class:`OnlineSoftmaxStepper`; ``.ui`` is what a notebook shows."""

    def __init__(self, stepper: OnlineSoftmaxStepper) -> None:
        self.stepper = stepper
        self.next_button = W.Button(description="next block", button_style="primary")
        self.run_button = W.Button(description="run to the end")
        self.reset_button = W.Button(description="reset")
        self.shuffle_button = W.Button(description="shuffle physical blocks", layout=W.Layout(width="200px"))
        self.head = W.IntSlider(0, min=0, max=stepper.num_q_heads - 1, description="query head")
        self.status = W.HTML()
        self.fig = _figure_widget(stepper_figure(stepper, 0))
        self.next_button.on_click(lambda _: self.next_block())
        self.run_button.on_click(lambda _: self.run_to_end())
        self.reset_button.on_click(lambda _: self.reset())
        self.shuffle_button.on_click(lambda _: self.shuffle())
        self.head.observe(lambda _: self.redraw(), "value")
        buttons = W.HBox([self.next_button, self.run_button, self.reset_button, self.shuffle_button, self.head])
        self.ui = W.VBox([buttons, self.status, self.fig])
        self._last = ""
        self.redraw()

    # -- callbacks (also plain methods) ----------------------------------------------------------
    def next_block(self) -> None:
        if not self.stepper.done:
            self.stepper.step()
        self._last = ""
        self.redraw()

    def run_to_end(self) -> None:
        self.stepper.run()
        self._last = ""
        self.redraw()

    def reset(self) -> None:
        self.stepper.reset()
        self._last = ""
        self.redraw()

    def shuffle(self) -> None:
        before = self.stepper.output().clone() if self.stepper.history else None
        old = self.stepper.block_table
        new = self.stepper.shuffle()
        same = (
            ""
            if before is None
            else (
                f"; o / l after the same {self.stepper.num_processed} block(s) differs by "
                f"{(self.stepper.output() - before).abs().max().item():.1e}"
            )
        )
        self._last = f"<br>shuffled: block table {old} &rarr; {new}{same}"
        self.redraw()

    # -- the view ----------------------------------------------------------------------------------
    def redraw(self) -> None:
        s, h = self.stepper, self.head.value
        with self.fig.batch_update():
            for trace, data in zip(self.fig.data, stepper_traces(s, h)):
                trace.update(data)
        self.next_button.disabled = s.done
        table = ", ".join(str(b) for b in s.block_table)
        if s.history:
            r = s.history[-1]
            masked = s.block_size - r["num_valid"]
            line = (
                f"block b = {r['b']} &rarr; physical block B({r['b']}) = {r['block_id']}: "
                f"{r['num_valid']} valid slot(s){f', {masked} masked' if masked else ''}; head {h}: "
                f"m = {float(r['m'][h]):.3f}, l = {float(r['l'][h]):.3f}, "
                f"error of o/l = {float(r['error'][h]):.2e}"
            )
        else:
            line = "no block processed yet: (m, l, o) = (-inf, 0, 0)"
        done = " &mdash; last block: o / l is the attention output" if s.done else ""
        self.status.value = (
            f"<tt>s = {s.seq_len}, B = {s.block_size}, block table [{table}]<br>{line}{done}{self._last}</tt>"
        )

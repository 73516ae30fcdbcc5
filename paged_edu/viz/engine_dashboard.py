"""The engine dashboard: a thin view over a live :class:`~paged_edu.engine.Engine` (lesson 5).

Type a prompt and **add request** -- at any time, while others run -- then **step**, **run 10
steps** or **run to the end**. The view shows the waiting / running / swapped queues, every running
sequence's block table over the physical pool (the views of lessons 2-3,
:mod:`paged_edu.viz.figures`, now driven by the engine's allocator), each request's text so far,
and the live metrics of the engine's event stream (:meth:`Engine.subscribe`): KV usage, prefix hit
rate, tokens per step, and time to first token and inter-token latency per request.

Every button is also a method (``add_request``, ``step``, ``run_to_end``), so tests drive the
dashboard headless. :class:`ChunkedPrefillExplorer` is the lesson's slider over
``max_num_batched_tokens``.
"""

from __future__ import annotations

import html

import ipywidgets as W

from paged_edu.engine import RequestMetrics, SamplingParams, StepMetrics
from paged_edu.viz import engine_figures as EF
from paged_edu.viz import figures as F
from paged_edu.viz.widgets import _figure_widget, _update_heatmap
from paged_edu.viz import palette as P

__all__ = ["ChunkedPrefillExplorer", "EngineDashboard"]

_MONO = "<div style='font-family:monospace;font-size:12px;line-height:1.5'>"


class EngineDashboard:
    """Queues, block tables, request texts and live metrics of one engine; buttons drive it."""

    def __init__(self, engine, tokenizer=None, *, max_tokens: int = 24, cols: int = 8) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.cols = cols
        self.colors = P.OwnerColors()
        self.history: list[StepMetrics] = []
        self.finished: dict[int, RequestMetrics] = {}
        self.outputs: dict[int, list[int]] = {}
        self.prompts: dict[int, list[int]] = {}
        self.stop_ids = (
            (tokenizer.eos_token_id,) if tokenizer is not None and tokenizer.eos_token_id is not None else ()
        )
        engine.subscribe(self._on_event)
        self.prompt = W.Text(
            value="What is the capital of France?", description="prompt", layout=W.Layout(width="460px")
        )
        self.max_tokens = W.IntSlider(max_tokens, min=1, max=128, description="max tokens")
        self.add_button = W.Button(description="add request", icon="plus", button_style="success")
        self.step_button = W.Button(description="step", icon="step-forward")
        self.run10_button = W.Button(description="run 10 steps", icon="forward")
        self.end_button = W.Button(description="run to the end", icon="fast-forward", button_style="info")
        self.status = W.HTML()
        self.queues = W.HTML()
        self.texts = W.HTML()
        self.add_button.on_click(lambda _: self._guard(self.add_request))
        self.step_button.on_click(lambda _: self._guard(self.step))
        self.run10_button.on_click(lambda _: self._guard(lambda: self.step(10)))
        self.end_button.on_click(lambda _: self._guard(self.run_to_end))
        self.grid = _figure_widget(
            F.block_grid_figure(
                engine.allocator, cols, self.colors, title="Physical KV pool (colour = sequence, rc = ref count)"
            )
        )
        self.table = _figure_widget(
            F.block_table_figure(engine.allocator, self.colors, title="Block tables of the running sequences")
        )
        self.metrics = _figure_widget(EF.engine_metrics_figure(self.history, stacked=True))
        controls = W.VBox(
            [
                W.HBox([self.prompt, self.max_tokens, self.add_button]),
                W.HBox([self.step_button, self.run10_button, self.end_button]),
                self.status,
            ]
        )
        # Two columns under the buttons -- the pool and the queues; the block tables and the metrics --
        # and the requests' texts across, so that everything a button changes is on a laptop's screen
        # (1366 x 768) at once.
        right = W.VBox([self.table, self.metrics], layout=W.Layout(flex="1", min_width="0"))
        self.ui = W.VBox([controls, W.HBox([W.VBox([self.grid, self.queues]), right]), self.texts])
        self.refresh()

    # -- callbacks (also the headless API) ---------------------------------------------------------
    def add_request(self, text: str | None = None, max_tokens: int | None = None) -> int:
        """Queue a request: the prompt box's text through the chat template (or ``text``)."""
        text = self.prompt.value if text is None else text
        if not text.strip():
            raise ValueError("the prompt is empty: type something first")
        ids = self.encode(text)
        params = SamplingParams(
            max_tokens=self.max_tokens.value if max_tokens is None else max_tokens, stop_token_ids=self.stop_ids
        )
        request_id = self.engine.add_request(ids, params)
        self.prompts[request_id] = ids
        self.say(f"request {request_id} queued: {len(ids)} prompt tokens, up to {params.max_tokens} new")
        self.refresh()
        return request_id

    def step(self, n: int = 1) -> list:
        """Run ``n`` engine steps (fewer if everything finishes); returns the finished requests."""
        done, ran = [], 0
        for _ in range(n):
            if not self.engine.has_unfinished():
                break
            for out in self.engine.step():
                self.outputs[out.request_id] = out.outputs[0]
                done.append(out)
            ran += 1
        if ran == 0:
            self.say("nothing to run: add a request first")
        else:
            finished = f"finished {[o.request_id for o in done]}" if done else "nothing finished"
            self.say(f"ran {ran} step(s), now at step {self.engine.step_count}; {finished}")
        self.refresh()
        return done

    def run_to_end(self, max_steps: int = 10_000) -> list:
        return self.step(max_steps)

    # -- helpers -----------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:  # random weights: the text's bytes stand in for token ids
            vocab = self.engine.model.config.vocab_size
            return [3 + b % (vocab - 3) for b in text.encode()]
        messages = [{"role": "user", "content": text}]
        chat = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(chat, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _on_event(self, event) -> None:
        if isinstance(event, StepMetrics):
            self.history.append(event)
        elif isinstance(event, RequestMetrics):
            self.finished[event.request_id] = event

    def _guard(self, action) -> None:
        try:
            action()
        except (ValueError, TypeError, RuntimeError) as exc:
            self.say(f"{type(exc).__name__}: {exc}", ok=False)

    def say(self, message: str, ok: bool = True) -> None:
        color = P.GOOD if ok else P.BAD
        self.status.value = f"<span style='color:{color}'>{html.escape(message)}</span>"

    def request_rows(self) -> list[dict]:
        """Every request seen: its state, text so far, TTFT and mean inter-token latency (seconds)."""
        sched, rows = self.engine.scheduler, {}
        for state, queue in (("waiting", sched.waiting), ("running", sched.running), ("swapped", sched.swapped)):
            for seq in queue:
                rows[seq.request_id] = {
                    "id": seq.request_id,
                    "state": state,
                    "output": list(seq.output_token_ids),
                    "ttft": seq.ttft,
                    "itl": _mean(seq.inter_token_latencies),
                }
        for rid, m in self.finished.items():
            rows[rid] = {
                "id": rid,
                "state": "finished",
                "output": self.outputs.get(rid, []),
                "ttft": m.ttft,
                "itl": m.mean_itl,
            }
        return [rows[k] for k in sorted(rows)]

    # -- view --------------------------------------------------------------------------------------
    def refresh(self) -> None:
        a, sched = self.engine.allocator, self.engine.scheduler
        with self.grid.batch_update():
            _update_heatmap(self.grid.data[0], F.block_grid_data(a, self.cols, self.colors))
        table = F.block_table_data(a, self.colors)
        with self.table.batch_update():
            _update_heatmap(self.table.data[0], table)
            self.table.layout.height = 100 + 26 * max(1, len(table["y"]))
        d = EF.engine_metrics_data(self.history)
        with self.metrics.batch_update():
            for trace, key in zip(self.metrics.data, ("kv_usage", "hit_rate", "tokens", "running")):
                trace.x, trace.y = d["x"], d[key]
        last = self.history[-1] if self.history else None

        def ids(queue):
            return ", ".join(f"r{s.request_id}/s{s.seq_id}" for s in queue) or "-"

        self.queues.value = _MONO + (
            f"<b>waiting</b>: {ids(sched.waiting)}<br><b>running</b>: {ids(sched.running)}<br>"
            f"<b>swapped</b>: {ids(sched.swapped)}<br>"
            f"KV usage <b>{a.usage:.0%}</b> ({a.num_used_blocks}/{a.num_blocks} blocks) | prefix hit rate "
            f"<b>{sched.stats()['prefix_hit_rate']:.0%}</b> | tokens last step "
            f"<b>{last.num_batched_tokens if last else 0}</b> | step {self.engine.step_count}</div>"
        )
        lines = []
        for r in self.request_rows():
            ttft = "-" if r["ttft"] is None else f"{1e3 * r['ttft']:.0f} ms"
            itl = "-" if r["itl"] is None else f"{1e3 * r['itl']:.0f} ms"
            text = html.escape(self.decode(r["output"]))
            lines.append(f"<b>r{r['id']}</b> [{r['state']}] TTFT {ttft}, ITL {itl}: {text or '<i>(no tokens yet)</i>'}")
        self.texts.value = _MONO + ("<br>".join(lines) or "no requests yet") + "</div>"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class ChunkedPrefillExplorer:
    """A slider over ``max_num_batched_tokens``: each value reruns the chunked-prefill trace."""

    def __init__(self, model, *, budget: int = 64, long_prompt_len: int = 200) -> None:
        from paged_edu.labs.batching import chunked_prefill_trace

        self._trace = lambda b: chunked_prefill_trace(model, max_num_batched_tokens=b, long_prompt_len=long_prompt_len)
        self.trace = self._trace(budget)
        self.budget = W.IntSlider(
            budget,
            min=8,
            max=256,
            step=8,
            description="max_num_batched_tokens",
            style={"description_width": "170px"},
            layout=W.Layout(width="520px"),
        )
        self.summary = W.HTML()
        self.fig = _figure_widget(EF.chunked_prefill_figure(self.trace))
        self.budget.observe(lambda ch: self.set_budget(ch["new"]), "value")
        self.ui = W.VBox([self.budget, self.summary, self.fig])
        self._show()

    def set_budget(self, budget: int) -> dict:
        if self.budget.value != budget:
            self.budget.value = budget  # fires the observer, which lands here again
            return self.trace
        self.trace = self._trace(budget)
        self._show()
        return self.trace

    def prefill_steps(self) -> int:
        """Steps that computed a chunk of the long prompt."""
        t = self.trace
        return sum(1 for a, b in zip([0] + t["long_done"], t["long_done"]) if b > a)

    def _show(self) -> None:
        d = EF.chunked_prefill_data(self.trace)
        with self.fig.batch_update():
            for trace, key in zip(self.fig.data, ("decode", "prefill", "budget")):
                trace.x, trace.y = d["x"], d[key]
        self.summary.value = _MONO + (
            f"budget {self.trace['budget']} tokens per step: the {self.trace['long_prompt_len']}-token prompt is "
            f"computed in <b>{self.prefill_steps()}</b> steps, and the decodes never stop</div>"
        )

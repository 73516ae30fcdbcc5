"""Lesson 1's calculator: bytes per token, per request, for a batch, and how many requests fit.

Model geometries, parameter counts and GPU memory come from the one table,
:mod:`paged_edu.core.hardware` (GPU memory in bytes as the device reports it, each figure cited
there); the calculator only adds sliders for what a learner may change.
"""

from __future__ import annotations

import math

import ipywidgets as W
import plotly.graph_objects as go

from paged_edu.core.hardware import DTYPE_BYTES, GPUS, MODELS, ModelGeometry, find_model
from paged_edu.core.memory import format_bytes, kv_bytes, vllm_kv_budget
from paged_edu.viz.memory_figures import kv_memory_figure
from paged_edu.viz.palette import BAD, GOOD
from paged_edu.viz.widgets.base import _figure_widget

__all__ = ["GPU_MEMORY", "PARAMS", "KVMemoryCalculator"]

# Views of the one table, by the names the menus show.
PARAMS = {m.name: m.num_params for m in MODELS.values()}
GPU_MEMORY = {g.label: g.memory_bytes for g in GPUS.values()}


def gpu_label(gpu: str) -> str:
    """A menu label from a label or a table key (``"h200"`` -> ``"H200 (141 GB)"``)."""
    if gpu in GPU_MEMORY:
        return gpu
    if gpu in GPUS:
        return GPUS[gpu].label
    raise ValueError(
        f"gpu={gpu!r} is not in the GPU table; choose one of {', '.join(GPU_MEMORY)} (or the keys {', '.join(GPUS)})"
    )


class KVMemoryCalculator:
    """Presets and sliders for ``M_KV(s) = 2 N_layers N_kv d_head s sizeof(dtype)``; how many fit.

    The memory for KV is ``gpu_memory_utilization * GPUs * GPU memory - weights`` (GPU memory in
    bytes as the device reports it and the weights from the preset's parameter count at its dtype,
    both from :mod:`paged_edu.core.hardware`; tensor parallelism splits both over the GPUs).

    ``readout()`` returns the numbers the view shows: bytes per token, bytes per request, bytes
    for the batch, the memory left for KV after the weights, and the requests of ``s`` tokens that
    fit in it (paged, block size 16).
    """

    def __init__(
        self,
        preset: str = "Seed 70B example",
        gpu: str = "H200 (141 GB)",
        seq_len: int = 8192,
        batch: int = 8,
        num_gpus: int = 1,
        gpu_memory_utilization: float = 0.9,
    ) -> None:
        style = {"description_width": "110px"}
        layout = W.Layout(width="420px")
        self.preset = W.Dropdown(
            options=list(PARAMS) + ["custom"], value=preset, description="model", style=style, layout=layout
        )
        self.layers = W.IntSlider(80, min=1, max=128, description="N_layers", style=style, layout=layout)
        self.kv_heads = W.IntSlider(8, min=1, max=128, description="N_kv heads", style=style, layout=layout)
        self.head_dim = W.IntSlider(128, min=16, max=256, step=16, description="d_head", style=style, layout=layout)
        self.dtype = W.Dropdown(
            options=list(DTYPE_BYTES), value="fp16", description="dtype", style=style, layout=layout
        )
        self.seq_len = W.IntSlider(
            seq_len, min=128, max=131072, step=128, description="s (tokens)", style=style, layout=layout
        )
        self.batch = W.IntSlider(batch, min=1, max=512, description="batch", style=style, layout=layout)
        gpu = gpu_label(gpu)
        self.gpu = W.Dropdown(options=list(GPU_MEMORY), value=gpu, description="GPU", style=style, layout=layout)
        self.gpu_gb = W.FloatSlider(
            GPU_MEMORY[gpu] / 1e9,
            min=8,
            max=192,
            step=0.01,
            description="GPU memory GB",
            readout_format=".2f",
            style=style,
            layout=layout,
        )
        self.num_gpus = W.IntSlider(num_gpus, min=1, max=8, description="GPUs", style=style, layout=layout)
        self.weights_gb = W.FloatSlider(
            0, min=0, max=1400, step=0.5, description="weights GB", style=style, layout=layout
        )
        self.util = gpu_memory_utilization
        self.html = W.HTML()
        self._mla: tuple[int, int] = (0, 0)  # (latent_dim, rope_dim) while an MLA preset is untouched
        self._syncing = False
        self.fig = _figure_widget(kv_memory_figure(self.spec(), self.seq_len.value, self.batch.value, 1))
        self.preset.observe(lambda ch: self.set_preset(ch["new"]), "value")
        self.gpu.observe(lambda ch: self.set_gpu(ch["new"]), "value")
        for w in (self.layers, self.kv_heads, self.head_dim, self.dtype):
            w.observe(self._on_geometry, "value")
        for w in (self.seq_len, self.batch, self.gpu_gb, self.num_gpus, self.weights_gb):
            w.observe(lambda ch: self.update(), "value")
        self.set_preset(preset)
        controls = W.VBox(
            [
                self.preset,
                self.layers,
                self.kv_heads,
                self.head_dim,
                self.dtype,
                self.seq_len,
                self.batch,
                self.gpu,
                self.gpu_gb,
                self.num_gpus,
                self.weights_gb,
            ],
            layout=W.Layout(min_width="440px"),
        )
        self.fig.layout.height = 300  # with the controls above it, on a laptop's screen (1366 x 768) whole
        self.ui = W.VBox([W.HBox([controls, self.html]), self.fig])

    def spec(self) -> ModelGeometry:
        latent, rope = self._mla
        return ModelGeometry(
            "custom",
            self.layers.value,
            self.kv_heads.value,
            self.head_dim.value,
            self.dtype.value,
            latent_dim=latent,
            rope_dim=rope,
        )

    def set_preset(self, name: str) -> None:
        """Load a preset's geometry (and its weights' size at the preset's dtype) into the sliders."""
        if name == "custom":
            return
        spec = find_model(name)
        self._syncing = True
        try:
            if self.preset.value != name:
                self.preset.value = name
            self.layers.value, self.kv_heads.value = spec.num_layers, spec.num_kv_heads
            self.head_dim.value, self.dtype.value = spec.head_dim, spec.dtype
            self._mla = (spec.latent_dim, spec.rope_dim)
            self.weights_gb.value = round(PARAMS.get(name, 0) * DTYPE_BYTES[spec.dtype] / 1e9, 1)
        finally:
            self._syncing = False
        self.update()

    def set_gpu(self, name: str) -> None:
        """Select a GPU of the table (label or key); its memory as the device reports it fills the slider."""
        name = gpu_label(name)
        if self.gpu.value != name:
            self.gpu.value = name
        self.gpu_gb.value = GPU_MEMORY[name] / 1e9
        self.update()

    def _on_geometry(self, change) -> None:
        if self._syncing:
            return
        self._mla = (0, 0)  # a hand-edited geometry is a plain K/V cache
        self._syncing = True
        self.preset.value = "custom"
        self._syncing = False
        self.update()

    def readout(self) -> dict[str, float]:
        spec, s, batch = self.spec(), self.seq_len.value, self.batch.value
        gpu_bytes = self.num_gpus.value * self.gpu_gb.value * 1e9
        kv_budget = max(0.0, vllm_kv_budget(gpu_bytes, self.util, self.weights_gb.value * 1e9))
        per_request = kv_bytes(spec, s)
        block = spec.block_bytes(16)
        fit = int(kv_budget // block) // math.ceil(s / 16)
        return {
            "bytes_per_token": spec.kv_bytes_per_token,
            "bytes_per_request": per_request,
            "bytes_batch": per_request * batch,
            "kv_budget_bytes": kv_budget,
            "requests_that_fit": fit,
            "batch_fits": per_request * batch <= kv_budget,
        }

    def update(self) -> None:
        if self._syncing:
            return
        r, spec = self.readout(), self.spec()
        formula = (
            f"{spec.num_layers} x ({spec.latent_dim} + {spec.rope_dim})"
            if spec.is_mla
            else f"2 x {spec.num_layers} x {spec.num_kv_heads} x {spec.head_dim}"
        )
        verdict = (
            f"<span style='color:{GOOD}'>fits</span>"
            if r["batch_fits"]
            else f"<span style='color:{BAD}'><b>does NOT fit</b></span>"
        )
        self.html.value = (
            "<div style='font-family:monospace;line-height:1.6;padding-left:16px'>"
            f"<b>per token</b>: {formula} x {DTYPE_BYTES[spec.kv_dtype]} B = <b>{r['bytes_per_token']:,} B</b>"
            f" ({r['bytes_per_token'] / 1024:,.1f} KiB)<br>"
            f"<b>per request</b> (s = {self.seq_len.value:,}): {format_bytes(r['bytes_per_request'])}<br>"
            f"<b>batch of {self.batch.value}</b>: {format_bytes(r['bytes_batch'])} -- {verdict}<br>"
            f"<b>memory for KV</b>: {self.util:.0%} x {self.num_gpus.value} x {self.gpu_gb.value:.2f} GB - {self.weights_gb.value:.1f} GB weights"
            f" = {format_bytes(r['kv_budget_bytes'])}<br>"
            f"<b>requests of s tokens that fit</b> (paged, B = 16): <b>{r['requests_that_fit']:,}</b></div>"
        )
        new = kv_memory_figure(spec, self.seq_len.value, self.batch.value, int(r["kv_budget_bytes"]))
        with self.fig.batch_update():
            for old_trace, new_trace in zip(self.fig.data, new.data):
                old_trace.x, old_trace.y = new_trace.x, new_trace.y
                if isinstance(new_trace, go.Bar):
                    old_trace.marker.color = new_trace.marker.color

"""Live widgets: thin views whose callbacks drive the library.

Every widget keeps its state in ``paged_edu`` objects (a :class:`BlockAllocator`, a paged KV
cache) and redraws plotly ``FigureWidget``s from them with the pure functions of
:mod:`paged_edu.viz.figures`. Each button or slider callback is also a plain method
(``add_request``, ``append_tokens``, ``fork``, ``free``, ``pick``, ``set_preset`` ...), so tests and
notebooks can drive a widget headless; ``widget.ui`` is what a notebook displays.

* :class:`KVMemoryCalculator` -- bytes per token, per request, and how many requests fit.
* :class:`BlockTableWidget` -- requests come and go; blocks, tables and one token's address.
* :class:`PrefixSharingWidget` -- chat requests share a system prompt; fork; copy-on-write; evict.
"""

from __future__ import annotations

import html
import itertools
import math

import ipywidgets as W
import plotly.graph_objects as go

from paged_edu.core.allocator import BlockAllocator, BlockEvent, OutOfBlocksError
from paged_edu.core.memory import DTYPE_BYTES, PRESETS, KVSpec, format_bytes, kv_bytes
from paged_edu.viz import figures as F
from paged_edu.lessons.kv_view import KVView

__all__ = ["KVMemoryCalculator", "BlockTableWidget", "PrefixSharingWidget"]

# Rough parameter counts for the presets, to subtract the weights from the GPU's memory.
PARAMS = {"Seed 70B example": 70.6e9, "Llama-3-8B": 8.03e9, "Llama-2-7B": 6.74e9, "OPT-13B": 12.9e9,
          "SmolLM2-135M": 0.135e9, "DeepSeek-V3 (MLA)": 671e9}
GPUS = {"T4 (16 GB)": 16e9, "A100 40GB": 40e9, "A100 80GB": 80e9, "H100 80GB": 80e9, "H200 (141 GB)": 141e9}


def _figure_widget(fig: go.Figure) -> go.FigureWidget:
    return go.FigureWidget(fig)


def _update_heatmap(trace, data: dict) -> None:
    trace.z = data["z"] or [[None]]
    trace.text = data["text"] or [[""]]
    if "hover" in data:
        trace.customdata = data["hover"]
    if "y" in data:
        trace.y = data["y"] or [""]
        trace.x = data["x"]


# ----------------------------------------------------------------------------------------------
# Lesson 1: the KV memory calculator
# ----------------------------------------------------------------------------------------------


class KVMemoryCalculator:
    """Presets and sliders for ``M_KV(s) = 2 N_layers N_kv d_head s sizeof(dtype)``; how many fit.

    The memory for KV is ``gpu_memory_utilization * GPUs * GPU memory - weights`` (weights from the
    preset's parameter count at its dtype; tensor parallelism splits both over the GPUs).

    ``readout()`` returns the numbers the view shows: bytes per token, bytes per request, bytes
    for the batch, the memory left for KV after the weights, and the requests of ``s`` tokens that
    fit in it (paged, block size 16).
    """

    def __init__(self, preset: str = "Seed 70B example", gpu: str = "H200 (141 GB)", seq_len: int = 8192,
                 batch: int = 8, num_gpus: int = 1, gpu_memory_utilization: float = 0.9) -> None:
        style = {"description_width": "110px"}
        layout = W.Layout(width="420px")
        self.preset = W.Dropdown(options=list(PRESETS) + ["custom"], value=preset, description="model", style=style, layout=layout)
        self.layers = W.IntSlider(80, min=1, max=128, description="N_layers", style=style, layout=layout)
        self.kv_heads = W.IntSlider(8, min=1, max=128, description="N_kv heads", style=style, layout=layout)
        self.head_dim = W.IntSlider(128, min=16, max=256, step=16, description="d_head", style=style, layout=layout)
        self.dtype = W.Dropdown(options=list(DTYPE_BYTES), value="fp16", description="dtype", style=style, layout=layout)
        self.seq_len = W.IntSlider(seq_len, min=128, max=131072, step=128, description="s (tokens)", style=style, layout=layout)
        self.batch = W.IntSlider(batch, min=1, max=512, description="batch", style=style, layout=layout)
        self.gpu = W.Dropdown(options=list(GPUS), value=gpu, description="GPU", style=style, layout=layout)
        self.gpu_gb = W.FloatSlider(GPUS[gpu] / 1e9, min=8, max=192, step=1, description="GPU memory GB", style=style, layout=layout)
        self.num_gpus = W.IntSlider(num_gpus, min=1, max=8, description="GPUs", style=style, layout=layout)
        self.weights_gb = W.FloatSlider(0, min=0, max=1400, step=0.5, description="weights GB", style=style, layout=layout)
        self.util = gpu_memory_utilization
        self.html = W.HTML()
        self._mla: tuple[int, int] = (0, 0)  # (latent_dim, rope_dim) while an MLA preset is untouched
        self._syncing = False
        self.fig = _figure_widget(F.kv_memory_figure(self.spec(), self.seq_len.value, self.batch.value, 1))
        self.preset.observe(lambda ch: self.set_preset(ch["new"]), "value")
        self.gpu.observe(lambda ch: self.set_gpu(ch["new"]), "value")
        for w in (self.layers, self.kv_heads, self.head_dim, self.dtype):
            w.observe(self._on_geometry, "value")
        for w in (self.seq_len, self.batch, self.gpu_gb, self.num_gpus, self.weights_gb):
            w.observe(lambda ch: self.update(), "value")
        self.set_preset(preset)
        controls = W.VBox([self.preset, self.layers, self.kv_heads, self.head_dim, self.dtype,
                           self.seq_len, self.batch, self.gpu, self.gpu_gb, self.num_gpus, self.weights_gb],
                          layout=W.Layout(min_width="440px"))
        self.ui = W.VBox([W.HBox([controls, self.html]), self.fig])

    def spec(self) -> KVSpec:
        latent, rope = self._mla
        return KVSpec("custom", self.layers.value, self.kv_heads.value, self.head_dim.value, self.dtype.value,
                      latent_dim=latent, rope_dim=rope)

    def set_preset(self, name: str) -> None:
        """Load a preset's geometry (and its weights' size at the preset's dtype) into the sliders."""
        if name == "custom":
            return
        spec = PRESETS[name]
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
        if self.gpu.value != name:
            self.gpu.value = name
        self.gpu_gb.value = GPUS[name] / 1e9
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
        kv_budget = max(0.0, gpu_bytes * self.util - self.weights_gb.value * 1e9)
        per_request = kv_bytes(spec, s)
        block = spec.block_bytes(16)
        fit = int(kv_budget // block) // math.ceil(s / 16)
        return {"bytes_per_token": spec.bytes_per_token, "bytes_per_request": per_request,
                "bytes_batch": per_request * batch, "kv_budget_bytes": kv_budget, "requests_that_fit": fit,
                "batch_fits": per_request * batch <= kv_budget}

    def update(self) -> None:
        if self._syncing:
            return
        r, spec = self.readout(), self.spec()
        formula = (f"{spec.num_layers} x ({spec.latent_dim} + {spec.rope_dim})" if spec.is_mla else
                   f"2 x {spec.num_layers} x {spec.num_kv_heads} x {spec.head_dim}")
        verdict = ("<span style='color:#17a398'>fits</span>" if r["batch_fits"]
                   else "<span style='color:#e4572e'>does NOT fit</span>")
        self.html.value = (
            "<div style='font-family:monospace;line-height:1.6;padding-left:16px'>"
            f"<b>per token</b>: {formula} x {DTYPE_BYTES[spec.dtype]} B = <b>{r['bytes_per_token']:,} B</b>"
            f" ({r['bytes_per_token'] / 1024:,.1f} KiB)<br>"
            f"<b>per request</b> (s = {self.seq_len.value:,}): {format_bytes(r['bytes_per_request'])}<br>"
            f"<b>batch of {self.batch.value}</b>: {format_bytes(r['bytes_batch'])} -- {verdict}<br>"
            f"<b>memory for KV</b>: {self.util:.0%} x {self.num_gpus.value} x {self.gpu_gb.value:.0f} GB - {self.weights_gb.value:.1f} GB weights"
            f" = {format_bytes(r['kv_budget_bytes'])}<br>"
            f"<b>requests of s tokens that fit</b> (paged, B = 16): <b>{r['requests_that_fit']:,}</b></div>")
        new = F.kv_memory_figure(spec, self.seq_len.value, self.batch.value, int(r["kv_budget_bytes"]))
        with self.fig.batch_update():
            for old_trace, new_trace in zip(self.fig.data, new.data):
                old_trace.x, old_trace.y = new_trace.x, new_trace.y
                if isinstance(new_trace, go.Bar):
                    old_trace.marker.color = new_trace.marker.color


# ----------------------------------------------------------------------------------------------
# Lesson 2: the block-table widget
# ----------------------------------------------------------------------------------------------


class _AllocatorView:
    """Shared plumbing: an allocator, its KV view, the grid and table figures, an event log, the
    selected sequence, and the steps every button shares (guard, select, allocate, redraw)."""

    def __init__(self, allocator: BlockAllocator, kv: KVView | bool, *, device, dtype, seed: int,
                 cols: int) -> None:
        if kv is True:  # real K/V tensors behind the allocator, made here
            kv = KVView(allocator, device=device, dtype=dtype, seed=seed)
        self.allocator = allocator
        self.kv = kv or None
        self.cols = cols
        self.colors = F.OwnerColors()
        self.events: list[BlockEvent] = []
        allocator.subscribe(self.events.append)
        self.grid = _figure_widget(F.block_grid_figure(allocator, cols, self.colors))
        self.table = _figure_widget(F.block_table_figure(allocator, self.colors))
        self.status = W.HTML()
        self.log = W.HTML()
        self.seq = W.Dropdown(options=[], description="sequence", style={"description_width": "90px"})

    # -- steps the callbacks share ---------------------------------------------------------------
    def _guard(self, action) -> None:
        """Run a button's action; an error it raises is shown in the status line, not thrown."""
        try:
            action()
        except (OutOfBlocksError, ValueError, KeyError) as exc:
            self.say(f"{type(exc).__name__}: {exc}", ok=False)

    def _selected(self, seq_id=None, error: str = "no sequence selected"):
        """``seq_id``, or the dropdown's sequence when it is None; ``ValueError(error)`` if neither."""
        seq_id = self.seq.value if seq_id is None else seq_id
        if seq_id is None:
            raise ValueError(error)
        return seq_id

    def _allocate(self, seq_id: str, tokens: list[int]) -> list[int]:
        """Blocks for a new prompt (its block table), and its K/V written when there are tensors."""
        table = self.allocator.allocate(seq_id, tokens)
        if self.kv is not None:
            self.kv.write_prompt(seq_id)
        return table

    def _after_change(self, select=None) -> None:
        """Offer the live sequences in the dropdown (selecting ``select``), then redraw."""
        ids = list(self.allocator.seq_ids)
        self.seq.options = ids
        if select is not None:
            self.seq.value = select
        elif self.seq.value not in ids:
            self.seq.value = ids[-1] if ids else None
        self.refresh()

    # -- view ------------------------------------------------------------------------------------
    def refresh(self) -> None:
        with self.grid.batch_update():
            _update_heatmap(self.grid.data[0], F.block_grid_data(self.allocator, self.cols, self.colors))
        table_data = F.block_table_data(self.allocator, self.colors)
        with self.table.batch_update():
            _update_heatmap(self.table.data[0], table_data)
            self.table.layout.height = 110 + 36 * max(1, len(table_data["y"]))
        lines = [f"{e.kind}: seq {e.seq_id!s}, blocks {e.block_ids}" + (f", slot {e.slot}" if e.slot >= 0 else "")
                 for e in self.events[-6:]]
        self.log.value = ("<div style='font-family:monospace;font-size:12px;color:#555'>"
                          + "<br>".join(html.escape(x) for x in lines) + "</div>")

    def say(self, message: str, ok: bool = True) -> None:
        color = "#1b6e5a" if ok else "#b03a1a"
        self.status.value = f"<span style='color:{color}'>{html.escape(message)}</span>"


class BlockTableWidget(_AllocatorView):
    """Add requests, append tokens, free them; see the physical blocks, the tables, one token's address.

    With ``kv`` (a :class:`~paged_edu.lessons.kv_view.KVView`, made by default on ``device``), every
    token written through the allocator is also written into real K/V tensors, and :meth:`pick`
    checks the seed's address formula against the tensor's actual memory.
    """

    def __init__(self, num_blocks: int = 24, block_size: int = 4, *, device="cpu", dtype=None,
                 kv: KVView | bool = True, seed: int = 0, cols: int = 8) -> None:
        super().__init__(BlockAllocator(num_blocks, block_size, enable_prefix_caching=False), kv,
                         device=device, dtype=dtype, seed=seed, cols=cols)
        self._next_id = itertools.count()
        self._next_token = itertools.count(1000)
        style = {"description_width": "90px"}
        self.prompt_len = W.IntSlider(6, min=1, max=4 * block_size, description="prompt len", style=style)
        self.add_button = W.Button(description="add request", icon="plus", button_style="success",
                                     layout=W.Layout(width="auto"))
        self.num_append = W.IntSlider(1, min=1, max=2 * block_size, description="tokens", style=style)
        self.append_button = W.Button(description="append tokens", icon="forward")
        self.free_button = W.Button(description="free", icon="trash", button_style="danger")
        self.position = W.IntSlider(0, min=0, max=0, description="token t", style=style)
        self.address = W.HTML()
        self.add_button.on_click(lambda _: self._guard(self.add_request))
        self.append_button.on_click(lambda _: self._guard(self.append_tokens))
        self.free_button.on_click(lambda _: self._guard(self.free))
        self.seq.observe(lambda ch: self._sync_position(), "value")
        self.position.observe(lambda ch: self._show_pick(), "value")
        controls = W.VBox([W.HBox([self.prompt_len, self.add_button]),
                           W.HBox([self.seq, self.free_button]),
                           W.HBox([self.num_append, self.append_button]),
                           self.status, self.position, self.address])
        self.ui = W.VBox([W.HBox([controls, self.grid]), self.table, self.log])
        self.refresh()

    # -- callbacks (also the headless API) ---------------------------------------------------------
    def add_request(self, num_tokens: int | None = None) -> str:
        """Admit a prompt of ``num_tokens`` (the slider's value by default) fresh tokens."""
        n = self.prompt_len.value if num_tokens is None else num_tokens
        seq_id = f"req{next(self._next_id)}"
        tokens = [next(self._next_token) for _ in range(n)]
        table = self._allocate(seq_id, tokens)
        self.say(f"{seq_id}: {n} tokens -> {len(table)} blocks {table}")
        self._after_change(select=seq_id)
        return seq_id

    def append_tokens(self, seq_id=None, n: int | None = None) -> list[int]:
        """Append ``n`` tokens to ``seq_id`` (the selected sequence); return their physical slots."""
        seq_id = self._selected(seq_id, "no sequence selected: add a request first")
        n = self.num_append.value if n is None else n
        slots = []
        for _ in range(n):
            slots.append(self.allocator.append(seq_id, next(self._next_token)))
            if self.kv is not None:
                self.kv.write_last(seq_id)
        self.say(f"{seq_id}: +{n} tokens at slots {slots}")
        self._after_change(select=seq_id)
        return slots

    def free(self, seq_id=None) -> None:
        seq_id = self._selected(seq_id)
        blocks = self.allocator.block_table(seq_id)
        self.allocator.free(seq_id)
        self.say(f"{seq_id} freed: blocks {blocks} back to the free list")
        self._after_change()

    def pick(self, seq_id=None, position: int | None = None) -> dict:
        """Logical block ``i = t // B``, offset ``j = t mod B``, physical block ``B(i)``, slot and
        address of token ``t`` -- checked against the real tensor when there is one."""
        seq_id = self.seq.value if seq_id is None else seq_id
        t = self.position.value if position is None else position
        B = self.allocator.block_size
        table = self.allocator.block_table(seq_id)
        if not 0 <= t < self.allocator.num_tokens(seq_id):
            raise ValueError(f"position {t} is outside {seq_id} of {self.allocator.num_tokens(seq_id)} tokens")
        i, j = divmod(t, B)
        info = {"seq_id": seq_id, "t": t, "i": i, "j": j, "block": table[i], "slot": self.allocator.slot(seq_id, t)}
        if self.kv is not None:
            info.update(self.kv.check_address(seq_id, t))
        return info

    # -- view ------------------------------------------------------------------------------------
    def _after_change(self, select=None) -> None:
        super()._after_change(select)
        self._sync_position()  # the token slider's range and the address readout follow the selection

    def _sync_position(self) -> None:
        seq_id = self.seq.value
        n = self.allocator.num_tokens(seq_id) if seq_id in self.allocator else 1
        self.position.max = max(0, n - 1)
        self._show_pick()

    def _show_pick(self) -> None:
        if self.seq.value not in self.allocator:
            self.address.value = ""
            return
        p = self.pick()
        B = self.allocator.block_size
        lines = [f"t = {p['t']}: i = t // B = {p['t']} // {B} = {p['i']}, j = t mod B = {p['j']}",
                 f"B(i) = {p['block']}, slot = B(i)*B + j = {p['slot']}"]
        if "address_formula" in p:
            lines.append(f"BasePtr_K + B(i)*S_block + j*S_token = {p['base']:#x} + {p['block']}*{p['s_block']} + "
                         f"{p['j']}*{p['s_token']} = {p['address_formula']:#x}")
            lines.append(f"tensor k_cache[{p['block']}, {p['j']}].data_ptr() = {p['address_tensor']:#x} "
                         + ("(match)" if p["address_match"] else "(MISMATCH)")
                         + f"; stored K equals the token's K: {p['value_match']}")
        self.address.value = "<div style='font-family:monospace;font-size:12px'>" + "<br>".join(
            html.escape(x) for x in lines) + "</div>"


# ----------------------------------------------------------------------------------------------
# Lesson 3: prefix sharing, fork, copy-on-write, eviction
# ----------------------------------------------------------------------------------------------


class PrefixSharingWidget(_AllocatorView):
    """Chat requests that share a system prompt; fork for parallel sampling; append -> copy-on-write.

    ``system_prompt`` token ids are common to every chat request; ``dynamic`` puts a changing
    "timestamp" token at the start of the prompt (the seed's zero-hit-rate fault), at the end (the
    fix) or nowhere. Every copy-on-write is applied to the KV tensors and checked: the copy equals
    its source when made, and the source is untouched after the writer appends (``cow_checks``).
    """

    def __init__(self, num_blocks: int = 24, block_size: int = 4, system_len: int = 10, *, device="cpu",
                 dtype=None, kv: KVView | bool = True, seed: int = 0, cols: int = 8) -> None:
        super().__init__(BlockAllocator(num_blocks, block_size, enable_prefix_caching=True), kv,
                         device=device, dtype=dtype, seed=seed, cols=cols)
        self.system_prompt = list(range(1, system_len + 1))
        self.dynamic_mode = "none"
        self._next_id = itertools.count()
        self._next_token = itertools.count(5000)
        self._clock = itertools.count(90000)  # "timestamps"
        self.cow_checks: list[dict] = []
        style = {"description_width": "90px"}
        self.user_len = W.IntSlider(3, min=1, max=3 * block_size, description="user tokens", style=style)
        self.dynamic = W.ToggleButtons(options=[("no timestamp", "none"), ("timestamp first", "start"),
                                                ("timestamp last", "end")], value="none", description="system prompt",
                                       style={"description_width": "90px", "button_width": "120px"})
        self.chat_button = W.Button(description="new chat request", icon="comment", button_style="success",
                                     layout=W.Layout(width="auto"))
        self.fork_button = W.Button(description="fork", icon="code-fork")
        self.append_button = W.Button(description="append token", icon="forward")
        self.free_button = W.Button(description="free", icon="trash", button_style="danger")
        self.metrics = W.HTML()
        self.chat_button.on_click(lambda _: self._guard(self.add_chat))
        self.fork_button.on_click(lambda _: self._guard(self.fork))
        self.append_button.on_click(lambda _: self._guard(self.append_token))
        self.free_button.on_click(lambda _: self._guard(self.free))
        self.dynamic.observe(lambda ch: self.set_dynamic(ch["new"]), "value")
        controls = W.VBox([self.dynamic, W.HBox([self.user_len, self.chat_button]),
                           W.HBox([self.seq, self.fork_button, self.append_button, self.free_button]),
                           self.status, self.metrics])
        self.ui = W.VBox([controls, W.HBox([self.grid, self.log]), self.table])
        self.refresh()

    def set_dynamic(self, mode: str) -> None:
        if mode not in ("none", "start", "end"):
            raise ValueError(f"dynamic must be 'none', 'start' or 'end', got {mode!r}")
        self.dynamic_mode = mode
        if self.dynamic.value != mode:
            self.dynamic.value = mode

    def prompt_for(self, user_tokens: list[int]) -> list[int]:
        """System prompt + user message, with the changing token where ``dynamic`` says."""
        if self.dynamic_mode == "start":
            return [next(self._clock)] + self.system_prompt + user_tokens
        if self.dynamic_mode == "end":
            return self.system_prompt + user_tokens + [next(self._clock)]
        return self.system_prompt + user_tokens

    def add_chat(self, num_user_tokens: int | None = None) -> str:
        n = self.user_len.value if num_user_tokens is None else num_user_tokens
        seq_id = f"chat{next(self._next_id)}"
        tokens = self.prompt_for([next(self._next_token) for _ in range(n)])
        table = self._allocate(seq_id, tokens)
        cached = self.allocator.num_cached_tokens(seq_id)
        self.say(f"{seq_id}: {len(tokens)} prompt tokens, {cached} from the prefix cache -> blocks {table}")
        self._after_change(select=seq_id)
        return seq_id

    def fork(self, seq_id=None) -> str:
        parent = self._selected(seq_id)
        child = f"{parent}.{sum(1 for s in self.allocator.seq_ids if str(s).startswith(f'{parent}.')) + 1}"
        while child in self.allocator:
            child += "'"
        self.allocator.fork(parent, child)
        self.say(f"{child} forked from {parent}: shares all {len(self.allocator.block_table(child))} blocks")
        self._after_change(select=child)
        return child

    def append_token(self, seq_id=None) -> int:
        """Append one token; a shared, partly filled last block is copied first (and checked)."""
        seq_id = self._selected(seq_id)
        slot = self.allocator.append(seq_id, next(self._next_token))
        copies = self.allocator.take_copies()
        message = f"{seq_id}: appended at slot {slot}"
        if self.kv is not None:
            for src, dst in copies:
                self.cow_checks.append(self.kv.copy_block(src, dst))
            self.kv.write_last(seq_id)
            for check in self.cow_checks[-len(copies):] if copies else []:
                check["source_untouched"] = self.kv.block_unchanged(check)
        if copies:
            message += "; copy-on-write " + ", ".join(f"{s} -> {d}" for s, d in copies)
            if self.kv is not None:
                c = self.cow_checks[-1]
                message += (f" (copy equals source: {c['copy_equal']}, source untouched after the write: "
                            f"{c['source_untouched']})")
        self.say(message)
        self._after_change(select=seq_id)
        return slot

    def free(self, seq_id=None) -> None:
        seq_id = self._selected(seq_id)
        self.allocator.free(seq_id)
        self.say(f"{seq_id} freed; its full blocks stay in the cache (evictable) until the pool needs them")
        self._after_change()

    def refresh(self) -> None:
        super().refresh()
        st, a = self.allocator.stats, self.allocator
        self.metrics.value = (
            "<div style='font-family:monospace'>"
            f"prefix hit rate: <b>{st.hit_rate:.1%}</b> ({st.hit_tokens} of {st.queried_tokens} prompt tokens)<br>"
            f"blocks: {a.num_used_blocks} in use, {a.num_evictable_blocks} evictable (cached, ref 0), "
            f"{a.num_free_blocks - a.num_evictable_blocks} free</div>")

"""Lesson 2's widget: requests come and go; the physical blocks, the block tables, one token's address."""

from __future__ import annotations

import html
import itertools

import ipywidgets as W

from paged_edu.core.allocator import BlockAllocator
from paged_edu.labs.kv_view import KVView
from paged_edu.viz.widgets.base import _AllocatorView

__all__ = ["BlockTableWidget"]


class BlockTableWidget(_AllocatorView):
    """Add requests, append tokens, free them; see the physical blocks, the tables, one token's address.

    With ``kv`` (a :class:`~paged_edu.labs.kv_view.KVView`, made by default on ``device``), every
    token written through the allocator is also written into real K/V tensors, and :meth:`pick`
    checks the seed's address formula against the tensor's actual memory.
    """

    def __init__(
        self,
        num_blocks: int = 24,
        block_size: int = 4,
        *,
        device="cpu",
        dtype=None,
        kv: KVView | bool = True,
        seed: int = 0,
        cols: int = 8,
    ) -> None:
        super().__init__(
            BlockAllocator(num_blocks, block_size, enable_prefix_caching=False),
            kv,
            device=device,
            dtype=dtype,
            seed=seed,
            cols=cols,
        )
        self._next_id = itertools.count()
        self._next_token = itertools.count(1000)
        style = {"description_width": "90px"}
        slider = W.Layout(width="280px")
        self.prompt_len = W.IntSlider(
            6, min=1, max=4 * block_size, description="prompt len", style=style, layout=slider
        )
        self.add_button = W.Button(
            description="add request", icon="plus", button_style="success", layout=W.Layout(width="auto")
        )
        self.num_append = W.IntSlider(1, min=1, max=2 * block_size, description="tokens", style=style, layout=slider)
        self.append_button = W.Button(description="append tokens", icon="forward")
        self.free_button = W.Button(description="free", icon="trash", button_style="danger")
        self.position = W.IntSlider(0, min=0, max=0, description="token t", style=style, layout=slider)
        self.address = W.HTML()
        self.add_button.on_click(lambda _: self._guard(self.add_request))
        self.append_button.on_click(lambda _: self._guard(self.append_tokens))
        self.free_button.on_click(lambda _: self._guard(self.free))
        self.seq.observe(lambda ch: self._sync_position(), "value")
        self.position.observe(lambda ch: self._show_pick(), "value")
        controls = W.VBox(
            [
                W.HBox([self.prompt_len, self.add_button]),
                W.HBox([self.seq, self.free_button]),
                W.HBox([self.num_append, self.append_button]),
                self.status,
                self.position,
                self.address,
            ]
        )
        # Side by side, so the buttons and the pool and tables they change fit a laptop's screen together.
        left = W.VBox([controls, self.log], layout=W.Layout(width="400px", min_width="400px"))
        self.ui = W.HBox([left, W.VBox([self.grid, self.table])])
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
            slots += self.allocator.append_slots(seq_id)
            self._computed(seq_id, next(self._next_token))
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
        lines = [
            f"t = {p['t']}: i = t // B = {p['t']} // {B} = {p['i']}, j = t mod B = {p['j']}",
            f"B(i) = {p['block']}, slot = B(i)*B + j = {p['slot']}",
        ]
        if "address_formula" in p:
            lines.append(
                f"BasePtr_K + B(i)*S_block + j*S_token (+ h*S_head, h = 0) = {p['base']:#x} + {p['block']}*{p['s_block']} + "
                f"{p['j']}*{p['s_token']} = {p['address_formula']:#x}"
            )
            lines.append(
                f"tensor k_cache[{p['block']}, {p['j']}, 0].data_ptr() = {p['address_tensor']:#x} "
                + ("(match)" if p["address_match"] else "(MISMATCH)")
                + f"; stored K equals the token's K: {p['value_match']}"
            )
            seed = p["seed_lands"]
            lines.append(
                f"the seed's formula as written (+ j*d_head, in elements): offset {seed['byte_offset']} B -> "
                f"token {seed['token']}, head {seed['head']}, dim {seed['dim']}: "
                + ("the right K" if seed["k_matches"] else "NOT this token's K")
            )
        self.address.value = (
            "<div style='font-family:monospace;font-size:12px'>" + "<br>".join(html.escape(x) for x in lines) + "</div>"
        )

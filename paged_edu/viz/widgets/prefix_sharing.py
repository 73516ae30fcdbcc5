"""Lesson 3's widget: chat requests share a system prompt; fork; copy-on-write on the tensors; eviction."""

from __future__ import annotations

import itertools

import ipywidgets as W

from paged_edu.core.allocator import BlockAllocator
from paged_edu.labs.kv_view import KVView
from paged_edu.viz.widgets.base import _AllocatorView

__all__ = ["PrefixSharingWidget"]


class PrefixSharingWidget(_AllocatorView):
    """Chat requests that share a system prompt; fork for parallel sampling; append -> copy-on-write.

    ``system_prompt`` token ids are common to every chat request; ``dynamic`` puts a changing
    "timestamp" token at the start of the prompt (the seed's zero-hit-rate fault), at the end (the
    fix) or nowhere. Every copy-on-write is applied to the KV tensors and checked: the copy equals
    its source when made, and the source is untouched after the writer appends (``cow_checks``).
    """

    def __init__(
        self,
        num_blocks: int = 24,
        block_size: int = 4,
        system_len: int = 10,
        *,
        device="cpu",
        dtype=None,
        kv: KVView | bool = True,
        seed: int = 0,
        cols: int = 8,
    ) -> None:
        super().__init__(
            BlockAllocator(num_blocks, block_size, enable_prefix_caching=True),
            kv,
            device=device,
            dtype=dtype,
            seed=seed,
            cols=cols,
        )
        self.system_prompt = list(range(1, system_len + 1))
        self.dynamic_mode = "none"
        self._next_id = itertools.count()
        self._next_token = itertools.count(5000)
        self._clock = itertools.count(90000)  # "timestamps"
        self.cow_checks: list[dict] = []
        style = {"description_width": "90px"}
        self.user_len = W.IntSlider(3, min=1, max=3 * block_size, description="user tokens", style=style)
        self.dynamic = W.ToggleButtons(
            options=[("no timestamp", "none"), ("timestamp first", "start"), ("timestamp last", "end")],
            value="none",
            description="system prompt",
            style={"description_width": "90px", "button_width": "120px"},
        )
        self.chat_button = W.Button(
            description="new chat request", icon="comment", button_style="success", layout=W.Layout(width="auto")
        )
        self.fork_button = W.Button(description="fork", icon="code-fork")
        self.append_button = W.Button(description="append token", icon="forward")
        self.free_button = W.Button(description="free", icon="trash", button_style="danger")
        self.metrics = W.HTML()
        self.chat_button.on_click(lambda _: self._guard(self.add_chat))
        self.fork_button.on_click(lambda _: self._guard(self.fork))
        self.append_button.on_click(lambda _: self._guard(self.append_token))
        self.free_button.on_click(lambda _: self._guard(self.free))
        self.dynamic.observe(lambda ch: self.set_dynamic(ch["new"]), "value")
        controls = W.VBox(
            [
                self.dynamic,
                W.HBox([self.user_len, self.chat_button]),
                W.HBox([self.seq, self.fork_button, self.append_button, self.free_button]),
                self.status,
                self.metrics,
            ]
        )
        # The block tables and the log beside the pool, so the buttons and what they change fit a laptop's screen.
        self.ui = W.VBox([controls, W.HBox([self.grid, W.VBox([self.table, self.log], layout=W.Layout(flex="1"))])])
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
        if self.kv is not None:
            self.kv.fork(parent, child)
        self.say(f"{child} forked from {parent}: shares all {len(self.allocator.block_table(child))} blocks")
        self._after_change(select=child)
        return child

    def append_token(self, seq_id=None) -> int:
        """Append one token; a shared, partly filled last block is copied first (and checked)."""
        seq_id = self._selected(seq_id)
        [slot] = self.allocator.append_slots(seq_id)
        copies = self.allocator.take_copies()
        message = f"{seq_id}: appended at slot {slot}"
        if self.kv is not None:
            for src, dst in copies:
                self.cow_checks.append(self.kv.copy_block(src, dst))
        self._computed(seq_id, next(self._next_token))
        if self.kv is not None:
            for check in self.cow_checks[-len(copies) :] if copies else []:
                check["source_untouched"] = self.kv.block_unchanged(check)
        if copies:
            message += "; copy-on-write " + ", ".join(f"{s} -> {d}" for s, d in copies)
            if self.kv is not None:
                c = self.cow_checks[-1]
                message += (
                    f" (copy equals source: {c['copy_equal']}, source untouched after the write: "
                    f"{c['source_untouched']})"
                )
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
            f"{a.num_free_blocks - a.num_evictable_blocks} free</div>"
        )

"""The prefix cache's contents, rebuilt from its events: what a view of the cache draws.

An allocator tells its cache subscribers (:meth:`~paged_edu.core.allocator.BlockAllocator.subscribe_cache`,
vLLM's KV cache events) three things: ``store`` (blocks entered the cache: vLLM's ``BlockStored``),
``evict`` (one block left it: ``BlockRemoved``) and ``clear`` (``reset_prefix_cache`` emptied it:
``AllBlocksCleared``). A router outside the engine -- vLLM's KV-aware routing, SGLang's cache-aware
load balancer -- knows a replica's cache only through these events. :class:`CacheContents` is such an
outside observer: it keeps every event and replays them, so its state after ``k`` events is the
cache's contents at that moment, for the hash chain and the radix tree alike.

Invariant (checked by the tests against the allocator itself): after every operation,
``set(contents.cached) == {b for b in range(num_blocks) if allocator.index.is_cached(b)}``.
"""

from __future__ import annotations

import random
from collections.abc import Hashable

from paged_edu.core.allocator import BlockAllocator, BlockEvent, OutOfBlocksError

__all__ = ["CacheContents", "chat_turns", "serve_turns"]


class CacheContents:
    """The cached blocks of ``allocator`` as its cache events tell them: ``block id -> the sequence
    that stored it``. Subscribe while the cache is empty (a new allocator, or after
    ``reset_prefix_cache()``), else the blocks cached before are unknown to it."""

    def __init__(self, allocator: BlockAllocator) -> None:
        if allocator.num_cached_blocks:
            raise ValueError(
                f"the allocator already caches {allocator.num_cached_blocks} blocks the events will never "
                "name: subscribe to an empty cache (a new allocator, or after reset_prefix_cache())"
            )
        self.num_blocks = allocator.num_blocks
        self.events: list[BlockEvent] = []
        self.cached: dict[int, Hashable] = {}  # block id -> the sequence whose store cached it
        self.unsubscribe = allocator.subscribe_cache(self.apply)

    def apply(self, event: BlockEvent) -> None:
        """Replay one event (the allocator calls this); an event that contradicts the ones before raises."""
        _replay(self.cached, event)
        self.events.append(event)

    def at(self, k: int) -> dict[int, Hashable]:
        """The cached blocks after the first ``k`` events (``0 .. len(events)``)."""
        if not 0 <= k <= len(self.events):
            raise ValueError(f"k must be in [0, {len(self.events)}] (events so far), got {k}")
        cached: dict[int, Hashable] = {}
        for event in self.events[:k]:
            _replay(cached, event)
        return cached

    def sizes(self) -> list[int]:
        """How many blocks were cached after each of the events (``0`` before the first)."""
        cached: dict[int, Hashable] = {}
        out = [0]
        for event in self.events:
            _replay(cached, event)
            out.append(len(cached))
        return out


def _replay(cached: dict[int, Hashable], event: BlockEvent) -> None:
    if event.kind == "store":
        again = [b for b in event.block_ids if b in cached]
        if again:
            raise ValueError(f"store of blocks {again} that are cached already")
        cached.update(dict.fromkeys(event.block_ids, event.seq_id))
    elif event.kind == "evict":
        for b in event.block_ids:
            if cached.pop(b, None) is None:
                raise ValueError(f"evict of block {b}, which was never stored")
    elif event.kind == "clear":
        cached.clear()
    else:
        raise ValueError(f"not a cache event: {event.kind!r} (store, evict and clear are)")


# -- a small workload to watch: conversations that share a system prompt ---------------------------


def chat_turns(
    num_chats: int = 4, num_turns: int = 3, system_len: int = 8, turn_len: int = 5, seed: int = 0
) -> list[tuple[tuple[int, int], list[int]]]:
    """``((chat, turn), prompt)`` in arrival order, round-robin over the chats: every prompt starts
    with one system prompt, and turn ``t`` of a chat repeats the chat's earlier turns before its own."""
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(system_len)]
    history = {c: list(system) for c in range(num_chats)}
    turns = []
    for t in range(num_turns):
        for c in range(num_chats):
            history[c] += [rng.randrange(1000) for _ in range(turn_len)]
            turns.append(((c, t), list(history[c])))
    return turns


def serve_turns(allocator: BlockAllocator, turns, max_live: int = 3, on_admit=None) -> int:
    """Admit each prompt (its full blocks enter the cache) with at most ``max_live`` held at once,
    the oldest freed first; a prompt the pool cannot take waits until one is freed. Frees all at the
    end. ``on_admit(seq_id)`` is called after each admission. Returns how many admissions had to wait."""
    live: list[Hashable] = []
    waited = 0
    for seq_id, prompt in turns:
        while True:
            try:
                allocator.allocate(seq_id, prompt)
                allocator.mark_computed(seq_id, len(prompt), prompt)  # its K/V is written: publish it
                break
            except OutOfBlocksError:
                if not live:
                    raise
                waited += 1
                allocator.free(live.pop(0))
        live.append(seq_id)
        if len(live) > max_live:
            allocator.free(live.pop(0))
        if on_admit is not None:
            on_admit(seq_id)
    for seq_id in live:
        allocator.free(seq_id)
    return waited

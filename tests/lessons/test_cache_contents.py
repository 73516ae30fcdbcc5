"""Lesson 8's cache view: the prefix cache's contents rebuilt from its store / evict / clear events.
That they equal the cache's own (``allocator.index.is_cached``) after every operation, for the hash
chain and the radix tree, is tested with the events themselves in test_cache_salt.py; here: what the
model refuses, and that the view draws exactly the cached blocks at every admission."""

from __future__ import annotations

import pytest

from paged_edu.core.allocator import BlockAllocator, BlockEvent
from paged_edu.core.radix_cache import RadixAllocator
from paged_edu.labs.cache_contents import CacheContents, chat_turns, serve_turns

B = 4
ALLOCATORS = {
    "hash-computed": lambda n: BlockAllocator(n, B, cache_when_computed=True),
    "hash-full": lambda n: BlockAllocator(n, B),
    "radix-computed": lambda n: RadixAllocator(n, B, cache_when_computed=True),
    "radix-full": lambda n: RadixAllocator(n, B),
}


def cached_blocks(a) -> set[int]:
    return {b for b in range(a.num_blocks) if a.index.is_cached(b)}


def test_the_contents_refuse_what_they_cannot_know_and_events_that_contradict():
    a = BlockAllocator(8, B)
    a.allocate("s", list(range(2 * B)))
    with pytest.raises(ValueError, match="already caches"):
        CacheContents(a)
    contents = CacheContents(BlockAllocator(8, B))
    contents.apply(BlockEvent("store", "s", [1, 2], 2 * B))
    with pytest.raises(ValueError, match="cached already"):
        contents.apply(BlockEvent("store", "t", [2], B))
    with pytest.raises(ValueError, match="never stored"):
        contents.apply(BlockEvent("evict", None, [5]))
    with pytest.raises(ValueError, match="not a cache event"):
        contents.apply(BlockEvent("free", "s", [1]))
    assert contents.cached == {1: "s", 2: "s"} and len(contents.events) == 1
    with pytest.raises(ValueError, match="k must be"):
        contents.at(2)


def test_the_view_draws_each_cache_at_every_admission():
    pytest.importorskip("ipywidgets")
    from paged_edu.viz.cache_contents import CacheContentsView

    view = CacheContentsView()
    evicted = {name: sum(e.kind == "evict" for e in c.events) for name, c in view.contents.items()}
    assert all(evicted.values()), evicted  # the default pool is tight enough to evict
    for k in range(len(view.turns) + 1):
        view.slider.value = k  # as a learner drags it
        for i, (name, make) in enumerate([("hash", ALLOCATORS["hash-full"]), ("radix", ALLOCATORS["radix-full"])]):
            oracle = make(view.num_blocks)
            serve_turns(oracle, view.turns[:k], max_live=2)  # freeing changes no cached block
            z = [code for row in view.fig.data[i].z for code in row][: view.num_blocks]
            drawn = {b for b, code in enumerate(z) if code != 0}
            assert drawn == cached_blocks(oracle), (name, k)
        assert f"after {k} of {len(view.turns)} prompts" in view.status.value
    with pytest.raises(ValueError, match="admissions"):
        view.show(len(view.turns) + 1)


def test_chat_turns_repeat_each_chats_history():
    turns = chat_turns(num_chats=2, num_turns=3, system_len=4, turn_len=2, seed=1)
    assert [seq_id for seq_id, _ in turns] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    by = dict(turns)
    assert by[(0, 0)][:4] == by[(1, 0)][:4] and by[(0, 2)][: len(by[(0, 1)])] == by[(0, 1)]
    assert len(by[(1, 2)]) == 4 + 3 * 2

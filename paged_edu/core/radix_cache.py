"""A radix-tree prefix cache over the block pool (SGLang's RadixAttention).

:class:`RadixAllocator` is the :class:`~paged_edu.core.allocator.BlockAllocator` -- the same block
tables, pool, fork, free, copy-on-write, statistics and block events -- with a different prefix
index: :class:`RadixIndex`, a :class:`~paged_edu.core.radix_tree.RadixTree` instead of a table of
chained block hashes (:mod:`~paged_edu.core.prefix_index` names the interface both implement):

* **lookup** walks the tree for the longest cached prefix of the prompt (whole blocks, never the
  prompt's last token); **lock** splits the last edge where the match ended and locks the path
  (``lock_ref``), so the hit cannot be evicted while the sequence lives;
* **publish** inserts the sequence's computed full blocks into the tree (SGLang's
  ``cache_unfinished_req`` after a chunk, ``cache_finished_req`` at the end): from then on later
  prompts hit them. Where the tree already holds the same tokens in another block (the prefix was
  computed twice), the sequence takes the tree's copy and releases its own -- only once its K/V is
  written (``mark_computed``), never at an append. A finished or preempted sequence's blocks stay
  in the tree, unlocked, until the pool needs them;
* **evict** frees the least recently used unlocked leaves, each from its tail.

``ref_count(b)`` counts the block tables holding ``b``; a block the tree holds and no table does is
free (evictable), as a cached block with ref count 0 is in the hash cache. Source read:
sgl-project/sglang, ``python/sglang/srt/mem_cache/radix_cache.py``. Plain Python, no torch.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from paged_edu.core.allocator import BlockAllocator, pool_size
from paged_edu.core.block_hash import ROOT_HASH
from paged_edu.core.prefix_index import PrefixMatch
from paged_edu.core.radix_tree import RadixNode, RadixTree

__all__ = ["RadixAllocator", "RadixIndex"]


@dataclass(slots=True)
class _RadixKey:
    """A sequence's place in the tree: the deepest node it locks, the blocks on the path to it, and
    its salt's root (which namespace of the tree its prefixes go to)."""

    node: RadixNode | None  # None: it locks nothing
    depth: int = 0
    root: bytes = ROOT_HASH


class RadixIndex:
    """The prefix-index interface (:mod:`~paged_edu.core.prefix_index`) over a radix tree."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.tree = RadixTree(block_size)
        self.in_tree = [False] * num_blocks
        self.num_cached_blocks = 0

    @property
    def num_evictable(self) -> int:
        return self.tree.num_evictable

    def is_cached(self, block_id: int) -> bool:
        return self.in_tree[block_id]

    def hash_of(self, block_id: int) -> None:
        return None  # the tree names a block by its path, not by a hash

    def lookup(self, packed: array, max_blocks: int, root: bytes = ROOT_HASH) -> PrefixMatch:
        below = self.tree.namespace(root)
        path = self.tree.match(packed, max_blocks, below) if below is not None else []
        hits = [b for node, m in path for b in node.blocks[:m]]
        relocked = sum(m for node, m in path if node.lock_ref == 0)  # evictable now, locked by the hit
        return PrefixMatch(hits, relocked, (path, root))

    def lock(self, match: PrefixMatch) -> _RadixKey:
        path, root = match.note
        if not path:
            return _RadixKey(None, 0, root)
        node = self.tree.settle(path)
        self.tree.lock(node)
        self.tree.touch(node)
        return _RadixKey(node, len(match.block_ids), root)

    def extend(self, key: _RadixKey, block_tokens: array) -> None:
        pass  # the tree is keyed by tokens: nothing to compute per block

    def publish(self, key, table, start, end, block_tokens, ref_count, dedupe):
        """Insert ``table``'s blocks up to ``end`` below the sequence's node and lock the new path.
        A block a fork shares that is not in the tree cannot join it (the other holder would hold
        it unlocked): publishing stops before it."""
        first = key.depth
        for i in range(first, end):
            block_id = table[i]
            if not self.in_tree[block_id] and ref_count[block_id] > 1:
                end = i
                break
        tokens = block_tokens[: (end - first) * self.block_size]  # the tree keeps them as its keys
        below = key.node
        if below is None:
            below = self.tree.namespace(key.root, create=end > first)
        if (
            not dedupe and below is not None
        ):  # a block the tree holds in another block stays out, and so does what follows it
            end = first + self._num_own_blocks(below, tokens, table[first:end])
        if end <= first:
            return end, (), ()
        tokens = tokens[: (end - first) * self.block_size]
        node, adopted, replaced = self.tree.insert(tokens, table[first:end], below)
        for block_id in adopted:
            self.in_tree[block_id] = True
        self.num_cached_blocks += len(adopted)
        self.tree.lock(node)
        if key.node is not None:
            self.tree.unlock(key.node)
        key.node, key.depth = node, end
        return end, ([(first + i, b) for i, b in replaced] if dedupe else ()), adopted

    def _num_own_blocks(self, node: RadixNode | None, tokens: array, blocks: list[int]) -> int:
        """Leading ``blocks`` the tree does not hold in another block (below ``node``)."""
        pos = 0
        for child, m in self.tree.match(tokens, len(blocks), node):
            for j in range(m):
                if child.blocks[j] != blocks[pos + j]:
                    return pos + j
            pos += m
        return len(blocks)

    def fork(self, key: _RadixKey) -> _RadixKey:
        if key.node is not None:
            self.tree.lock(key.node)
        return _RadixKey(key.node, key.depth, key.root)

    def unlock(self, key: _RadixKey) -> None:
        if key.node is not None:
            self.tree.unlock(key.node)

    def on_share(self, block_id: int) -> None:
        pass  # a tree block's evictability follows the locks, not the ref counts

    def on_free(self, block_id: int) -> None:
        pass

    def evict(self, n: int) -> list[int]:
        evicted = self.tree.evict(n)
        for block_id in evicted:
            self.in_tree[block_id] = False
        self.num_cached_blocks -= len(evicted)
        return evicted


class RadixAllocator(BlockAllocator):
    """A pool of ``num_blocks`` KV blocks of ``block_size`` slots with a radix-tree prefix cache."""

    def __init__(self, num_blocks: int, block_size: int = 16, cache_when_computed: bool = False) -> None:
        self.num_blocks, self.block_size = pool_size(num_blocks, block_size)
        self._init_blocks(RadixIndex(self.num_blocks, self.block_size), True, cache_when_computed)

    @property
    def tree(self) -> RadixTree:
        return self.index.tree

    def __repr__(self) -> str:
        return (
            f"RadixAllocator(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"free={self.num_free_blocks}, cached={self.num_cached_blocks}, seqs={len(self._seqs)})"
        )

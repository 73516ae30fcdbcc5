"""A radix-tree prefix cache behind the scheduler's memory-manager interface (SGLang's RadixAttention).

:class:`RadixAllocator` gives sequences block tables over a pool of ``num_blocks`` blocks of ``B``
slots, as :class:`~paged_edu.core.allocator.BlockAllocator` does, but finds cached prefixes in a
:class:`~paged_edu.core.radix_tree.RadixTree` instead of a table of chained block hashes:

* **allocate** walks the tree for the longest cached prefix of the prompt (whole blocks, never the
  prompt's last token), locks the path (``lock_ref``) and takes fresh blocks for the rest -- from
  the free list first, then by evicting the least recently used unlocked leaves;
* **mark_computed** inserts the sequence's computed full blocks into the tree (SGLang's
  ``cache_unfinished_req`` after a chunk, ``cache_finished_req`` at the end): from then on later
  prompts hit them. A finished or preempted sequence's blocks stay in the tree, unlocked, until
  the pool needs them. ``cache_when_computed=False`` inserts a block as soon as it is full;
* **fork** and **copy-on-write** as in the block allocator: children share every block; a shared,
  partly filled last block is copied before a write (``take_copies``).

``ref_count(b)`` counts the block tables holding ``b``; a block the tree holds and no table does is
free (evictable), as a cached block with ref count 0 is in the block allocator. Every operation
completes or raises leaving the allocator as it was. Source read: sgl-project/sglang,
``python/sglang/srt/mem_cache/radix_cache.py``. Plain Python, no torch.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from paged_edu.core.block_pool import OutOfBlocksError, PrefixCacheStats
from paged_edu.core.radix_tree import RadixNode, RadixTree
from paged_edu.core.seq_lookup import SequenceLookup
from paged_edu.core.validation import integer, new_id, token_array, token_id as check_token_id

__all__ = ["RadixAllocator"]

SeqId = Hashable


@dataclass(slots=True)
class _RadixSeq:
    block_table: list[int]
    tail: array  # tokens of the partly filled last block
    num_full: int  # full blocks (their tokens are in the pool)
    node: RadixNode | None  # the deepest tree node this sequence locks (None: none)
    num_cached_tokens: int = 0
    num_published: int = 0  # leading full blocks already offered to the tree
    node_depth: int = 0  # blocks on the tree path down to ``node``: the leading blocks it holds from the tree


class RadixAllocator(SequenceLookup):
    """A pool of ``num_blocks`` KV blocks of ``block_size`` slots with a radix-tree prefix cache."""

    enable_prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int = 16, cache_when_computed: bool = False) -> None:
        self.num_blocks = integer("num_blocks", num_blocks, low=1)
        self.block_size = integer("block_size", block_size, low=1)
        self.cache_when_computed = bool(cache_when_computed)
        self.tree = RadixTree(self.block_size)
        self._ref_count = [0] * self.num_blocks  # block tables holding each block
        self._in_tree = [False] * self.num_blocks
        self._block_tokens: list[array | None] = [None] * self.num_blocks  # a full block's tokens
        self._free: deque[int] = deque(range(self.num_blocks))  # held by nobody, not in the tree
        self._seqs: dict[SeqId, _RadixSeq] = {}
        self._copies: list[tuple[int, int]] = []
        self.stats = PrefixCacheStats()

    # -- queries -------------------------------------------------------------------------------
    def _length(self, seq: _RadixSeq) -> int:
        return seq.num_full * self.block_size + len(seq.tail)

    def num_tokens(self, seq_id: SeqId) -> int:
        return self._length(self._seq(seq_id))

    def token_ids(self, seq_id: SeqId) -> list[int]:
        """The sequence's tokens, read from its blocks."""
        seq = self._seq(seq_id)
        tokens = self._prefix_tokens(seq, seq.num_full)
        tokens += seq.tail
        return tokens.tolist()

    def _prefix_tokens(self, seq: _RadixSeq, num_blocks: int) -> array:
        tokens = array("q")
        for block_id in seq.block_table[:num_blocks]:
            tokens += self._block_tokens[block_id]
        return tokens

    def num_cached_tokens(self, seq_id: SeqId) -> int:
        return self._seq(seq_id).num_cached_tokens

    def num_cached_tokens_for(self, token_ids: Sequence[int]) -> int:
        """Leading tokens of ``token_ids`` an :meth:`allocate` now would hit (changes nothing)."""
        packed = token_array("token_ids", token_ids)
        return sum(m for _, m in self.tree.match(packed, self._max_hit_blocks(len(packed)))) * self.block_size

    def _max_hit_blocks(self, n: int) -> int:
        return max(n - 1, 0) // self.block_size  # the prompt's last token is always computed

    def ref_count(self, block_id: int) -> int:
        return self._ref_count[integer("block id", block_id, low=0, high=self.num_blocks - 1)]

    @property
    def num_free_blocks(self) -> int:
        """Blocks no block table holds: never-cached free ones plus the tree's unlocked ones."""
        return len(self._free) + self.tree.num_evictable

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return sum(self._in_tree)

    @property
    def usage(self) -> float:
        return 1 - self.num_free_blocks / self.num_blocks

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self._copies = self._copies, []
        return copies

    # -- blocks --------------------------------------------------------------------------------
    def _take(self, n: int) -> list[int]:
        """``n`` blocks with ref count 1 (checked by the caller): free ones first, then evicted."""
        taken = [self._free.popleft() for _ in range(min(n, len(self._free)))]
        if len(taken) < n:
            for block_id in self.tree.evict(n - len(taken)):
                self._in_tree[block_id] = False
                self._block_tokens[block_id] = None
                taken.append(block_id)
        for block_id in taken:
            self._ref_count[block_id] = 1
        return taken

    def _release(self, block_ids) -> None:
        for block_id in block_ids:
            self._ref_count[block_id] -= 1
            if self._ref_count[block_id] == 0 and not self._in_tree[block_id]:
                self._block_tokens[block_id] = None
                self._free.append(block_id)

    def _publish(self, seq: _RadixSeq, num_blocks: int) -> None:
        """Insert the sequence's first ``num_blocks`` full blocks into the tree and lock them; a
        block the tree already holds in another block is swapped for the tree's (same K/V)."""
        if num_blocks <= seq.num_published:
            return
        start = seq.node_depth if seq.node is not None else 0  # blocks before it are on the tree path
        for i in range(start, num_blocks):  # a block a fork shares cannot join the tree:
            block_id = seq.block_table[i]  # the other holder would hold it unlocked
            if not self._in_tree[block_id] and self._ref_count[block_id] > 1:
                num_blocks = i
                break
        seq.num_published = max(seq.num_published, num_blocks)
        if num_blocks <= start:
            return
        tokens = array("q")
        for block_id in seq.block_table[start:num_blocks]:
            tokens += self._block_tokens[block_id]
        node, adopted, replaced = self.tree.insert(tokens, seq.block_table[start:num_blocks], seq.node)
        for block_id in adopted:
            self._in_tree[block_id] = True
        for i, tree_block in replaced:  # computed twice: hold the tree's copy, drop our own
            self._ref_count[tree_block] += 1
            self._release([seq.block_table[start + i]])
            seq.block_table[start + i] = tree_block
        self.tree.lock(node)
        if seq.node is not None:
            self.tree.unlock(seq.node)
        seq.node, seq.node_depth = node, num_blocks

    # -- operations ----------------------------------------------------------------------------
    def allocate(self, seq_id: SeqId, token_ids: Sequence[int], *, record_stats: bool = True) -> list[int]:
        """Admit a prompt: lock its longest cached prefix, take fresh blocks for the rest.

        Raises :class:`OutOfBlocksError` (nothing changed) when the pool cannot supply them.
        """
        new_id("sequence id", seq_id, self._seqs)
        packed = token_array("token_ids", token_ids)
        n, B = len(packed), self.block_size
        if n == 0:
            raise ValueError("cannot allocate an empty prompt: it needs at least one token")
        path = self.tree.match(packed, self._max_hit_blocks(n))
        hits = [b for node, m in path for b in node.blocks[:m]]
        num_fresh = -(-n // B) - len(hits)
        relocked = sum(m for node, m in path if node.lock_ref == 0)  # evictable now, locked by this hit
        available = len(self._free) + self.tree.num_evictable - relocked
        if num_fresh > available:
            raise OutOfBlocksError(
                f"sequence {seq_id!r} needs {num_fresh} free blocks for {n} tokens "
                f"({len(hits)} cached), only {available} available"
            )
        # Commit: nothing below can fail.
        node = self.tree.settle(path) if path else None
        if node is not None:
            self.tree.lock(node)  # before evicting, so the hit cannot be evicted
            self.tree.touch(path)
        for block_id in hits:
            self._ref_count[block_id] += 1
        table = hits + self._take(num_fresh)
        num_full = n // B
        for i in range(len(hits), num_full):
            self._block_tokens[table[i]] = packed[i * B:(i + 1) * B]
        seq = _RadixSeq(table, packed[num_full * B:], num_full, node, len(hits) * B, len(hits), len(hits))
        self._seqs[seq_id] = seq
        if not self.cache_when_computed:
            self._publish(seq, num_full)
        if record_stats:
            self.stats.queried_tokens += n
            self.stats.hit_tokens += seq.num_cached_tokens
        return list(table)

    def append(self, seq_id: SeqId, token_id: int) -> int:
        """Append one token; return its slot. A full last block gets a new one after it; a shared,
        partly filled one is copied first (copy-on-write)."""
        seq = self._seq(seq_id)
        token_id = check_token_id("token id", token_id)
        B = self.block_size
        offset = len(seq.tail)
        last = seq.block_table[-1]
        if offset == 0 or self._ref_count[last] > 1:
            if self.num_free_blocks < 1:
                purpose = "a new block" if offset == 0 else "copy-on-write"
                raise OutOfBlocksError(f"no free block for {purpose} in sequence {seq_id!r}")
            [block_id] = self._take(1)
            if offset == 0:
                seq.block_table.append(block_id)
            else:
                self._release([last])
                seq.block_table[-1] = block_id
                self._copies.append((last, block_id))
        seq.tail.append(token_id)
        if offset == B - 1:  # the last block is full: its tokens move to the pool
            self._block_tokens[seq.block_table[-1]], seq.tail = seq.tail, array("q")
            seq.num_full += 1
            if not self.cache_when_computed:
                self._publish(seq, seq.num_full)
        return seq.block_table[-1] * B + offset

    def mark_computed(self, seq_id: SeqId, num_computed_tokens: int) -> None:
        """The first ``num_computed_tokens`` tokens' K/V is written: insert their full blocks."""
        seq = self._seq(seq_id)
        num_computed_tokens = integer(f"num_computed_tokens for sequence {seq_id!r}", num_computed_tokens,
                                      low=0, high=self._length(seq))
        self._publish(seq, min(num_computed_tokens // self.block_size, seq.num_full))

    def fork(self, parent_id: SeqId, child_id: SeqId) -> list[int]:
        """A child that shares every block of its parent (and locks the same tree path)."""
        parent = self._seq(parent_id)
        new_id("sequence id", child_id, self._seqs)
        for block_id in parent.block_table:
            self._ref_count[block_id] += 1
        if parent.node is not None:
            self.tree.lock(parent.node)
        self._seqs[child_id] = _RadixSeq(list(parent.block_table), array("q", parent.tail), parent.num_full,
                                         parent.node, parent.num_cached_tokens, parent.num_published,
                                         parent.node_depth)
        return list(parent.block_table)

    def free(self, seq_id: SeqId) -> None:
        """Release a sequence; its blocks in the tree stay there, unlocked, for later hits."""
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        if seq.node is not None:
            self.tree.unlock(seq.node)
        self._release(reversed(seq.block_table))

    def __repr__(self) -> str:
        return (f"RadixAllocator(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"free={self.num_free_blocks}, cached={self.num_cached_blocks}, seqs={len(self._seqs)})")

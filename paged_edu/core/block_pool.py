"""The physical blocks: reference counts, what each block holds, the free list and the prefix cache.

A :class:`BlockPool` knows nothing of sequences; :class:`~paged_edu.core.allocator.BlockAllocator`
keeps the block tables and calls it. Each of the ``num_blocks`` blocks has

* ``ref_count[b]`` -- how many block tables hold it (0: free);
* ``token_ids[b]`` -- once the block is full, the ``block_size`` token ids whose K/V it holds
  (``array('q')``), the content the paged KV cache holds as tensors: a shared block holds its tokens
  once. ``None`` while it is not full (the sequence writing it keeps those tokens);
* ``block_hash[b]`` -- the chained hash it is cached under (:mod:`~paged_edu.core.block_hash`), or
  ``None``; ``hash_to_block`` is the reverse map, the prefix cache itself.

A free block (ref count 0) is in exactly one of two places: ``free_block_ids`` if it holds nothing
reusable, or ``evictable`` if it is still cached -- its K/V can be hit again until the pool needs
the block. :meth:`take` hands out never-cached blocks first, then evicts the least recently freed.
Invariant: ``len(free_block_ids) + len(evictable) + (blocks with ref_count > 0) == num_blocks``.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["BlockPool", "OutOfBlocksError", "PrefixCacheStats"]


class OutOfBlocksError(MemoryError):
    """Raised when the pool has too few free blocks; nothing was changed."""


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache statistics in tokens: how many prompt tokens were looked up, how many hit."""

    queried_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` slots: ref counts, contents, free list, prefix cache."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_count: list[int] = [0] * num_blocks
        self.token_ids: list[array | None] = [None] * num_blocks  # None: not full
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))  # hold nothing reusable
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, least recently freed first

    @property
    def num_free(self) -> int:
        """Blocks with ref count 0, evictable cached ones included."""
        return len(self.free_block_ids) + len(self.evictable)

    def take(self, n: int) -> tuple[list[int], list[int]]:
        """Hand out ``n`` empty blocks with ref count 1: ``(block ids, those evicted from the cache)``.

        Never-cached blocks go first; then the least recently freed cached block is evicted (its hash
        leaves the cache). Raises :class:`OutOfBlocksError`, changing nothing, if fewer are free.
        """
        if n > self.num_free:
            raise OutOfBlocksError(f"need {n} free blocks, only {self.num_free} available")
        taken, evicted = [], []
        for _ in range(n):
            if self.free_block_ids:
                block_id = self.free_block_ids.popleft()
            else:
                block_id, _ = self.evictable.popitem(last=False)
                del self.hash_to_block[self.block_hash[block_id]]
                self.block_hash[block_id] = None
                evicted.append(block_id)
            self.ref_count[block_id] = 1
            self.token_ids[block_id] = None
            taken.append(block_id)
        return taken, evicted

    def share(self, block_ids: Iterable[int]) -> None:
        """One more block table holds each of ``block_ids``; a cached free one leaves ``evictable``."""
        for block_id in block_ids:
            if self.ref_count[block_id] == 0:
                del self.evictable[block_id]
            self.ref_count[block_id] += 1

    def release(self, block_ids: Iterable[int]) -> None:
        """One block table fewer holds each of ``block_ids``, in order; at 0 a block is free
        (evictable if it is cached, the most recently freed being evicted last)."""
        for block_id in block_ids:
            self.ref_count[block_id] -= 1
            if self.ref_count[block_id] == 0:
                if self.block_hash[block_id] is not None:
                    self.evictable[block_id] = None
                else:
                    self.free_block_ids.append(block_id)

    def cache(self, block_id: int, block_hash: bytes) -> None:
        """Publish a full block under its chained hash. The first writer wins: a block whose hash is
        already cached (the same prefix computed twice) stays uncached."""
        if block_hash not in self.hash_to_block:
            self.hash_to_block[block_hash] = block_id
            self.block_hash[block_id] = block_hash

"""The physical blocks: reference counts and the free list.

A :class:`BlockPool` knows nothing of sequences; :class:`~paged_edu.core.allocator.BlockAllocator`
keeps the block tables and calls it. Which blocks are *cached* (may be hit by a later prompt) is
the business of a prefix index (:mod:`~paged_edu.core.prefix_index`: a hash chain or a radix
tree) that the pool is given. Each of the ``num_blocks`` blocks has

* ``ref_count[b]`` -- how many block tables hold it (0: free).

What a block holds is named by the index (a cached block's hash, or its path in the radix tree),
never stored here: the sequences hold their tokens, the allocator only counts slots.

A free block (ref count 0) is in exactly one of two places: ``free_block_ids`` if it holds nothing
reusable, or the index's evictable blocks if it is still cached -- its K/V can be hit again until
the pool needs the block. :meth:`take` hands out never-cached blocks first, then asks the index to
evict. Invariant: ``len(free_block_ids) + index.num_evictable + (blocks with ref_count > 0) ==
num_blocks``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["BlockPool", "OutOfBlocksError", "PrefixCacheStats"]


class OutOfBlocksError(MemoryError):
    """Raised when the pool has too few free blocks; nothing was changed."""


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache statistics in tokens: how many prompt tokens were looked up, how many hit.

    A preempted sequence that is recomputed looks its prompt up again and mostly hits its own
    blocks, cached before it was preempted: that is no prefix reuse, so its lookups are counted
    apart (``preempted_*``) and :attr:`hit_rate` reads only first admissions -- as vLLM v1's
    ``PrefixCacheStats.record(num_tokens, num_hits, preempted)`` does (``vllm/v1/metrics/stats.py``).
    ``per_salt`` splits first admissions by cache salt (None: unsalted): ``salt -> [queried, hit]``,
    the hits each tenant got.
    """

    queried_tokens: int = 0
    hit_tokens: int = 0
    requests: int = 0  # first admissions looked up
    preempted_requests: int = 0  # re-admissions of preempted (recomputed) sequences
    preempted_queries: int = 0  # their prompt tokens looked up
    preempted_hits: int = 0  # ... and hit
    per_salt: dict = field(default_factory=dict)  # cache salt -> [queried tokens, hit tokens]

    def record(self, num_tokens: int, num_hits: int, preempted: bool = False, cache_salt: str | None = None) -> None:
        """One admission's lookup: ``num_tokens`` looked up, ``num_hits`` found (under ``cache_salt``)."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queried_tokens += num_tokens
            self.hit_tokens += num_hits
            tenant = self.per_salt.setdefault(cache_salt, [0, 0])
            tenant[0] += num_tokens
            tenant[1] += num_hits

    def hit_rate_of(self, cache_salt: str | None) -> float:
        """Hits over lookups of first admissions under ``cache_salt`` (0.0 if it sent none)."""
        queried, hit = self.per_salt.get(cache_salt, (0, 0))
        return hit / queried if queried else 0.0

    @property
    def hit_rate(self) -> float:
        """Hits over lookups of first admissions: the prefix reuse."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def preempted_hit_rate(self) -> float:
        """Hits over lookups of preempted sequences' re-admissions."""
        return self.preempted_hits / self.preempted_queries if self.preempted_queries else 0.0

    @property
    def hit_rate_counting_readmissions(self) -> float:
        """First admissions and re-admissions pooled: what a counter reports that takes a recomputed
        sequence's re-admission for a new prompt (as paged_edu's counter once did)."""
        queried = self.queried_tokens + self.preempted_queries
        return (self.hit_tokens + self.preempted_hits) / queried if queried else 0.0


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` slots: ref counts and free list, over one prefix index."""

    def __init__(self, num_blocks: int, block_size: int, index) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.index = index  # a prefix index (:mod:`~paged_edu.core.prefix_index`)
        self.ref_count: list[int] = [0] * num_blocks
        self.free_block_ids: deque[int] = deque(range(num_blocks))  # hold nothing reusable

    @property
    def num_free(self) -> int:
        """Blocks with ref count 0, evictable cached ones included."""
        return len(self.free_block_ids) + self.index.num_evictable

    def take(self, n: int) -> tuple[list[int], list[int]]:
        """Hand out ``n`` empty blocks with ref count 1: ``(block ids, those evicted from the cache)``.

        Never-cached blocks go first; then the index evicts the cached blocks it would lose first.
        Raises :class:`OutOfBlocksError`, changing nothing, if fewer are free.
        """
        if n > self.num_free:
            raise OutOfBlocksError(f"need {n} free blocks, only {self.num_free} available")
        free = self.free_block_ids
        if n == 1 and free:  # an append's new block: the common case
            block_id = free.popleft()
            self.ref_count[block_id] = 1
            return [block_id], []
        taken = [free.popleft() for _ in range(min(n, len(free)))]
        evicted = self.index.evict(n - len(taken)) if len(taken) < n else []
        taken += evicted
        for block_id in taken:
            self.ref_count[block_id] = 1
        return taken, evicted

    def share(self, block_ids: Iterable[int]) -> None:
        """One more block table holds each of ``block_ids``; a cached free one stops being evictable."""
        for block_id in block_ids:
            if self.ref_count[block_id] == 0 and self.index.is_cached(block_id):
                self.index.on_share(block_id)
            self.ref_count[block_id] += 1

    def release(self, block_ids: Iterable[int]) -> None:
        """One block table fewer holds each of ``block_ids``, in order; at 0 a block is free
        (evictable if it is cached, the most recently freed being evicted last)."""
        for block_id in block_ids:
            self.ref_count[block_id] -= 1
            if self.ref_count[block_id] == 0:
                if self.index.is_cached(block_id):
                    self.index.on_free(block_id)
                else:
                    self.free_block_ids.append(block_id)

    def drop_cached(self) -> list[int]:
        """Evict every cached block no table holds into the free list; returns them."""
        dropped = self.index.evict(self.index.num_evictable)
        self.free_block_ids.extend(dropped)
        return dropped

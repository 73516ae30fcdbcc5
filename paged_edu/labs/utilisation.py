"""Lesson 2's measurements on a real allocator: the utilisation ``eta_paged`` of a set of requests,
and how many requests fit in a pool, paged or contiguous.

Both drive a :class:`~paged_edu.core.allocator.BlockAllocator` (distinct token ids, so nothing is
shared); the figures of :mod:`paged_edu.viz.memory_figures` draw what they return.
"""

from __future__ import annotations

from collections.abc import Sequence

from paged_edu.core.allocator import BlockAllocator

__all__ = ["admit_until_full", "measure_eta_paged"]


def measure_eta_paged(lengths: Sequence[int], block_size: int, num_blocks: int | None = None) -> float:
    """Admit one prompt of each length into a real :class:`BlockAllocator`; return the measured
    ``eta_paged = sum(s) / (blocks in use * B)`` (distinct token ids, so no prefix is shared)."""
    total_blocks = sum(-(-s // block_size) for s in lengths)
    allocator = BlockAllocator(num_blocks or max(1, total_blocks), block_size, enable_prefix_caching=False)
    next_token = 0
    for k, s in enumerate(lengths):
        allocator.allocate(k, range(next_token, next_token + s))
        next_token += s
    return sum(lengths) / (allocator.num_used_blocks * block_size)


def admit_until_full(
    lengths: Sequence[int], num_slots: int, block_size: int | None = None, max_seq_len: int | None = None
) -> int:
    """How many requests of ``lengths`` (final lengths ``s``, admitted in order) fit in ``num_slots``.

    Paged (``block_size``): each takes ``ceil(s/B)`` blocks of a real :class:`BlockAllocator`.
    Contiguous (``max_seq_len``): each reserves ``L_max`` slots, so ``num_slots // L_max`` fit.
    """
    if (block_size is None) == (max_seq_len is None):
        raise ValueError("pass exactly one of block_size (paged) or max_seq_len (contiguous)")
    if max_seq_len is not None:
        return min(len(lengths), num_slots // max_seq_len)
    allocator = BlockAllocator(num_slots // block_size, block_size, enable_prefix_caching=False)
    next_token = 0
    for k, s in enumerate(lengths):
        if allocator.num_free_blocks < -(-s // block_size):
            return k
        allocator.allocate(k, range(next_token, next_token + s))
        next_token += s
    return len(lengths)

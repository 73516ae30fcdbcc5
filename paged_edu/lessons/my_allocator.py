"""Exercise 5.3, "bring your own allocator": a block allocator for the engine, written by you.

Fill in the four methods marked ``Exercise 5.3`` -- ``allocate``, ``append_slots``, ``fork`` and
``free`` -- either here (edit this file and restart the kernel) or in a notebook cell, by
subclassing::

    from paged_edu.lessons.my_allocator import MyAllocator

    class LearnerAllocator(MyAllocator):
        def allocate(self, seq_id, token_ids, *, record_stats=True): ...

The data structures and every query are written for you. No prefix caching here (every prompt
gets fresh blocks, ``num_cached_tokens`` is 0), but fork and copy-on-write are in: parallel
samples share blocks. The rules, with ``B = block_size``:

* ``allocate``: a prompt of ``n`` tokens takes ``ceil(n / B)`` free blocks, each with ref count 1;
  if there are not enough, raise :class:`~paged_edu.core.block_pool.OutOfBlocksError` and change
  nothing. Return the block table (a new list).
* ``append_slots``: room for ``num_tokens`` more tokens (one, in a decode step), counted, not named:
  the token may still be being sampled, so its id is not given (it arrives with ``mark_computed``,
  which only a prefix cache needs). For each new position ``t = num_tokens(seq_id)``: if
  ``t % B == 0`` the last block is full: take a free block. Else, if the last block is shared (ref
  count > 1), copy-on-write: take a free block, record ``(old, new)`` in ``self.copies``, drop one
  reference to the old block, and put the new one at the end of the table. Raise
  ``OutOfBlocksError`` (changing nothing) when a block is needed and none is free. Return the new
  tokens' slots ``table[t // B] * B + t % B``.
* ``fork``: the child gets a copy of the parent's length and block table; every block's ref count
  goes up by one. Return the table.
* ``free``: drop the sequence; every block of its table loses one reference, and a block at 0
  goes back to ``free_block_ids``.

``ex.check("5.3", MyAllocator)`` runs the allocator contract
(:mod:`paged_edu.core.contract`) on it and then an engine on it, token for token
against the library's :class:`~paged_edu.core.allocator.BlockAllocator`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

from paged_edu.core.block_pool import OutOfBlocksError, PrefixCacheStats  # noqa: F401
from paged_edu.core.seq_lookup import UnknownSequenceError  # noqa: F401

__all__ = ["MyAllocator"]


class MyAllocator:
    """A pool of ``num_blocks`` blocks of ``block_size`` token slots; block tables and ref counts."""

    enable_prefix_caching = False

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_block_ids: deque[int] = deque(range(num_blocks))  # take with popleft(), return with append()
        self.ref_counts: list[int] = [0] * num_blocks
        self.block_tables: dict[Hashable, list[int]] = {}  # seq_id -> physical block of each logical block
        self.lengths: dict[Hashable, int] = {}  # seq_id -> slots it holds (its tokens, ids not needed)
        self.copies: list[tuple[int, int]] = []  # copy-on-write (src, dst) pairs not yet taken
        self.stats = PrefixCacheStats()  # no prefix cache: the hit rate stays 0

    # -- Exercise 5.3: the four operations ---------------------------------------------------------
    def allocate(self, seq_id: Hashable, token_ids: Sequence[int], *, record_stats: bool = True) -> list[int]:
        raise NotImplementedError(
            "Exercise 5.3: allocate ceil(n / B) free blocks for the prompt (or raise "
            "OutOfBlocksError, changing nothing) and return the block table"
        )

    def append_slots(self, seq_id: Hashable, num_tokens: int = 1) -> list[int]:
        raise NotImplementedError(
            "Exercise 5.3: reserve slots for num_tokens more tokens (a new block when "
            "the last is full, copy-on-write when it is shared) and return them"
        )

    def fork(self, parent_id: Hashable, child_id: Hashable) -> list[int]:
        raise NotImplementedError("Exercise 5.3: give the child the parent's length and blocks, every ref count + 1")

    def free(self, seq_id: Hashable) -> None:
        raise NotImplementedError(
            "Exercise 5.3: drop one reference to each block of the sequence; blocks at 0 go back to free_block_ids"
        )

    # -- queries (written for you) -----------------------------------------------------------------
    def _table(self, seq_id: Hashable) -> list[int]:
        try:
            return self.block_tables[seq_id]
        except (KeyError, TypeError):
            raise UnknownSequenceError(f"unknown sequence id {seq_id!r}") from None

    def block_table(self, seq_id: Hashable) -> list[int]:
        return list(self._table(seq_id))

    def num_tokens(self, seq_id: Hashable) -> int:
        self._table(seq_id)
        return self.lengths[seq_id]

    def num_cached_tokens(self, seq_id: Hashable) -> int:
        """No prefix cache: every prompt token is computed."""
        self._table(seq_id)
        return 0

    def slot(self, seq_id: Hashable, position: int) -> int:
        table, B = self._table(seq_id), self.block_size
        if not 0 <= position < self.lengths[seq_id]:
            raise ValueError(f"position {position} is outside sequence {seq_id!r} of {self.lengths[seq_id]} tokens")
        return table[position // B] * B + position % B

    def ref_count(self, block_id: int) -> int:
        return self.ref_counts[block_id]

    def mark_computed(self, seq_id: Hashable, num_computed_tokens: int, token_ids: Sequence[int] | None = None) -> None:
        """The scheduler reports K/V written and the sampled tokens' ids; a prefix cache would hash and
        publish full blocks now. Nothing to do."""
        self._table(seq_id)

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write ``(src, dst)`` pairs made since the last call (the engine applies them)."""
        copies, self.copies = self.copies, []
        return copies

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self.block_tables

    @property
    def seq_ids(self) -> list[Hashable]:
        return list(self.block_tables)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_block_ids)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

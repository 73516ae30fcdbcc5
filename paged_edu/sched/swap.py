"""The CPU swap space: the one owner of CPU block ids while sequences are swapped out.

Preemption by swapping (vLLM's ``--swap-space``) copies a sequence's GPU blocks to CPU memory and
frees them on the GPU; when the sequence comes back its blocks are copied in again. The tensors
live in :class:`~paged_edu.cache.kv_cache.PagedKVCache` (``cpu_k_caches`` / ``cpu_v_caches``);
*which* CPU blocks are free and which swapped sequence holds which is kept here, and only here.
The scheduler turns every move into ``(gpu_block, cpu_block)`` / ``(cpu_block, gpu_block)`` copies
for the executor.

Plain Python, no torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

from paged_edu.core.validation import integer

__all__ = ["SwapSpace"]


class SwapSpace:
    """``num_blocks`` CPU blocks: a free list, and each swapped-out sequence's blocks in order."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = integer("num_cpu_blocks", num_blocks, low=0)
        # Free ids: those given back (reused first), then every id from _next_unused on -- so a
        # swap space of any size costs nothing until it is used.
        self._free: deque[int] = deque()
        self._next_unused = 0
        self._held: dict[Hashable, list[int]] = {}  # seq_id -> its CPU blocks, in block-table order

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self.num_blocks - self._next_unused

    @property
    def free_block_ids(self) -> list[int]:
        return [*self._free, *range(self._next_unused, self.num_blocks)]

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._held

    def can_swap_out(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    def _take_free(self) -> int:
        if self._free:
            return self._free.popleft()
        self._next_unused += 1
        return self._next_unused - 1

    def swap_out(self, seq_id: Hashable, gpu_blocks: Sequence[int]) -> list[tuple[int, int]]:
        """Take one CPU block per GPU block of ``seq_id``; return the ``(gpu, cpu)`` copies to make."""
        if seq_id in self._held:
            raise ValueError(f"sequence {seq_id!r} is already swapped out")
        if not self.can_swap_out(len(gpu_blocks)):
            raise ValueError(f"sequence {seq_id!r} needs {len(gpu_blocks)} CPU blocks, {self.num_free_blocks} are free")
        cpu_blocks = [self._take_free() for _ in gpu_blocks]
        self._held[seq_id] = cpu_blocks
        return list(zip(gpu_blocks, cpu_blocks))

    def swap_in(self, seq_id: Hashable, gpu_blocks: Sequence[int], first: int = 0) -> list[tuple[int, int]]:
        """Release ``seq_id``'s CPU blocks; return the ``(cpu, gpu)`` copies for blocks ``first`` on.

        Blocks before ``first`` came back from the GPU prefix cache and need no copy.
        """
        cpu_blocks = self._take(seq_id)
        return [(cpu_blocks[i], gpu_blocks[i]) for i in range(first, len(cpu_blocks))]

    def blocks_of(self, seq_id: Hashable) -> tuple[int, ...]:
        """The CPU blocks ``seq_id`` holds while swapped out, in block-table order (none when it is not)."""
        return tuple(self._held.get(seq_id, ()))

    def num_blocks_held(self, seq_id: Hashable) -> int:
        """CPU blocks ``seq_id`` holds while swapped out (0 when it is not)."""
        return len(self._held.get(seq_id, ()))

    def release(self, seq_id: Hashable) -> None:
        """Drop a swapped-out sequence's copy (an abort): its CPU blocks are free again."""
        self._take(seq_id)

    def _take(self, seq_id: Hashable) -> list[int]:
        try:
            cpu_blocks = self._held.pop(seq_id)
        except KeyError:
            raise ValueError(f"sequence {seq_id!r} is not swapped out") from None
        self._free.extend(cpu_blocks)
        return cpu_blocks

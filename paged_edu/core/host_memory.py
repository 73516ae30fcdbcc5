"""What the host can hold: its available memory, and the check that a pool of blocks fits in it.

A block allocator keeps a few Python objects for every block it manages -- a ref count, a free-list
entry, the prefix index's entry and, once the block is cached, its hash or its radix-tree key -- so
``num_blocks`` decides how much *host* memory the allocator itself takes, whatever the KV cache's
device. ``BlockAllocator(2**31)`` would need over 100 GiB before its first block is handed out: the
process is killed by the OS half-way through building it. :func:`check_host_fits` refuses such a
size first, with an error naming the field.

Measured with ``tracemalloc`` (CPython 3.11, 64-bit; ``tests/core/test_host_memory.py`` measures it
again): a built allocator takes 56 bytes per block (the free list's int objects and deque slots, the
ref counts, the index's per-block entry); with every block of 16 slots cached and held, up to 238 bytes
per block (hash chain: a 32-byte hash, its map and LRU entries, block tables) and 209 (radix tree, which
keeps each cached block's token ids as its key: 8 bytes a slot). :func:`allocator_host_bytes` states the
bound the check uses, ``num_blocks * (HOST_BYTES_PER_BLOCK + 8 * block_size)``: what the pool takes
when full, so a pool that is built can also be filled.

Plain Python, no torch.
"""

from __future__ import annotations

import os

from paged_edu.core.validation import FieldValueError

__all__ = ["HOST_BYTES_PER_BLOCK", "allocator_host_bytes", "available_host_bytes", "check_host_fits"]

# A block's own structures with everything cached and held, its slots' token ids apart (8 * block_size):
# measured 238 bytes in all at B = 16 (56 when built), so 256 + 8 * 16 = 384 bounds it.
HOST_BYTES_PER_BLOCK = 256


def allocator_host_bytes(num_blocks: int, block_size: int) -> int:
    """Host bytes a block allocator of ``num_blocks`` blocks of ``block_size`` slots takes at most when
    every block is cached and held: ``num_blocks * (HOST_BYTES_PER_BLOCK + 8 * block_size)``."""
    return num_blocks * (HOST_BYTES_PER_BLOCK + 8 * block_size)


def available_host_bytes() -> tuple[int, str] | None:
    """The host memory a new structure can take now, and which figure it is: Linux's ``MemAvailable``
    (free memory plus the page cache the kernel can reclaim, ``/proc/meminfo``), else the free pages
    ``os.sysconf`` reports; None where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free pages (os.sysconf)"
    except (ValueError, OSError, AttributeError):  # not on this OS
        return None


def check_host_fits(field: str, num_blocks: int, block_size: int, given: str | None = None) -> None:
    """Refuse, before anything is built, ``num_blocks`` blocks whose allocator the host's available
    memory cannot hold (:func:`allocator_host_bytes`): a :class:`FieldValueError` naming ``field``
    (``given`` says what was asked, by default ``field=num_blocks``) and the figures, instead of a
    bare ``MemoryError`` or the OS killing the process."""
    available = available_host_bytes()
    if available is None:
        return
    free, source = available
    need = allocator_host_bytes(num_blocks, block_size)
    if need > free:
        per_block = allocator_host_bytes(1, block_size)
        raise FieldValueError(
            field,
            f"{given or f'{field}={num_blocks:,}'}: {num_blocks:,} blocks of {block_size} slots need up to "
            f"{need / 2**30:.2f} GiB of host memory for the block allocator's own structures ({per_block} bytes a "
            f"block), but the host has {free / 2**30:.2f} GiB available ({source}); at most {free // per_block:,} "
            "blocks fit",
        )

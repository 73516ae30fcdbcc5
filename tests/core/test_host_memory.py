"""Every allocator size bounded before anything is built (issue 44 item 4).

``RadixAllocator(2**31)`` had no upper bound (the OOM killer stopped the process at 22.9 GB) and
``BlockAllocator`` took up to 2**31 - 1 blocks: both now check ``num_blocks`` against
``MAX_NUM_BLOCKS`` and against the host's available memory, naming the field. The oracle for the
memory bound is ``tracemalloc``: what the allocator's structures really take, built and filled.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from paged_edu.core import host_memory
from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.host_memory import allocator_host_bytes, available_host_bytes, check_host_fits
from paged_edu.core.radix_cache import RadixAllocator
from paged_edu.core.validation import MAX_NUM_BLOCKS, FieldValueError
from paged_edu.sim.managers import make_manager

MAKERS = [BlockAllocator, RadixAllocator]


def measured_bytes(make, num_blocks: int, block_size: int) -> int:
    """The peak ``tracemalloc`` sees while ``make`` builds an allocator and fills it: every block
    cached by sequences of 8 blocks of distinct tokens, then half of them freed (evictable)."""
    gc.collect()
    tracemalloc.start()
    try:
        a = make(num_blocks, block_size)
        seqs = num_blocks // 8
        for s in range(seqs):
            a.allocate(s, list(range(s * 8 * block_size, (s + 1) * 8 * block_size)))
        for s in range(0, seqs, 2):
            a.free(s)
        assert a.num_cached_blocks >= num_blocks - 8  # the cache is full
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("make", MAKERS, ids=["hash", "radix"])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_the_stated_bound_covers_what_a_full_allocator_takes(make, block_size):
    num_blocks = 8_000
    peak = measured_bytes(make, num_blocks, block_size)
    assert peak <= allocator_host_bytes(num_blocks, block_size)
    assert peak >= allocator_host_bytes(num_blocks, block_size) / 4  # a bound, not a guess off by 10x


@pytest.mark.parametrize("make", MAKERS, ids=["hash", "radix"])
@pytest.mark.parametrize("num_blocks", [2**31, 2**33, 10**12])
def test_a_block_count_past_the_int32_bound_is_refused_naming_it(make, num_blocks):
    """The issue's ``RadixAllocator(2**31)``, and larger: refused by the stated bound, nothing built."""
    tracemalloc.start()
    try:
        with pytest.raises(FieldValueError, match=rf"num_blocks must be in \[1, {MAX_NUM_BLOCKS}\]") as info:
            make(num_blocks)
        assert tracemalloc.get_traced_memory()[1] < 2**20  # refused before anything was built
    finally:
        tracemalloc.stop()
    assert info.value.field == "num_blocks"


@pytest.mark.parametrize("make", MAKERS, ids=["hash", "radix"])
@pytest.mark.parametrize("num_blocks", [MAX_NUM_BLOCKS, 2**30, 10**9])
def test_a_pool_the_host_cannot_hold_is_refused_naming_num_blocks(make, num_blocks):
    """``BlockAllocator(2**31 - 1)`` passed the int32 bound and ran out of memory: 2**31 - 1 blocks
    need ~800 GiB of structures. Refused before anything is built, with the host's figure."""
    free, _ = available_host_bytes()
    assert allocator_host_bytes(num_blocks, 16) > free, "this host could hold it: pick a larger count"
    tracemalloc.start()
    try:
        with pytest.raises(FieldValueError, match=r"num_blocks=.*host memory.*at most [\d,]+ blocks fit") as info:
            make(num_blocks, 16)
        assert tracemalloc.get_traced_memory()[1] < 2**20
    finally:
        tracemalloc.stop()
    assert info.value.field == "num_blocks"


@pytest.mark.parametrize("make", MAKERS, ids=["hash", "radix"])
def test_the_host_check_is_exact_at_its_bound(make, monkeypatch):
    """With 1,000 blocks' worth of memory available, 1,000 blocks are built and 1,001 refused."""
    room = allocator_host_bytes(1_000, 4)
    monkeypatch.setattr(host_memory, "available_host_bytes", lambda: (room, "a test's figure"))
    assert make(1_000, 4).num_blocks == 1_000
    with pytest.raises(FieldValueError, match=r"num_blocks=1,001: 1,001 blocks .* \(a test's figure\); at most 1,000"):
        make(1_001, 4)


def test_an_unknown_host_memory_checks_only_the_stated_bound(monkeypatch):
    monkeypatch.setattr(host_memory, "available_host_bytes", lambda: None)
    check_host_fits("num_blocks", MAX_NUM_BLOCKS, 16)  # nothing known: nothing refused


def test_the_host_figure_is_linux_memavailable_when_there_is_one():
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    free, source = available_host_bytes()
    kib = int(fields["MemAvailable"].split()[0])
    assert source.startswith("MemAvailable") and abs(free - kib * 1024) < 2**30  # read a moment apart


@pytest.mark.parametrize("manager", ["paged", "paged-prefix", "paged-radix"])
def test_a_simulated_pool_the_host_cannot_hold_names_num_kv_slots(manager, monkeypatch):
    monkeypatch.setattr(host_memory, "available_host_bytes", lambda: (allocator_host_bytes(100, 16), "a test's figure"))
    assert make_manager(manager, 100 * 16, 16).num_blocks == 100
    with pytest.raises(FieldValueError, match=r"num_kv_slots=1,616: 101 blocks of 16 slots") as info:
        make_manager(manager, 101 * 16, 16)
    assert info.value.field == "num_kv_slots"
    assert make_manager("contiguous-max", 10**9, 16).num_blocks == 10**9  # a list of gaps: no per-slot cost

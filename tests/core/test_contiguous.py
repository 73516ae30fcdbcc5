"""The contiguous baseline: first fit, merging, and the three pathologies, measured."""

import pytest

from paged_edu import ContiguousAllocator, FragmentationError, OutOfBlocksError


def test_first_fit_reserves_l_max_and_counts_idle_slots():
    c = ContiguousAllocator(100, 30)
    assert c.allocate("a", [1] * 10) == (0, 30)
    assert c.allocate("b", [1] * 5) == (30, 30)
    assert c.reserved_slots == 60 and c.used_slots == 15
    assert c.utilization == 15 / 60  # eta_naive over live requests
    assert c.append("b", 7) == 35


def test_free_merges_neighbouring_gaps():
    c = ContiguousAllocator(90, 30)
    for s in "abc":
        c.allocate(s, [1])
    c.free("a")
    c.free("c")
    assert c.free_gaps == [(0, 30), (60, 30)]
    c.free("b")
    assert c.free_gaps == [(0, 90)]


def test_external_fragmentation_refuses_with_enough_total_memory():
    c = ContiguousAllocator(100, 100)
    c.allocate("a", [1] * 5, reserve=30)
    c.allocate("b", [1] * 5, reserve=20)
    c.allocate("c", [1] * 5, reserve=30)
    c.allocate("d", [1] * 5, reserve=20)
    c.free("a")
    c.free("c")
    assert c.free_slots == 60 and c.largest_free_gap == 30
    before = (c.free_gaps, c.reserved_slots, c.used_slots)
    with pytest.raises(FragmentationError, match="60 are free in total but the largest gap is 30"):
        c.allocate("e", [1] * 5, reserve=40)
    assert (c.free_gaps, c.reserved_slots, c.used_slots) == before
    with pytest.raises(OutOfBlocksError) as err:
        c.allocate("f", [1] * 5, reserve=70)
    assert not isinstance(err.value, FragmentationError)


def test_shared_prompt_is_stored_once_per_request():
    c = ContiguousAllocator(1000, 100)
    system = list(range(40))
    for i in range(4):
        c.allocate(i, system + [100 + i])
    assert c.duplicated_prompt_tokens() == 3 * 40


def test_reservation_overflow_and_errors():
    c = ContiguousAllocator(10, 4)
    c.allocate("a", [1, 2, 3, 4])
    with pytest.raises(OutOfBlocksError, match="full"):
        c.append("a", 5)
    with pytest.raises(ValueError, match="already exists"):
        c.allocate("a", [1])
    with pytest.raises(ValueError, match="empty"):
        c.allocate("b", [])
    with pytest.raises(ValueError, match="reserve"):
        c.allocate("b", [1, 2, 3], reserve=2)
    with pytest.raises(KeyError, match="ghost"):
        c.free("ghost")
    with pytest.raises(ValueError):
        ContiguousAllocator(0, 4)


def test_reserve_takes_a_range_with_no_tokens_and_fails_changing_nothing():
    c = ContiguousAllocator(10, 4)
    assert c.reserve("family", 6) == 0  # first fit, holds no token yet
    assert c.num_tokens("family") == 0 and c.reservation("family") == (0, 6) and c.used_slots == 0
    assert c.append("family", 7) == 0 and c.num_tokens("family") == 1
    before = (c.free_gaps, c.reserved_slots)
    with pytest.raises(OutOfBlocksError, match="needs 5 slots, only 4"):
        c.reserve("big", 5)
    with pytest.raises(ValueError, match="already exists"):
        c.reserve("family", 1)
    with pytest.raises(ValueError, match="size"):
        c.reserve("zero", 0)
    assert (c.free_gaps, c.reserved_slots) == before and "big" not in c
    d = ContiguousAllocator(10, 4)
    for name, size in (("a", 3), ("b", 3), ("c", 4)):
        d.reserve(name, size)
    d.free("a")
    d.free("c")  # gaps of 3 and 4: 7 slots free, no 5 in a row
    with pytest.raises(FragmentationError, match="largest gap is 4"):
        d.reserve("e", 5)
    assert d.free_gaps == [(0, 3), (6, 4)]


def test_bad_input_is_refused_naming_it_and_numpy_integers_are_taken():
    """The same checks as the paged allocator's (paged_edu.core.validation): bytes are not a prompt,
    bools are not tokens or sizes, numpy integers are integers; nothing changes on a refusal."""
    import numpy as np

    c = ContiguousAllocator(np.int64(20), 8)
    for bad, kind, words in (
        (b"abc", TypeError, "token_ids"),
        ([1, True], TypeError, "element 1"),
        ([1, 2.5], TypeError, "element 1"),
        ([1, -3], ValueError, "1"),
    ):
        with pytest.raises(kind, match=words):
            c.allocate("x", bad)
    with pytest.raises(TypeError, match="reserve"):
        c.allocate("x", [1], reserve=True)
    with pytest.raises(TypeError, match="hashable"):
        c.reserve(["unhashable"], 2)
    assert c.seq_ids == [] and c.free_slots == 20
    assert c.allocate("x", [np.int64(1), 2], reserve=np.int32(4)) == (0, 4)
    with pytest.raises(TypeError, match="token id"):
        c.append("x", True)
    assert c.append("x", np.int64(3)) == 2 and c.num_tokens("x") == 3

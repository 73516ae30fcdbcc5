"""Unit tests of the BlockAllocator contract, one point at a time.

Each test states the contract in its name; expected values are worked out by hand from the
definitions (ceil(n/B) blocks, chained hashes, copy-on-write), not read back from the code.
"""

import copy
import warnings
import hashlib
import math
from array import array

import numpy as np
import pytest

from paged_edu import BlockAllocator, OutOfBlocksError
from paged_edu.core.block_hash import chained_block_hashes
from paged_edu.core.seq_lookup import UnknownSequenceError
from paged_edu.core.contract import observable
from paged_edu.core.radix_cache import RadixAllocator

from allocator_helpers import append_token, assert_holds

B = 4


def snapshot(a: BlockAllocator):
    """Everything observable, to check that a failed call left the allocator exactly as it was."""
    return (
        a.num_free_blocks,
        a.num_evictable_blocks,
        {
            s: (
                a.block_table(s),
                a.num_tokens(s),
                a.num_known_tokens(s),
                list(a._seqs[s].pending),
                a.num_cached_tokens(s),
            )
            for s in a.seq_ids
        },
        [a.ref_count(b) for b in range(a.num_blocks)],
        [a.block_hash(b) for b in range(a.num_blocks)],
        copy.deepcopy(a.index.hash_to_block),
        list(a.index.evictable),
        list(a.pool.free_block_ids),
        (a.stats.queried_tokens, a.stats.hit_tokens),
        list(a._copies),
    )


# -- allocate ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, B - 1, B, B + 1, 3 * B, 3 * B + 2])
def test_prompt_gets_ceil_n_over_b_distinct_blocks(n):
    a = BlockAllocator(16, B)
    table = a.allocate("s", list(range(n)))
    assert len(table) == math.ceil(n / B)
    assert len(set(table)) == len(table)
    assert a.num_free_blocks == 16 - len(table)
    assert all(a.ref_count(b) == 1 for b in table)
    assert a.block_table("s") == table


def test_hash_is_chained_sha256_over_framed_token_bytes():
    """h_i = SHA-256(b"block" || len(h_{i-1}) as one byte || h_{i-1} || int64 bytes of block i), h_{-1} = b""."""
    tokens = list(range(10))
    expected, parent = [], b""
    for i in range(2):
        framed = b"block" + bytes([len(parent)]) + parent + array("q", tokens[i * B : (i + 1) * B]).tobytes()
        parent = hashlib.sha256(framed).digest()
        expected.append(parent)
    assert chained_block_hashes(tokens, B) == expected


def test_full_blocks_enter_the_cache_and_a_second_prompt_hits_them():
    a = BlockAllocator(16, B)
    t1 = a.allocate("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    t2 = a.allocate("b", [1, 2, 3, 4, 5, 6, 7, 8, 10, 11])
    assert t2[:2] == t1[:2] and t2[2] != t1[2]
    assert a.num_cached_tokens("b") == 8
    assert a.ref_count(t1[0]) == a.ref_count(t1[1]) == 2
    assert a.stats.queried_tokens == 19 and a.stats.hit_tokens == 8


def test_hash_is_position_aware_same_block_after_different_prefix_is_not_shared():
    a = BlockAllocator(16, B)
    t1 = a.allocate("a", [1, 1, 1, 1, 7, 7, 7, 7, 0])
    t2 = a.allocate("b", [2, 2, 2, 2, 7, 7, 7, 7, 0])
    # Block 1 holds the same four tokens in both, but after a different prefix: its K/V differs.
    assert set(t1).isdisjoint(t2)
    assert a.num_cached_tokens("b") == 0


def test_lookup_stops_at_first_miss():
    a = BlockAllocator(16, B)
    a.allocate("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0])
    table = a.allocate("b", [1, 2, 3, 4, 0, 0, 0, 0, 9, 10, 11, 12, 0])
    assert a.num_cached_tokens("b") == 4
    assert a.ref_count(table[2]) == 1


def test_fully_cached_prompt_still_computes_its_last_token_in_a_private_block():
    a = BlockAllocator(16, B)
    prompt = list(range(8))
    t1 = a.allocate("a", prompt)
    t2 = a.allocate("b", prompt)
    assert a.num_cached_tokens("b") == 4  # a multiple of B, smaller than n = 8
    assert t2[0] == t1[0] and t2[1] != t1[1]
    assert a.ref_count(t2[1]) == 1


def test_num_cached_tokens_is_multiple_of_b_and_below_n():
    a = BlockAllocator(32, B)
    base = list(range(20))
    a.allocate("a", base)
    for n in range(1, 21):
        a.allocate(n, base[:n])
        cached = a.num_cached_tokens(n)
        assert cached % B == 0 and cached < n
        assert cached == min((n - 1) // B, 5) * B
        a.free(n)


def test_prefix_caching_disabled_shares_nothing():
    a = BlockAllocator(16, B, enable_prefix_caching=False)
    t1 = a.allocate("a", list(range(9)))
    t2 = a.allocate("b", list(range(9)))
    assert set(t1).isdisjoint(t2) and a.num_cached_tokens("b") == 0
    a.free("a")
    assert a.num_evictable_blocks == 0 and a.block_hash(t1[0]) is None


# -- append --------------------------------------------------------------------------------------


def test_append_returns_physical_slot_and_takes_new_block_when_full():
    a = BlockAllocator(16, B)
    table = a.allocate("s", [1, 2, 3])
    assert append_token(a, "s", 4) == table[0] * B + 3
    slot = append_token(a, "s", 5)
    new_table = a.block_table("s")
    assert len(new_table) == 2 and slot == new_table[1] * B + 0
    assert_holds(a, "s", [1, 2, 3, 4, 5])


def test_block_filled_by_append_enters_cache():
    a = BlockAllocator(16, B)
    a.allocate("a", [1, 2, 3])
    append_token(a, "a", 4)
    t = a.allocate("b", [1, 2, 3, 4, 9])
    assert a.num_cached_tokens("b") == 4 and t[0] == a.block_table("a")[0]


def test_copy_on_write_on_append_into_shared_partial_block():
    a = BlockAllocator(16, B)
    parent = a.allocate("p", [1, 2, 3, 4, 5, 6])
    assert a.fork("p", "c") == parent
    assert [a.ref_count(b) for b in parent] == [2, 2]
    slot = append_token(a, "c", 7)
    child = a.block_table("c")
    assert child[0] == parent[0] and child[1] != parent[1]
    assert slot == child[1] * B + 2
    assert a.ref_count(parent[1]) == 1 and a.ref_count(child[1]) == 1
    assert a.take_copies() == [(parent[1], child[1])]
    assert a.take_copies() == []
    # The parent, now the only owner, writes in place.
    assert append_token(a, "p", 8) == parent[1] * B + 2
    assert a.take_copies() == []


def test_append_after_fork_into_full_block_needs_no_copy():
    a = BlockAllocator(16, B)
    a.allocate("p", [1, 2, 3, 4])
    a.fork("p", "c")
    append_token(a, "c", 5)
    assert a.take_copies() == []
    assert a.block_table("c")[0] == a.block_table("p")[0]


# -- free, eviction ------------------------------------------------------------------------------


def test_free_keeps_full_blocks_cached_and_reusable():
    a = BlockAllocator(8, B)
    t1 = a.allocate("a", list(range(9)))
    a.free("a")
    assert a.num_free_blocks == 8
    assert a.num_evictable_blocks == 2  # the two full blocks; the partial one is plain free
    t2 = a.allocate("b", list(range(9)))
    assert t2[:2] == t1[:2] and a.num_cached_tokens("b") == 8


def test_eviction_drops_the_hash_when_the_block_is_handed_out_again():
    a = BlockAllocator(3, B)
    t1 = a.allocate("a", list(range(9)))  # 3 blocks, two of them cached
    a.free("a")
    a.allocate("x", [50] * 12)  # needs all three: evicts both cached blocks
    assert all(a.block_hash(b) is not None for b in a.block_table("x")[:2])
    a.free("x")
    table = a.allocate("b", list(range(9)))
    assert a.num_cached_tokens("b") == 0  # no stale hit on an overwritten block
    assert table is not None and t1 is not None


def test_never_cached_free_blocks_go_before_evicting():
    a = BlockAllocator(6, B)
    a.allocate("a", list(range(8)) + [0])
    a.free("a")
    a.allocate("b", [9] * 3)
    a.allocate("c", [8] * 3)
    a.allocate("d", [7] * 3)
    assert a.num_evictable_blocks == 2


def test_lru_evicts_least_recently_freed_and_tail_first():
    a = BlockAllocator(6, B)
    ta = a.allocate("a", [1] * 9)  # blocks: full, full, partial
    tb = a.allocate("b", [2] * 9)
    old_hash = a.block_hash(ta[1])
    a.free("a")  # a's tail full block is freed first, then its head
    a.free("b")
    assert list(a.index.evictable) == [ta[1], ta[0], tb[1], tb[0]]
    # Exhaust: free plain blocks first (the two partials), then evict in that order.
    x = a.allocate("x", [3] * 12)
    assert a.num_evictable_blocks == 3
    assert ta[1] in x and a.block_hash(ta[1]) != old_hash  # evicted, now x's
    a.free("x")
    assert a.allocate("y", [1] * 9)[0] == ta[0] and a.num_cached_tokens("y") == 4  # a's head still cached


def test_cache_hit_revives_an_evictable_block():
    a = BlockAllocator(4, B)
    t1 = a.allocate("a", [1, 2, 3, 4, 5])
    a.free("a")
    t2 = a.allocate("b", [1, 2, 3, 4, 6])
    assert t2[0] == t1[0] and not a.is_evictable(t1[0]) and a.ref_count(t1[0]) == 1


# -- errors leave state as it was ---------------------------------------------------------------


def test_out_of_blocks_in_allocate_rolls_back_everything():
    a = BlockAllocator(4, B)
    a.allocate("a", list(range(9)))  # 3 blocks
    a.free("a")  # 2 evictable + 2 plain free
    a.allocate("b", [5] * 5)  # 2 plain blocks
    before = snapshot(a)
    # Hits block 0 (revives it), then needs 3 fresh blocks; only 1 remains once block 0 is revived.
    with pytest.raises(OutOfBlocksError) as err:
        a.allocate("c", list(range(4)) + [9] * 10)
    assert isinstance(err.value, MemoryError)
    assert "needs" in str(err.value)
    assert snapshot(a) == before


def test_out_of_blocks_in_append_and_copy_on_write_changes_nothing():
    a = BlockAllocator(3, B)
    a.allocate("a", [1, 2, 3, 4, 5])
    a.fork("a", "b")
    a2 = BlockAllocator(1, B)
    a2.allocate("x", [1, 2, 3, 4])
    before2 = snapshot(a2)
    with pytest.raises(OutOfBlocksError):
        append_token(a2, "x", 5)  # full block, pool empty
    assert snapshot(a2) == before2
    a.allocate("z", [9])  # takes the last free block
    before = snapshot(a)
    with pytest.raises(OutOfBlocksError):
        append_token(a, "b", 6)  # needs a copy-on-write block
    assert snapshot(a) == before


def _appended_one_by_one(a: BlockAllocator, seq_ids, num_tokens) -> int:
    """The oracle of ``append_slots_upto``: one ``append_slots`` per sequence short of its count."""
    for i, (seq_id, want) in enumerate(zip(seq_ids, num_tokens)):
        if a.num_tokens(seq_id) != want:
            try:
                a.append_slots(seq_id)
            except OutOfBlocksError:
                return i
    return len(seq_ids)


@pytest.mark.parametrize("subscribed", [None, "allocator", "cache"])
@pytest.mark.parametrize("num_blocks", [4, 5, 6, 40])
def test_append_slots_upto_equals_append_slots_one_by_one(num_blocks, subscribed):
    """New blocks (evicting a cached one when the pool is small), copies on write, sequences that
    hold their slot already, and a pool that runs out part-way: the same slots, blocks, copies and
    events -- the allocator's or the prefix cache's -- as ``append_slots`` per sequence."""
    runs = []
    for bulk in (True, False):
        a = BlockAllocator(num_blocks, B)
        events = []
        if subscribed:
            (a.subscribe if subscribed == "allocator" else a.subscribe_cache)(events.append)
        a.allocate("old", [11, 12, 13, 14])
        a.free("old")  # a cached block, evictable: a new block takes it once the never-cached ones are gone
        a.allocate("full", [1, 2, 3, 4])  # its last block full: a new block
        a.allocate("room", [5, 6])  # room in its last block
        a.fork("room", "child")  # a shared last block: "room" copies it, then "child" holds it alone
        a.allocate("held", [7, 8, 9])  # holds its count already: nothing
        seq_ids = ["full", "room", "child", "held"]
        wants = [a.num_tokens(i) + (i != "held") for i in seq_ids]
        served = (a.append_slots_upto if bulk else lambda *x: _appended_one_by_one(a, *x))(seq_ids, wants)
        runs.append((served, snapshot(a), a.take_copies(), events))
    assert runs[0] == runs[1]
    if num_blocks < 5:  # 3 blocks held, 2 more needed, 1 free (cached)
        assert runs[0][0] < 4  # the pool ran out part-way (the case is meant to)
    if subscribed == "cache" and num_blocks < 6:
        assert ("evict", [0]) in [(e.kind, e.block_ids) for e in runs[0][3]]  # the cached block went


def test_append_slots_upto_names_an_unknown_sequence_and_serves_those_before_it():
    a = BlockAllocator(8, B)
    a.allocate("a", [1, 2])
    with pytest.raises(UnknownSequenceError, match="nope"):
        a.append_slots_upto(["a", "nope"], [3, 1])
    assert a.num_tokens("a") == 3  # as append_slots one by one: "a" was served before "nope" raised


def test_unknown_sequence_raises_key_error_naming_it():
    a = BlockAllocator(4, B)
    for call in (
        lambda: append_token(a, "ghost", 1),
        lambda: a.free("ghost"),
        lambda: a.block_table("ghost"),
        lambda: a.num_cached_tokens("ghost"),
        lambda: a.fork("ghost", "x"),
    ):
        with pytest.raises(KeyError) as err:
            call()
        assert isinstance(err.value, UnknownSequenceError)
        assert "ghost" in str(err.value)


@pytest.mark.parametrize("make", [lambda: BlockAllocator(8, B, True), lambda: RadixAllocator(8, B)])
def test_block_tables_are_each_sequences_table_read_in_one_call(make):
    """``block_tables(ids)``: ``block_table(id)`` for each id, in order (the allocator's own lists, not
    copies); an unknown id is named, as by ``block_table``; a manager without it gets the per-sequence
    fallback from ``block_tables_reader``."""
    from paged_edu.sched.memory_manager import block_tables_reader

    a = make()
    a.allocate("a", list(range(2 * B + 1)))
    a.allocate("b", [7])
    a.fork("a", "c")
    append_token(a, "c", 3)  # copy-on-write: c's last block differs from a's
    ids = ["c", "b", "a"]
    assert a.block_tables(ids) == [a.block_table(i) for i in ids] and a.block_table("c") != a.block_table("a")
    with pytest.raises(UnknownSequenceError, match="ghost"):
        a.block_tables(["a", "ghost"])

    class TablesOnly:  # a learner's manager: block_table, no block_tables
        block_table = a.block_table

    assert block_tables_reader(TablesOnly())(ids) == a.block_tables(ids)
    assert block_tables_reader(a) == a.block_tables


def test_existing_id_raises_value_error():
    a = BlockAllocator(8, B)
    a.allocate("a", [1])
    a.allocate("b", [2])
    before = snapshot(a)
    with pytest.raises(ValueError, match="already exists"):
        a.allocate("a", [3])
    with pytest.raises(ValueError, match="already exists"):
        a.fork("a", "b")
    assert snapshot(a) == before


@pytest.mark.parametrize(
    "tokens, exc, words",
    [
        ([], ValueError, "empty"),
        ([1, -2], ValueError, "non-negative"),
        ([1, 2.5], TypeError, "integers"),
        (["a"], TypeError, "integers"),
        ([2**70], ValueError, "64 bits"),
    ],
)
def test_bad_prompts_raise_clear_errors_and_change_nothing(tokens, exc, words):
    a = BlockAllocator(8, B)
    a.allocate("a", [1, 2, 3, 4, 5])
    before = snapshot(a)
    with pytest.raises(exc, match=words):
        a.allocate("new", tokens)
    assert snapshot(a) == before


@pytest.mark.parametrize("token, exc", [(-1, ValueError), (1.0, TypeError), ("x", TypeError), (True, TypeError)])
def test_bad_appended_token_raises_and_changes_nothing(token, exc):
    a = BlockAllocator(8, B)
    a.allocate("a", [1, 2, 3, 4])
    a.append_slots("a")  # the slot, by count; the bad id arrives with mark_computed
    before = snapshot(a)
    with pytest.raises(exc):
        a.mark_computed("a", 5, [token])
    assert snapshot(a) == before


@pytest.mark.parametrize("prompt_len", [B - 1, B])  # the token would fill the block / need a new one
@pytest.mark.parametrize("token", [2**63, 2**70])
def test_appended_token_too_big_for_64_bits_raises_and_changes_nothing(prompt_len, token):
    a = BlockAllocator(8, B)
    a.allocate("a", list(range(1, prompt_len + 1)))
    a.append_slots("a")
    before = snapshot(a)
    with pytest.raises(ValueError, match="64 bits"):
        a.mark_computed("a", prompt_len + 1, [token])
    assert snapshot(a) == before
    assert a.num_known_tokens("a") == prompt_len
    a.mark_computed("a", prompt_len + 1, [2**63 - 1])  # the largest int64 is a valid token, as in allocate
    assert_holds(a, "a", [*range(1, prompt_len + 1), 2**63 - 1])


@pytest.mark.parametrize("tokens", [[True, 2, 3], (1, False)])
def test_bool_token_ids_in_a_prompt_are_refused_like_in_append(tokens):
    a = BlockAllocator(8, B)
    a.allocate("a", [1, 2, 3, 4, 5])
    a.append_slots("a")
    before = snapshot(a)
    with pytest.raises(TypeError, match="bool"):
        a.allocate("new", tokens)
    with pytest.raises(TypeError):
        a.mark_computed("a", 6, [tokens[0] if isinstance(tokens[0], bool) else tokens[1]])
    assert snapshot(a) == before


def test_numpy_style_integer_tokens_are_accepted():
    class Index:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    a = BlockAllocator(8, B)
    a.allocate("a", [1, 2, 3])
    assert append_token(a, "a", Index(4)) == a.block_table("a")[0] * B + 3


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"num_blocks": 0}, ValueError),
        ({"num_blocks": -1}, ValueError),
        ({"block_size": 0}, ValueError),
        ({"num_blocks": 2.0}, TypeError),
        ({"block_size": "16"}, TypeError),
    ],
)
def test_bad_construction(kwargs, exc):
    args = {"num_blocks": 4, "block_size": 4, **kwargs}
    with pytest.raises(exc, match="num_blocks|block_size"):
        BlockAllocator(**args)


# -- counts, not token values (issue 20 item 3) --------------------------------------------------


@pytest.mark.parametrize("make", [lambda: BlockAllocator(16, B), lambda: RadixAllocator(16, B)], ids=["hash", "radix"])
def test_a_slot_is_reserved_without_its_token_id(make):
    """A decode's slot before its token exists: the count grows, the known ids do not, nothing is hashed."""
    a = make()
    table = a.allocate("s", [1, 2, 3])
    assert a.append_slots("s") == [table[0] * B + 3]  # no token id passed: it is still being sampled
    assert a.num_tokens("s") == 4 and a.num_known_tokens("s") == 3
    assert a.num_cached_tokens_for([1, 2, 3, 4, 9]) == 0  # the full block's ids are unknown: not cached
    slots = a.append_slots("s", 5)  # several at once: one more block filled, one begun
    assert slots == a.slot_mapping("s", 4) and len(a.block_table("s")) == 3
    a.mark_computed("s", 9, [4, 5, 6, 7, 8, 9])  # ids of tokens 3 .. 8 (3 is known: not read again)
    assert a.num_known_tokens("s") == 9 and a.num_tokens("s") == 9
    assert a.num_cached_tokens_for([1, 2, 3, 4, 5, 6, 7, 8, 0]) == 8


@pytest.mark.parametrize(
    "make",
    [lambda: BlockAllocator(16, B, cache_when_computed=True), lambda: RadixAllocator(16, B, cache_when_computed=True)],
    ids=["hash", "radix"],
)
def test_a_full_block_is_published_only_once_its_ids_arrive_and_its_kv_is_computed(make):
    a = make()
    a.allocate("s", [1, 2, 3])
    a.mark_computed("s", 3)  # the prompt's K/V
    a.append_slots("s")  # block 0 is full by count
    a.mark_computed("s", 3)
    assert a.num_cached_tokens_for([1, 2, 3, 4, 9]) == 0  # ids unknown, K/V of token 3 not written
    a.mark_computed("s", 4, [4])  # token 3's K/V is written and its id is 4
    assert a.num_cached_tokens_for([1, 2, 3, 4, 9]) == 4
    assert a.num_cached_tokens_for([1, 2, 3, 5, 9]) == 0  # published under the ids given, no other


@pytest.mark.parametrize("make", [lambda: BlockAllocator(16, B), lambda: RadixAllocator(16, B)], ids=["hash", "radix"])
def test_ids_that_leave_a_gap_or_overrun_the_reserved_slots_are_refused_and_change_nothing(make):
    a = make()
    a.allocate("s", [1, 2, 3])
    a.append_slots("s", 2)
    before = observable(a), a.num_known_tokens("s")
    with pytest.raises(ValueError, match="missing"):
        a.mark_computed("s", 5, [9])  # token 3's id was never given
    with pytest.raises(ValueError, match="num_computed_tokens"):
        a.mark_computed("s", 6, [4, 5, 6])  # only 5 slots are reserved
    with pytest.raises(ValueError, match="num_tokens"):
        a.append_slots("s", -1)
    assert (observable(a), a.num_known_tokens("s")) == before


def test_reserving_several_slots_is_all_or_nothing():
    a = BlockAllocator(3, B)
    a.allocate("p", [1, 2, 3, 4, 5])
    a.fork("p", "c")  # c's last block is shared: its next slot needs a copy, and 4 more a new block
    before = observable(a)
    with pytest.raises(OutOfBlocksError):
        a.append_slots("c", 8)  # a copy and 2 new blocks: 3 blocks, 1 free
    assert observable(a) == before and a.take_copies() == []
    shared = a.block_table("p")[1]
    slots = a.append_slots("c", 3)  # the rest of the last block: a copy of it, and nothing more
    copy = a.block_table("c")[1]
    assert a.take_copies() == [(shared, copy)] and slots == [copy * B + 1, copy * B + 2, copy * B + 3]


# -- events and helpers --------------------------------------------------------------------------


def test_event_stream_reports_each_operation():
    a = BlockAllocator(3, B)
    events = []
    unsubscribe = a.subscribe(events.append)
    a.allocate("a", [1, 2, 3, 4, 5])
    a.free("a")
    a.allocate("b", [1, 2, 3, 4, 6])
    a.fork("b", "c")
    append_token(a, "c", 7)
    kinds = [e.kind for e in events]
    assert kinds[:3] == ["allocate", "free", "cache_hit"]
    assert "fork" in kinds and "copy_on_write" in kinds and kinds.count("append") == 1
    unsubscribe()
    n = len(events)
    a.free("b")
    assert len(events) == n


def test_evict_event_names_the_block():
    a = BlockAllocator(2, B)
    events = []
    a.subscribe(events.append)
    t = a.allocate("a", [1, 2, 3, 4, 5])
    a.free("a")
    a.allocate("b", [7] * 8)
    assert [e.block_ids for e in events if e.kind == "evict"] == [[t[0]]]


def test_slot_mapping_matches_block_table_formula():
    a = BlockAllocator(16, B)
    a.allocate("a", list(range(11)))
    table = a.block_table("a")
    assert a.slot_mapping("a") == [table[t // B] * B + t % B for t in range(11)]
    assert a.slot("a", 9) == table[2] * B + 1
    with pytest.raises(ValueError, match="outside"):
        a.slot("a", 11)


def test_num_new_blocks_for_predicts_allocate():
    a = BlockAllocator(16, B)
    a.allocate("a", list(range(9)))
    a.free("a")
    before = a.num_free_blocks
    need = a.num_new_blocks_for(list(range(8)) + [99, 98])
    a.allocate("b", list(range(8)) + [99, 98])
    assert before - a.num_free_blocks == need


def test_cache_when_computed_publishes_blocks_only_once_marked():
    a = BlockAllocator(16, B, cache_when_computed=True)
    a.allocate("a", list(range(13)))  # 3 full blocks, nothing computed yet
    a.allocate("b", list(range(13)))
    assert a.num_cached_tokens("b") == 0  # a's K/V does not exist yet: no hit
    a.mark_computed("a", 9)  # blocks 0 and 1 are written
    a.allocate("c", list(range(13)))
    assert a.num_cached_tokens("c") == 8
    a.free("a")
    a.free("c")
    assert a.num_evictable_blocks == 2  # block 2 was never computed: not cached
    with pytest.raises(ValueError, match="num_computed_tokens"):
        a.mark_computed("b", 14)
    with pytest.raises(AttributeError, match="cache_when_computed"):  # the constructor's policy, fixed
        a.cache_when_computed = False


def test_block_queries_take_any_integer_and_refuse_bools_and_floats():
    class Index:
        def __index__(self):
            return 1

    a = BlockAllocator(4, B)
    a.allocate("a", [1, 2, 3, 4, 5])
    assert a.ref_count(Index()) == a.ref_count(1) == 1
    for bad, exc in ((True, TypeError), (1.0, TypeError), ("1", TypeError), (4, ValueError), (-1, ValueError)):
        with pytest.raises(exc, match="block id"):
            a.ref_count(bad)


# -- issue 15: prompts, positions and counts of the wrong type -----------------------------------


@pytest.mark.parametrize(
    "make_prompt, exc, words",
    [
        (lambda: b"abcdefgh", TypeError, "bytes"),  # once stored as ONE token, 7523094288207667809
        (lambda: bytearray(b"abcd"), TypeError, "bytearray"),
        (lambda: "abcd", TypeError, "str"),
        (lambda: (t for t in [1, 2, True]), TypeError, "element 2 is bool"),  # a generator's bools too
        (lambda: [np.int64(1), 2.5], TypeError, "element 1 is float"),  # the float, not the numpy int
    ],
)
def test_prompts_that_are_not_integer_sequences_are_refused_and_change_nothing(make_prompt, exc, words):
    a = BlockAllocator(8, B)
    a.allocate("a", [1, 2, 3, 4, 5])
    before = snapshot(a)
    with pytest.raises(exc, match=words):
        a.allocate("x", make_prompt())
    with pytest.raises(exc, match=words):
        a.num_new_blocks_for(make_prompt())
    assert snapshot(a) == before and "x" not in a


@pytest.mark.parametrize(
    "prompt",
    [np.array([1, 2, 3, 4, 5]), (t for t in [1, 2, 3, 4, 5]), range(1, 6), [np.int64(1), 2, np.uint8(3), 4, 5]],
)
def test_any_integer_sequence_is_a_prompt(prompt):
    a = BlockAllocator(8, B)
    a.allocate("x", prompt)
    assert_holds(a, "x", [1, 2, 3, 4, 5])
    assert [a.block_hash(b) for b in a.block_table("x")[:1]] == chained_block_hashes([1, 2, 3, 4, 5], B)[:1]


def test_mark_computed_takes_numpy_integers_and_refuses_bools_and_floats():
    a = BlockAllocator(16, B, cache_when_computed=True)
    a.allocate("a", list(range(9)))
    before = snapshot(a)
    for bad, exc in ((True, TypeError), (1.5, TypeError), ("4", TypeError), (-1, ValueError), (10, ValueError)):
        with pytest.raises(exc, match="num_computed_tokens"):
            a.mark_computed("a", bad)
    assert snapshot(a) == before
    a.mark_computed("a", np.int64(8))  # two full blocks computed: both published
    a.allocate("b", list(range(9)))
    assert a.num_cached_tokens("b") == 8


def test_positions_must_be_integers():
    a = BlockAllocator(8, B)
    a.allocate("a", list(range(6)))
    table = a.block_table("a")
    assert a.slot("a", np.int64(5)) == table[1] * B + 1
    assert a.slot_mapping("a", np.int64(4), np.int32(6)) == [table[1] * B, table[1] * B + 1]
    for call in (
        lambda: a.slot("a", 1.5),
        lambda: a.slot("a", True),
        lambda: a.slot_mapping("a", 1.5),
        lambda: a.slot_mapping("a", 0, 2.0),
    ):
        with pytest.raises(TypeError, match="position|start|end"):
            call()


def test_num_blocks_may_be_a_numpy_integer():
    a = BlockAllocator(np.int64(4), np.int64(2))
    assert (a.num_blocks, a.block_size) == (4, 2) and type(a.num_blocks) is int


# -- issue 15: a subscriber that raises loses nothing ---------------------------------------------


def _raise_on(kind):
    def callback(event):
        if event.kind == kind:
            raise RuntimeError(f"subscriber failed on {kind}")

    return callback


def _consistent(a: BlockAllocator):
    holders = [0] * a.num_blocks
    for s in a.seq_ids:
        for b in a.block_table(s):
            holders[b] += 1
    assert holders == [a.ref_count(b) for b in range(a.num_blocks)]
    assert a.num_free_blocks == holders.count(0)
    assert a.num_free_blocks + a.num_used_blocks == a.num_blocks


def test_a_subscriber_raising_on_evict_during_allocate_loses_no_block():
    a = BlockAllocator(2, B)
    a.subscribe(_raise_on("evict"))
    seen = []
    a.subscribe(seen.append)  # a second subscriber still gets every event
    a.allocate("a", [1, 2, 3, 4, 5, 6, 7, 8])  # two full blocks, cached
    a.free("a")
    with pytest.warns(RuntimeWarning, match="evict"):
        table = a.allocate("b", [9] * 8)  # both blocks must be evicted
    _consistent(a)
    assert a.block_table("b") == table
    assert_holds(a, "b", [9] * 8)
    assert [e.kind for e in seen][-2:] == ["evict", "allocate"]
    a.free("b")
    assert a.num_free_blocks == 2  # before the fix both blocks were lost for good
    with pytest.warns(RuntimeWarning, match="evict"):
        a.allocate("c", [5] * 8)


@pytest.mark.parametrize("kind", ["evict", "copy_on_write", "append", "fork", "free", "cache_hit", "allocate"])
def test_a_raising_subscriber_leaves_the_same_state_as_no_subscriber(kind):
    """The same operations on two allocators, one with a subscriber that raises on ``kind``:
    the observable states must agree after every step (the quiet twin is the oracle)."""
    quiet, noisy = BlockAllocator(4, B), BlockAllocator(4, B)
    noisy.subscribe(_raise_on(kind))
    ops = [
        ("allocate", "a", [1, 2, 3, 4, 5, 6]),
        ("fork", "a", "b"),
        ("append", "b", 7),
        ("append", "a", 8),
        ("free", "a"),
        ("allocate", "c", [1, 2, 3, 4, 9]),
        ("free", "b"),
        ("allocate", "d", [3] * 12),
        ("append", "d", 1),
        ("free", "c"),
        ("allocate", "e", [1, 2, 3, 4, 5]),
        ("free", "e"),
        ("allocate", "f", [7] * 16),
    ]  # the last one evicts every cached block
    raised = []
    for op, *args in ops:
        results = []
        for a in (quiet, noisy):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    results.append(append_token(a, *args) if op == "append" else getattr(a, op)(*args))
                except (OutOfBlocksError, KeyError) as exc:  # the same refusal on both
                    results.append(type(exc).__name__)
            raised += [w for w in caught if issubclass(w.category, RuntimeWarning)]
        assert results[0] == results[1], (op, args)
        assert snapshot(quiet) == snapshot(noisy), (op, args)
        assert quiet.take_copies() == noisy.take_copies()
        _consistent(noisy)
    assert raised, f"the operations never produced a {kind!r} event: the test would prove nothing"

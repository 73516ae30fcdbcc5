"""The radix-tree prefix cache: hits against a brute-force longest-shared-prefix oracle, the hash
cache as a second oracle, LRU eviction, the computed-only rule, side-effect-free lookups, bad input."""

import random

import pytest

from paged_edu import BlockAllocator
from paged_edu.core.block_pool import OutOfBlocksError
from paged_edu.core.seq_lookup import UnknownSequenceError
from paged_edu.core.radix_cache import RadixAllocator
from paged_edu.core.contract import observable

from allocator_helpers import append_token, assert_holds


def _brute_force_hit(prompt, computed, B):
    """Whole blocks of the longest prefix ``prompt`` shares with a computed sequence, < len(prompt)."""
    best = 0
    for tokens in computed:
        n = 0
        while n < min(len(tokens), len(prompt)) and tokens[n] == prompt[n]:
            n += 1
        best = max(best, n // B * B)
    return min(best, (len(prompt) - 1) // B * B)


@pytest.mark.parametrize("B", [1, 2, 4])
def test_hits_equal_the_longest_computed_prefix_and_the_hash_caches_hits(B):
    """No eviction (a big pool): the radix cache hits exactly the brute-force prefix, as the hash cache does."""
    rng = random.Random(B)
    radix, hashed = RadixAllocator(4096, B), BlockAllocator(4096, B)
    computed, live = [], {}
    for step in range(400):
        if live and rng.random() < 0.4:
            seq = rng.choice(list(live))
            tok = rng.randrange(3)
            append_token(radix, seq, tok)
            append_token(hashed, seq, tok)
            live[seq].append(tok)
        elif live and rng.random() < 0.3:
            seq = rng.choice(list(live))
            computed.append(live.pop(seq))
            radix.free(seq)
            hashed.free(seq)
        else:
            base = rng.choice(computed + list(live.values())) if (computed or live) and rng.random() < 0.8 else []
            prompt = base[: rng.randrange(len(base) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(1, 6))]
            expected = _brute_force_hit(prompt, computed + list(live.values()), B)
            assert radix.num_cached_tokens_for(prompt) == expected
            radix.allocate(step, prompt)
            hashed.allocate(step, prompt)
            assert radix.num_cached_tokens(step) == expected == hashed.num_cached_tokens(step)
            live[step] = list(prompt)
        for seq, tokens in live.items():
            assert_holds(radix, seq, tokens)


def test_a_block_is_hit_only_once_its_kv_is_computed():
    a = RadixAllocator(16, 4, cache_when_computed=True)
    a.allocate("x", list(range(12)))
    assert a.num_cached_tokens_for(list(range(13))) == 0
    a.mark_computed("x", 9)  # two full blocks computed
    assert a.num_cached_tokens_for(list(range(13))) == 8
    a.free("x")  # a finished sequence's blocks stay in the tree
    assert a.num_cached_tokens_for(list(range(13))) == 8 and a.num_free_blocks == 16


def test_eviction_takes_the_least_recently_used_leaf_first():
    a = RadixAllocator(6, 4, cache_when_computed=False)
    old, new = [1] * 8 + [9], [2] * 8 + [9]
    for name, prompt in (("old", old), ("new", new)):
        a.allocate(name, prompt)
        a.free(name)
    a.allocate("hit-old", old)  # touches "old": now "new" is the least recently used
    a.free("hit-old")
    a.allocate("big", [3] * 16)  # needs 4 blocks: the 2 free tails + "new"'s 2 cached blocks
    assert a.num_cached_tokens_for(old) == 8
    assert a.num_cached_tokens_for(new) == 0


def test_locked_prefixes_are_not_evicted_and_a_full_pool_changes_nothing():
    a = RadixAllocator(4, 4)
    a.allocate("x", [1] * 9)  # 3 blocks, 2 cached and locked
    before = observable(a)
    with pytest.raises(OutOfBlocksError):
        a.allocate("y", [5] * 8)
    assert observable(a) == before
    a.allocate("y", [1] * 8 + [2])  # shares the locked head: 1 fresh block
    assert a.num_cached_tokens("y") == 8 and a.num_free_blocks == 0


def test_lookups_change_nothing_and_agree_with_allocate():
    a = RadixAllocator(32, 4)
    a.allocate(0, list(range(20)))
    before = observable(a)
    probe = list(range(10)) + [99]
    got = a.num_cached_tokens_for(probe)
    assert observable(a) == before
    a.allocate(1, probe)
    assert got == a.num_cached_tokens(1) == 8


def test_bad_input_is_refused_naming_the_problem_and_changes_nothing():
    a = RadixAllocator(8, 4)
    a.allocate("x", [1, 2, 3])
    before = observable(a)
    for call, error, words in [
        (lambda: a.allocate("y", []), ValueError, "empty"),
        (lambda: a.allocate("y", [1, -2]), ValueError, "token"),
        (lambda: a.allocate("y", [1, 2.5]), TypeError, "token"),
        (lambda: a.allocate("x", [1]), ValueError, "sequence id"),
        (lambda: a.mark_computed("x", 3, [-1]), ValueError, "token id"),
        (lambda: append_token(a, "nope", 1), UnknownSequenceError, "unknown sequence"),
        (lambda: a.mark_computed("x", 4), ValueError, "num_computed_tokens"),
        (lambda: a.fork("x", "x"), ValueError, "sequence id"),
        (lambda: a.ref_count(8), ValueError, "block id"),
    ]:
        with pytest.raises(error, match=words):
            call()
        assert observable(a) == before
    with pytest.raises(ValueError, match="block_size"):
        RadixAllocator(8, 0)


def test_the_radix_cache_emits_the_hash_caches_block_events():
    """One pool, two indexes: the same operations give the same event kinds and tables on both."""
    logs = {}
    for name, a in (("radix", RadixAllocator(8, 2)), ("hash", BlockAllocator(8, 2))):
        events = []
        a.subscribe(events.append)
        a.allocate("x", [1, 2, 3])
        append_token(a, "x", 4)
        a.fork("x", "y")
        append_token(a, "y", 5)
        a.allocate("z", [1, 2, 9])  # hits x's first block
        a.free("x")
        logs[name] = [(e.kind, e.seq_id, e.block_ids) for e in events]
    assert [k for k, _, _ in logs["radix"]] == ["allocate", "append", "fork", "append", "cache_hit", "allocate", "free"]
    assert logs["radix"] == logs["hash"]


def test_a_hit_inside_an_edge_stamps_the_matched_half_not_the_unused_tail():
    """Issue 23: after a hit that ends inside an edge, LRU must keep the matched prefix and evict the
    unused tail of the split edge first (SGLang stamps the matched path)."""
    a = RadixAllocator(8, 2)
    p, q = [1, 1, 2, 2, 3, 3, 4], [5, 5, 6, 6, 7]
    for name, prompt in (("p", p), ("q", q), ("r", [1, 1, 9])):  # r hits p's first block only
        a.allocate(name, prompt)
        a.free(name)
    a.allocate("big", [8] * 10)  # 5 blocks: the 3 free ones + the 2 least recently used cached ones
    assert a.num_cached_tokens_for([1, 1, 2, 2, 3, 3, 0]) == 2  # p's unused tail went first ...
    assert a.num_cached_tokens_for(q) == 4  # ... not q, used later, nor the head r just hit


def test_the_eviction_heap_stays_bounded_while_nothing_is_evicted():
    """Issue 23: one heap entry per request without eviction grew the heap without bound."""
    a = RadixAllocator(64, 2)
    for i in range(3000):
        a.allocate(i, [1, 1, 2, 2, 3])
        a.free(i)
    assert len(a.tree._candidates) <= 2 * a.tree.num_nodes + 64


def test_publishing_at_once_never_hands_out_a_slot_in_a_block_others_hold():
    """Issue 23: with cache_when_computed=False the append that fills a block the tree already holds
    (the same tokens computed twice) returned a slot in the tree's copy, held by another sequence."""
    for B in (1, 2):
        a = RadixAllocator(16, B)
        a.allocate("x", [1, 2, 3])
        a.allocate("y", [1, 2, 3])
        append_token(a, "x", 4)
        [slot] = a.append_slots("y")  # handed out before anything is published
        assert a.ref_count(slot // B) == 1
        a.mark_computed("y", 4, [4])  # the K/V of [.., 4] is written now: y may take the tree's copy
        append_token(a, "y", 5)
        assert_holds(a, "y", [1, 2, 3, 4, 5])


def test_the_caching_policy_cannot_change_while_sequences_are_live():
    """Issue 23: flipping cache_when_computed under live sequences is refused, as the hash cache does
    (issue 20: the policy is the constructor's; no setter changes it at all)."""
    for a in (RadixAllocator(8, 2), BlockAllocator(8, 2)):
        a.allocate("x", [1, 2, 3])
        with pytest.raises(AttributeError, match="cache_when_computed"):
            a.cache_when_computed = True
        assert a.cache_when_computed is False


def test_reset_prefix_cache_drops_what_no_sequence_holds_and_says_what_it_could_not():
    """Issue 23 item 3, on both indexes: cached blocks nobody holds become plain free blocks (one
    evict event each); blocks a live sequence holds stay, and their number is returned."""
    for a in (RadixAllocator(8, 2), BlockAllocator(8, 2)):
        a.allocate("done", [1, 2, 3, 4, 5])
        a.free("done")
        a.allocate("live", [7, 7, 8, 8, 9])
        events = []
        a.subscribe(events.append)
        assert a.num_cached_blocks == 4
        assert a.reset_prefix_cache() == 2  # live's two full blocks
        assert sorted(b for e in events for b in e.block_ids) == sorted(set(b for e in events for b in e.block_ids))
        assert [e.kind for e in events] == ["evict", "evict"] and a.num_cached_blocks == 2
        assert a.num_cached_tokens_for([1, 2, 3, 4, 5]) == 0 and a.num_cached_tokens_for([7, 7, 8, 8, 9]) == 4
        assert a.num_free_blocks == 5
        a.free("live")
        assert a.reset_prefix_cache() == 0 and a.num_cached_blocks == 0 and a.num_free_blocks == 8

"""DecodeTables (the decode steps' block tables kept across steps) against a fresh pack of the
allocator's lists, after random allocator operations; and the version numbers it relies on."""

from __future__ import annotations

import random

import numpy as np
import pytest

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.radix_cache import RadixAllocator
from paged_edu.engine.decode_tables import DecodeTables

B = 4


def fresh_pack(tables: list[list[int]]) -> np.ndarray:
    """The oracle: the zero-padded (C, W) matrix, written out with Python loops."""
    W = max(len(t) for t in tables)
    out = np.zeros((len(tables), W), dtype=np.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out


def make(kind: str):
    if kind == "hash":
        return BlockAllocator(64, B, cache_when_computed=True)
    return RadixAllocator(64, B, cache_when_computed=True)


@pytest.mark.parametrize("kind", ["hash", "radix"])
@pytest.mark.parametrize("seed", range(6))
def test_matrix_matches_a_fresh_pack_after_random_operations(kind, seed):
    """Allocations with shared prompts (cache hits, and the radix index swapping a block for the
    cache's copy), appends, forks (copy-on-write of a shared last block), frees and a freed id
    allocated again: every step's matrix, for a random subset of the live sequences in random order,
    equals the allocator's tables packed afresh."""
    rng = random.Random(seed)
    a = make(kind)
    tables = DecodeTables(a.block_table_versions)
    tokens: dict[int, list[int]] = {}
    prompts = [[rng.randrange(5) for _ in range(rng.randrange(1, 3 * B))] for _ in range(3)]
    next_id = 0
    checked = 0
    for _ in range(300):
        op = rng.random()
        live = list(tokens)
        try:
            if op < 0.15 or not live:  # a new sequence, or a freed id again, often with a shared prompt
                sid = rng.choice([next_id, *[i for i in range(next_id) if i not in tokens]])
                next_id = max(next_id, sid + 1)
                prompt = list(rng.choice(prompts)) + [rng.randrange(5) for _ in range(rng.randrange(3))]
                a.allocate(sid, prompt)
                tokens[sid] = prompt
                a.mark_computed(sid, len(prompt))  # publishes (and may dedupe) its full blocks
            elif op < 0.22:  # fork: the child shares every block, the next append copies the last one
                parent = rng.choice(live)
                a.fork(parent, next_id)
                tokens[next_id] = list(tokens[parent])
                next_id += 1
            elif op < 0.30:
                sid = rng.choice(live)
                a.free(sid)
                del tokens[sid]
            else:  # a decode: a slot by count, then its id with mark_computed
                sid = rng.choice(live)
                a.append_slots(sid)
                tokens[sid].append(rng.randrange(5))
                a.mark_computed(sid, len(tokens[sid]), tokens[sid][a.num_known_tokens(sid) :])
        except Exception as exc:  # a full pool changes nothing: free someone and go on
            assert type(exc).__name__ == "OutOfBlocksError", exc
            sid = rng.choice(live)
            a.free(sid)
            del tokens[sid]
            continue
        live = list(tokens)
        if not live:
            continue
        step = rng.sample(live, rng.randrange(1, len(live) + 1))
        lists = a.block_tables(step)
        lens = np.array([len(t) for t in lists], dtype=np.int64)
        got = tables.matrix(step, lists, lens)
        np.testing.assert_array_equal(got, fresh_pack(lists))
        checked += 1
    assert checked > 200


def test_a_step_that_only_appends_within_blocks_writes_no_row():
    """What it saves: once copied, a table that did not change is not written again, and one that
    grew by a block gets one write; a copy-on-write (a new version) rewrites its row."""
    a = BlockAllocator(32, B, cache_when_computed=True)
    for sid in range(3):
        a.allocate(sid, [sid] * (B + 1))  # two blocks each, the second with room for 3 more tokens
    tables = DecodeTables(a.block_table_versions)

    def step(ids):
        lists = a.block_tables(ids)
        before = tables.num_rows_written
        got = tables.matrix(ids, lists, np.array([len(t) for t in lists]))
        np.testing.assert_array_equal(got, fresh_pack(lists))
        return tables.num_rows_written - before

    assert step([0, 1, 2]) == 3  # first sight: every row written
    for sid in range(3):
        a.append_slots(sid)  # within the second block
    assert step([2, 0, 1]) == 0
    a.append_slots(0, 3)  # sequence 0 takes a third block
    assert step([0, 1, 2]) == 1
    a.fork(1, 7)  # the child shares sequence 1's partly filled last block
    assert step([0, 1, 2, 7]) == 1  # the child's row, new
    a.append_slots(7)  # copy-on-write of the shared last block: a new version
    assert step([0, 1, 2, 7]) == 1


def test_versions_change_exactly_when_a_table_is_edited_in_place():
    a = RadixAllocator(32, B, cache_when_computed=True)
    a.allocate(0, [1] * (2 * B))
    a.allocate(1, [1] * (2 * B))  # nothing published yet: its own blocks
    (v0,), (v1,) = a.block_table_versions([0]), a.block_table_versions([1])
    assert v0 != v1
    a.append_slots(0)  # grows (a new block): same version
    assert a.block_table_versions([0]) == [v0]
    a.mark_computed(0, 2 * B)  # publishes sequence 0's two blocks
    table_before = a.block_table(1)
    a.mark_computed(1, 2 * B)  # the same tokens: the radix index swaps sequence 1's blocks for 0's
    assert a.block_table(1) != table_before
    assert a.block_table_versions([1]) != [v1]
    a.fork(0, 5)
    assert a.block_table_versions([5]) != a.block_table_versions([0])
    with pytest.raises(KeyError, match="unknown sequence id 9"):
        a.block_table_versions([0, 9])

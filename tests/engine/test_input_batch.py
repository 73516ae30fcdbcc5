"""The persistent input batch (paged_edu.engine.input_batch) against a from-scratch build: after random
steps of a real scheduler -- admissions with shared prompts, decodes, preemption (recompute and swap),
parallel sampling (forks, copy-on-write), aborts, failed steps -- every batch equals the batch defined
token by token from the sequences and the allocator's tables, its placeholders read as the tokens the
last step drew; and the kept table rows against the allocator's lists after random allocator
operations. Plus the version numbers the rows rely on, and what the steady state saves."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.radix_cache import RadixAllocator
from paged_edu.engine.batch import BatchChunk
from paged_edu.engine.input_batch import InputBatch
from paged_edu.engine.sampling import Sampler, SamplingParams, plan_sampling, tokens_by_sequence
from paged_edu.sched.memory_manager import block_table_versions_reader, block_tables_reader, latest_table_version_reader
from paged_edu.sched.scheduler import Scheduler
from paged_edu.sched.scheduler_output import ScheduledSeq, SchedulerOutput
from paged_edu.sched.sequence import Sequence

from test_runner import brute_force_batch  # the batch by its definition, one token at a time

B = 4


def fresh_pack(tables: list[list[int]]) -> np.ndarray:
    """The oracle: the zero-padded (C, W) matrix, written out with Python loops."""
    W = max(len(t) for t in tables)
    out = np.zeros((len(tables), W), dtype=np.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out


def make(kind: str, num_blocks: int = 64):
    if kind == "hash":
        return BlockAllocator(num_blocks, B, cache_when_computed=True)
    return RadixAllocator(num_blocks, B, cache_when_computed=True)


def input_batch(a, watermark: bool = True) -> InputBatch:
    """``watermark=False``: version numbers but no latest number (every row's version read each step)."""
    latest = latest_table_version_reader(a) if watermark else None
    return InputBatch(B, block_tables_reader(a), block_table_versions_reader(a), latest)


# ----------------------------------------------------------------------------------------------
# Whole steps against the definition
# ----------------------------------------------------------------------------------------------


def decode_step(group: list[Sequence], as_chunks: bool = False) -> SchedulerOutput:
    """A step that decodes ``group``, each at its computed count: as the scheduler sends leading decodes
    (the two lists), or as ``ScheduledSeq`` s in ``chunks`` (decodes after a prompt chunk) -- the batch
    must not depend on which."""
    if as_chunks:
        return SchedulerOutput(chunks=[ScheduledSeq(q, 1, q.num_computed_tokens, True) for q in group])
    return SchedulerOutput(decode_seqs=list(group), decode_starts=[q.num_computed_tokens for q in group])


def assert_batch_is_the_definition(batch, scheduled, allocator, tokens):
    """``batch`` against the per-token definition of the step (test_runner's brute force) over the
    sequences' tokens and the allocator's tables; ``tokens`` (the last step's draw) resolve the
    placeholders ``-1 - j``."""
    chunks = [
        BatchChunk(
            (it.seq.prompt_token_ids + it.seq.output_token_ids)[it.start : it.start + it.num_new_tokens],
            it.start,
            list(allocator.block_table(it.seq.seq_id)),
        )
        for it in scheduled
    ]
    ids, pos, slots, last, dec, pre = brute_force_batch(chunks, B)
    got_ids = [int(tokens[-1 - i]) if i < 0 else i for i in batch.input_ids.tolist()]
    assert got_ids == ids
    assert batch.positions.tolist() == pos and batch.slot_mapping.tolist() == slots
    assert batch.logits_rows.tolist() == last and batch.num_decodes == len(dec)
    if dec:
        assert batch.decode_seq_lens.tolist() == [c.start + 1 for c in dec]
        np.testing.assert_array_equal(batch.decode_block_tables, fresh_pack([c.block_table for c in dec]))
    if pre:
        np.testing.assert_array_equal(batch.prefill_block_tables, fresh_pack([c.block_table for c in pre]))


@pytest.mark.parametrize("kind", ["hash", "radix", "radix, no watermark"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("seed", range(4))
def test_every_batch_equals_the_definition_after_random_steps(kind, preemption, seed):
    """A real scheduler on a small pool (it preempts), random admissions (shared prompts: cache hits,
    the radix index swapping blocks for its copies), parallel sampling, aborts and failed steps; each
    step's batch -- built row-wise or packed from its chunks, its continuing sequences' tokens from
    the host (as the synchronous engine reads them) or as placeholders (as async scheduling leaves
    them) -- equals the definition; and most decode rows continue (the test would pass vacuously
    otherwise)."""
    rng = random.Random(seed)
    a = make(kind.split(",")[0], num_blocks=48)
    s = Scheduler(
        a,
        max_num_seqs=8,
        max_num_batched_tokens=32,
        preemption_mode=preemption,
        num_cpu_blocks=64 if preemption == "swap" else 0,
    )
    ib, sampler, requests = input_batch(a, watermark="no watermark" not in kind), Sampler(seed), {}
    prompts = [[rng.randrange(5) for _ in range(rng.randrange(1, 3 * B))] for _ in range(3)]
    tokens = None  # the last committed step's draw
    decode_rows = checked = failed = 0
    for step in range(300):
        if (
            rng.random() < 0.25 and len(s.running) + len(s.waiting) + len(s.swapped) < 8
        ):  # a request, often with a shared prompt
            rid = step
            n = rng.choice([1, 1, 1, 2])
            params = SamplingParams(max_tokens=rng.randrange(2, 20), temperature=1.0 if n > 1 else 0.0, n=n)
            seq = Sequence(
                s.new_seq_id(),
                list(rng.choice(prompts)) + [rng.randrange(5) for _ in range(rng.randrange(3))],
                params.max_tokens,
                request_id=rid,
                num_samples=n,
            )
            s.add(seq)
            requests[rid] = SimpleNamespace(params=params)
            sampler.add(rid, params)
        if rng.random() < 0.03 and s.running:  # an abort between steps
            s.abort(rng.choice(s.running))
        sched = s.schedule()
        if sched.is_empty:
            continue
        plan = plan_sampling(sched, sampler, requests)
        batch = ib.prepare(sched, None if plan.forks else plan.chunks)
        assert_batch_is_the_definition(batch, sched.scheduled, a, tokens)
        checked += 1
        decode_rows += batch.num_decodes if batch.is_pure_decode else 0
        drawn = np.array([rng.randrange(5) for _ in plan.chunks])
        ib.launched(drawn if len(drawn) else None)
        if rng.random() < 0.08:  # the step fails after its draw: undone, retried next step
            ib.rollback()
            sampler.rollback()
            failed += 1
            continue
        if rng.random() < 0.5:  # the tokens reach the host before the commit (the synchronous engine)
            ib.read(drawn if len(drawn) else None, drawn)
        ib.commit()
        sampler.commit()
        tokens = drawn if len(drawn) else None
        for seq in s.update(sched, tokens_by_sequence(plan, drawn.tolist()) if len(drawn) else {}):
            sampler.remove(seq.request_id, seq.sample_index)
    assert checked > 150 and failed > 5 and ib.num_decode_steps > 50
    assert ib.num_rows_read < decode_rows // 3  # the rest continued


# ----------------------------------------------------------------------------------------------
# The kept table rows against the allocator's lists
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["hash", "radix"])
@pytest.mark.parametrize("seed", range(6))
def test_kept_rows_match_a_fresh_pack_after_random_operations(kind, seed):
    """Allocations with shared prompts (cache hits, and the radix index swapping a block for the
    cache's copy), appends, forks (copy-on-write of a shared last block), frees and a freed id
    allocated again: every step's matrix, for a random subset of the live sequences in random order,
    equals the allocator's tables packed afresh."""
    rng = random.Random(seed)
    a = make(kind)
    tables = input_batch(a)
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
        rows = tables._rows(step)  # the rows a step of these sequences would use, brought up to date
        tables._refresh([SimpleNamespace(seq_id=i) for i in step], rows, lens)
        np.testing.assert_array_equal(tables.table[rows, : lens.max()], fresh_pack(lists))
        assert not tables.table[rows, lens.max() :].any()  # zeros past each row's length
        checked += 1
    assert checked > 200


def test_a_decode_step_writes_only_the_rows_that_changed():
    """What it saves: a decode step whose sequences continue the last step reads none of them from its
    chunk, and writes only the rows whose table changed since -- a new block (one write each), a
    copy-on-write (a new version) -- and no others; a sequence that finished leaves the others'
    rows as they were."""
    a = BlockAllocator(64, B, cache_when_computed=True)
    seqs = []
    for sid, n in enumerate((B + 1, B + 2, B + 3)):  # at positions 4, 5, 6: one token a step from there
        seq = Sequence(sid, [sid] * n, 50)
        a.allocate(sid, seq.prompt_token_ids)
        seq.num_computed_tokens = n - 1
        seqs.append(seq)
    ib = input_batch(a)
    seen = {}  # seq_id -> its table at the last step

    def step(group):
        sched = decode_step(group)
        changed = sum(seen.get(q.seq_id) != a.block_table(q.seq_id) for q in group)  # the oracle
        seen.update({q.seq_id: a.block_table(q.seq_id) for q in group})
        before = ib.num_rows_written, ib.num_rows_read
        batch = ib.prepare(sched, range(len(group)))
        assert_batch_is_the_definition(batch, sched.scheduled, a, ib.tokens)
        drawn = np.arange(len(group)) + 10 * len(seen)
        ib.launched(drawn)
        ib.commit()
        for q, t in zip(group, drawn):  # as the scheduler's update and its next schedule do
            q.append_token(int(t))
            q.num_computed_tokens += 1
            a.append_slots(q.seq_id)
        return ib.num_rows_written - before[0], changed, ib.num_rows_read - before[1]

    writes = [step(seqs) for _ in range(6)]
    assert writes[0] == (3, 3, 3)  # first sight: every row read from its chunk and written
    assert all(w == c and read == 0 for w, c, read in writes[1:])  # then: continued, only changes written
    assert sum(w for w, _, _ in writes[1:]) == 3 and 0 in [w for w, _, _ in writes[1:]]  # one block each
    a.fork(0, 7)  # the child shares sequence 0's partly filled last block ...
    writes = [step(seqs) for _ in range(2)]  # ... so sequence 0's next slot copies it: a new version
    assert all(w == c and read == 0 for w, c, read in writes) and writes[1][0] >= 1
    w, c, read = step(seqs[:2])  # the third finished: the others continue
    assert w == c < 2 and read == 0
    assert ib.num_decode_steps == 9


def test_the_same_sequences_in_another_order_are_not_read_as_the_last_order():
    """The usual decode step -- the last step's sequences, in its order, each drew -- takes its ids as
    the last draw itself, in order (InputBatch._decode's first branch). The same sequences in another
    order, or a subset, are not that step: each row must still read its own token. Every batch against
    the per-token definition, with the tokens on the host (synchronous) and as placeholders (async)."""
    a = BlockAllocator(64, B, cache_when_computed=True)
    seqs = []
    for sid, n in enumerate((B + 1, B + 2, B + 3, 2)):
        seq = Sequence(sid, [sid + 1] * n, 50)
        a.allocate(sid, seq.prompt_token_ids)
        seq.num_computed_tokens = n - 1
        seqs.append(seq)
    ib = input_batch(a)
    orders = [[0, 1, 2, 3]] * 3 + [[3, 2, 1, 0]] * 2 + [[1, 3]] + [[0, 1, 2, 3]] * 2 + [[2, 0, 3, 1]]
    for step, order in enumerate(orders):
        group = [seqs[k] for k in order]
        sched = decode_step(group, as_chunks=step % 3 == 2)  # either form of a decode
        batch = ib.prepare(sched, range(len(group)))
        assert_batch_is_the_definition(batch, sched.scheduled, a, ib.tokens)
        drawn = np.arange(len(group)) + 10 * step + 5  # distinct per row and step: a row reading another's shows
        ib.launched(drawn)
        if step % 2:  # on the host before the commit (the synchronous engine); else placeholders
            ib.read(drawn, drawn)
        ib.commit()
        for q, t in zip(group, drawn):
            q.append_token(int(t))
            q.num_computed_tokens += 1
            a.append_slots(q.seq_id)
    assert ib.num_decode_steps == len(orders)


def test_a_failed_step_is_not_continued_from():
    """rollback(): the step that failed and the last committed one are forgotten: the retry reads its
    sequences from their chunks (the real token, no placeholder)."""
    a = BlockAllocator(16, B, cache_when_computed=True)
    seq = Sequence(0, [1, 2, 3], 10)
    a.allocate(0, seq.prompt_token_ids)
    seq.num_computed_tokens = 2
    ib = input_batch(a)
    ib.prepare(decode_step([seq]), [0])
    ib.launched(np.array([9]))
    ib.commit()  # its tokens never reached the host (async scheduling): the next step holds a placeholder
    seq.append_token(9)
    seq.num_computed_tokens = 3
    a.append_slots(0)
    batch = ib.prepare(decode_step([seq]), [0])
    assert batch.input_ids.tolist() == [-1] and ib.num_rows_read == 1  # continued: token 0 of the last draw
    ib.launched(np.array([4]))
    ib.rollback()  # undone: the sequence stays at position 3
    batch = ib.prepare(decode_step([seq]), [0])
    assert batch.input_ids.tolist() == [9] and ib.num_rows_read == 2  # read from the sequence
    assert ib.tokens.tolist() == [9]  # the last committed draw stays (async scheduling's placeholders read it)
    ib.launched(tokens := np.array([5]))
    ib.read(tokens, np.array([5]))  # on the host before the commit (the synchronous engine)
    ib.commit()
    seq.append_token(5)
    seq.num_computed_tokens = 4
    a.append_slots(0)
    assert ib.prepare(decode_step([seq], as_chunks=True), [0]).input_ids.tolist() == [5]  # from the host


# ----------------------------------------------------------------------------------------------
# The allocator's version numbers
# ----------------------------------------------------------------------------------------------


def test_versions_change_exactly_when_a_table_is_edited_in_place():
    a = RadixAllocator(32, B, cache_when_computed=True)
    a.allocate(0, [1] * (2 * B))
    a.allocate(1, [1] * (2 * B))  # nothing published yet: its own blocks
    (v0,), (v1,) = a.block_table_versions([0]), a.block_table_versions([1])
    assert v0 != v1 and a.latest_table_version == max(v0, v1)
    a.append_slots(0)  # grows (a new block): same version, no new number
    assert a.block_table_versions([0]) == [v0] and a.latest_table_version == max(v0, v1)
    a.mark_computed(0, 2 * B)  # publishes sequence 0's two blocks
    table_before = a.block_table(1)
    a.mark_computed(1, 2 * B)  # the same tokens: the radix index swaps sequence 1's blocks for 0's
    assert a.block_table(1) != table_before
    assert a.block_table_versions([1]) != [v1]
    assert a.latest_table_version == a.block_table_versions([1])[0]  # the counter moved with the edit
    a.fork(0, 5)
    assert a.block_table_versions([5]) != a.block_table_versions([0])
    with pytest.raises(KeyError, match="unknown sequence id 9"):
        a.block_table_versions([0, 9])

"""The scheduler driven by a brute-force executor whose "model" is a pure function of the prefix.

The executor keeps the KV memory as a dict (slot -> the prefix whose K/V it holds), applies the
scheduler's block copies in order, and before computing any token checks that every earlier token of
the sequence reads back its own prefix through the block table. Because the toy model's next token
depends only on the tokens so far, every run -- whatever the pool size, chunking or preemption mode
-- must produce exactly the tokens of a plain sequential loop (the oracle).
"""

import random

import pytest

from paged_edu import BlockAllocator
from paged_edu.sched.scheduler import Scheduler
from paged_edu.sched.sequence import SequenceStatus
from paged_edu.sim.simulator import MadeUpTokens, _BeamForks

B = 4
VOCAB = 50


def toy_next(tokens) -> int:
    h = 0
    for t in tokens:
        h = (h * 31 + t + 7) % 1_000_003
    return h % VOCAB


def oracle(prompt, max_new, stop=(), n=1):
    outs = []
    for i in range(n):
        tokens = list(prompt)
        out = []
        while len(out) < max_new:
            t = toy_next(tokens)
            if not out:
                t = (t + i) % VOCAB  # sample i of n starts from its own first token
            out.append(t)
            tokens.append(t)
            if t in stop:
                break
        outs.append(out)
    return outs


class BruteForceExecutor:
    positional = False  # hand update the leading decodes' tokens as decode_tokens (the engine's way)

    def __init__(self, scheduler: Scheduler):
        self.s = scheduler
        self.a = scheduler.allocator
        self.gpu: dict[int, tuple] = {}
        self.cpu: dict[int, tuple] = {}
        self.steps = 0

    def _copy(self, src_mem, src, dst_mem, dst):
        for j in range(B):
            if src * B + j in src_mem:
                dst_mem[dst * B + j] = src_mem[src * B + j]
            else:
                dst_mem.pop(dst * B + j, None)

    def step(self):
        out = self.s.schedule()
        self.steps += 1
        assert out.num_batched_tokens <= self.s.max_num_batched_tokens
        assert len(self.s.running) <= self.s.max_num_seqs
        for op, x, y in out.block_ops:
            if op == "swap_out":
                self._copy(self.gpu, x, self.cpu, y)
            elif op == "swap_in":
                self._copy(self.cpu, x, self.gpu, y)
            else:
                self._copy(self.gpu, x, self.gpu, y)
        sampled = {}
        for item in out.scheduled:
            seq = item.seq
            tokens = seq.token_ids
            for p in range(item.start):  # attention reads every earlier token's K/V
                assert self.gpu.get(self.a.slot(seq.seq_id, p)) == tuple(tokens[: p + 1]), (
                    f"seq {seq.seq_id} reads wrong K/V at position {p}"
                )
            for p in range(item.start, item.end):
                self.gpu[self.a.slot(seq.seq_id, p)] = tuple(tokens[: p + 1])
            if item.emits_token:
                t = toy_next(tokens)
                n = seq.samples.num_tokens_to_sample  # (num_samples, less samples aborted before the fork)
                if n > 1:
                    sampled[seq.seq_id] = [(t + i) % VOCAB for i in range(n)]
                else:
                    sampled[seq.seq_id] = t
        if self.positional:  # the leading decodes' tokens as a list, in their order; the rest by sequence
            decode_tokens = [sampled.pop(q.seq_id) for q in out.decode_seqs]
            return self.s.update(out, sampled, now=float(self.steps), decode_tokens=decode_tokens)
        return self.s.update(out, sampled, now=float(self.steps))

    def run(self, max_steps=5000):
        finished = []
        while self.s.has_unfinished():
            finished += self.step()
            assert self.steps < max_steps, "the scheduler made no progress"
        return finished


def make_requests(rng, num, shared_prefix):
    reqs = []
    for _ in range(num):
        prompt = shared_prefix[: rng.randint(1, len(shared_prefix))] + [
            rng.randrange(VOCAB) for _ in range(rng.randint(0, 9))
        ]
        reqs.append((prompt, rng.randint(1, 14)))
    return reqs


class _OneByOne:
    """A paged allocator without ``append_slots_upto``: the scheduler reserves every slot in its loop."""

    def __init__(self, allocator: BlockAllocator) -> None:
        self._allocator = allocator

    def __getattr__(self, name):
        if name == "append_slots_upto":
            raise AttributeError(name)
        return getattr(self._allocator, name)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("num_blocks, budget", [(14, 8), (10, 3), (30, 20)])
def test_bulk_decodes_decide_what_the_loop_decides(mode, num_blocks, budget):
    """``_schedule_decodes`` (the running decodes' slots in one call) schedules, preempts and copies
    exactly as the loop does one sequence at a time (a manager without the bulk call), every step."""
    runs = []
    for bulk in (True, False):
        rng = random.Random(num_blocks * 100 + budget)
        shared = [rng.randrange(VOCAB) for _ in range(11)]
        a = BlockAllocator(num_blocks, B, cache_when_computed=True)
        s = Scheduler(
            a if bulk else _OneByOne(a),
            max_num_seqs=5,
            max_num_batched_tokens=budget,
            preemption_mode=mode,
            num_cpu_blocks=64,
        )
        for i, (p, m) in enumerate(make_requests(rng, 12, shared)):
            s.make_sequence(p, m, stop_token_ids=(3,), num_samples=1 + i % 3)
        executor, steps = BruteForceExecutor(s), []
        schedule = s.schedule

        def recorded(schedule=schedule, steps=steps):
            out = schedule()
            chunks = [(x.seq.seq_id, x.num_new_tokens, x.start, x.emits_token) for x in out.scheduled]
            steps.append((chunks, [q.seq_id for q in out.preempted], list(out.block_ops)))
            return out

        s.schedule = recorded
        bulk_decodes = []
        schedule_decodes = s._schedule_decodes
        s._schedule_decodes = lambda out: bulk_decodes.append(schedule_decodes(out)) or bulk_decodes[-1]
        executor.run()
        runs.append((steps, s.num_preemptions))
        assert (sum(bulk_decodes) > 0) == bulk  # the bulk path ran (with the paged allocator only)
    assert runs[0] == runs[1]
    assert (runs[0][1] > 0) == (num_blocks < 30)  # the small pools preempt


@pytest.mark.parametrize("mode", ["recompute", "swap", "auto"])
@pytest.mark.parametrize(
    "num_blocks, budget, chunked, caching",
    [
        (200, 64, True, True),  # roomy: no preemption
        (14, 8, True, True),  # tight pool, small budget: preemption and chunking
        (14, 40, False, False),  # no chunking, no prefix caching
        (10, 3, True, True),  # tiny budget: prompts span many steps
    ],
)
def test_outputs_equal_the_sequential_oracle(mode, num_blocks, budget, chunked, caching):
    rng = random.Random(num_blocks * 100 + budget)
    shared = [rng.randrange(VOCAB) for _ in range(11)]
    a = BlockAllocator(num_blocks, B, enable_prefix_caching=caching, cache_when_computed=True)
    s = Scheduler(
        a,
        max_num_seqs=5,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        preemption_mode=mode,
        num_cpu_blocks=64,
    )
    reqs = make_requests(rng, 12, shared)
    seqs = [s.make_sequence(p, m, stop_token_ids=(3,)) for p, m in reqs]
    BruteForceExecutor(s).run()
    for seq, (p, m) in zip(seqs, reqs):
        assert seq.output_token_ids == oracle(p, m, stop=(3,))[0]
        assert seq.finish_reason in ("stop", "length")
    assert a.num_free_blocks == num_blocks  # no leaks
    assert s.free_cpu_blocks and len(s.free_cpu_blocks) == 64
    if num_blocks == 14 and budget == 8:
        assert s.num_preemptions > 0  # the case is meant to exercise preemption


@pytest.mark.parametrize("num_blocks, budget", [(200, 64), (14, 8), (10, 3)])
def test_decode_tokens_in_order_give_the_oracles_tokens(num_blocks, budget):
    """``update(..., decode_tokens=...)`` -- the leading decodes' tokens as a list, the others by
    sequence, as the engine hands them -- gives every sample the sequential loop's tokens (parallel
    samples among them: a decode whose token is a list of samples is taken back by the loop)."""
    rng = random.Random(num_blocks * 100 + budget)
    shared = [rng.randrange(VOCAB) for _ in range(11)]
    a = BlockAllocator(num_blocks, B, cache_when_computed=True)
    s = Scheduler(a, max_num_seqs=5, max_num_batched_tokens=budget, preemption_mode="auto", num_cpu_blocks=64)
    reqs = [(p, m, 1 + i % 3) for i, (p, m) in enumerate(make_requests(rng, 12, shared))]
    seqs = [s.make_sequence(p, m, stop_token_ids=(3,), num_samples=n) for p, m, n in reqs]
    ex = BruteForceExecutor(s)
    ex.positional = True
    finished = ex.run()
    for seq, (p, m, n) in zip(seqs, reqs):
        samples = sorted((f for f in finished if f.request_id == seq.request_id), key=lambda f: f.sample_index)
        assert [f.output_token_ids for f in samples] == oracle(p, m, stop=(3,), n=n)
    assert a.num_free_blocks == num_blocks


def test_decode_tokens_after_an_abort_match_the_map():
    """A decode aborted between ``schedule`` and ``update`` (async scheduling reads a step late) stops
    the bulk pass; the decodes after it get their tokens from ``decode_tokens`` all the same: the
    sequences end as with the tokens handed by sequence. A list of the wrong length is refused, and
    nothing changes."""
    runs = []
    for positional in (False, True):
        a = BlockAllocator(200, B, cache_when_computed=True)
        s = Scheduler(a, max_num_seqs=8, max_num_batched_tokens=64)
        seqs = [s.make_sequence([5 + i, 9, 13], 6 + i) for i in range(6)]
        for step in range(12):
            out = s.schedule()
            if step == 3:
                s.abort(out.decode_seqs[2])  # in the middle of the step's decodes
            sampled = {q.seq_id: toy_next(q.token_ids) for q in out.chunk_seqs()}
            if positional:
                tokens = [sampled.pop(q.seq_id) for q in out.decode_seqs]
                if step == 5:
                    before = [(q.num_computed_tokens, list(q.output_token_ids)) for q in seqs]
                    with pytest.raises(ValueError, match="decode_tokens"):
                        s.update(out, sampled, float(step), decode_tokens=tokens[:-1])
                    assert [(q.num_computed_tokens, list(q.output_token_ids)) for q in seqs] == before
                s.update(out, sampled, float(step), decode_tokens=tokens)
            else:
                s.update(out, sampled, float(step))
        runs.append([(q.output_token_ids, q.finish_reason, q.num_computed_tokens, q.token_times) for q in seqs])
    assert runs[0] == runs[1]
    assert runs[0][2][1] == "abort" and sum(r[1] == "length" for r in runs[0]) == 5


def test_held_placeholders_replaced_in_place_as_appends():
    """``update(..., num_held)``: leading decodes that already hold a placeholder for their token (async
    scheduling's hold: the token appended as ``-1 - i``, the counts advanced) end exactly as decodes
    updated by append -- tokens, counts, times, the blocks published -- also when a held decode's token
    is not a plain int (a numpy integer: the bulk pass stops, the placeholder goes back, the loop appends).
    A bad ``num_held`` is refused, and nothing changes."""
    np = pytest.importorskip("numpy")
    runs = []
    for hold in (False, True):
        a = BlockAllocator(200, B, cache_when_computed=True)
        s = Scheduler(a, max_num_seqs=8, max_num_batched_tokens=64)
        seqs = [s.make_sequence([5 + i, 9, 13], 6 + i, stop_token_ids=(3,)) for i in range(6)]
        for step in range(14):
            out = s.schedule()
            sampled = {q.seq_id: toy_next(q.token_ids) for q in out.chunk_seqs()}
            tokens = [sampled.pop(q.seq_id) for q in out.decode_seqs]
            if step == 4 and len(tokens) > 3:
                tokens[2] = np.int64(tokens[2])
            num_held = 0
            if hold:
                for q, start in zip(out.decode_seqs, out.decode_starts):
                    if q.status is not SequenceStatus.RUNNING:
                        break
                    num_held += 1
                    q.output_token_ids.append(-num_held)
                    q.num_tokens += 1
                    q.num_computed_tokens = start + 1
                if step == 5:
                    before = [(q.num_tokens, q.num_computed_tokens, list(q.output_token_ids)) for q in seqs]
                    with pytest.raises(ValueError, match="num_held"):
                        s.update(out, sampled, float(step), tokens, len(tokens) + 1)
                    assert [(q.num_tokens, q.num_computed_tokens, list(q.output_token_ids)) for q in seqs] == before
            s.update(out, sampled, float(step), tokens, num_held)
        runs.append(
            [(q.output_token_ids, q.num_tokens, q.num_computed_tokens, q.token_times, q.finish_reason) for q in seqs]
            + [[a.block_hash(b) for b in range(a.num_blocks)]]
        )
    assert runs[0] == runs[1]
    assert all(-1 not in r[0] for r in runs[1][:-1]) and any(runs[1][-1])


def test_parallel_samples_share_prompt_blocks_then_copy_on_write():
    a = BlockAllocator(40, B, cache_when_computed=True)
    s = Scheduler(a, max_num_batched_tokens=64)
    prompt = list(range(10))  # 2 full blocks + a partial one
    parent = s.make_sequence(prompt, 5, num_samples=3)
    ex = BruteForceExecutor(s)
    ex.step()  # the prompt is computed and three first tokens sampled
    family = [q for q in s.running if q.request_id == parent.request_id]
    assert len(family) == 3
    tables = [a.block_table(q.seq_id) for q in family]
    assert tables[0] == tables[1] == tables[2]
    assert all(a.ref_count(b) == 3 for b in tables[0])
    out = s.schedule()  # each appends its own token into the shared partial block
    assert len(out.blocks_to_copy) == 2  # two copy, the last owner writes in place
    tables = [a.block_table(q.seq_id) for q in family]
    assert tables[0][:2] == tables[1][:2] == tables[2][:2]
    assert len({t[2] for t in tables}) == 3
    # finish the run with the executor: the copies were already taken, so re-apply them.
    for src, dst in out.blocks_to_copy:
        ex._copy(ex.gpu, src, ex.gpu, dst)
    sampled = {}
    for item in out.scheduled:
        for p in range(item.start, item.end):
            ex.gpu[a.slot(item.seq.seq_id, p)] = tuple(item.seq.token_ids[: p + 1])
        sampled[item.seq.seq_id] = toy_next(item.seq.token_ids)
    s.update(out, sampled, now=2.0)
    ex.run()
    outs = sorted(q.output_token_ids for q in family)
    assert outs == sorted(oracle(prompt, 5, n=3))
    assert a.num_free_blocks == 40


def test_swap_mode_swaps_and_recompute_mode_requeues():
    for mode in ("recompute", "swap"):
        a = BlockAllocator(6, B, cache_when_computed=True)
        s = Scheduler(a, max_num_seqs=4, max_num_batched_tokens=32, preemption_mode=mode, num_cpu_blocks=16)
        seqs = [s.make_sequence([i] * 5, 10) for i in range(3)]
        ex = BruteForceExecutor(s)
        saw = False
        while s.has_unfinished():
            out_before = len(s.swapped) + len(s.waiting)
            ex.step()
            if mode == "swap" and s.swapped:
                saw = True
            if mode == "recompute" and s.num_preemptions and out_before >= 0:
                saw = True
        assert saw and s.num_preemptions > 0
        for i, seq in enumerate(seqs):
            assert seq.output_token_ids == oracle([i] * 5, 10)[0]


def test_bad_configuration_and_requests():
    a = BlockAllocator(4, B, cache_when_computed=True)
    with pytest.raises(ValueError, match="preemption_mode"):
        Scheduler(a, preemption_mode="drop")
    with pytest.raises(ValueError, match="num_cpu_blocks"):
        Scheduler(a, preemption_mode="swap")
    with pytest.raises(ValueError, match="max_num_seqs"):
        Scheduler(a, max_num_seqs=0)
    s = Scheduler(a)
    with pytest.raises(ValueError, match="more than the whole pool"):
        s.make_sequence([1] * 10, 10)  # 20 tokens > 4 blocks of 4
    with pytest.raises(ValueError, match="empty"):
        s.make_sequence([], 3)
    s2 = Scheduler(a, enable_chunked_prefill=False, max_num_batched_tokens=4)
    with pytest.raises(ValueError, match="chunked prefill"):
        s2.make_sequence([1] * 3, 3)  # may re-prefill 5 tokens
    assert not s.has_unfinished() and not s2.has_unfinished()


def test_auto_mode_swaps_parallel_samples_and_recomputes_lone_sequences():
    a = BlockAllocator(8, B, cache_when_computed=True)
    s = Scheduler(a, max_num_batched_tokens=64, preemption_mode="auto", num_cpu_blocks=32)
    family = s.make_sequence([2] * 6, 12, num_samples=2)
    lone = [s.make_sequence([1] * 6, 12), s.make_sequence([3] * 5, 12)]
    ex = BruteForceExecutor(s)
    swapped_ids, recomputed_ids = set(), set()
    while s.has_unfinished():
        ex.step()
        swapped_ids |= {q.request_id for q in s.swapped}
        recomputed_ids |= {q.request_id for q in s.waiting if q.num_preemptions}
    assert swapped_ids == {family.request_id}
    assert recomputed_ids == {q.request_id for q in lone}
    for q, prompt in zip(lone, ([1] * 6, [3] * 5)):
        assert q.output_token_ids == oracle(prompt, 12)[0]
    assert a.num_free_blocks == 8 and len(s.free_cpu_blocks) == 32


class _PrivateWritesOnly(dict):
    """GPU memory that refuses a write into a block another live sequence can read (ref count > 1)."""

    def __init__(self, allocator):
        super().__init__()
        self.a = allocator

    def __setitem__(self, slot, value):
        block = slot // B
        assert self.a.ref_count(block) <= 1, f"write into block {block} shared by {self.a.ref_count(block)} sequences"
        super().__setitem__(slot, value)


def test_swapped_in_prefill_never_recomputes_into_a_shared_cached_block():
    # Request 3 is swapped out after computing 3 tokens of its first block; meanwhile request 0
    # publishes that block, so the swap-in hits it. Recomputing token 3 would write into a block
    # four sequences read (found by a randomised run; the requests are kept as found).
    reqs = [
        ([48, 42, 10, 23, 14, 33, 29, 1, 22, 12, 14, 46], 10, (3,), 1),
        ([48, 42, 10, 23, 14, 33, 29, 1, 24, 26, 39, 25, 16, 1], 2, (3,), 1),
        ([48, 42, 10, 23, 14, 41, 5, 37, 0, 4, 15], 5, (3,), 3),
        ([48, 42, 10, 23, 14, 33, 10, 18, 35, 27, 9], 9, (16,), 1),
        ([48, 42, 10, 23, 44, 37, 10, 27, 25, 14, 38, 44, 10], 2, (3,), 2),
        ([48, 42, 10, 23, 14, 33, 29, 1, 24, 38, 37], 2, (30,), 2),
        ([48, 42, 32, 32, 10, 16, 4, 0, 33], 1, (3,), 2),
        ([48, 42, 10, 23, 14, 33, 25, 30, 21, 32], 4, (3,), 2),
    ]
    a = BlockAllocator(13, B, cache_when_computed=True)
    s = Scheduler(a, max_num_seqs=6, max_num_batched_tokens=40, preemption_mode="swap", num_cpu_blocks=64)
    seqs = [s.make_sequence(p, m, stop_token_ids=stop, num_samples=n) for p, m, stop, n in reqs]
    ex = BruteForceExecutor(s)
    ex.gpu = _PrivateWritesOnly(a)
    finished = ex.run()
    assert s.num_preemptions > 0
    for seq, (p, m, stop, n) in zip(seqs, reqs):
        samples = sorted((f for f in finished if f.request_id == seq.request_id), key=lambda f: f.sample_index)
        assert [f.output_token_ids for f in samples] == oracle(p, m, stop=stop, n=n)
    assert a.num_free_blocks == 13 and len(s.free_cpu_blocks) == 64


@pytest.mark.parametrize("mode", ["recompute", "swap", "auto"])
def test_parallel_samples_count_against_max_num_seqs(mode):
    # A request of n samples becomes n running sequences at its first token, so admission counts it
    # as n (vLLM does the same); the executor checks len(running) <= max_num_seqs after every step.
    reqs = [([1, 2, 3, 4, 5], 6, 3), ([7] * 6, 4, 1), ([1, 2, 3, 9], 5, 2), ([1, 2, 3, 4, 8], 6, 3)]
    a = BlockAllocator(24, B, cache_when_computed=True)
    s = Scheduler(a, max_num_seqs=4, max_num_batched_tokens=16, preemption_mode=mode, num_cpu_blocks=32)
    seqs = [s.make_sequence(p, m, num_samples=n) for p, m, n in reqs]
    ex = BruteForceExecutor(s)
    finished, peak = [], 0
    while s.has_unfinished():
        finished += ex.step()
        peak = max(peak, len(s.running))
        assert ex.steps < 500
    assert peak == 4  # the limit is reached, never passed
    for seq, (p, m, n) in zip(seqs, reqs):
        samples = sorted((f for f in finished if f.request_id == seq.request_id), key=lambda f: f.sample_index)
        assert [f.output_token_ids for f in samples] == oracle(p, m, n=n)
    assert a.num_free_blocks == 24
    with pytest.raises(ValueError, match="max_num_seqs=4"):
        s.make_sequence([1, 2], 3, num_samples=5)  # could never run: refused, not queued forever
    assert not s.has_unfinished()


def _brute_force_num_seqs(s: Scheduler) -> int:
    """What ``max_num_seqs`` bounds, counted from scratch: every running sequence, and the samples and
    beam branches each will still fork."""
    return len(s.running) + sum(max(seq.max_num_running_seqs - 1, 0) for seq in s.running)


@pytest.mark.parametrize("mode, seed", [("recompute", 0), ("swap", 1), ("auto", 10), ("recompute", 22)])
def test_the_kept_sequence_count_equals_a_count_from_scratch(mode, seed):
    """``Scheduler._num_seqs`` is kept as sequences start, stop and fork; at every step it equals the
    count from scratch through parallel samples, beam branches forked later (``Scheduler.fork``),
    preemption, aborts of sequences and aborts of samples not forked yet (through the request's
    record, which the scheduler does not see)."""
    rng = random.Random(seed)
    a = BlockAllocator(16, B, cache_when_computed=True)
    s = Scheduler(a, max_num_seqs=6, max_num_batched_tokens=12, preemption_mode=mode, num_cpu_blocks=64)
    ex, beams, model = BruteForceExecutor(s), _BeamForks(), MadeUpTokens()
    branches = {}  # a beam parent -> the output lengths at which it forks its next branches (next last)
    seen = dict.fromkeys(("forks", "preemptions", "sample aborts", "aborts"), 0)
    for i in range(30):
        prompt, max_new = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 9))], rng.randint(2, 12)
        if i % 3 == 2:  # a beam: forks 1-2 branches as its output grows
            seq = s.make_sequence(prompt, max_new, num_pending_forks=rng.randint(1, 2))
            branches[seq] = sorted(rng.sample(range(1, max_new), min(seq.num_pending_forks, max_new - 1)), reverse=True)
            seq.num_pending_forks = len(branches[seq])
        else:
            s.make_sequence(prompt, max_new, num_samples=rng.randint(1, 3))
    while s.has_unfinished():
        assert s._num_seqs() == _brute_force_num_seqs(s)
        before = s.num_preemptions
        ex.step()
        seen["preemptions"] += s.num_preemptions > before
        assert s._num_seqs() == _brute_force_num_seqs(s)
        for parent, points in branches.items():  # branches due, right after the parent sampled: the simulator's forks
            if parent.status is SequenceStatus.RUNNING:
                num_points = len(points)
                beams.fork(s, model, parent, points)  # Scheduler.fork for each point reached
                seen["forks"] += num_points - len(points)
        if rng.random() < 0.15:  # abort a sample not forked yet, or a whole sequence
            drawing = [q for q in s.running if q.samples.num_tokens_to_sample > 1]  # counted, running
            if drawing and rng.random() < 0.7:
                record = drawing[0].samples
                for stopped in record.abort(rng.choice(record.sample_indices(drawing[0]))):
                    s.abort(stopped)
                seen["sample aborts"] += 1
            elif s.running:
                s.abort(rng.choice(s.running))
                seen["aborts"] += 1
        assert ex.steps < 2000
    assert s._num_seqs() == 0 and a.num_free_blocks == 16
    assert min(seen.values()) > 0, seen  # every kind of change happened


def test_swap_in_does_not_count_towards_the_prefix_hit_rate():
    """The hit rate counts each admitted prompt once (brute force: the sum over first admissions)."""
    a = BlockAllocator(7, B, cache_when_computed=True)
    s = Scheduler(a, max_num_batched_tokens=64, preemption_mode="swap", num_cpu_blocks=32)
    seqs = [s.make_sequence([5] * 8 + [i], 10) for i in range(3)]
    ex = BruteForceExecutor(s)
    first_admission, swapped = {}, 0
    while s.has_unfinished():
        ex.step()
        swapped += len(s.swapped)
        for q in s.running:
            first_admission.setdefault(q.seq_id, (q.num_prompt_tokens, q.num_cached_tokens))
    assert swapped > 0  # some sequence really went to CPU and came back
    assert a.stats.queried_tokens == sum(n for n, _ in first_admission.values()) == 27
    assert a.stats.hit_tokens == sum(c for _, c in first_admission.values())
    assert all(q.output_token_ids == oracle(q.prompt_token_ids, 10)[0] for q in seqs)


def test_abort_releases_memory_wherever_the_sequence_is():
    a = BlockAllocator(7, B, cache_when_computed=True)
    s = Scheduler(a, max_num_batched_tokens=64, preemption_mode="swap", num_cpu_blocks=32)
    seqs = [s.make_sequence([5] * 8 + [i], 10) for i in range(3)]
    ex = BruteForceExecutor(s)
    while not s.swapped:  # run until one sequence sits in CPU memory
        ex.step()
    victims = [s.swapped[0], s.running[0]]
    for seq in victims:
        s.abort(seq)
        assert seq.is_finished and seq.finish_reason == "abort"
    # the aborted one's CPU blocks came back; only sequences still swapped hold any
    assert len(s.free_cpu_blocks) == 32 - sum(len(s.swap_space._held[q.seq_id]) for q in s.swapped)
    assert victims[0] not in s.swapped and victims[1] not in s.running
    ex.run()
    assert a.num_free_blocks == 7
    for seq in seqs:
        if seq not in victims:
            assert seq.output_token_ids == oracle(seq.prompt_token_ids, 10)[0]


def _state(s: Scheduler):
    """Everything abort could disturb: queues, free GPU blocks and block tables, free CPU blocks."""
    a = s.allocator
    return (
        [q.seq_id for q in s.waiting],
        [q.seq_id for q in s.running],
        [q.seq_id for q in s.swapped],
        a.num_free_blocks,
        {i: a.block_table(i) for i in a.seq_ids},
        s.free_cpu_blocks,
        s.has_unfinished(),
    )


def test_abort_of_an_unknown_or_finished_sequence_is_refused_and_changes_nothing():
    from paged_edu.sched.sequence import Sequence

    a = BlockAllocator(16, B, cache_when_computed=True)
    s = Scheduler(a, max_num_batched_tokens=64, preemption_mode="swap", num_cpu_blocks=8)
    done = s.make_sequence([1, 2, 3], 1)
    live = s.make_sequence([4, 5, 6], 6)
    ex = BruteForceExecutor(s)
    ex.step()
    assert done.is_finished and done.finish_reason == "length" and not live.is_finished
    before = _state(s)
    with pytest.raises(ValueError, match="already finished"):
        s.abort(done)
    assert done.finish_reason == "length"  # not rewritten to "abort"
    stranger = Sequence(live.seq_id, [4, 5, 6], 6)  # same id, never added here
    with pytest.raises(ValueError, match="not in this scheduler"):
        s.abort(stranger)
    assert _state(s) == before
    s.abort(live)
    with pytest.raises(ValueError, match="already finished"):  # twice: refused, no leak, no double free
        s.abort(live)
    assert a.num_free_blocks == 16 and not s.has_unfinished() and not a.seq_ids


def test_abort_of_a_family_leaves_nothing_behind():
    a = BlockAllocator(32, B, cache_when_computed=True)
    s = Scheduler(a, max_num_batched_tokens=64)
    parent = s.make_sequence([1, 2, 3, 4, 5], 8, num_samples=3)
    ex = BruteForceExecutor(s)
    ex.step()
    family = list(s.running)
    assert len(family) == 3
    for seq in family:
        s.abort(seq)
    assert parent.finish_reason == "abort" and not s.has_unfinished()
    assert a.num_free_blocks == 32 and not a.seq_ids


def test_requests_that_can_never_run_are_refused_at_add_naming_the_limit():
    a = BlockAllocator(8, B, cache_when_computed=True)
    s = Scheduler(a, max_num_seqs=2, max_model_len=20)
    with pytest.raises(ValueError, match="max_model_len=20"):
        s.make_sequence([1] * 15, 6)  # 21 tokens
    with pytest.raises(ValueError, match=r"whole pool holds \(8 blocks\)"):
        Scheduler(a).make_sequence([1] * 30, 3)  # 33 tokens > 32 slots
    with pytest.raises(ValueError, match="max_num_seqs=2"):
        s.make_sequence([1], 2, num_samples=3)
    s.check_fits(15, 5, 2)  # exactly at every limit: fine
    assert not s.has_unfinished() and a.num_free_blocks == 8
    with pytest.raises(ValueError, match="max_model_len"):
        Scheduler(a, max_model_len=0)


def test_memory_managers_implement_the_protocol_and_early_publishing_is_refused():
    from paged_edu.sched.memory_manager import MemoryManager
    from paged_edu.sim.managers import make_manager

    for name in ("paged", "paged-prefix", "contiguous-max"):
        assert isinstance(make_manager(name, 4096, 16), MemoryManager)
    assert isinstance(BlockAllocator(4, B), MemoryManager)
    with pytest.raises(ValueError, match="cache_when_computed=True"):
        Scheduler(BlockAllocator(4, B))  # would share blocks of half-computed prompts
    Scheduler(BlockAllocator(4, B, enable_prefix_caching=False))  # no cache: nothing published early


def test_a_preempted_sequences_readmission_is_counted_apart_from_prefix_reuse():
    """Issue 21: two 5-token prompts sharing no token on 6 blocks of 2: the recomputed victim hit its
    own blocks (17 tokens queried, 4 hit). As vLLM v1's PrefixCacheStats, re-admissions count apart."""
    a = BlockAllocator(6, 2, cache_when_computed=True)
    s = Scheduler(a)
    for prompt in ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]):
        s.make_sequence(prompt, 3)
    while s.has_unfinished():
        out = s.schedule()
        s.update(out, {x.seq.seq_id: 11 for x in out.scheduled if x.emits_token})
    assert s.num_preemptions == 1
    assert (a.stats.queried_tokens, a.stats.hit_tokens, a.stats.hit_rate) == (10, 0, 0.0)
    assert (a.stats.requests, a.stats.preempted_requests) == (2, 1)
    assert a.stats.preempted_queries == 7 and a.stats.preempted_hits == 4


def test_a_decode_reserves_its_slot_by_count_and_the_ids_follow_when_its_block_fills():
    """Issue 20 item 3: the scheduler reserves the sampled token's slot without its id (what an
    overlapping scheduler needs for a token still on the GPU); the ids reach the allocator with the
    ``mark_computed`` after the step that fills their block, and only then is that block cached."""
    a = BlockAllocator(16, B, cache_when_computed=True)
    s = Scheduler(a, max_num_batched_tokens=64)
    seq = s.make_sequence([1, 2, 3], 8)
    out = s.schedule()
    s.update(out, {seq.seq_id: 7})  # the prefill: 3 tokens computed, token 7 sampled
    out = s.schedule()  # its decode: a slot for token 7, reserved by count
    assert a.num_tokens(seq.seq_id) == 4 and a.num_known_tokens(seq.seq_id) == 3
    assert a.num_cached_tokens_for([1, 2, 3, 7, 9]) == 0
    s.update(out, {seq.seq_id: 8})  # token 7's K/V is written: block 0 is full and known
    assert a.num_known_tokens(seq.seq_id) == 4 and a.num_cached_tokens_for([1, 2, 3, 7, 9]) == B
    out = s.schedule()
    s.update(out, {seq.seq_id: 9})  # token 8 computed: it waits for its block to fill
    assert a.num_tokens(seq.seq_id) == 5 and a.num_known_tokens(seq.seq_id) == 4

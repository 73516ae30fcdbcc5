"""Random allocate / append / fork / free against a brute-force model of the KV memory.

The model is the oracle: a dict from physical slot to what the slot *should* hold. Attention makes
the K/V of token ``p`` a function of every token up to ``p``, so we write ``prefix(p) = tuple of
tokens[: p + 1]`` into a slot whenever the allocator says a token is computed there, and copy slots
when it asks for copy-on-write. After every step each live sequence must read its own prefixes
back through its block table. A position-blind block hash, a stale cache entry after eviction, or a
missing copy-on-write each make some sequence read another prefix's K/V and fail here.
"""

import math

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule, run_state_machine_as_test

from paged_edu import BlockAllocator, OutOfBlocksError

B = 4
NUM_BLOCKS = 14
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 7, 7, 7, 7], [5, 6, 7, 8, 1, 2, 3, 4], [9, 9]]

# Stateful runs: max_examples * stateful_step_count >= 2,000 steps in CI.
STEPS = settings(
    max_examples=120, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def observable(a: BlockAllocator):
    return (
        a.num_free_blocks,
        {s: (a.block_table(s), a.token_ids(s)) for s in a.seq_ids},
        [a.ref_count(b) for b in range(a.num_blocks)],
        [a.block_hash(b) for b in range(a.num_blocks)],
        (a.stats.queried_tokens, a.stats.hit_tokens),
    )


class AllocatorMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    steps_run = 0  # counted across examples, to prove the CI budget of random steps

    def __init__(self):
        super().__init__()
        self.a = BlockAllocator(NUM_BLOCKS, B)
        self.memory: dict[int, tuple] = {}  # slot -> prefix whose K/V it holds
        self.tokens: dict[int, list[int]] = {}  # the model's own record of each sequence
        self.next_id = 0

    def _write(self, seq_id, start):
        tokens = self.tokens[seq_id]
        for p in range(start, len(tokens)):
            self.memory[self.a.slot(seq_id, p)] = tuple(tokens[: p + 1])

    def _apply_copies(self):
        for src, dst in self.a.take_copies():
            for j in range(B):
                if src * B + j in self.memory:
                    self.memory[dst * B + j] = self.memory[src * B + j]

    @rule(target=seqs, prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(0, 3), max_size=6),
          cut=st.integers(0, 9))
    def allocate(self, prefix, suffix, cut):
        AllocatorMachine.steps_run += 1
        tokens = prefix[: max(1, len(prefix) - cut % 3)] + suffix
        seq_id = self.next_id
        before = observable(self.a)
        try:
            self.a.allocate(seq_id, tokens)
        except OutOfBlocksError:
            assert observable(self.a) == before  # rolled back completely
            return seq_id  # never created: later rules on it are skipped
        self.next_id += 1
        cached = self.a.num_cached_tokens(seq_id)
        assert cached % B == 0 and cached < len(tokens)
        self.tokens[seq_id] = list(tokens)
        # The cached prefix must already hold exactly these prefixes: checked by the invariant.
        self._write(seq_id, cached)
        return seq_id

    @rule(seq=seqs, token=st.integers(0, 3))
    def append(self, seq, token):
        AllocatorMachine.steps_run += 1
        if seq not in self.tokens:
            return
        before = observable(self.a)
        try:
            slot = self.a.append(seq, token)
        except OutOfBlocksError:
            assert observable(self.a) == before
            return
        self._apply_copies()
        self.tokens[seq].append(token)
        assert slot == self.a.slot(seq, len(self.tokens[seq]) - 1)
        self._write(seq, len(self.tokens[seq]) - 1)

    @rule(target=seqs, parent=seqs)
    def fork(self, parent):
        AllocatorMachine.steps_run += 1
        child = self.next_id
        if parent not in self.tokens:
            return child
        self.next_id += 1
        table = self.a.fork(parent, child)
        assert table == self.a.block_table(parent)
        self.tokens[child] = list(self.tokens[parent])
        return child

    @rule(seq=consumes(seqs))
    def free(self, seq):
        AllocatorMachine.steps_run += 1
        if seq not in self.tokens:
            return
        self.a.free(seq)
        del self.tokens[seq]

    @invariant()
    def ref_counts_match_live_tables(self):
        holders = [0] * NUM_BLOCKS
        for s in self.tokens:
            for b in self.a.block_table(s):
                holders[b] += 1
        assert holders == [self.a.ref_count(b) for b in range(NUM_BLOCKS)]
        assert self.a.num_free_blocks == holders.count(0)

    @invariant()
    def tables_have_ceil_len_over_b_blocks(self):
        for s, tokens in self.tokens.items():
            assert len(self.a.block_table(s)) == math.ceil(len(tokens) / B)
            assert self.a.token_ids(s) == tokens

    @invariant()
    def every_sequence_reads_back_its_own_tokens(self):
        for s, tokens in self.tokens.items():
            for p in range(len(tokens)):
                got = self.memory.get(self.a.slot(s, p))
                assert got == tuple(tokens[: p + 1]), (
                    f"sequence {s} position {p}: slot {self.a.slot(s, p)} holds {got}, expected {tokens[: p + 1]}"
                )


def test_random_operations_keep_every_invariant():
    AllocatorMachine.steps_run = 0
    run_state_machine_as_test(AllocatorMachine, settings=STEPS)
    assert AllocatorMachine.steps_run >= 2000, f"only {AllocatorMachine.steps_run} random steps ran"


def test_the_machine_can_catch_a_position_blind_hash(monkeypatch):
    """Sanity check of the oracle: with the seed's per-block hash the machine must fail."""
    import hashlib

    import paged_edu.core.block_hash as block_hash

    monkeypatch.setattr(block_hash, "hash_block", lambda parent, data: hashlib.sha256(data).digest())
    try:
        run_state_machine_as_test(AllocatorMachine, settings=settings(STEPS, max_examples=200, database=None))
    except AssertionError:
        return
    raise AssertionError("the stateful test did not notice a position-blind block hash")

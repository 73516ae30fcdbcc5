"""Random allocate / append / fork / free against a brute-force model of the KV memory; appends go
by count, as a scheduler places them: a slot reserved first, its token resolved later.

The model is the oracle, :class:`paged_edu.core.contract.ContractModel`: a dict from
physical slot to what the slot *should* hold. Attention makes the K/V of token ``p`` a function of
every token up to ``p``, so it writes ``prefix(p) = tuple of tokens[: p + 1]`` into a slot whenever
the allocator says a token is computed there, and copies slots when it asks for copy-on-write.
After every step each live sequence must read its own prefixes back through its block table. A
position-blind block hash, a stale cache entry after eviction, or a missing copy-on-write each make
some sequence read another prefix's K/V and fail here. Lesson 5 checks a learner's allocator with
the same model (:func:`~paged_edu.core.contract.check_contract`).
"""

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule, run_state_machine_as_test

from paged_edu import BlockAllocator
from paged_edu.core import radix_tree
from paged_edu.core.radix_cache import RadixAllocator
from paged_edu.core.contract import B, NUM_BLOCKS, PREFIXES, ContractModel, check_contract

# Stateful runs: max_examples * stateful_step_count >= 2,000 steps in CI.
STEPS = settings(max_examples=120, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class AllocatorMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    steps_run = 0  # counted across examples, to prove the CI budget of random steps
    factory = staticmethod(lambda num_blocks, block_size: BlockAllocator(num_blocks, block_size))

    def __init__(self):
        super().__init__()
        self.model = ContractModel(self.factory(NUM_BLOCKS, B))

    @rule(
        target=seqs,
        prefix=st.sampled_from(PREFIXES),
        suffix=st.lists(st.integers(0, 3), max_size=6),
        cut=st.integers(0, 9),
    )
    def allocate(self, prefix, suffix, cut):
        AllocatorMachine.steps_run += 1
        seq_id = self.model.allocate(prefix[: max(1, len(prefix) - cut % 3)] + suffix)
        return -1 if seq_id is None else seq_id  # never created: later rules on it are skipped

    @rule(seq=seqs, token=st.integers(0, 3))
    def append(self, seq, token):
        AllocatorMachine.steps_run += 1
        self.model.append(seq, token)

    @rule(seq=seqs)
    def reserve_a_slot_before_its_token_exists(self, seq):
        AllocatorMachine.steps_run += 1
        self.model.reserve(seq)

    @rule(seq=seqs, token=st.integers(0, 3))
    def resolve_the_placeholder(self, seq, token):
        AllocatorMachine.steps_run += 1
        self.model.resolve(seq, token)

    @rule(target=seqs, parent=seqs)
    def fork(self, parent):
        AllocatorMachine.steps_run += 1
        child = self.model.fork(parent)
        return -1 if child is None else child

    @rule(seq=consumes(seqs))
    def free(self, seq):
        AllocatorMachine.steps_run += 1
        self.model.free(seq)

    @invariant()
    def ref_counts_match_live_tables(self):
        self.model.check_ref_counts()

    @invariant()
    def tables_have_ceil_len_over_b_blocks(self):
        self.model.check_tables()

    @invariant()
    def every_sequence_reads_back_its_own_tokens(self):
        self.model.check_reads()


def _use_position_blind_hash(monkeypatch):
    """The seed's per-block hash, ``sha256(block)``, wherever the allocator's chain is hashed."""
    import hashlib
    import importlib

    for name in ("paged_edu.core.allocator", "paged_edu.core.block_hash"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "hash_block"):
            monkeypatch.setattr(module, "hash_block", lambda parent, data: hashlib.sha256(data).digest())


def test_random_operations_keep_every_invariant():
    AllocatorMachine.steps_run = 0
    run_state_machine_as_test(AllocatorMachine, settings=STEPS)
    assert AllocatorMachine.steps_run >= 2000, f"only {AllocatorMachine.steps_run} random steps ran"


def test_the_machine_can_catch_a_position_blind_hash(monkeypatch):
    """Sanity check of the oracle: with the seed's per-block hash the machine must fail."""
    _use_position_blind_hash(monkeypatch)
    try:
        run_state_machine_as_test(AllocatorMachine, settings=settings(STEPS, max_examples=200, database=None))
    except AssertionError:
        return
    raise AssertionError("the stateful test did not notice a position-blind block hash")


def test_the_plain_driver_passes_the_library_allocator_and_catches_the_same_bug(monkeypatch):
    """check_contract (no hypothesis, what lesson 5 runs) agrees with the machine on both."""
    report = check_contract(BlockAllocator)
    assert report.ok and report.num_ops >= 2000, report.error
    _use_position_blind_hash(monkeypatch)
    report = check_contract(BlockAllocator)
    assert not report.ok and "expected" in report.error


class RadixMachine(AllocatorMachine):
    """The same machine over the radix-tree prefix cache (block size 4 and token-granular B = 1)."""

    factory = staticmethod(lambda num_blocks, block_size: RadixAllocator(num_blocks, block_size))


class TokenRadixMachine(AllocatorMachine):
    factory = staticmethod(lambda num_blocks, block_size: RadixAllocator(num_blocks, 1))


def _match_first_block_only(monkeypatch):
    """A broken radix cache: an edge whose first block matches is taken as matched whole."""

    def broken(key, packed, start, limit, block_size):
        return (
            min(len(key) // block_size, limit)
            if key[:block_size] == packed[start * block_size : (start + 1) * block_size]
            else 0
        )

    monkeypatch.setattr(radix_tree, "edge_match", broken)


def test_random_operations_keep_every_invariant_on_the_radix_cache():
    for machine in (RadixMachine, TokenRadixMachine):
        AllocatorMachine.steps_run = 0
        run_state_machine_as_test(machine, settings=STEPS)
        assert AllocatorMachine.steps_run >= 2000


def test_the_machine_catches_a_radix_cache_that_matches_only_an_edges_first_block(monkeypatch):
    _match_first_block_only(monkeypatch)
    try:
        run_state_machine_as_test(RadixMachine, settings=settings(STEPS, max_examples=200, database=None))
    except AssertionError:
        return
    raise AssertionError("the stateful test did not notice a radix cache matching only an edge's first block")


def test_the_plain_driver_passes_the_radix_cache_and_catches_the_broken_match(monkeypatch):
    for factory in (RadixAllocator, lambda n, b: RadixAllocator(n, 1), lambda n, b: RadixAllocator(n, b, True)):
        report = check_contract(factory)
        assert report.ok and report.num_ops >= 2000, report.error
    _match_first_block_only(monkeypatch)
    report = check_contract(RadixAllocator)
    assert not report.ok and ("expected" in report.error or "differ" in report.error), report

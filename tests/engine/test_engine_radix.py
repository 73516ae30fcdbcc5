"""The real engine on the radix-tree prefix cache (issue 12): a multi-turn chat, token for token.

Each conversation's turn ``t`` prompt is its turn ``t - 1`` prompt, plus the reply the engine gave,
plus new user tokens -- the workload where a prefix cache pays. Three engines run the same
conversations on the same tiny random Llama (``paged_edu.labs.engine_lab.tiny_model``):

* ``RadixAllocator`` (SGLang's RadixAttention, ``paged_edu.core.radix_cache``),
* ``BlockAllocator`` with prefix caching (vLLM's chained block hashes),
* ``BlockAllocator`` without prefix caching -- the oracle: it computes every K/V itself.

Greedy outputs must be identical across the three (a cache that served a wrong block changes the
tokens: the model is initialised wide so its choices depend on the context), the two caches must hit
the same number of tokens (both hit the longest computed prefix in whole blocks), and the engine
must leave every pool empty. The same again on a pool small enough that the scheduler preempts.
"""

from __future__ import annotations

import random

import pytest

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.radix_cache import RadixAllocator
from paged_edu.labs.engine_lab import engine_on, tiny_model

VOCAB = 512
BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3, vocab_size=VOCAB)


def allocators(num_blocks: int) -> dict:
    return {
        "radix": RadixAllocator(num_blocks, BLOCK_SIZE, cache_when_computed=True),
        "hash": BlockAllocator(num_blocks, BLOCK_SIZE, enable_prefix_caching=True, cache_when_computed=True),
        "none": BlockAllocator(num_blocks, BLOCK_SIZE, enable_prefix_caching=False),
    }


def run_chats(engine, num_chats: int, num_turns: int, max_new_tokens: int, seed: int = 0) -> list[list[list[int]]]:
    """``num_chats`` conversations of ``num_turns`` turns, all chats' turn ``t`` generated together.

    Returns ``replies[chat][turn]``. The user tokens are drawn from one seeded generator, so every
    engine sees the same first prompts; later prompts depend on the engine's own replies.
    """
    rng = random.Random(seed)
    system = [rng.randrange(3, VOCAB) for _ in range(9)]  # shared by every chat, not block-aligned
    prompts = [system + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(2, 9))] for _ in range(num_chats)]
    turns = [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 7))] for _ in range(num_chats * num_turns)]
    replies: list[list[list[int]]] = [[] for _ in range(num_chats)]
    for t in range(num_turns):
        outputs = engine.generate(prompts, max_new_tokens=max_new_tokens)
        for c, out in enumerate(outputs):
            replies[c].append(out)
            prompts[c] = prompts[c] + out + turns[t * num_chats + c]  # the whole conversation so far
    return replies


def assert_empty(engine) -> None:
    a = engine.allocator
    assert not engine.has_unfinished()
    assert a.seq_ids == [] and a.num_used_blocks == 0 and a.num_free_blocks == a.num_blocks
    assert all(a.ref_count(b) == 0 for b in range(a.num_blocks))


def record_admissions(allocator) -> list[tuple[str, list[int], int]]:
    """Wrap the allocator to log ``("allocate", tokens, cached tokens)`` for every admission and
    ``("free", tokens its blocks held, 0)`` for every free (a finish or a preemption): the tokens whose
    ids reached the allocator, at allocate and ``mark_computed`` (the allocator keeps no copy)."""
    log: list[tuple[str, list[int], int]] = []
    known: dict = {}  # seq_id -> the token ids the allocator was given
    allocate, free, mark_computed, fork = allocator.allocate, allocator.free, allocator.mark_computed, allocator.fork

    def logged_allocate(seq_id, token_ids, *, record_stats=True):
        table = allocate(seq_id, token_ids, record_stats=record_stats)
        log.append(("allocate", list(token_ids), allocator.num_cached_tokens(seq_id)))
        known[seq_id] = list(token_ids)
        return table

    def logged_mark_computed(seq_id, num_computed_tokens, token_ids=None):
        mark_computed(seq_id, num_computed_tokens, token_ids)
        if token_ids is not None:  # the ids of the tokens ending at num_computed_tokens
            tokens, begin = known[seq_id], num_computed_tokens - len(token_ids)
            tokens[begin:num_computed_tokens] = list(token_ids)

    def logged_fork(parent_id, child_id):
        table = fork(parent_id, child_id)
        known[child_id] = list(known[parent_id])
        return table

    def logged_free(seq_id):
        log.append(("free", known.pop(seq_id), 0))
        free(seq_id)

    allocator.allocate, allocator.free = logged_allocate, logged_free
    allocator.mark_computed, allocator.fork = logged_mark_computed, logged_fork
    return log


def longest_block_prefix(tokens: list[int], seen: list[list[int]]) -> int:
    """Brute force: the longest prefix of ``tokens`` (whole blocks, never the last token) shared with
    a token list some sequence held earlier -- an upper bound on what any prefix cache can hit."""
    best = 0
    for other in seen:
        n = 0
        for a, b in zip(tokens, other):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return min(best, len(tokens) - 1) // BLOCK_SIZE * BLOCK_SIZE


def test_radix_engine_matches_hash_cache_and_no_cache_roomy(model):
    """A pool that never fills: identical tokens, and the two caches hit exactly as many tokens."""
    results, hits = {}, {}
    for name, allocator in allocators(96).items():
        engine = engine_on(model, allocator)
        results[name] = run_chats(engine, num_chats=4, num_turns=3, max_new_tokens=6)
        hits[name] = allocator.stats.hit_tokens
        assert engine.scheduler.num_preemptions == 0
        assert_empty(engine)
    assert results["radix"] == results["hash"] == results["none"]
    assert hits["none"] == 0
    assert hits["radix"] == hits["hash"] > 0


def test_radix_engine_under_preemption(model):
    """A 14-block pool: the scheduler preempts (recompute), outputs stay identical to the no-cache
    oracle on both caches, and every admission's hit is whole blocks and never more than the longest
    prefix shared with the tokens some sequence held before (brute force over the allocate/free log).

    The hit counts may differ here, by design: the radix cache deduplicates a prefix two sequences
    computed at once onto the tree's blocks (as SGLang's ``cache_finished_req`` does), freeing the copies,
    while the hash cache keeps both (vLLM v1's block tables are append-only), so the two pools fill,
    preempt and evict at different moments.
    """
    results, hits, logs = {}, {}, {}
    for name, allocator in allocators(14).items():
        logs[name] = record_admissions(allocator)
        engine = engine_on(model, allocator)
        results[name] = run_chats(engine, num_chats=4, num_turns=3, max_new_tokens=6)
        hits[name] = allocator.stats.hit_tokens
        assert engine.scheduler.num_preemptions > 0
        assert_empty(engine)
    assert results["radix"] == results["hash"] == results["none"]
    assert hits["none"] == 0 and hits["radix"] > 0 and hits["hash"] > 0
    for name in ("radix", "hash"):
        seen: list[list[int]] = []
        for event, tokens, cached in logs[name]:
            if event == "allocate":
                assert cached % BLOCK_SIZE == 0 and cached <= longest_block_prefix(tokens, seen), (name, cached)
            seen.append(tokens)


@pytest.mark.parametrize(
    "extra", [dict(preemption_mode="swap"), dict(max_num_batched_tokens=8)], ids=["swap", "chunked-prefill-8"]
)
def test_radix_engine_with_swap_and_with_small_chunks(model, extra):
    """The other protocol paths: preemption by swapping (a swapped-in sequence is re-allocated on the
    radix cache without counting hits) and prompts computed over several steps (a block joins the
    tree only once computed). Outputs identical to the no-cache oracle, pools left empty."""
    results = {}
    for name, allocator in allocators(14).items():
        engine = engine_on(model, allocator, **extra)
        results[name] = run_chats(engine, num_chats=4, num_turns=3, max_new_tokens=6)
        assert_empty(engine)
        assert (allocator.stats.hit_tokens > 0) == (name != "none")
        if "preemption_mode" in extra:
            assert engine.num_blocks_swapped_out > 0 and engine.num_blocks_swapped_in > 0
    assert results["radix"] == results["hash"] == results["none"]


def test_later_turns_hit_the_whole_previous_conversation(model):
    """Turn t + 1 of a chat hits every full block of turn t's prompt and reply (roomy pool)."""
    allocator = RadixAllocator(96, BLOCK_SIZE, cache_when_computed=True)
    engine = engine_on(model, allocator)
    rng = random.Random(1)
    prompt = [rng.randrange(3, VOCAB) for _ in range(10)]
    reply = engine.generate([prompt], max_new_tokens=6)[0]
    # The reply's last token was sampled, never fed back: its K/V was not computed.
    computed = len(prompt) + len(reply) - 1
    follow_up = prompt + reply + [rng.randrange(3, VOCAB) for _ in range(3)]
    before = allocator.stats.hit_tokens
    assert allocator.num_cached_tokens_for(follow_up) == computed // BLOCK_SIZE * BLOCK_SIZE
    engine.generate([follow_up], max_new_tokens=2)
    assert allocator.stats.hit_tokens - before == computed // BLOCK_SIZE * BLOCK_SIZE
    assert_empty(engine)


def test_a_radix_cache_that_claims_an_uncomputed_block_is_caught(model):
    """The comparison can fail: a cache that reports one block more than it holds (so the engine
    skips computing that block's K/V and reads whatever the slots hold) changes the tokens."""

    class OverClaims(RadixAllocator):
        def allocate(self, seq_id, token_ids, *, record_stats=True):
            table = super().allocate(seq_id, token_ids, record_stats=record_stats)
            seq = self._seqs[seq_id]
            if seq.num_cached_tokens and seq.num_cached_tokens + self.block_size < len(token_ids):
                seq.num_cached_tokens += self.block_size
            return table

    ok = run_chats(engine_on(model, BlockAllocator(96, BLOCK_SIZE, enable_prefix_caching=False)), 4, 3, 6)
    sloppy = OverClaims(96, BLOCK_SIZE, cache_when_computed=True)
    log = record_admissions(sloppy)
    broken = run_chats(engine_on(model, sloppy), 4, 3, 6)
    assert broken != ok
    seen, over = [], 0  # and the brute-force bound of the preemption test flags it
    for event, tokens, cached in log:
        over += event == "allocate" and cached > longest_block_prefix(tokens, seen)
        seen.append(tokens)
    assert over > 0


def test_swap_in_reads_the_block_table_after_the_radix_publish():
    """Issue 23: the radix publish at swap-in swaps a block for the tree's copy; a table read before
    ``mark_computed`` held the released block, which a second swap-in then took ("a destination
    block appears twice"). The run must finish, token-identical to the cache-free engine."""
    import torch

    from paged_edu import Engine, SamplingParams
    from paged_edu.models.config import LlamaConfig
    from paged_edu.models.loaders import random_llama

    cfg = LlamaConfig(
        vocab_size=8, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=2, head_dim=16
    )
    prompts, params = [[3, 2, 2], [2, 3], [3, 2]], [SamplingParams(max_tokens=m) for m in (3, 4, 4)]
    outputs = {}
    for name, allocator in (
        ("radix", RadixAllocator(7, 1, cache_when_computed=True)),
        ("none", BlockAllocator(7, 1, enable_prefix_caching=False)),
    ):
        torch.manual_seed(0)
        engine = Engine(
            random_llama(cfg, seed=0),
            num_blocks=7,
            block_size=1,
            preemption_mode="swap",
            num_cpu_blocks=16,
            allocator=allocator,
        )
        outputs[name] = [out.outputs[0] for out in engine.run(prompts, params)]
        assert allocator.num_free_blocks == 7
    assert outputs["radix"] == outputs["none"]


@pytest.mark.parametrize("name", ["radix", "hash"])
def test_an_engine_refuses_an_allocator_that_still_caches_another_engines_blocks(model, name):
    """Issue 23: the "every block free" check counted evictable cached blocks as free, so a second
    engine on the same allocator hit K/V that exists only in the first engine's cache."""
    from paged_edu.sched.memory_manager import is_empty

    allocator = allocators(32)[name]
    assert is_empty(allocator)
    engine_on(model, allocator).generate([[5, 6, 7, 8, 9, 10, 11, 12, 13]], max_new_tokens=2)
    assert allocator.num_free_blocks == 32 and allocator.num_cached_blocks > 0 and not is_empty(allocator)
    with pytest.raises(ValueError, match="still caches"):
        engine_on(model, allocator)


@pytest.mark.parametrize("seed", range(6))
def test_a_swap_in_never_copies_into_a_block_the_radix_publish_gave_it(seed):
    """Found by the soak (benchmarks/soak_engine.py): two samples of one request, swapped out with the
    same 16 computed tokens, came back in one step. Each re-allocation hits at most all but the block
    of its last token, so publishing that block swapped it for the tree's copy -- which the first
    swap-in was copying into -- and both copies went to one block ("a destination block appears
    twice"; the engine then failed every step). A copy goes only to a block taken for it this step.
    Scheduler only (tokens chosen from a 2-token vocabulary, so samples often agree)."""
    from paged_edu.sched.scheduler import Scheduler

    rng = random.Random(seed)
    allocator = RadixAllocator(14, 2, cache_when_computed=True)
    sched = Scheduler(allocator, max_num_seqs=6, max_num_batched_tokens=16, preemption_mode="swap", num_cpu_blocks=64)
    system = [5, 6, 7]
    swapped_in = 0
    for _ in range(400):
        if rng.random() < 0.3 and len(sched.waiting) < 3:
            prompt = system + [rng.randrange(2) for _ in range(rng.randrange(1, 4))]
            sched.make_sequence(prompt, rng.randrange(3, 12), num_samples=rng.choice([1, 2, 3]))
        held = {b for b in range(allocator.num_blocks) if allocator.ref_count(b)}
        out = sched.schedule()
        dst = [gpu for kind, _, gpu in out.block_ops if kind == "swap_in"]
        assert len(dst) == len(set(dst)), out.block_ops
        assert not held & set(dst), out.block_ops  # never into a block that sequences were reading
        swapped_in += len(dst)
        sampled = {}
        for item in out.scheduled:
            if item.emits_token:
                k = item.seq.samples.num_tokens_to_sample
                tokens = [rng.randrange(2) for _ in range(k)]
                sampled[item.seq.seq_id] = tokens if k > 1 else tokens[0]
        sched.update(out, sampled)
    assert swapped_in > 0

"""Salted prefix caches (issue 23 item 1) and the prefix cache's own events (item 3), on both indexes.

A salt enters the hash before a prompt's first block (the hash chain, as vLLM's ``cache_salt``) or
names the request's own child of the radix root (as TensorRT-LLM's ``cache_salt_id``). The oracle
for sharing is the block tables themselves: two prompts share a block exactly when a physical block
id appears in both tables. The oracle for the cache events is the index: replaying store / evict /
clear must give exactly the blocks ``is_cached`` reports, after every operation of a random run.
"""

from __future__ import annotations

import hashlib
import json
import random
from array import array

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.block_hash import BLOCK_TAG, ROOT_HASH, ROOT_TAG, chained_block_hashes, hash_block, prefix_root
from paged_edu.core.radix_cache import RadixAllocator
from paged_edu.core.validation import MAX_CACHE_SALT_LEN
from allocator_helpers import append_token

B = 4
PROMPT = list(range(1, 4 * B + 2))  # four full blocks and one token


def both(num_blocks: int = 32, **kwargs):
    return [BlockAllocator(num_blocks, B, **kwargs), RadixAllocator(num_blocks, B, **kwargs)]


def shared(a, s, t) -> set[int]:
    return set(a.block_table(s)) & set(a.block_table(t))


@pytest.mark.parametrize("a", both(), ids=["hash", "radix"])
def test_different_salts_share_no_block_and_the_same_salt_shares_as_before(a):
    a.allocate("alice", PROMPT, cache_salt="alice")
    a.allocate("mallory", PROMPT, cache_salt="mallory")
    assert shared(a, "alice", "mallory") == set() and a.num_cached_tokens("mallory") == 0
    a.allocate("alice2", PROMPT, cache_salt="alice")
    assert a.num_cached_tokens("alice2") == 4 * B and len(shared(a, "alice", "alice2")) == 4
    a.allocate("nobody", PROMPT)  # unsalted: its own namespace, the one of every unsalted request
    assert a.num_cached_tokens("nobody") == 0
    assert all(not shared(a, "nobody", s) for s in ("alice", "mallory", "alice2"))
    assert a.num_cached_tokens_for(PROMPT) == 4 * B  # nobody's blocks now
    assert a.num_cached_tokens_for(PROMPT, cache_salt="mallory") == 4 * B
    assert a.num_cached_tokens_for(PROMPT, cache_salt="eve") == 0
    # after every holder is gone the salted blocks are still cached, still under their salt
    for s in ("alice", "mallory", "alice2", "nobody"):
        a.free(s)
    assert a.num_cached_tokens_for(PROMPT, cache_salt="alice") == 4 * B
    assert a.num_cached_tokens_for(PROMPT, cache_salt="eve") == 0


@pytest.mark.parametrize("a", both(), ids=["hash", "radix"])
def test_salts_hold_through_appends_forks_and_the_tail(a):
    """Blocks filled by appends after admission are cached under the sequence's salt too."""
    short = PROMPT[: B - 1]  # no full block at admission: the salt must survive to the first seal
    a.allocate("a", short, cache_salt="x")
    for t in PROMPT[B - 1 : 2 * B]:
        append_token(a, "a", t)
    a.fork("a", "a2")
    a.free("a")
    a.free("a2")
    probe = PROMPT[: 2 * B] + [99]
    assert a.num_cached_tokens_for(probe) == 0
    assert a.num_cached_tokens_for(probe, cache_salt="y") == 0
    assert a.num_cached_tokens_for(probe, cache_salt="x") == 2 * B


@pytest.mark.parametrize("a", both(), ids=["hash", "radix"])
def test_extra_keys_partition_like_a_salt(a):
    a.allocate("lora1", PROMPT, extra_keys=("adapter-1",))
    assert a.num_cached_tokens_for(PROMPT, extra_keys=("adapter-2",)) == 0
    assert a.num_cached_tokens_for(PROMPT, extra_keys=("adapter-1",)) == 4 * B
    assert a.num_cached_tokens_for(PROMPT, cache_salt="adapter-1") == 0  # a salt is not an extra key
    assert a.num_cached_tokens_for(PROMPT) == 0


def test_no_salt_is_the_unsalted_chain():
    assert prefix_root() == ROOT_HASH == b""
    assert prefix_root("a") != prefix_root(None, ("a",)) != ROOT_HASH
    assert prefix_root("ab", ("c",)) != prefix_root("a", ("bc",))  # length-prefixed parts
    a = BlockAllocator(8, B)
    a.allocate("s", PROMPT)
    assert [a.block_hash(b) for b in a.block_table("s")[:4]] == chained_block_hashes(PROMPT, B)


# -- salted and unsalted chains in separate hash domains (issue 44 item 5) ---------------------------
#
# The salted root was SHA-256(tag || len || salt) and a salted chain's first block SHA-256(root || tokens),
# exactly as an unsalted block at depth >= 1: an unsalted prompt whose first block's int64 bytes spell the
# root's input had h_0 == the salted root, so its next blocks hashed as the tenant's and hit them. The
# oracle below is the block tables (a shared physical block is a shared block) and the hashes themselves.

OLD_ROOT_TAG = b"paged_edu prefix root"  # the root's tag before issue 44 (the issue's repro spells it)


def spell(data: bytes) -> list[int] | None:
    """The token ids whose int64 bytes are ``data`` (a multiple of 8 bytes), or None if some 8 bytes
    are no token id (a negative int64: token ids are < 2**63)."""
    tokens = list(array("q", data))
    return tokens if all(t >= 0 for t in tokens) else None


def root_input(tag: bytes, salt: str) -> bytes:
    """What the salted root hashed under ``tag``: the tag, then the salt's length and UTF-8."""
    data = salt.encode("utf-8")
    return tag + len(data).to_bytes(4, "little") + data


def crafted_salts(block_size: int) -> list[tuple[bytes, str]]:
    """``(tag, salt)`` whose root input fills whole blocks of ``block_size`` tokens: the attacker
    can spell it as an unsalted prompt's first block(s)."""
    out = []
    for tag in (OLD_ROOT_TAG, ROOT_TAG, BLOCK_TAG):
        for num_blocks in (1, 2):
            salt_len = 8 * block_size * num_blocks - len(tag) - 4
            if 1 <= salt_len <= MAX_CACHE_SALT_LEN:
                out.append((tag, "s" * salt_len))
    return out


def probe(a, tenant_prompt: list[int], salt: str, attacker: list[int]) -> tuple[set[int], int]:
    """The tenant caches ``tenant_prompt`` under ``salt``; the attacker, unsalted, sends ``attacker``
    twice (the first primes its own blocks, as in the issue's 3-record trace). Returns the tenant's
    blocks in the attacker's tables and the second attacker's cached tokens."""
    a.allocate("tenant", tenant_prompt, cache_salt=salt)
    a.allocate("attacker-1", attacker)
    a.allocate("attacker-2", attacker)
    tenant = set(a.block_table("tenant"))
    crossed = tenant & (set(a.block_table("attacker-1")) | set(a.block_table("attacker-2")))
    return crossed, a.num_cached_tokens("attacker-2")


SECRET = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 1]


CRAFTED = [(B, tag, salt) for B in (2, 4, 8, 16) for tag, salt in crafted_salts(B)]


@pytest.mark.parametrize(
    "block_size, tag, salt", CRAFTED, ids=[f"B{B}-{tag.decode()}-{len(salt)}" for B, tag, salt in CRAFTED]
)
def test_an_unsalted_prompt_spelling_the_salted_root_hits_nothing_of_the_tenant(block_size, tag, salt):
    """The issue's repro (B = 4, a 7-character salt, 12 tokens hit) and its siblings: every block size,
    a root input of one or two blocks, under the old tag and under the tags in use now."""
    head = spell(root_input(tag, salt))
    assert head is not None and len(head) % block_size == 0
    secret = SECRET[: 2 * block_size + 1]
    a = BlockAllocator(64, block_size)
    crossed, cached = probe(a, secret, salt, head + secret)
    assert crossed == set()
    # what the attacker may hit: its own first request's blocks, every full block before its last token
    assert cached == (len(head) + len(secret) - 1) // block_size * block_size
    unsalted = chained_block_hashes(head + secret, block_size)
    salted = chained_block_hashes(secret, block_size, prefix_root(salt))
    assert not set(unsalted) & {prefix_root(salt), *salted}


def test_the_crafted_cases_include_the_issues_repro():
    assert (4, OLD_ROOT_TAG, "s" * 7) in CRAFTED and len(CRAFTED) == 23


def test_the_salted_root_input_of_the_issue_spells_twelve_tokens_that_hit_before_the_fix():
    """The repro itself, checked to be one: under the layout before issue 44 (recomputed here by hand)
    the attacker's second block hashes exactly as the tenant's first -- so the test above tests it."""
    salt = "x" * 7
    head = spell(root_input(OLD_ROOT_TAG, salt))
    old_root = hashlib.sha256(root_input(OLD_ROOT_TAG, salt)).digest()
    old_h0 = hashlib.sha256(array("q", head).tobytes()).digest()  # the unsalted first block, old layout
    assert len(head) == 4 and old_h0 == old_root
    tokens = array("q", SECRET[:4]).tobytes()
    assert hashlib.sha256(old_h0 + tokens).digest() == hashlib.sha256(old_root + tokens).digest()


def _words(draw_bytes: bytes) -> list[int]:
    return [t & (2**63 - 1) for t in array("q", draw_bytes)]  # any 8 bytes, top bit cleared: a token id


@st.composite
def attacks(draw):
    """A salt and an unsalted prompt made of pieces an attacker would try: the salted root's input
    under each tag (spelled, or its bytes shifted by a few), the salted root itself, the tenant's
    tokens, and random token ids of any value."""
    B = draw(st.sampled_from([1, 2, 3, 4, 8]))
    if draw(st.booleans()):  # a salt whose root input fills whole blocks under some tag: spellable
        tag = draw(st.sampled_from([OLD_ROOT_TAG, ROOT_TAG, BLOCK_TAG]))
        num_bytes = 8 * B * draw(st.integers(1, 4)) - len(tag) - 4
        salt = "s" * num_bytes if 1 <= num_bytes <= MAX_CACHE_SALT_LEN else "s"
    else:
        salt = draw(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40))
    secret = draw(st.lists(st.integers(0, 2**63 - 1), min_size=B, max_size=4 * B))
    pieces = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["root input", "root", "block input", "secret", "random"]))
        if kind == "root input":
            data = root_input(draw(st.sampled_from([OLD_ROOT_TAG, ROOT_TAG, BLOCK_TAG])), salt)
            data = draw(st.binary(max_size=7)) + data  # shifted, so any alignment is tried
        elif kind == "root":
            data = prefix_root(salt)
        elif kind == "block input":  # the salted first block's input under the framing in use now
            data = BLOCK_TAG + bytes([32]) + prefix_root(salt) + array("q", secret[:B]).tobytes()
        elif kind == "secret":
            data = array("q", secret).tobytes()
        else:
            data = array("q", draw(st.lists(st.integers(0, 2**63 - 1), max_size=2 * B))).tobytes()
        pieces.append(data)
    data = b"".join(pieces)
    data += bytes(-len(data) % 8)
    attacker = _words(data) + secret + draw(st.lists(st.integers(0, 2**63 - 1), max_size=B))
    return B, salt, secret, attacker or [0]


@settings(max_examples=300, deadline=None)
@given(attacks())
def test_no_unsalted_token_sequence_produces_a_salted_hash(case):
    """Property: whatever an unsalted prompt holds -- crafted root inputs at any alignment, the root
    itself, the salted block's own input, the tenant's tokens, random ids -- none of its block hashes
    is the salted root or a salted block's hash, and sent twice it shares no block with the tenant."""
    B, salt, secret, attacker = case
    salted = chained_block_hashes(secret, B, prefix_root(salt))
    unsalted = chained_block_hashes(attacker, B)
    assert not set(unsalted) & {prefix_root(salt), *salted}
    num_blocks = 4 * (len(attacker) + len(secret)) // B + 8
    for a in (BlockAllocator(num_blocks, B), RadixAllocator(num_blocks, B)):
        crossed, _ = probe(a, secret, salt, attacker)
        assert crossed == set()


def test_a_block_parent_is_framed_by_its_length():
    """A parent of any other length than 0 (the unsalted root) or 32 (a digest) is no parent."""
    with pytest.raises(ValueError, match="parent_hash must be ROOT_HASH"):
        hash_block(b"\x00" * 31, b"x" * 8)
    assert BLOCK_TAG[:1] != ROOT_TAG[:1]  # no root's input is a block's


def test_the_simulator_keeps_a_salted_tenant_out_of_an_unsalted_trace(tmp_path):
    """The issue's 3-record trace, in the simulator: an unsalted request caches the crafted block, the
    tenant sends its secret under the salt, the unsalted probe follows. Oracle: the unsalted requests hit
    exactly what they hit when the tenant's request is left out of the trace."""
    from paged_edu.sim.request import load_trace, save_trace
    from paged_edu.sim.request import Request
    from paged_edu.sim.results import SimConfig
    from paged_edu.sim.simulator import simulate

    salt = "x" * 7
    head = spell(root_input(OLD_ROOT_TAG, salt))
    secret = SECRET[:9]
    trace = [
        Request(0.0, len(head) + 1, 1, prompt=head + [99]),
        Request(1.0, len(secret), 1, prompt=secret, cache_salt=salt),
        Request(2.0, len(head) + len(secret), 1, prompt=head + secret),
    ]
    path = tmp_path / "probe.jsonl"
    save_trace(trace, path)
    for manager in ("paged-prefix", "paged-radix"):
        config = SimConfig(manager=manager, block_size=4, num_kv_slots=256)
        with_tenant = simulate(load_trace(path), config)
        without = simulate([trace[0], trace[2]], config)
        assert with_tenant.prefix_hit_rate_per_salt[salt] == 0.0
        assert with_tenant.record()["prefix_hit_rate"] == pytest.approx(
            without.prefix_hit_rate * (len(head) + 1 + len(head) + len(secret)) / sum(r.prompt_len for r in trace)
        )


@pytest.mark.parametrize(
    "bad, exc",
    [
        ("", ValueError),
        ("x" * (MAX_CACHE_SALT_LEN + 1), ValueError),
        (b"salt", TypeError),
        (7, TypeError),
        ("\udcff", ValueError),
    ],
)
def test_a_bad_salt_is_refused_and_changes_nothing(bad, exc):
    for a in both(16):
        a.allocate("s", PROMPT, cache_salt="ok")
        before = (a.num_free_blocks, a.num_cached_blocks, a.stats.requests, dict(a.stats.per_salt))
        with pytest.raises(exc, match="cache_salt"):
            a.allocate("t", PROMPT, cache_salt=bad)
        with pytest.raises(exc, match="cache_salt"):
            a.num_cached_tokens_for(PROMPT, cache_salt=bad)
        with pytest.raises(exc, match=r"extra_keys\[0\]"):
            a.allocate("t", PROMPT, extra_keys=(bad,))
        assert "t" not in a
        assert (a.num_free_blocks, a.num_cached_blocks, a.stats.requests, dict(a.stats.per_salt)) == before
    a.allocate("t", PROMPT, cache_salt="x" * MAX_CACHE_SALT_LEN)  # the bound itself is fine


def test_hits_are_counted_per_salt():
    for a in both():
        a.allocate(1, PROMPT, cache_salt="t0")
        a.allocate(2, PROMPT, cache_salt="t0")
        a.allocate(3, PROMPT, cache_salt="t1")
        a.allocate(4, PROMPT)
        n = len(PROMPT)
        assert a.stats.per_salt == {"t0": [2 * n, 4 * B], "t1": [n, 0], None: [n, 0]}
        assert a.stats.hit_rate_of("t0") == 4 * B / (2 * n) and a.stats.hit_rate_of("t1") == 0.0
        assert a.stats.hit_rate_of("never") == 0.0
        assert a.stats.hit_tokens == 4 * B  # the totals as before


def test_a_radix_namespace_goes_with_its_last_block():
    a = RadixAllocator(5, B)
    a.allocate("s", PROMPT, cache_salt="gone")
    assert len(a.tree.root.children) == 1
    a.free("s")
    a.allocate("big", list(range(100, 100 + 5 * B)))  # needs every block: evicts the salted ones
    assert a.num_cached_tokens_for(PROMPT, cache_salt="gone") == 0
    assert all(child.blocks for child in a.tree.root.children.values())  # no empty namespace left


# -- the prefix cache's events ----------------------------------------------------------------------


class Replay:
    """The cache's contents as its events tell them: store adds, evict removes, clear empties."""

    def __init__(self, a) -> None:
        self.cached: set[int] = set()
        self.kinds: list[str] = []
        a.subscribe_cache(self)

    def __call__(self, event) -> None:
        self.kinds.append(event.kind)
        if event.kind == "store":
            assert not self.cached & set(event.block_ids), "stored twice"
            self.cached |= set(event.block_ids)
            assert event.num_tokens == len(event.block_ids) * B
        elif event.kind == "evict":
            [b] = event.block_ids
            assert b in self.cached, "evicted a block never stored"
            self.cached.remove(b)
        elif event.kind == "clear":
            assert set(event.block_ids) == self.cached
            self.cached = set()
        else:
            raise AssertionError(f"unexpected cache event {event.kind!r}")


def cached_blocks(a) -> set[int]:
    return {b for b in range(a.num_blocks) if a.index.is_cached(b)}


@pytest.mark.parametrize(
    "make",
    [
        lambda: BlockAllocator(12, B, cache_when_computed=True),
        lambda: BlockAllocator(12, B),
        lambda: RadixAllocator(12, B, cache_when_computed=True),
        lambda: RadixAllocator(12, B),
    ],
    ids=["hash-computed", "hash-full", "radix-computed", "radix-full"],
)
def test_cache_events_replay_to_the_cache_contents(make):
    """Replayed here (``Replay``) and by lesson 8's model (``CacheContents``, which can also replay
    any earlier moment): both equal the cache's own contents after every operation."""
    from paged_edu.labs.cache_contents import CacheContents

    rng = random.Random(5)
    a = make()
    replay = Replay(a)
    contents = CacheContents(a)
    history = []
    live: list[int] = []
    next_id = 0
    for _ in range(600):
        op = rng.random()
        try:
            if op < 0.3 or not live:
                prompt = [rng.randrange(3) for _ in range(rng.randrange(1, 3 * B))]
                salt = rng.choice([None, "a", "b"])
                a.allocate(next_id, prompt, cache_salt=salt)
                live.append(next_id)
                next_id += 1
            elif op < 0.6:
                append_token(a, rng.choice(live), rng.randrange(3))
            elif op < 0.7:
                s = rng.choice(live)
                a.mark_computed(s, a.num_tokens(s))
            elif op < 0.75:
                a.fork(rng.choice(live), next_id)
                live.append(next_id)
                next_id += 1
            elif op < 0.95:
                s = live.pop(rng.randrange(len(live)))
                a.free(s)
            else:
                a.reset_prefix_cache()
        except MemoryError:
            pass
        assert replay.cached == cached_blocks(a) == set(contents.cached)
        history.append((len(contents.events), cached_blocks(a)))
        if isinstance(a, RadixAllocator):  # a namespace lives exactly as long as something below it
            assert all(child.blocks or child.children for child in a.tree.root.children.values())
    assert {"store", "evict"} <= set(replay.kinds)
    for s in live:
        a.free(s)
    assert a.reset_prefix_cache() == 0
    assert replay.kinds[-1] == "clear" and replay.cached == set() == cached_blocks(a)
    assert contents.events[-1].kind == "clear" and contents.cached == {}
    for k, expected in history[::25]:  # an earlier moment, from the events alone
        assert set(contents.at(k)) == expected
    assert contents.sizes()[-1] == 0 and max(contents.sizes()) > 0


def test_store_and_clear_go_to_cache_subscribers_only():
    """The general stream keeps its events (existing widgets and tests read it); the cache stream is apart."""
    for a in both(8):
        general, cache = [], []
        a.subscribe(general.append)
        a.subscribe_cache(cache.append)
        a.allocate("s", PROMPT)
        a.free("s")
        assert a.reset_prefix_cache() == 0
        assert "store" not in {e.kind for e in general} and "clear" not in {e.kind for e in general}
        assert [e.kind for e in cache] == ["store", "clear"]
        assert cache[0].seq_id == "s" and len(cache[0].block_ids) == 4
        assert sorted(cache[1].block_ids) == sorted(cache[0].block_ids)


class Mutator:
    """A subscriber that changes the allocator from inside its callback (issue 44 item 6): on some
    events it admits a prompt of its own, frees one, or empties the cache -- at most ``budget`` times."""

    def __init__(self, a, rng: random.Random, budget: int = 60) -> None:
        self.a, self.rng, self.budget = a, rng, budget
        self.live: list[str] = []
        self.count = 0
        self.num_changes = 0  # operations it ran from inside a callback

    def __call__(self, event) -> None:
        if self.budget <= 0 or self.rng.random() < 0.5:
            return
        self.budget -= 1
        self.num_changes += 1
        op = self.rng.random()
        try:
            if op < 0.5 or not self.live:
                self.count += 1
                name = f"mutator-{self.count}"
                self.a.allocate(name, [self.rng.randrange(3) for _ in range(self.rng.randrange(1, 3 * B))])
                self.live.append(name)
            elif op < 0.9:
                self.a.free(self.live.pop(self.rng.randrange(len(self.live))))
            else:
                self.a.reset_prefix_cache()
        except MemoryError:
            pass


@pytest.mark.parametrize(
    "make",
    [
        lambda: BlockAllocator(12, B),
        lambda: BlockAllocator(12, B, cache_when_computed=True),
        lambda: RadixAllocator(12, B),
    ],
    ids=["hash-full", "hash-computed", "radix-full"],
)
@pytest.mark.parametrize("channel", ["subscribe_cache", "subscribe"])
def test_subscribers_get_events_in_order_whatever_a_callback_does(make, channel):
    """A subscriber that allocates, frees or resets the cache from inside its callback: every other
    subscriber -- registered before it or after it -- still gets every event in the order things
    happened, so the cache replayed from its events is the cache (after every operation), and both
    see one and the same sequence of events on each channel."""
    rng = random.Random(11)
    a = make()
    first, first_events = Replay(a), []
    a.subscribe(first_events.append)
    mutator = Mutator(a, random.Random(12))
    getattr(a, channel)(mutator)
    last, last_events = Replay(a), []
    a.subscribe(last_events.append)
    live, next_id = [], 0
    for _ in range(300):
        op = rng.random()
        try:
            if op < 0.4 or not live:
                a.allocate(next_id, [rng.randrange(3) for _ in range(rng.randrange(1, 3 * B))])
                live.append(next_id)
                next_id += 1
            elif op < 0.7:
                append_token(a, rng.choice(live), rng.randrange(3))
            elif op < 0.8:
                a.fork(rng.choice(live), next_id)
                live.append(next_id)
                next_id += 1
            else:
                a.free(live.pop(rng.randrange(len(live))))
        except MemoryError:
            pass
        assert first.cached == cached_blocks(a) == last.cached
    assert mutator.num_changes >= 30  # it did change the allocator from inside its callbacks
    assert first.kinds == last.kinds and [(e.kind, e.block_ids) for e in first_events] == [
        (e.kind, e.block_ids) for e in last_events
    ]


def test_a_cache_subscriber_that_raises_loses_nothing():
    a = BlockAllocator(8, B)

    def boom(event):
        raise RuntimeError("no")

    a.subscribe_cache(boom)
    replay = Replay(a)
    with pytest.warns(RuntimeWarning, match="prefix cache subscriber"):
        a.allocate("s", PROMPT)
    assert replay.cached == cached_blocks(a) and len(replay.cached) == 4


# -- the engine, the simulator, the CLI --------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    from paged_edu.labs.engine_lab import tiny_model

    return tiny_model(seed=3, vocab_size=128)


@pytest.mark.parametrize("radix", [False, True], ids=["hash", "radix"])
def test_engine_salts_keep_tenants_apart_and_a_bad_salt_is_refused(model, radix):
    from paged_edu.engine import Engine
    from paged_edu.engine.sampling import SamplingParams

    def engine():
        allocator = RadixAllocator(64, B, cache_when_computed=True) if radix else None
        return Engine(model, num_blocks=64, block_size=B, allocator=allocator)

    system = [5, 6, 7, 8] * 4
    prompts = [system + [10 + i] for i in range(3)]
    params = SamplingParams(max_tokens=5)
    ref = engine()
    expected = {tuple(o.prompt_token_ids): o.outputs for o in ref.run(prompts, [params] * 3)}

    e = engine()
    first = e.add_request(prompts[0], params, cache_salt="alice")
    for bad in ("", "x" * (MAX_CACHE_SALT_LEN + 1), 42):
        with pytest.raises((TypeError, ValueError), match="cache_salt"):
            e.add_request(prompts[1], params, cache_salt=bad)
    outputs = []
    while e.has_unfinished():
        outputs += e.step()
    second = e.add_request(prompts[1], params, cache_salt="mallory")
    third = e.add_request(prompts[2], params, cache_salt="alice")
    while e.has_unfinished():
        outputs += e.step()
    by_id = {o.request_id: o for o in outputs}
    assert sorted(by_id) == [first, second, third]  # the refused ones took no id, the rest served
    for o in outputs:
        assert o.outputs == expected[tuple(o.prompt_token_ids)]  # token-identical
    assert by_id[second].metrics.num_cached_tokens == 0  # another tenant's prefix: no hit
    assert by_id[third].metrics.num_cached_tokens == len(system)  # its own tenant's: hit
    assert e.allocator.stats.per_salt["mallory"][1] == 0


@pytest.mark.parametrize("radix", [False, True], ids=["hash", "radix"])
def test_add_requests_takes_a_salt_per_request_all_or_nothing(model, radix):
    """Per-request salts in one call: each request hits what add_request with its salt would hit;
    a bad salt anywhere in the list queues none of them, and the engine serves on."""
    from paged_edu.engine import Engine
    from paged_edu.engine.sampling import SamplingParams

    allocator = RadixAllocator(64, B, cache_when_computed=True) if radix else None
    e = Engine(model, num_blocks=64, block_size=B, allocator=allocator)
    system = [5, 6, 7, 8] * 4
    prompts = [system + [10 + i] for i in range(3)]
    params = [SamplingParams(max_tokens=3)] * 3
    expected = {
        tuple(o.prompt_token_ids): o.outputs for o in Engine(model, num_blocks=64, block_size=B).run(prompts, params)
    }

    for bad, exc, match in [
        (["t", "", "t"], ValueError, r"cache_salts\[1\]"),
        (["t", "t", 42], TypeError, r"cache_salts\[2\]"),
        (["t", "t"], ValueError, "one cache salt .* per prompt: 2 salts for 3 prompts"),
        ("t", ValueError, "one cache salt .* per prompt: one str"),
    ]:
        with pytest.raises(exc, match=match):
            e.add_requests(prompts, params, cache_salts=bad)
        assert not e.has_unfinished() and e.allocator.num_used_blocks == 0  # none of them queued

    outputs = []
    [warm] = e.add_requests(prompts[:1], params[:1], cache_salts=["alice"])
    while e.has_unfinished():
        outputs += e.step()
    ids = e.add_requests(prompts, params, cache_salts=["alice", "mallory", None])
    assert ids == [warm + 1, warm + 2, warm + 3]  # the refused calls took no id
    while e.has_unfinished():
        outputs += e.step()
    by_id = {o.request_id: o for o in outputs}
    assert [by_id[i].metrics.num_cached_tokens for i in ids] == [len(system), 0, 0]  # only alice's own prefix
    for o in outputs:
        assert o.outputs == expected[tuple(o.prompt_token_ids)]  # token-identical
    assert {k: v[0] > 0 for k, v in e.allocator.stats.per_salt.items()} == {"alice": True, "mallory": True, None: True}


def test_engine_refuses_a_salt_its_allocator_cannot_take(model):
    from paged_edu.engine import Engine
    from paged_edu.lessons.my_allocator import MyAllocator

    e = Engine(model, num_blocks=16, block_size=B, enable_prefix_caching=False, allocator=MyAllocator(16, B))
    with pytest.raises(TypeError, match="cache_salt"):
        e.add_request([1, 2, 3], cache_salt="t")
    assert not e.has_unfinished()


def test_trace_keeps_the_salt_and_refuses_a_bad_one(tmp_path):
    from paged_edu.sim.request import Request, load_trace, save_trace

    requests = [Request(0.0, 3, 2, prompt=[1, 2, 3], cache_salt="t1"), Request(0.5, 4, 1)]
    path = tmp_path / "t.jsonl"
    save_trace(requests, path)
    assert [r.cache_salt for r in load_trace(path)] == ["t1", None]
    assert "cache_salt" not in json.loads(path.read_text().splitlines()[1])
    with pytest.raises(ValueError, match="cache_salt"):
        Request(0.0, 3, 2, cache_salt="")
    path.write_text(json.dumps({"arrival_time": 0, "prompt_len": 3, "output_len": 1, "cache_salt": 5}) + "\n")
    with pytest.raises(TypeError, match="cache_salt"):
        load_trace(path)


def test_simulated_tenants_lose_the_shared_system_prompt():
    from paged_edu.sim.compare import default_configs
    from paged_edu.sim.simulator import simulate
    from paged_edu.sim.workloads import assign_tenants, chat

    def run(tenants, manager):
        requests = chat(40, rate=2.0, seed=0, system_prompt_len=64)
        if tenants:
            assign_tenants(requests, tenants)
        [config] = default_configs(block_sizes=[B], managers=[manager])
        return simulate(requests, config)

    for manager in ("paged-prefix", "paged-radix"):
        shared_run, one, many = run(0, manager), run(1, manager), run(40, manager)
        assert one.prefix_hit_rate == shared_run.prefix_hit_rate > 0  # one salt: shares as before
        assert many.prefix_hit_rate == 0.0  # every request its own tenant: nothing to share
        assert set(many.prefix_hit_rate_per_salt) == {f"tenant-{i}" for i in range(40)}
        assert "prefix_hit_rate_per_salt" not in shared_run.record()
    with pytest.raises(ValueError, match="num_tenants"):
        assign_tenants([], 0)


def test_cli_tenants_option(capsys):
    from paged_edu.cli import main

    assert (
        main(
            [
                "simulate",
                "--workload",
                "chat",
                "--num-requests",
                "12",
                "--rate",
                "2",
                "--tenants",
                "3",
                "--managers",
                "paged-prefix",
                "--block-sizes",
                "16",
                "--system-prompt-len",
                "64",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "prefix hits per tenant (3 tenants" in out and "tenant-2" in out


def test_the_side_channel_is_measured_and_closed_by_salts(model):
    """Lesson 3's lab: the probe's accounting (tokens, steps, modeled time) with and without the
    victim's prefix; salted, it is exactly the cold probe's. Oracle: the prompt's own arithmetic."""
    from paged_edu.labs.side_channel import side_channel, tenant_hit_rates

    secret = [3 + (5 * i) % 100 for i in range(8 * B)]
    cold, shared_, salted = side_channel(model, secret, [1, 2], block_size=B, chunk=2 * B)
    n = len(secret) + 2
    assert (cold.num_cached_tokens, cold.num_computed_tokens, cold.num_steps) == (0, n, -(-n // (2 * B)))
    assert (shared_.num_cached_tokens, shared_.num_computed_tokens, shared_.num_steps) == (len(secret), 2, 1)
    assert (salted.num_cached_tokens, salted.num_computed_tokens, salted.num_steps, salted.modeled_ttft_s) == (
        cold.num_cached_tokens,
        cold.num_computed_tokens,
        cold.num_steps,
        cold.modeled_ttft_s,
    )
    assert shared_.modeled_ttft_s < cold.modeled_ttft_s
    rates = tenant_hit_rates(model, secret, num_tenants=3, requests_per_tenant=2, block_size=B, chunk=2 * B)
    prompt = len(secret) + 2
    assert rates["no salts"] == pytest.approx(5 * len(secret) / (6 * prompt))  # only the first computes it
    assert rates["salted per tenant"] == pytest.approx(3 * len(secret) / (6 * prompt))  # each tenant's first does

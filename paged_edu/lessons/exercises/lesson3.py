"""Lesson 3's exercises: chained hashes, shared blocks and the prefix hit rate."""

from __future__ import annotations

import copy
import hashlib
import random
from array import array

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.block_hash import chained_block_hashes, hash_block
from paged_edu.lessons.exercises.framework import Verdict, check_function, compare, register


def chained_hashes(token_ids, B):
    """h_i = hash_block(h_{i-1}, bytes of block i) for every full block, h_{-1} = b''."""
    hashes, parent = [], b""
    for start in range(0, len(token_ids) - B + 1, B):  # full blocks only
        parent = hash_block(parent, array("q", token_ids[start : start + B]).tobytes())
        hashes.append(parent)
    return hashes


def chained_hashes_stub(token_ids, B):
    raise NotImplementedError("Exercise 3.1: return the chained hash of every full block")


def _hash_cases() -> list[tuple]:
    rng = random.Random(3)
    cases = []
    for B in (2, 4, 16):
        for _ in range(5):
            cases.append(([rng.randrange(50) for _ in range(rng.randint(0, 5 * B))], B))
    cases.append(([7] * 8, 4))  # two identical blocks: their hashes must differ
    return cases


@register(
    "3.1",
    "Write chained_hashes(token_ids, B): the chained hash h_i = hash_block(h_{i-1}, bytes of "
    "block i) of every full block, with h_{-1} = b'' and the tokens packed as "
    "array('q', block).tobytes().",
    chained_hashes,
    kind="function",
)
def _check_3_1(fn) -> Verdict:
    if _is_the_library(fn):
        return Verdict(
            False,
            [
                "[ ] chained_hashes: that is the library's own chained_block_hashes (the check's "
                "oracle), or a call to it -- write the chain yourself with hash_block"
            ],
        )
    verdict = check_function("chained_hashes", fn, _hash_cases(), chained_block_hashes)
    if not verdict.ok and _is_per_block_hash(fn):
        verdict.lines.append(
            "    -- that is the seed's per-block hash: every block hashed on its own, so the same tokens get the "
            "same hash wherever they appear (the two blocks of [7]*8 collide) and a prompt could hit K/V computed "
            "after another prefix; chain them: h_i = hash_block(h_{i-1}, bytes of block i)"
        )
    if verdict.ok:
        verdict.lines.append(
            "    (and the two identical blocks of [7]*8 got different hashes, because their prefixes differ)"
        )
    return verdict


def _per_block_hashes(token_ids, B, seed_text: bool):
    """The seed's scheme: each full block hashed alone -- ``hash_block(b'', bytes)``, or the seed's own
    ``sha256(str(chunk))`` hex digest when ``seed_text``."""
    blocks = [token_ids[s : s + B] for s in range(0, len(token_ids) - B + 1, B)]
    if seed_text:
        return [hashlib.sha256(str(b).encode("utf-8")).hexdigest() for b in blocks]
    return [hash_block(b"", array("q", b).tobytes()) for b in blocks]


def _is_per_block_hash(fn) -> bool:
    """Does ``fn`` hash every block on its own (the seed's defect), on every case of the check?"""
    for args in _hash_cases():
        try:
            got = fn(*copy.deepcopy(args))
        except Exception:
            return False
        if got != _per_block_hashes(*args, False) and got != _per_block_hashes(*args, True):
            return False
    return True


def _is_the_library(fn) -> bool:
    """Is ``fn`` the library's ``chained_block_hashes``, a ``functools.partial`` of it, or a function
    whose body names it (a one-line wrapper)?"""
    fn = getattr(fn, "func", fn)  # functools.partial
    code = getattr(fn, "__code__", None)
    return fn is chained_block_hashes or (code is not None and "chained_block_hashes" in code.co_names)


def _five_chats() -> BlockAllocator:
    """5 chats: a 40-token system prompt, then 6 private tokens each; B = 16."""
    a = BlockAllocator(64, 16)
    for k in range(5):
        a.allocate(k, list(range(40)) + [1000 + 10 * k + j for j in range(6)])
    return a


# 46 tokens = 3 blocks each. Blocks 0 and 1 (tokens 0-31) are full and identical: shared.
# Block 2 holds tokens 32-45 (8 shared + 6 private): private to each chat.
BLOCKS_FIVE_CHATS = 2 + 5 * 1  # 7, instead of 15 without sharing
# The first chat misses; 4 chats hit 32 tokens each.
HIT_RATE_FIVE_CHATS = (4 * 32) / (5 * 46)  # 0.5565


@register(
    "3.2",
    "5 chats share a 40-token system prompt and add 6 private tokens each (B = 16). How many blocks are in use?",
    BLOCKS_FIVE_CHATS,
)
def _check_3_2(answer) -> Verdict:
    return compare(
        "blocks in use for 5 chats sharing a 40-token system prompt (B = 16)",
        answer,
        _five_chats().num_used_blocks,
        hints={
            15: "no sharing at all: 5 x 3 blocks",
            8: "the seed's formula rounded per term, ceil(40/16) + 5 ceil(6/16): the partial prefix block is private",
            5: "the seed's formula in tokens (40 + 5 x 6 = 70) in blocks; only full blocks are shared",
        },
    )


@register(
    "3.3", "And the prefix hit rate (hit tokens / queried prompt tokens) after those 5 chats?", HIT_RATE_FIVE_CHATS
)
def _check_3_3(answer) -> Verdict:
    right = _five_chats().stats.hit_rate
    return compare(
        "prefix hit rate of those 5 chats",
        answer,
        right,
        sig_figs=2,
        hints={
            (4 * 40) / (5 * 46): "160/230: either all 40 system-prompt tokens counted as hits (only the 2 full blocks, "
            "32 tokens, are shared) or the first chat counted as a hit (it fills the cache)",
            (4 * 2) / (5 * 3): "blocks, not tokens: the hit rate counts prompt tokens",
            4 / 5: "requests that hit, not tokens",
            100 * right: "a percentage; give a fraction between 0 and 1",
        },
    )


# 3.4: the side channel of section 6, closed by salts. The victim's 256-token secret (16 full blocks
# of B = 16) is cached under the victim's salt; the attacker's probe (the secret + 2 tokens) carries
# another salt, so it hits nothing and computes all 258 tokens, 64 a step (chunked prefill).
SECRET_LEN, PROBE_TAIL, CHUNK, PROBE_B = 256, 2, 64, 16


def _salted_probe_steps() -> int:
    """Steps to the probe's first token: its uncached prompt tokens, ``CHUNK`` a step; the cached
    tokens read from the allocator itself (the victim's request cached under its own salt)."""
    a = BlockAllocator(64, PROBE_B)
    secret = list(range(1, SECRET_LEN + 1))
    a.allocate("victim", secret + [0], cache_salt="victim")
    a.free("victim")
    probe = secret + list(range(1000, 1000 + PROBE_TAIL))
    uncached = len(probe) - a.num_cached_tokens_for(probe, cache_salt="attacker")
    return -(-uncached // CHUNK)


@register(
    "3.4",
    "The victim's 256-token secret ran to its end (B = 16); the engine computes at most 64 prompt "
    "tokens a step. The attacker's probe is the secret plus 2 tokens of its own, and every user has their own "
    "cache salt. How many engine steps does the probe take to its first token?",
    _salted_probe_steps,
)
def _check_3_4(answer) -> Verdict:
    return compare(
        "steps to the salted probe's first token",
        answer,
        _salted_probe_steps(),
        hints={
            1: "the unsalted case: the probe would hit the victim's 16 blocks and compute only its own 2 tokens",
            4: "256 / 64: the probe's own 2 tokens need a step too",
            258: "tokens, not steps: 64 of them a step",
            0: "even a fully cached prompt computes its last token",
        },
    )

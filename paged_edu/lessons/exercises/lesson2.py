"""Lesson 2's exercises: slots, block tables and the utilisation of a paged cache."""

from __future__ import annotations

import math
import random

from paged_edu.core.memory import eta_paged, eta_paged_bound
from paged_edu.lessons.exercises.framework import Verdict, check_function, compare, register


def physical_slot(block_table, t, B):
    """The physical slot of token t: B(t // B) * B + t mod B."""
    i, j = divmod(t, B)  # logical block and offset
    return block_table[i] * B + j


def physical_slot_stub(block_table, t, B):
    raise NotImplementedError("Exercise 2.1: return the physical slot of token t")


def _slot_oracle(block_table, t, block_size):
    return block_table[t // block_size] * block_size + t % block_size


def _slot_cases() -> list[tuple]:
    rng = random.Random(2)
    cases = []
    for B in (1, 4, 8, 16, 32):
        for _ in range(6):
            n = rng.randint(1, 6 * B)
            table = rng.sample(range(64), -(-n // B))
            cases.append((table, rng.randrange(n), B))
    return cases


@register(
    "2.1",
    "Write physical_slot(block_table, t, B): the physical slot of token t, B(t // B) * B + t mod B.",
    physical_slot,
    kind="function",
)
def _check_2_1(fn) -> Verdict:
    return check_function("physical_slot", fn, _slot_cases(), _slot_oracle)


ETA_2049_16 = 2049 / (math.ceil(2049 / 16) * 16)  # 2049 / 2064 = 0.99273 (one slot past a block)


@register("2.2", "eta_paged for s = 2049 tokens and B = 16?", ETA_2049_16)
def _check_2_2(answer) -> Verdict:
    # Four significant figures: the right 0.9927 against the bound 0.9923 and the seed's 0.9922.
    right = eta_paged(2049, 16)
    return compare(
        "eta_paged for s = 2049, B = 16",
        answer,
        right,
        sig_figs=4,
        hints={
            eta_paged_bound(
                2049, 16
            ): "the bound 1 - B/(s+B) = s/(s+B) at s = 2049, a lower limit; eta_paged divides by ceil(s/B) * B = 2064",
            eta_paged_bound(2048, 16): "the seed's 99.22 %: the bound at s = 2048",
            eta_paged(2048, 16): "eta_paged at s = 2048, a multiple of 16; s = 2049 needs one more block",
            100 * right: "a percentage; give a fraction between 0 and 1",
        },
    )


WASTED_1_100_B8 = sum(math.ceil(s / 8) * 8 - s for s in range(1, 101))  # 358


@register(
    "2.3",
    "100 requests have lengths 1, 2, ..., 100 and B = 8. How many slots are reserved but empty in total?",
    WASTED_1_100_B8,
)
def _check_2_3(answer) -> Verdict:
    expected = sum(-(-s // 8) * 8 - s for s in range(1, 101))
    return compare(
        "wasted slots for lengths 1..100 at B = 8",
        answer,
        expected,
        hints={
            100 * 8 // 2: "B/2 per request, the rule of thumb; count the lengths exactly",
            100 * 7 // 2: "(B-1)/2 per request on average; 100 is not a multiple of 8, so count exactly",
            sum(s % 8 for s in range(1, 101)): "the tokens in each last block, not the empty slots",
        },
    )

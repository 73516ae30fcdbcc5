"""Exercises of lessons 1-3: every reference passes; every tempting wrong answer is refused with a
verdict that says what differs; right answers given to the precision asked for pass; no input crashes.

The wrong answers are computed independently here (by hand from the exercise's numbers), not taken
from the exercise modules' hint tables.
"""

from __future__ import annotations

import math
from array import array

import pytest

from paged_edu.core.allocator import hash_block
from paged_edu.lessons import exercises as ex

# name -> [(tempting wrong answer, words the verdict must contain)]
WRONG = {
    "1.1": [(2 * 32 * 8 * 128, "K or V alone"), (65_536 * 4, "fp32"), (2 * 32 * 32 * 128 * 2, "GQA"),
            (2 * 8 * 128 * 2, "one layer"), (131_071, "off by -1")],
    "1.2": [(40e9 / (131_072 * 4096), "round down"), (75, "rounded up"), (80, "40 GiB"), (73, "off by -1")],
    "1.3": [(305, "whole blocks"), (302 / 74, "the gain"), (303, "off by +1")],
    "2.1": [(lambda table, t, B: table[t // B] * B, "cases match; first differences"),
            (lambda table, t, B: t, "cases match"),
            (lambda table, t, B: table[t % B] * B + t // B, "cases match"),
            (lambda table, t, B: 1 / 0, "ZeroDivisionError")],
    "2.2": [(0.99225, "the bound"), (1 - 16 / 2065, "the bound"), (0.9922, "the seed's 99.22"),
            (1 - 16 / 2064, "the seed's 99.22"), (1.0, "a multiple of 16"), (99.27, "a percentage"),
            (0.993, "at least 4 significant figures"), (0.9928, "expected 0.992733")],
    "2.3": [(400, "B/2 per request"), (350, "(B-1)/2"), (sum(s % 8 for s in range(1, 101)), "tokens in each last block"),
            (359, "off by +1")],
    "3.1": [(lambda tokens, B: [hash_block(b"", array("q", tokens[i:i + B]).tobytes())
                                for i in range(0, len(tokens) - B + 1, B)], "cases match; first differences"),
            (lambda tokens, B: [], "cases match"),
            (lambda tokens, B: [hash_block(b"", array("q", tokens).tobytes())], "cases match")],
    "3.2": [(15, "no sharing"), (8, "rounded per term"), (5, "in tokens"), (6, "off by -1")],
    "3.3": [(160 / 230, "160/230"), (0.6957, "160/230"), (8 / 15, "blocks, not tokens"), (0.53, "blocks, not tokens"),
            (0.8, "requests that hit"), (55.65, "a percentage"), (0.55, "expected 0.556522"), (0.5, "expected")],
}

# name -> answers that must pass (the right value at the precision the exercise asks for)
RIGHT = {
    "2.2": [2049 / 2064, 0.9927, 0.99273, 0.992733, 1 - 15 / 2064],
    "3.3": [0.56, 0.557, 0.5565, 128 / 230],
    "1.2": [74, 74.0],
}

CRASHERS = [float("nan"), float("inf"), -float("inf"), "abc", [1, 2], {"x": 1}, object(), True, 10**400, -1]
MINE = [n for n in ex.EXERCISES if n.split(".")[0] in ("1", "2", "3")]


def test_every_exercise_of_lessons_1_to_3_has_wrong_answers_here():
    assert sorted(WRONG) == sorted(MINE)


@pytest.mark.parametrize("name", MINE)
def test_the_reference_passes(name, capsys):
    assert ex.check(name, ex.reference(name))
    assert "[x]" in capsys.readouterr().out and f"Exercise {name}" in ex.solution(name)


@pytest.mark.parametrize("name, wrong, words", [(n, w, words) for n, cases in WRONG.items() for w, words in cases])
def test_a_tempting_wrong_answer_is_refused_and_told_what_differs(name, wrong, words, capsys):
    verdict = ex.check(name, wrong)
    out = capsys.readouterr().out
    assert not verdict and "[ ]" in out and "Well done" not in out
    assert words in str(verdict), str(verdict)


@pytest.mark.parametrize("name, right", [(n, r) for n, cases in RIGHT.items() for r in cases])
def test_a_right_answer_at_the_asked_precision_passes(name, right):
    assert ex.check(name, right)


@pytest.mark.parametrize("name", MINE)
@pytest.mark.parametrize("answer", CRASHERS, ids=repr)
def test_no_answer_crashes_a_check(name, answer):
    verdict = ex.check(name, answer)
    assert not verdict and str(verdict).startswith("[ ]")


def test_compare_handles_non_finite_values_and_stub_functions():
    assert not ex.compare("x", math.nan, 1.0) and "not a finite number" in str(ex.compare("x", math.nan, 1.0))
    assert not ex.compare("x", math.inf, 1.0, sig_figs=2)
    assert not ex.check("2.2", None) and "not answered yet" in str(ex.check("2.2", None))

    def stub(table, t, B):
        raise NotImplementedError("Exercise 2.1: return the physical slot of token t")

    assert "NotImplementedError" in str(ex.check("2.1", stub))
    with pytest.raises(KeyError, match="no exercise"):
        ex.check("9.9", 1)

"""Exercises: any answer to any exercise gets a verdict, never an exception, and only the reference
passes; the notebooks ask every exercise and answer none. Lessons 1-3 in detail: every reference
passes; every tempting wrong answer is refused with a verdict that says what differs; right answers
given to the precision asked for pass; no input crashes.

The wrong answers are computed independently here (by hand from the exercise's numbers), not taken
from the exercise modules' hint tables.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from array import array
from pathlib import Path

import pytest
import torch

from paged_edu.core.block_hash import chained_block_hashes, hash_block
from paged_edu.lessons import exercises as ex

# name -> [(tempting wrong answer, words the verdict must contain)]
WRONG = {
    "1.1": [
        (2 * 32 * 8 * 128, "K or V alone"),
        (65_536 * 4, "fp32"),
        (2 * 32 * 32 * 128 * 2, "GQA"),
        (2 * 8 * 128 * 2, "one layer"),
        (131_071, "off by -1"),
    ],
    "1.2": [(40e9 / (131_072 * 4096), "round down"), (75, "rounded up"), (80, "40 GiB"), (73, "off by -1")],
    "1.3": [(305, "whole blocks"), (302 / 74, "the gain"), (303, "off by +1")],
    "2.1": [
        (lambda table, t, B: table[t // B] * B, "cases match; first differences"),
        (lambda table, t, B: t, "cases match"),
        (lambda table, t, B: table[t % B] * B + t // B, "cases match"),
        (lambda table, t, B: 1 / 0, "ZeroDivisionError"),
    ],
    "2.2": [
        (0.99225, "the bound"),
        (1 - 16 / 2065, "the bound"),
        (0.9922, "the seed's 99.22"),
        (1 - 16 / 2064, "the seed's 99.22"),
        (1.0, "a multiple of 16"),
        (99.27, "a percentage"),
        (0.993, "at least 4 significant figures"),
        (0.9928, "expected 0.992733"),
    ],
    "2.3": [
        (400, "B/2 per request"),
        (350, "(B-1)/2"),
        (sum(s % 8 for s in range(1, 101)), "tokens in each last block"),
        (359, "off by +1"),
    ],
    "3.1": [
        (
            lambda tokens, B: [
                hash_block(b"", array("q", tokens[i : i + B]).tobytes()) for i in range(0, len(tokens) - B + 1, B)
            ],
            "the seed's per-block hash",
        ),
        (
            lambda tokens, B: [
                hashlib.sha256(str(tokens[i : i + B]).encode()).hexdigest() for i in range(0, len(tokens) - B + 1, B)
            ],
            "the seed's per-block hash",
        ),
        (lambda tokens, B: [], "cases match"),
        (lambda tokens, B: [hash_block(b"", array("q", tokens).tobytes())], "cases match"),
    ],
    "3.2": [(15, "no sharing"), (8, "rounded per term"), (5, "in tokens"), (6, "off by -1")],
    "3.3": [
        (160 / 230, "160/230"),
        (0.6957, "160/230"),
        (8 / 15, "blocks, not tokens"),
        (0.53, "blocks, not tokens"),
        (0.8, "requests that hit"),
        (55.65, "a percentage"),
        (0.55, "expected 0.556522"),
        (0.5, "expected"),
    ],
    "3.4": [(1, "unsalted case"), (4, "need a step too"), (258, "tokens, not steps"), (6, "off by +1")],
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
# ids without addresses (" at 0x..."): every pytest-xdist worker must collect the same names
@pytest.mark.parametrize("answer", CRASHERS, ids=lambda a: re.sub(" at 0x[0-9a-f]+", "", repr(a)))
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


# -- every exercise, any answer: a verdict, never an exception; only the reference passes --------
# What each exercise asks for, written here independently of the exercise modules.
FUNCTIONS = {"2.1", "3.1", "4.1", "4.2", "4.3", "5.1", "9.4", "9.5", "10.1", "10.2", "11.1"}
CLASSES = {"5.3"}
NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


class Thing:
    """An instance of some class, given where a number, a function or a class is asked."""


def _raising(exc):
    def stub(*args, **kwargs):
        raise exc

    return stub


def _raising_class(exc):
    class Stub:
        def __init__(self, *args, **kwargs):
            raise exc

    return Stub


LABELS = [
    "reference",
    "the reference's value",
    "a function returning it",
    "an instance of the reference class",
    "an instance",
    "a NotImplementedError stub",
    "a RuntimeError stub",
    "None",
    "a string",
    "a tensor",
    "NaN",
    "a dict",
    "an empty list",
]
PASSING = LABELS[:3]


def _labels(name):
    """The answers exercise ``name`` is fed: the value ones only for a value exercise, the instance of
    the reference class only for the class exercise."""
    value = name not in FUNCTIONS | CLASSES
    return [
        label
        for label in LABELS
        if (value or label not in PASSING[1:]) and (name in CLASSES or label != "an instance of the reference class")
    ]


def _answer(name, label):
    """The answer called ``label`` for exercise ``name`` (built lazily: some references run a simulation)."""
    stub = _raising_class if name in CLASSES else _raising
    if label in PASSING:
        ref = ex.reference(name)
        value = ref() if callable(ref) and name not in FUNCTIONS | CLASSES else ref
        return {"reference": ref, "the reference's value": value, "a function returning it": lambda: value}[label]
    if label == "an instance of the reference class":
        from paged_edu.lessons.exercises.lesson5 import PlainAllocator

        return PlainAllocator(8, 4)
    return {
        "an instance": Thing(),
        "a NotImplementedError stub": stub(NotImplementedError(f"Exercise {name}: your turn")),
        "a RuntimeError stub": stub(RuntimeError("boom")),
        "None": None,
        "a string": "a string",
        "a tensor": torch.tensor([1.0, 2.0]),
        "NaN": float("nan"),
        "a dict": {"x": 1},
        "an empty list": [],
    }[label]


def test_every_exercise_is_fed_the_whole_list():
    assert len(ex.EXERCISES) == 37 and set(ex.EXERCISES) >= FUNCTIONS | CLASSES
    assert all(len(_labels(n)) >= 10 for n in ex.EXERCISES)


@pytest.mark.parametrize("name, label", [(n, label) for n in ex.EXERCISES for label in _labels(n)])
def test_any_answer_gets_a_verdict_and_only_the_reference_passes(name, label, capsys):
    passes = label in PASSING
    verdict = ex.check(name, _answer(name, label))  # never raises
    printed = capsys.readouterr().out
    assert isinstance(verdict, ex.Verdict) and bool(verdict) is passes, (label, str(verdict))
    assert str(verdict).startswith("[x]" if passes else "[ ]"), str(verdict)
    assert printed.strip() == str(verdict).strip() and "Verdict(ok=" not in repr(verdict)
    if label in ("None", "a NotImplementedError stub"):
        assert "not answered yet" in str(verdict), str(verdict)
    if label == "a RuntimeError stub":
        assert "RuntimeError" in str(verdict) and "boom" in str(verdict), str(verdict)


def test_the_lessons_allocator_stub_is_not_answered_yet():
    from paged_edu.lessons.my_allocator import MyAllocator

    assert "not answered yet" in str(ex.check("5.3", MyAllocator))


def test_a_printed_verdict_is_not_echoed_by_the_notebook(capsys):
    from IPython.core.formatters import DisplayFormatter

    verdict = ex.check("1.1", None)
    capsys.readouterr()
    assert DisplayFormatter().format(verdict) == ({}, {}) and capsys.readouterr().out == ""
    unprinted = ex.compare("x", 1, 2)  # a verdict nobody printed shows its text once
    assert DisplayFormatter().format(unprinted) == ({}, {}) and capsys.readouterr().out.strip() == str(unprinted)


# The tempting wrong answers issue 21 names, each with the words its verdict must contain.
def _textbook_merge(m1, l1, o1, m2, l2, o2):  # no guard for two empty sides: exp(-inf - -inf) = NaN
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, l1 * a1 + l2 * a2, o1 * a1[..., None] + o2 * a2[..., None]


def _decode_bytes_tensor(n, s, hq, hkv, d, item):
    return torch.tensor(2 * n * s * hkv * d * item + 2 * n * hq * d * item)


def _decode_bytes_numpy(n, s, hq, hkv, d, item):
    import numpy as np

    return np.int64(2 * n * s * hkv * d * item) + np.int64(2 * n * hq * d * item)


NAMED_WRONG = [
    ("1.1", "131072", "string"),
    ("3.1", chained_block_hashes, "library's own chained_block_hashes"),
    ("3.1", lambda token_ids, B: chained_block_hashes(token_ids, B), "library's own chained_block_hashes"),
    ("4.1", _textbook_merge, "both sides empty"),
    ("5.1", lambda p, B, k: math.ceil((p + k + 1) / B), "no slot yet"),
    ("7.2", {"paged": None, "contiguous-max": None}, "not answered yet"),
    ("7.2", {"paged": 1.0, "contiguous-max": None}, "not answered yet"),
    ("8.2", {"hash B=16": None, "radix B=16": None, "radix B=1": None}, "not answered yet"),
    ("11.1", lambda b, a: a[Q11] and a[H11] / a[Q11], "since the server started"),
    ("11.2", 25.0, "upper bound"),
    ("11.2", 0.0458333, "seconds"),
    ("11.3", {"front": 0, "end": 120}, "whole blocks"),
    ("11.3", {"front": 100, "end": 112}, "timestamp"),
]
Q11, H11 = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"


@pytest.mark.parametrize("name, wrong, words", NAMED_WRONG, ids=lambda x: x if isinstance(x, str) else "")
def test_the_named_tempting_answers_are_refused_with_what_differs(name, wrong, words, capsys):
    verdict = ex.check(name, wrong)
    assert not verdict and words in str(verdict), str(verdict)


@pytest.mark.parametrize("right", [_decode_bytes_tensor, _decode_bytes_numpy], ids=["tensor", "numpy"])
def test_a_right_answer_given_as_a_tensor_or_array_passes(right):
    assert ex.check("4.2", right)
    assert ex.check("1.1", torch.tensor(131_072)) and ex.check("2.3", torch.tensor([358]))


def test_6_1_says_what_a_knob_really_did():
    from paged_edu.lessons.exercises.lesson6 import _scenario_run

    base = _scenario_run().num_preemptions
    for value in (4, 5, 6, 12):
        verdict, run = ex.check("6.1", {"max_num_seqs": value}), _scenario_run((("max_num_seqs", value),))
        text = str(verdict)
        assert not verdict and f"{run.num_preemptions} preemptions" in text
        assert ("worse" in text) == (run.num_preemptions > base), text
        assert ("fewer" in text) == (run.num_preemptions < base), text


# -- the notebooks' exercise cells ------------------------------------------------------------------
def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_every_exercise_cell_is_asked_and_unanswered(path):
    cells = _cells(path)
    seen = []
    for k, cell in enumerate(cells):
        src = "".join(cell["source"])
        names = re.findall(r'ex\.check\("(\d+\.\d+)"', src)
        if cell["cell_type"] != "code" or not names:
            continue
        seen += names
        assert "ex.reference(" not in src, f"cell {k} checks the reference on the learner's behalf"
        assert not re.search(r"^assert ", src, re.M), f"cell {k}: an assert that cannot fail"
        if re.search(r"^def ", src, re.M):
            assert "raise NotImplementedError(" in src and "return None" not in src, f"cell {k}: stub must raise"
        statement = next("".join(c["source"]) for c in reversed(cells[:k]) if c["cell_type"] == "markdown")
        for name in names:
            assert f"**{name}" in statement, f"cell {k}: no statement of {name} in the markdown cell above it"
    lesson = str(int(path.name[:2]))
    assert seen and all(n.split(".")[0] == lesson for n in seen)
    assert sorted(seen) == sorted(n for n in ex.EXERCISES if n.split(".")[0] == lesson)


def test_5_1_states_the_subtle_definition():
    cells = _cells(next(p for p in NOTEBOOKS if p.name.startswith("05")))
    k = next(i for i, c in enumerate(cells) if 'ex.check("5.1"' in "".join(c["source"]))
    statement = "".join(cells[k - 1]["source"])
    assert "## Your turn" in statement and "no slot yet" in statement


def test_7_1_names_the_s_minus_1_count():
    from paged_edu.lessons.exercises.lesson7 import lengths

    s = lengths()
    wrong = sum(x - 1 for x in s) / (len(s) * 2048)
    for answer in (wrong, float(f"{wrong:.4g}")):
        verdict = ex.check("7.1", answer)
        assert not verdict and "s - 1 tokens" in str(verdict), str(verdict)

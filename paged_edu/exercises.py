""""Your turn" exercises: check functions with friendly verdicts, and solutions you can reveal.

Each exercise has a name (``"1.1"``, ``"2.1"`` ...), a check that compares your answer with the
library's and says what matched and by how much, and a reference solution::

    from paged_edu import exercises as ex
    ex.check("1.1", my_answer)      # prints a verdict, returns a Verdict (truthy when right)
    ex.solution("1.1")              # prints the reference solution

A function answer is tried on many cases, and the verdict lists the first few that differ. An
answer left as ``None`` gets a hint, not a failure, so a notebook still runs end to end.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from paged_edu.allocator import BlockAllocator, chained_block_hashes
from paged_edu.memory import PRESETS, eta_paged, kv_bytes

__all__ = ["Verdict", "check", "solution", "EXERCISES", "compare"]


@dataclass(slots=True)
class Verdict:
    ok: bool
    lines: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "\n".join(self.lines)

    def __repr__(self) -> str:
        return f"Verdict(ok={self.ok})"


def compare(name: str, got, expected, rel_tol: float = 0.0) -> Verdict:
    """Karpathy-style ``cmp``: exact, approximate (within ``rel_tol``), or off by how much."""
    if got is None:
        return Verdict(False, [f"[ ] {name}: not answered yet -- replace None with your answer"])
    try:
        g, e = float(got), float(expected)
    except (TypeError, ValueError):
        ok = got == expected
        return Verdict(ok, [f"[{'x' if ok else ' '}] {name}: {'matches' if ok else f'got {got!r}, expected {expected!r}'}"])
    if g == e:
        return Verdict(True, [f"[x] {name}: exact ({_fmt(e)})"])
    diff = g - e
    rel = abs(diff) / abs(e) if e else math.inf
    if rel <= rel_tol:
        return Verdict(True, [f"[x] {name}: approximately right ({_fmt(g)} vs {_fmt(e)}, off by {rel:.2%})"])
    hint = ""
    if e and g and abs(round(g / e) - g / e) < 1e-9 and round(g / e) != 1:
        hint = f" -- a factor of {g / e:g}: a missing or extra term?"
    elif e and g and abs(round(e / g) - e / g) < 1e-9 and round(e / g) != 1:
        hint = f" -- 1/{e / g:g} of it: a missing or extra term?"
    return Verdict(False, [f"[ ] {name}: got {_fmt(g)}, expected {_fmt(e)} (off by {diff:+,g}, {rel:.2%}){hint}"])


def _fmt(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.6g}"


def _check_function(name: str, fn, cases: list[tuple], reference: Callable, show: int = 3) -> Verdict:
    if fn is None:
        return Verdict(False, [f"[ ] {name}: not answered yet -- define the function and pass it in"])
    bad = []
    for args in cases:
        expected = reference(*args)
        try:
            got = fn(*args)
        except Exception as exc:  # a learner's bug is a verdict, not a crash
            got = f"{type(exc).__name__}: {exc}"
        if got != expected:
            bad.append((args, got, expected))
    if not bad:
        return Verdict(True, [f"[x] {name}: all {len(cases)} cases match"])
    lines = [f"[ ] {name}: {len(cases) - len(bad)} of {len(cases)} cases match; first differences:"]
    for args, got, expected in bad[:show]:
        lines.append(f"    {name}{_short(args)} -> {_short(got)}, expected {_short(expected)}")
    return Verdict(False, lines)


def _short(x, limit: int = 90) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ----------------------------------------------------------------------------------------------
# The exercises
# ----------------------------------------------------------------------------------------------


def _check_1_1(answer) -> Verdict:
    return compare("bytes per token of Llama-3-8B in bf16", answer, PRESETS["Llama-3-8B"].bytes_per_token)


def _check_1_2(answer) -> Verdict:
    # 40 GB for KV, Llama-3-8B bf16, requests of 1,000 tokens reserving L_max = 4,096 contiguously.
    per_request = kv_bytes(PRESETS["Llama-3-8B"], 4096)
    return compare("contiguous requests (L_max = 4096) that fit in 40e9 bytes", answer, 40_000_000_000 // per_request)


def _check_1_3(answer) -> Verdict:
    per_request = kv_bytes(PRESETS["Llama-3-8B"], 1008)  # ceil(1000/16) = 63 blocks = 1008 slots
    return compare("paged requests (s = 1000, B = 16) that fit in 40e9 bytes", answer, 40_000_000_000 // per_request)


def _slot_reference(block_table, t, block_size):
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


def _check_2_1(fn) -> Verdict:
    return _check_function("physical_slot", fn, _slot_cases(), _slot_reference)


def _check_2_2(answer) -> Verdict:
    return compare("eta_paged for s = 2049, B = 16", answer, eta_paged(2049, 16), rel_tol=1e-3)


def _check_2_3(answer) -> Verdict:
    # Wasted slots of 100 requests with lengths 1..100 at B = 8.
    expected = sum(-(-s // 8) * 8 - s for s in range(1, 101))
    return compare("wasted slots for lengths 1..100 at B = 8", answer, expected)


def _hash_cases() -> list[tuple]:
    rng = random.Random(3)
    cases = []
    for B in (2, 4, 16):
        for _ in range(5):
            cases.append(([rng.randrange(50) for _ in range(rng.randint(0, 5 * B))], B))
    cases.append(([7] * 8, 4))  # two identical blocks: their hashes must differ
    return cases


def _check_3_1(fn) -> Verdict:
    verdict = _check_function("chained_hashes", fn, _hash_cases(), chained_block_hashes)
    if verdict.ok:
        verdict.lines.append("    (and the two identical blocks of [7]*8 got different hashes, because their prefixes differ)")
    return verdict


def _check_3_2(answer) -> Verdict:
    # 5 chats: a 40-token system prompt, then 6 private tokens each; B = 16.
    a = BlockAllocator(64, 16)
    for k in range(5):
        a.allocate(k, list(range(40)) + [1000 + 10 * k + j for j in range(6)])
    return compare("blocks in use for 5 chats sharing a 40-token system prompt (B = 16)", answer, a.num_used_blocks)


def _check_3_3(answer) -> Verdict:
    a = BlockAllocator(64, 16)
    for k in range(5):
        a.allocate(k, list(range(40)) + [1000 + 10 * k + j for j in range(6)])
    return compare("prefix hit rate of those 5 chats", answer, a.stats.hit_rate, rel_tol=5e-3)


@dataclass(slots=True)
class Exercise:
    question: str
    checker: Callable[[object], Verdict]
    solution: str  # Python source; ``answer`` (or the function) is what it defines


EXERCISES: dict[str, Exercise] = {
    "1.1": Exercise(
        "Llama-3-8B: 32 layers, 8 KV heads, head_dim 128, bf16. How many bytes does one token take in the KV cache?",
        _check_1_1,
        "answer = 2 * 32 * 8 * 128 * 2   # K and V, layers, KV heads, head_dim, bytes per bf16 = 131,072 B = 128 KiB"),
    "1.2": Exercise(
        "40e9 bytes are left for the KV cache of Llama-3-8B (bf16). How many requests fit if each reserves "
        "L_max = 4096 contiguous slots?",
        _check_1_2,
        "answer = 40_000_000_000 // (2 * 32 * 8 * 128 * 2 * 4096)   # 74"),
    "1.3": Exercise(
        "Same memory, but the requests actually hold s = 1000 tokens and the cache is paged with B = 16. How many fit?",
        _check_1_3,
        "import math\n"
        "blocks_per_request = math.ceil(1000 / 16)                        # 63 blocks = 1008 slots\n"
        "answer = 40_000_000_000 // (2 * 32 * 8 * 128 * 2 * 16 * blocks_per_request)   # 302, about 4x more"),
    "2.1": Exercise(
        "Write physical_slot(block_table, t, B): the physical slot of token t, B(t // B) * B + t mod B.",
        _check_2_1,
        "def physical_slot(block_table, t, B):\n"
        "    i, j = divmod(t, B)          # logical block and offset\n"
        "    return block_table[i] * B + j"),
    "2.2": Exercise("eta_paged for s = 2049 tokens and B = 16?", _check_2_2,
                    "import math\nanswer = 2049 / (math.ceil(2049 / 16) * 16)   # 2049 / 2064 = 0.99273 (one slot past a block)"),
    "2.3": Exercise("100 requests have lengths 1, 2, ..., 100 and B = 8. How many slots are reserved but empty in total?",
                    _check_2_3,
                    "import math\nanswer = sum(math.ceil(s / 8) * 8 - s for s in range(1, 101))   # 358"),
    "3.1": Exercise(
        "Write chained_hashes(token_ids, B): the chained hash h_i = hash_block(h_{i-1}, bytes of block i) of every "
        "full block, with h_{-1} = b'' and the tokens packed as array('q', block).tobytes().",
        _check_3_1,
        "from array import array\nfrom paged_edu.allocator import hash_block\n\n"
        "def chained_hashes(token_ids, B):\n"
        "    hashes, parent = [], b''\n"
        "    for start in range(0, len(token_ids) - B + 1, B):       # full blocks only\n"
        "        parent = hash_block(parent, array('q', token_ids[start:start + B]).tobytes())\n"
        "        hashes.append(parent)\n"
        "    return hashes"),
    "3.2": Exercise(
        "5 chats share a 40-token system prompt and add 6 private tokens each (B = 16). How many blocks are in use?",
        _check_3_2,
        "# 46 tokens = 3 blocks each. Blocks 0 and 1 (tokens 0-31) are full and identical: shared.\n"
        "# Block 2 holds tokens 32-45 (8 shared + 6 private): private to each chat.\n"
        "answer = 2 + 5 * 1   # 7, instead of 15 without sharing"),
    "3.3": Exercise("And the prefix hit rate (hit tokens / queried prompt tokens) after those 5 chats?", _check_3_3,
                    "answer = (4 * 32) / (5 * 46)   # the first chat misses; 4 chats hit 32 tokens each: 0.5565"),
}


def check(name: str, answer) -> Verdict:
    """Check an answer to exercise ``name``; print and return the verdict."""
    try:
        exercise = EXERCISES[name]
    except KeyError:
        raise KeyError(f"no exercise {name!r}; there are {', '.join(EXERCISES)}") from None
    verdict = exercise.checker(answer)
    if verdict.ok:
        verdict.lines.append("    Well done.")
    print(verdict)
    return verdict


def solution(name: str) -> str:
    """Print (and return) the reference solution of exercise ``name``."""
    try:
        exercise = EXERCISES[name]
    except KeyError:
        raise KeyError(f"no exercise {name!r}; there are {', '.join(EXERCISES)}") from None
    print(f"# Exercise {name}: {exercise.question}\n{exercise.solution}")
    return exercise.solution

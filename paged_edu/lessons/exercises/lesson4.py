"""Lesson 4's exercises: merging partial softmax states, the bytes of a decode call, the per-block update.

Every check compares against an independent oracle -- attention computed by
:func:`paged_edu.kernels.reference.paged_attention_torch` or from the definition of a state -- and,
when an answer is wrong, tries the tempting wrong answers listed here to say which one it matches.
"""

from __future__ import annotations

import random

import torch

from paged_edu.kernels.online_softmax import block_update, merge_states
from paged_edu.kernels.reference import gather_kv, paged_attention_torch
from paged_edu.labs.timing import decode_bytes, random_paged_case
from paged_edu.lessons.exercises.framework import Verdict, one_number, raised, register
from paged_edu.labs.softmax_stepper import OnlineSoftmaxStepper

TOL = 1e-5


def _describe_error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _as_float64(x):
    """``x`` as a float64 tensor, or None when it is not numbers (a string, a ragged list, None)."""
    try:
        return torch.as_tensor(x, dtype=torch.float64)
    except Exception:
        return None


def _close(a, b, tol=TOL) -> bool:
    a, b = _as_float64(a), _as_float64(b)
    if a is None or b is None or a.shape != b.shape:
        return False
    same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    a, b = torch.where(same_inf, 0.0, a), torch.where(same_inf, 0.0, b)
    return bool(torch.isfinite(a).all()) and bool(((a - b).abs() <= tol * (1 + b.abs())).all())


def _matches(got, candidate) -> bool:
    return isinstance(got, (tuple, list)) and len(got) == 3 and all(_close(g, c) for g, c in zip(got, candidate))


def _normalised_close(got, truth) -> bool:
    """Is ``o / l`` of the state ``got`` the attention output ``truth``?"""
    o, l = _as_float64(got[2]), _as_float64(got[1])
    return o is not None and l is not None and l.dim() == 1 and o.shape[:1] == l.shape and _close(o / l[:, None], truth)


# ----------------------------------------------------------------------------------------------
# 4.1 -- merge two partial states
# ----------------------------------------------------------------------------------------------


def merge_stub(m1, l1, o1, m2, l2, o2):
    raise NotImplementedError("Exercise 4.1: return (m, l, o) over the union of the two token sets")


# Tempting wrong answers, each with what the verdict says when an answer matches it.
WRONG_MERGES = {
    "added l and o without rescaling: each side's l and o are relative to its own max m_i, so multiply "
    "them by exp(m_i - m) first": lambda m1, l1, o1, m2, l2, o2: (torch.maximum(m1, m2), l1 + l2, o1 + o2),
    "rescaled o but not l: l_i is a sum of exp(S - m_i) too, so it needs the same factor exp(m_i - m)": lambda m1, l1, o1, m2, l2, o2: (
        (lambda m: (m, l1 + l2, o1 * torch.exp(m1 - m)[..., None] + o2 * torch.exp(m2 - m)[..., None]))(
            torch.maximum(m1, m2)
        )
    ),
    "averaged the two outputs: o1/l1 and o2/l2 must be weighted by how much softmax mass each side holds, "
    "l_i exp(m_i - m), not equally": lambda m1, l1, o1, m2, l2, o2: (
        torch.maximum(m1, m2),
        torch.ones_like(l1),
        0.5 * (o1 / l1[..., None] + o2 / l2[..., None]),
    ),
}


def partial_state(q, k, v, scale):
    """The state over the tokens of ``k``/``v`` from its definition: q (H_q, D), k/v (n, H_q, D)."""
    S = torch.einsum("hd,nhd->hn", q, k) * scale  # (H_q, n)
    if S.shape[1] == 0:
        return (torch.full(S.shape[:1], float("-inf")), torch.zeros(S.shape[:1]), torch.zeros(q.shape))
    m = S.amax(dim=-1)
    P = torch.exp(S - m[:, None])
    return m, P.sum(dim=-1), torch.einsum("hn,nhd->hd", P, v)


def _merge_cases():
    """(name, state1, state2, oracle output, state over the union): GQA and MQA, ragged lengths, splits
    anywhere -- inside a block, at 0 (an empty left side), at s (an empty right side)."""
    rng = random.Random(41)
    cases = []
    for (num_q, num_kv), s, cut in [
        ((8, 2), 37, 13),
        ((4, 4), 16, 16),
        ((8, 1), 5, 0),
        ((6, 3), 100, 51),
        ((4, 2), 1, 1),
        ((8, 2), 64, 7),
    ]:
        d, B = 16, 8
        q, k_cache, v_cache, tables, _ = random_paged_case(
            1, -(-s // B) * B, num_q, num_kv, d, B, dtype=torch.float32, device="cpu", seed=rng.randrange(10**6)
        )
        lens = torch.tensor([s], dtype=torch.int32)
        q = 3 * q  # sharper softmax: the max matters
        scale = d**-0.5
        truth = paged_attention_torch(q, k_cache, v_cache, tables, lens, scale=scale)[0]  # (H_q, D)
        k, _ = gather_kv(k_cache, tables, lens)
        v, _ = gather_kv(v_cache, tables, lens)
        heads = torch.arange(num_q) // (num_q // num_kv)
        k, v = k[0, :s][:, heads], v[0, :s][:, heads]  # (s, H_q, D): query head h sees KV head h // G
        st1 = partial_state(q[0], k[:cut], v[:cut], scale)
        st2 = partial_state(q[0], k[cut:], v[cut:], scale)
        whole = partial_state(q[0], k, v, scale)
        cases.append((f"H_q={num_q}, H_kv={num_kv}, s={s}, split at {cut}", st1, st2, truth, whole))
    # Both sides empty: a split that starts past the end of a short sequence, merged with another
    # such split. The union is empty too: m = -inf, l = 0, o = 0 (and no o / l to compare).
    q, none = torch.zeros(4, 16), torch.zeros(0, 4, 16)
    empty = partial_state(q, none, none, 0.25)
    cases.append((BOTH_EMPTY, empty, empty, None, empty))
    return cases


BOTH_EMPTY = "both sides empty (H_q=4, no tokens on either side)"
BOTH_EMPTY_HINT = (
    "both sides empty -- a split past the end of the sequence, merged with another: m1 = m2 = -inf, so "
    "m = -inf and exp(m_i - m) = exp(-inf - (-inf)) = NaN. The union of two empty sets is empty (m = -inf, "
    "l = 0, o = 0): rescale with exp(m_i - m) only where m is finite (e.g. subtract 0 instead of m "
    "where m = -inf), as the kernel's merge gives an empty split weight 0"
)


@register(
    "4.1",
    "Write merge(m1, l1, o1, m2, l2, o2): the state (m, l, o) over the union of two disjoint "
    "token sets, given each set's state (m, l of shape (H,), o unnormalised, (H, D)).",
    merge_states,
    kind="function",
)
def _check_4_1(fn) -> Verdict:
    cases = _merge_cases()
    for name, st1, st2, truth, whole in cases:
        try:
            got = fn(*(t.clone() for t in st1), *(t.clone() for t in st2))
        except Exception as exc:  # a learner's bug is a verdict, not a crash
            return raised("merge", exc, f"on {name}, your function")
        if got is None:
            return Verdict(False, ["[ ] merge: not answered yet -- your function returned None"])
        if _matches(got, whole) and (truth is None or _normalised_close(got, truth)):
            continue
        lines = [f"[ ] merge: wrong on {name}"]
        if name == BOTH_EMPTY:
            state = [_as_float64(g) for g in got] if isinstance(got, (tuple, list)) else []
            if any(t is not None and bool(torch.isnan(t).any()) for t in state):
                return Verdict(False, lines + [f"    it returned NaN: {BOTH_EMPTY_HINT}"])
        for hint, wrong in WRONG_MERGES.items():
            if _matches(got, wrong(*st1, *st2)):
                lines.append(f"    you {hint}")
                break
        else:
            if isinstance(got, (tuple, list)) and len(got) == 3:
                for part, g, e in zip(("m", "l", "o"), got, whole):
                    if not _close(g, e):
                        t = _as_float64(g)
                        diff = (
                            "not numbers"
                            if t is None
                            else f"shape {tuple(t.shape)}, expected {tuple(e.shape)}"
                            if t.shape != e.shape
                            else f"max difference {(t - e.double()).abs().max().item()}"
                        )
                        lines.append(f"    {part} differs from the state over both sets ({diff})")
                        break
                else:
                    lines.append("    o / l differs from attention over the whole sequence")
            else:
                lines.append(f"    expected a tuple (m, l, o), got {type(got).__name__}")
        return Verdict(False, lines)
    return Verdict(
        True,
        [
            f"[x] merge: all {len(cases)} cases match the oracle (GQA/MQA, ragged lengths, "
            "splits inside a block, one empty side or both); o / l equals attention over the whole sequence"
        ],
    )


# ----------------------------------------------------------------------------------------------
# 4.2 -- the bytes one decode call must read
# ----------------------------------------------------------------------------------------------


_BYTES_CASES = [
    (1, 8192, 32, 8, 128, 2),
    (64, 4096, 32, 8, 128, 2),
    (16, 32768, 32, 8, 128, 2),
    (8, 16, 32, 8, 128, 2),
    (4, 1000, 9, 3, 64, 4),
    (3, 50, 16, 16, 64, 2),
    (2, 300, 8, 1, 128, 1),
]


def _kv(n, s, h, d, item):
    return 2 * n * s * h * d * item


def _q_out(n, hq, d, item):
    return 2 * n * hq * d * item


# Tempting wrong answers, each with what the verdict says when an answer matches it.
WRONG_BYTES = {
    "counted K but not V: the kernel reads both for every token": lambda n, s, hq, hkv, d, item: (
        _kv(n, s, hkv, d, item) // 2 + _q_out(n, hq, d, item)
    ),
    "counted K and V once per *query* head: the query heads of a GQA group share one KV head, so the kernel "
    "loads those bytes once -- num_kv_heads, not num_q_heads": lambda n, s, hq, hkv, d, item: (
        _kv(n, s, hq, d, item) + _q_out(n, hq, d, item)
    ),
    "counted K and V once per query head and left out q and the output": lambda n, s, hq, hkv, d, item: _kv(
        n, s, hq, d, item
    ),
    "left out the queries read and the outputs written (2 * num_seqs * num_q_heads * head_dim * itemsize): "
    "small for long sequences, not for short ones": lambda n, s, hq, hkv, d, item: _kv(n, s, hkv, d, item),
    "counted elements, not bytes: multiply by itemsize": lambda n, s, hq, hkv, d, item: (
        _kv(n, s, hkv, d, 1) + _q_out(n, hq, d, 1)
    ),
}


@register(
    "4.2",
    "Write decode_bytes(num_seqs, seq_len, num_q_heads, num_kv_heads, head_dim, itemsize): the "
    "bytes one decode call must move at least (K, V, the queries read and the outputs written).",
    decode_bytes,
    kind="function",
)
def _check_4_2(fn) -> Verdict:
    for args in _BYTES_CASES:
        expected = decode_bytes(*args)
        try:
            got = one_number(fn(*args))  # a right count computed in torch or numpy passes
        except Exception as exc:
            return raised("decode_bytes", exc, f"decode_bytes{args}")
        if isinstance(got, (int, float)) and not isinstance(got, bool) and got == expected:
            continue
        if got is None:
            return Verdict(False, ["[ ] decode_bytes: not answered yet -- your function returned None"])
        lines = [f"[ ] decode_bytes{args} -> {got!r}, expected {expected:,}"]
        hint = next(
            (h for h, wrong in WRONG_BYTES.items() if isinstance(got, (int, float)) and got == wrong(*args)), None
        )
        if hint:
            lines.append(f"    you {hint}")
        elif isinstance(got, (int, float)) and not isinstance(got, bool) and got:
            lines.append(f"    off by a factor of {got / expected:.4g}")
        return Verdict(False, lines)
    return Verdict(True, [f"[x] decode_bytes: all {len(_BYTES_CASES)} cases match (GQA, MQA, MHA; bf16, fp32, fp8)"])


# ----------------------------------------------------------------------------------------------
# 4.3 -- the per-block online-softmax update, run by the stepper
# ----------------------------------------------------------------------------------------------


def block_update_stub(m, l, o, scores, values, valid):
    raise NotImplementedError("Exercise 4.3: fold one block into (m, l, o) and return the new (m, l, o)")


def _no_mask(m, l, o, scores, values, valid):
    return block_update(m, l, o, scores, values, torch.ones_like(valid))


def _no_rescale(m, l, o, scores, values, valid):
    m_new, _, _ = block_update(m, l, o, scores, values, valid)
    P = torch.exp(scores.masked_fill(~valid, float("-inf")) - m_new[:, None])
    return m_new, l + P.sum(-1), o + torch.einsum("hb,hbd->hd", P, values)


WRONG_UPDATES = {
    "the masked slots were counted: slots where valid is False hold another request's stale K/V -- set their "
    "scores to -inf (M_b) before the max and the exp": _no_mask,
    "l and o were not rescaled: when the max grows, multiply the old l and o by exp(m - m_new)": _no_rescale,
}

# (seq_len, block_size, num_q_heads, num_kv_heads, head_dim, shuffled): a partial last block, MQA with
# full blocks, a single partial block, ragged GQA, and a shuffled table.
STEPPER_CASES = [
    (45, 8, 4, 2, 16, False),
    (32, 8, 8, 1, 8, False),
    (5, 16, 2, 2, 4, False),
    (100, 16, 6, 3, 16, False),
    (45, 8, 4, 2, 16, True),
]


def run_stepper_check(update) -> tuple[bool, str]:
    """Run the stepper with ``update`` and with the reference on every case; compare every step's state
    and the final ``o / l`` with attention over the whole sequence. Returns (ok, what differed)."""
    for seq_len, B, hq, hkv, d, shuffled in STEPPER_CASES:
        name = f"s={seq_len}, B={B}, H_q={hq}, H_kv={hkv}{', shuffled' if shuffled else ''}"
        case = dict(block_size=B, num_blocks=-(-seq_len // B) + 3, num_q_heads=hq, num_kv_heads=hkv, head_dim=d)
        mine = OnlineSoftmaxStepper(seq_len, **case, seed=seq_len, update=update)
        ref = OnlineSoftmaxStepper(seq_len, **case, seed=seq_len)
        if shuffled:
            mine.shuffle()
            ref.shuffle()
        for b in range(ref.num_logical_blocks):
            expected = ref.step()
            try:
                got = mine.step()
            except NotImplementedError:
                raise  # "not answered yet", said by the check
            except TypeError as exc:
                if "got NoneType" in str(exc):
                    return False, "not answered yet -- your function returned None"
                return False, f"{name}: block {b} raised {_describe_error(exc)}"
            except Exception as exc:
                return False, f"{name}: block {b} raised {_describe_error(exc)}"
            for part in ("m", "l", "o"):
                if not _close(got[part], expected[part]):
                    tail = (
                        " (the last block, with a masked tail)"
                        if b == ref.num_logical_blocks - 1 and seq_len % B
                        else ""
                    )
                    return False, f"{name}: after block {b}{tail}, {part} differs from the reference state"
        if not _close(mine.output(), ref.truth):
            return False, f"{name}: the final o / l differs from attention over the whole sequence"
    return True, ""


@register(
    "4.3",
    "Write block_update(m, l, o, scores, values, valid): fold one block -- scores (H, B), values "
    "(H, B, D), valid (B,) bool -- into the state m (H,), l (H,), o (H, D); return the new (m, l, o).",
    block_update,
    kind="function",
)
def _check_4_3(fn) -> Verdict:
    try:
        ok, what = run_stepper_check(fn)
    except NotImplementedError as exc:
        return raised("block_update", exc, "your function")
    if ok:
        return Verdict(
            True,
            [
                f"[x] block_update: the stepper ran it on all {len(STEPPER_CASES)} cases (partial last "
                "block, MQA, GQA, a shuffled table); every step's (m, l, o) matches, and o / l at the "
                "last block equals attention over the whole sequence"
            ],
        )
    lines = [f"[ ] block_update: {what}"]
    for hint, wrong in WRONG_UPDATES.items():
        if _same_as(fn, wrong):
            lines.append(f"    {hint}")
            break
    return Verdict(False, lines)


def _same_as(fn, wrong) -> bool:
    """Does ``fn`` give what the wrong answer ``wrong`` gives on a block with a masked tail and a growing max?"""
    g = torch.Generator().manual_seed(7)
    m, l, o = torch.tensor([0.5, -1.0]), torch.tensor([2.0, 1.5]), torch.randn(2, 4, generator=g)
    scores = 3 * torch.randn(2, 6, generator=g)
    scores[:, 4:] = 9.0  # stale slots with large scores
    values, valid = torch.randn(2, 6, 4, generator=g), torch.arange(6) < 4
    try:
        return _matches(fn(m, l, o, scores, values, valid), wrong(m, l, o, scores, values, valid))
    except Exception:
        return False


__all__ = [
    "merge_stub",
    "block_update_stub",
    "run_stepper_check",
    "partial_state",
    "WRONG_MERGES",
    "WRONG_BYTES",
    "WRONG_UPDATES",
]

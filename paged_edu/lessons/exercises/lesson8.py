"""Lesson 8's exercises: a vLLM command line in blocks, a chat workload's hit rate under each cache,
and where cache-aware admission (LPM) helps -- each checked against the library or the simulator."""

from __future__ import annotations

import math
from functools import lru_cache

from paged_edu.core.hardware import GPUS, MODELS
from paged_edu.labs import cache_compare as cc
from paged_edu.labs import serving_flags as sf
from paged_edu.lessons.exercises.framework import Verdict, compare, describe, register
from paged_edu.sched.policy import POLICIES

COMMAND = "vllm serve facebook/opt-13b --gpu-memory-utilization 0.85 --block-size 32 --kv-cache-dtype fp8"
GPU = "a100-80gb"
# Exercise 8.2's chat: 50 conversations of 4 turns, each user message 40 tokens, each reply 56 (lengths
# that end inside a block of 16), arriving at 20/s into the H200's whole pool: nothing is evicted.
CHAT = {"num_requests": 200, "user_len": 40, "reply_len": 56, "num_turns": 4}
CACHE_KEYS = ("hash B=16", "radix B=16", "radix B=1")


def kv_blocks(command: str = COMMAND, gpu: str = GPU) -> int:
    """8.1's reference: the library's translation of the command line."""
    return sf.translate(command, gpu=gpu).num_blocks


def _wrong_blocks() -> dict:
    """8.1's tempting wrong answers, each from the exercise's numbers by hand."""
    g, total = MODELS["opt-13b"], GPUS[GPU].memory_bytes
    weights = g.num_params * 2
    m_fp8, m_fp16 = 2 * 40 * 40 * 128, 2 * 2 * 40 * 40 * 128
    budget = 0.85 * total - weights
    return {
        int(budget // (32 * m_fp16)): "an fp16 cache; --kv-cache-dtype fp8 stores 1 byte per value",
        int(budget // (16 * m_fp8)): "blocks of 16; --block-size 32 makes each block twice as big",
        int(0.85 * (total - weights) // (32 * m_fp8)): "0.85 of what is free after the weights (lesson 6's engine); "
        "vLLM takes 0.85 of the TOTAL and subtracts the weights",
        int((0.85 * 80e9 - weights) // (32 * m_fp8)): "80 GB in decimal units; the device reports 81,920 MiB",
        int(budget // m_fp8): "tokens, not blocks: divide by the block's 32 tokens",
        int(0.85 * total // (32 * m_fp8)): "the weights were not subtracted",
    }


@register(
    "8.1",
    f"On an A100 80GB, how many KV blocks does `{COMMAND}` leave? (vLLM's rule: gpu_memory_utilization "
    "x the GPU's memory - the weights, divided by the bytes of one block; OPT-13B's geometry is in "
    "paged_edu.core.hardware.MODELS)",
    kv_blocks,
)
def _check_8_1(answer) -> Verdict:
    return compare("KV blocks", answer, kv_blocks(), hints=_wrong_blocks())


def chat_requests():
    """8.2's workload (the simulator's multi-turn chat with the lengths of :data:`CHAT`)."""
    from paged_edu.sim.prefix_workloads import multiturn

    c = CHAT
    return multiturn(
        c["num_requests"], 20.0, 0, num_turns=c["num_turns"], user_len=c["user_len"], reply_len=c["reply_len"]
    )


def chat_hit_rates() -> dict[str, float]:
    """8.2's reference, worked out without the simulator: turn t hits what the previous turn STORED, in
    whole blocks -- its prompt and its reply but the reply's last token (a sampled token's K/V is only
    computed when it is fed back, and the conversation ends there); the first turn hits nothing.
    Hit rate = hit tokens / prompt tokens."""
    c = CHAT
    prompts = [t * c["user_len"] + (t - 1) * c["reply_len"] for t in range(1, c["num_turns"] + 1)]
    queried = sum(prompts)
    rates = {}
    for key in CACHE_KEYS:
        b = int(key.split("B=")[1])
        rates[key] = sum((p + c["reply_len"] - 1) // b * b for p in prompts[:-1]) / queried
    return rates


@lru_cache(maxsize=1)
def _simulated_chat() -> dict[str, float]:
    c = CHAT
    rows = cc.granularity(c["num_requests"], 0, c["user_len"], c["reply_len"])
    return {r.cache: r.hit_rate for r in rows}


def _chat_wrong(key: str) -> dict:
    c = CHAT
    prompts = [t * c["user_len"] + (t - 1) * c["reply_len"] for t in range(1, c["num_turns"] + 1)]
    q = sum(prompts)
    b = int(key.split("B=")[1])
    stored = [p + c["reply_len"] - 1 for p in prompts[:-1]]  # what each turn left in the cache, in tokens
    candidates = [
        (
            sum(p + c["reply_len"] for p in prompts[:-1]) / q,
            "the whole reply counted as cached: its last sampled "
            "token is never stored (its K/V would be computed only when it is fed back), so it cannot be hit",
        ),
        (
            sum(p // b * b for p in prompts[:-1]) / q,
            "the reply counted as never cached: the next turn's prompt "
            "carries the reply's tokens, and the blocks the reply filled are cached like the prompt's",
        ),
        ((c["num_turns"] - 1) / c["num_turns"], "the share of requests that hit; the hit rate counts tokens"),
        (sum(-(-s // b) * b for s in stored) / q, "rounded up: a partly filled last block is never cached"),
    ]
    if b != 1:
        candidates.append(
            (sum(stored) / q, "token granularity: at B=16 only whole blocks of what the earlier turn stored hit")
        )
    wrong: dict[float, str] = {}
    for value, hint in candidates:  # two mistakes can land on the same number: name both
        wrong[value] = f"{wrong[value]}; or {hint}" if value in wrong else hint
    return wrong


@register(
    "8.2",
    "Exercise 8.2's chat (ex8.CHAT, ex8.chat_requests()): 50 conversations of 4 turns, user messages "
    "of 40 tokens, replies of 56, nothing evicted. Predict the prefix hit rate (hit tokens / prompt tokens) "
    "under each cache: a dict {'hash B=16': ..., 'radix B=16': ..., 'radix B=1': ...}.",
    chat_hit_rates,
)
def _check_8_2(answer) -> Verdict:
    if not isinstance(answer, dict) or set(answer) != set(CACHE_KEYS):
        return Verdict(False, [f"[ ] 8.2: give a dict with the keys {list(CACHE_KEYS)}, got {describe(answer)}"])
    simulated = _simulated_chat()
    verdicts = [
        compare(f"hit rate, {key}", answer[key], simulated[key], sig_figs=3, hints=_chat_wrong(key))
        for key in CACHE_KEYS
    ]
    lines = [line for v in verdicts for line in v.lines]
    return Verdict(
        all(verdicts),
        lines + ([] if all(verdicts) else ["    (the simulator's measured hit rates are what is checked)"]),
    )


SPEC_KEYS = ("workload", "num_kv_slots", "rate")
WIN_FACTOR = 0.95  # "LPM beats FCFS": its TTFT p50 at least 5 % lower


@lru_cache(maxsize=32)
def _lpm_vs_fcfs(workload: str, num_kv_slots, rate: float) -> tuple[cc.CacheRow, cc.CacheRow]:
    return tuple(cc.run_setting(workload, num_kv_slots, rate, "paged-radix", 16, p) for p in POLICIES)


def _clean_spec(spec):
    if not isinstance(spec, dict) or set(spec) != set(SPEC_KEYS):
        raise ValueError(f"give a dict with the keys {list(SPEC_KEYS)}, got {spec!r}")
    slots, rate = spec["num_kv_slots"], spec["rate"]
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 1):
        raise ValueError(f"num_kv_slots must be None (the H200's whole pool) or a positive int, got {slots!r}")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise ValueError(f"rate must be a positive number of requests/s (math.inf: all at t = 0), got {rate!r}")
    return spec["workload"], slots, float(rate)


def _lpm_verdict(label: str, spec, want_win: bool) -> Verdict:
    try:
        workload, slots, rate = _clean_spec(spec)
        fcfs, lpm = _lpm_vs_fcfs(workload, slots, rate)
    except (ValueError, TypeError) as exc:
        return Verdict(False, [f"[ ] {label}: {exc}"])
    wins = lpm.ttft_p50 < WIN_FACTOR * fcfs.ttft_p50
    said = (
        f"{label}: TTFT p50 FCFS {fcfs.ttft_p50:.3f} s, LPM {lpm.ttft_p50:.3f} s (p99 {fcfs.ttft_p99:.3f} / "
        f"{lpm.ttft_p99:.3f} s); hit rate {fcfs.hit_rate:.3f} / {lpm.hit_rate:.3f}"
    )
    if wins == want_win:
        return Verdict(True, [f"[x] {said}"])
    if want_win:
        if lpm.ttft_p50 == fcfs.ttft_p50 and lpm.hit_rate == fcfs.hit_rate:
            why = (
                "identical runs: no queue forms (a roomy pool, a gentle rate), or no waiting request has a cached "
                "prefix (sharegpt shares none), so LPM admits in FCFS order"
            )
        else:
            why = "LPM reorders here but does not cut TTFT p50 by 5 %: try a smaller pool with everything at t = 0"
    else:
        why = "LPM wins here; a run where it cannot (no queue, or no shared prefixes) or where it starves the median"
    return Verdict(False, [f"[ ] {said} -- {why}"])


@register(
    "8.3",
    "Find one workload where LPM beats FCFS (TTFT p50 at least 5 % lower) and one where it does not, "
    "on the radix cache (B = 16, 200 requests, OPT-13B on the H200). Answer {'lpm_wins': spec, "
    "'lpm_does_not_win': spec}, each spec {'workload': name, 'num_kv_slots': int or None, 'rate': req/s}.",
    {
        "lpm_wins": {"workload": "fewshot", "num_kv_slots": 6144, "rate": math.inf},
        "lpm_does_not_win": {"workload": "multiturn", "num_kv_slots": 6144, "rate": math.inf},
    },
)
def _check_8_3(answer) -> Verdict:
    if not isinstance(answer, dict) or set(answer) != {"lpm_wins", "lpm_does_not_win"}:
        return Verdict(
            False, [f"[ ] 8.3: give a dict with the keys 'lpm_wins' and 'lpm_does_not_win', got {describe(answer)}"]
        )
    a = _lpm_verdict("lpm_wins", answer["lpm_wins"], True)
    b = _lpm_verdict("lpm_does_not_win", answer["lpm_does_not_win"], False)
    return Verdict(bool(a and b), a.lines + b.lines)

"""Lesson 1's exercises: what a token costs, and how many requests a budget holds."""

from __future__ import annotations

import math

from paged_edu.core.hardware import MODELS
from paged_edu.core.memory import kv_bytes
from paged_edu.lessons.exercises.framework import Verdict, compare, register

BUDGET = 40_000_000_000  # bytes left for the KV cache in exercises 1.2 and 1.3


def bytes_per_token_llama3_8b() -> int:
    return 2 * 32 * 8 * 128 * 2  # K and V, layers, KV heads, head_dim, bytes per bf16 = 131,072 B


def contiguous_requests() -> int:
    return BUDGET // (bytes_per_token_llama3_8b() * 4096)  # each reserves L_max = 4096 slots: 74


def paged_requests() -> int:
    blocks_per_request = math.ceil(1000 / 16)  # 63 blocks = 1008 slots
    return BUDGET // (bytes_per_token_llama3_8b() * 16 * blocks_per_request)  # 302, about 4x more


@register(
    "1.1",
    "Llama-3-8B: 32 layers, 8 KV heads, head_dim 128, bf16. How many bytes does one token take in the KV cache?",
    bytes_per_token_llama3_8b(),
)
def _check_1_1(answer) -> Verdict:
    spec = MODELS["llama-3-8b"]
    return compare(
        "bytes per token of Llama-3-8B in bf16",
        answer,
        spec.kv_bytes_per_token,
        hints={
            spec.kv_bytes_per_token // 2: "K or V alone: the cache stores both (the factor 2)",
            spec.kv_bytes_per_token * 2: "4 bytes per value (fp32); bf16 takes 2",
            spec.kv_bytes_per_token * 4: "32 KV heads, one per query head; with GQA only 8 KV heads are stored",
            spec.kv_bytes_per_token // 32: "one layer; the cache holds all 32",
        },
    )


@register(
    "1.2",
    "40e9 bytes are left for the KV cache of Llama-3-8B (bf16). How many requests fit if "
    "each reserves L_max = 4096 contiguous slots?",
    contiguous_requests(),
)
def _check_1_2(answer) -> Verdict:
    one = kv_bytes(MODELS["llama-3-8b"], 4096)
    return compare(
        "contiguous requests (L_max = 4096) that fit in 40e9 bytes",
        answer,
        BUDGET // one,
        hints={
            BUDGET / one: "a fraction of a request: only whole requests fit, round down",
            BUDGET // one + 1: "rounded up: the last request would not fit",
            40 * 2**30 // one: "40 GiB; the budget is 40e9 bytes (40 GB)",
        },
    )


@register(
    "1.3",
    "Same memory, but the requests actually hold s = 1000 tokens and the cache is paged with B = 16. How many fit?",
    paged_requests(),
)
def _check_1_3(answer) -> Verdict:
    spec = MODELS["llama-3-8b"]
    return compare(
        "paged requests (s = 1000, B = 16) that fit in 40e9 bytes",
        answer,
        BUDGET // kv_bytes(spec, 1008),
        hints={
            BUDGET // kv_bytes(spec, 1000): "1000 slots each; a request takes whole blocks, ceil(1000/16) = 63 of 16",
            BUDGET
            // kv_bytes(spec, 1008)
            / (BUDGET // kv_bytes(spec, 4096)): "the gain over contiguous, not the count",
        },
    )

"""Lesson 7's exercises: the benchmark table's numbers, predicted before they are simulated."""

from __future__ import annotations

import math
from functools import lru_cache

from paged_edu.labs import benchmark_table as bt
from paged_edu.lessons.exercises.framework import Verdict, compare, describe, register

RATES = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)  # the grid of exercise 7.2 (requests/s)


@lru_cache(maxsize=1)
def lengths() -> tuple[int, ...]:
    """Final lengths (prompt + output) of 300 ShareGPT-like requests, seed 0: the exercises' workload."""
    return tuple(bt.final_lengths(bt.workload("sharegpt", 300, math.inf, 0)))


@lru_cache(maxsize=1)
def _prompts_outputs():
    reqs = bt.workload("sharegpt", 300, math.inf, 0)
    return [r.prompt_len for r in reqs], [r.output_len for r in reqs]


UTIL_REFERENCE = bt.contiguous_max_utilization(lengths())


@register(
    "7.1",
    "Every request reserves L_max = 2048 slots. From eta_naive = s / L_max, what share of the "
    "reserved KV slots hold tokens once the 300 requests of ex7.lengths() have all been written?",
    UTIL_REFERENCE,
)
def _check_7_1(answer) -> Verdict:
    prompts, outputs = _prompts_outputs()
    n = len(prompts)
    right = bt.contiguous_max_utilization(lengths())
    return compare(
        "contiguous-max KV utilisation",
        answer,
        right,
        sig_figs=3,
        hints={
            sum(prompts) / (n * 2048): "the prompts only; a request also stores its output tokens",
            sum(outputs) / (n * 2048): "the outputs only; the prompt's K/V are stored too",
            2048 * n / sum(lengths()): "L_max / mean(s), inverted; eta_naive = s / L_max",
            sum(s - 1 for s in lengths()) / (n * 2048): "s - 1 tokens per request: the question counts all s tokens "
            "of a request (prompt and output, ex7.lengths()), as eta_naive = s / L_max does -- one token less each is "
            "the K/V of a request whose last sampled token is never fed back, a different question",
            100 * right: "a percentage; give a fraction between 0 and 1",
        },
    )


@lru_cache(maxsize=1)
def crossing_reference() -> dict:
    """The lowest rate of RATES at which p99 TTFT passes 1 s, paged (B = 16) and contiguous-max."""
    return bt.p99_ttft_crossing("sharegpt", RATES, num_requests=200, seed=0, bound_s=1.0)


@register(
    "7.2",
    "On 200 ShareGPT-like requests (seed 0, OPT-13B on an A100-40GB), at which rate of RATES does "
    "p99 TTFT first pass 1 s? Answer a dict {'paged': rate, 'contiguous-max': rate}.",
    crossing_reference,
)
def _check_7_2(answer) -> Verdict:
    right = crossing_reference()
    if not isinstance(answer, dict) or set(answer) != set(right):
        return Verdict(False, [f"[ ] 7.2: give a dict with the keys {sorted(right)}, got {describe(answer)}"])
    if answer == right:
        return Verdict(
            True,
            [
                f"[x] right: p99 TTFT passes 1 s at {right['contiguous-max']} req/s for contiguous-max "
                f"and at {right['paged']} req/s for paged"
            ],
        )
    if answer == {"paged": right["contiguous-max"], "contiguous-max": right["paged"]}:
        return Verdict(False, ["[ ] swapped: paging fits more requests per batch, so it is the one that lasts longer"])
    wrong = [k for k in right if answer[k] != right[k]]
    return Verdict(
        False,
        [
            f"[ ] not right for {', '.join(wrong)}: simulate each rate of RATES in turn and take the first "
            "whose p99 TTFT exceeds 1 s (not the last below it, not p50)"
        ],
    )


RATIO_REFERENCE = bt.batch_ratio_formula(lengths(), 16)


@register(
    "7.3",
    "The seed's formula: paged fits L_max / (ceil(s/B) B) times as many requests as contiguous-max. "
    "For ex7.lengths() and B = 16, what ratio does it predict (averaging ceil(s/B) B over the requests)?",
    RATIO_REFERENCE,
)
def _check_7_3(answer) -> Verdict:
    right = bt.batch_ratio_formula(lengths(), 16)
    n = len(lengths())
    return compare(
        "paged / contiguous batch-size ratio (formula)",
        answer,
        right,
        sig_figs=3,
        hints={
            2048 * n / sum(lengths()): "L_max / mean(s): the ratio without the last block's rounding to B",
            1 / right: "inverted: paged is the one that fits more",
            sum(2048 / (math.ceil(s / 16) * 16) for s in lengths()) / n: "the mean of per-request ratios; "
            "the pool holds mean(ceil(s/B) B) per request, so divide L_max by the mean",
        },
    )

"""Lesson 11's exercises: a hit rate from two scrapes of the counters, a latency quantile from a
histogram's buckets, and where a timestamp in a prompt costs the cache -- each checked against the
library (:mod:`paged_edu.labs.serving`, the allocator)."""

from __future__ import annotations

from paged_edu.core.allocator import BlockAllocator
from paged_edu.labs.serving import histogram_quantile, window_hit_rate
from paged_edu.lessons.exercises.framework import Verdict, check_function, compare, describe, register

QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"


def _scrapes() -> list[tuple]:
    """11.1's cases: ``(before, after)`` pairs of scrapes."""
    pairs = [
        ((0, 0), (1200, 600)),
        ((10_000, 9_000), (10_500, 9_000)),  # a window with no hit, after a history of many
        ((5_000, 0), (9_000, 3_200)),
        ((700, 100), (700, 100)),  # nothing happened: no query, no rate
        ((1, 1), (65_537, 32_769)),
    ]
    return [({QUERIES: q0, HITS: h0}, {QUERIES: q1, HITS: h1}) for (q0, h0), (q1, h1) in pairs]


@register(
    "11.1",
    "Write window_hit_rate(before, after): the prefix-cache hit rate over the window between two scrapes "
    "of /metrics (dicts of sample name -> value), as rate(hits) / rate(queries) reads it in PromQL; 0.0 "
    "when nothing was queried in the window.",
    window_hit_rate,
    kind="function",
)
def _check_11_1(fn) -> Verdict:
    verdict = check_function("window_hit_rate", fn, _scrapes(), window_hit_rate)
    if not verdict.ok and callable(fn):
        try:
            cumulative = fn({QUERIES: 10_000, HITS: 9_000}, {QUERIES: 10_500, HITS: 9_000})
        except Exception:  # noqa: BLE001 -- the verdict above already names what it raised
            cumulative = None
        if isinstance(cumulative, float) and abs(cumulative - 9_000 / 10_500) < 1e-9:
            verdict.lines.append("    (that is the rate since the server started, not over the window)")
    return verdict


def itl_window() -> list[tuple[float, float]]:
    """11.2's histogram: ``(upper bound in s, cumulative count)`` of a window of
    ``vllm:inter_token_latency_seconds`` under load (the buckets are the server's)."""
    counts = [(0.001, 0), (0.0025, 40), (0.005, 310), (0.01, 820), (0.025, 1030), (0.05, 1090), (0.075, 1110),
              (0.1, 1130), (0.15, 1150), (0.2, 1170), (float("inf"), 1200)]  # fmt: skip
    return counts


def itl_p90_ms() -> float:
    """11.2's reference: the 0.9-quantile as Prometheus's histogram_quantile interpolates it, in ms."""
    return 1e3 * histogram_quantile(0.9, itl_window())


@register(
    "11.2",
    "ex11.itl_window() is a window of vllm:inter_token_latency_seconds: (upper bound in seconds, cumulative "
    "count) per bucket. What is its p90 in ms, as Prometheus's histogram_quantile interpolates it?",
    itl_p90_ms,
)
def _check_11_2(answer) -> Verdict:
    b = itl_window()
    return compare(
        "ITL p90 (ms)",
        answer,
        itl_p90_ms(),
        sig_figs=3,
        hints={
            25.0: "the bucket's upper bound: interpolate within the bucket",
            10.0: "the bucket's lower bound: interpolate within the bucket",
            1e3 * histogram_quantile(0.9, _summed(b)): "the counts read as per-bucket, not cumulative",
            histogram_quantile(0.9, b): "seconds; the question asks for ms",
            1e3 * histogram_quantile(0.5, b): "the median (p50), not p90",
        },
    )


def _summed(b):
    """The tempting misreading: cumulative counts taken for per-bucket ones, and summed again."""
    out, total = [], 0.0
    for upper, count in b:
        total += count
        out.append((upper, total))
    return out


# 11.3: a system prompt of 100 tokens, a user message of 20, a timestamp of 8 that changes every request.
SYSTEM, USER, STAMP, B = 100, 20, 8, 16


def _prompt(position: str, stamp: int) -> list[int]:
    system, user = list(range(1000, 1000 + SYSTEM)), list(range(2000, 2000 + USER))
    timestamp = [3000 + stamp] * STAMP
    return timestamp + system + user if position == "front" else system + user + timestamp


def cached_after_one(position: str) -> int:
    """The second request's prompt tokens served by the cache (B = 16): the allocator tells."""
    a = BlockAllocator(64, B)
    a.allocate("first", _prompt(position, 1))
    a.allocate("second", _prompt(position, 2))
    return a.num_cached_tokens("second")


def cached_tokens() -> dict[str, int]:
    return {p: cached_after_one(p) for p in ("front", "end")}


@register(
    "11.3",
    "A chat's prompt is a 100-token system prompt, a 20-token user message and an 8-token timestamp that "
    "differs every request; blocks of 16. How many prompt tokens does the prefix cache serve to the second "
    "request when the timestamp is at the front, and when it is at the end? A dict {'front': ..., 'end': ...}.",
    cached_tokens,
)
def _check_11_3(answer) -> Verdict:
    if not isinstance(answer, dict) or set(answer) != {"front", "end"}:
        return Verdict(False, [f"[ ] 11.3: give a dict with the keys ['front', 'end'], got {describe(answer)}"])
    right = cached_tokens()
    shared = SYSTEM + USER  # the tokens the two prompts share when the timestamp is last
    hints = {
        "front": {SYSTEM: "the first block holds the timestamp: nothing after it can be found again"},
        "end": {
            shared: "tokens, not whole blocks: only full blocks are cached",
            shared + STAMP: "the whole prompt: the timestamp differs",
            right["end"] - B: "one block short: every full block of the shared prefix is found",
            SYSTEM: "the user message is shared too: it comes before the timestamp",
        },
    }
    verdicts = [compare(f"cached tokens, timestamp at the {k}", answer[k], right[k], hints=hints[k]) for k in right]
    return Verdict(all(verdicts), [line for v in verdicts for line in v.lines])

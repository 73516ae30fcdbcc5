"""Lesson 6's exercises: the knob that removes preemptions, the pool a utilisation leaves, the first victim."""

from __future__ import annotations

import math
from functools import lru_cache

from paged_edu.core.hardware import GPUS, MODELS, MiB
from paged_edu.lessons.exercises.framework import Verdict, compare, describe, register

# The run of 6.1 and 6.3: 6 requests of 24 prompt + 32 new tokens (7 blocks of 8 each at full
# length, 42 in all) on a pool of 24 blocks, recompute preemption, every limit at its default.
SCENARIO = {"num_requests": 6, "prompt_len": 24, "max_new_tokens": 32, "block_size": 8, "num_blocks": 24}
KNOBS = ("max_num_seqs", "max_num_batched_tokens", "num_cpu_blocks", "preemption_mode")


@lru_cache(maxsize=None)
def _scenario_run(knob: tuple = ()):
    from paged_edu.labs.preemption import pressure_prompts, run_under_pressure

    s = SCENARIO
    prompts = pressure_prompts(s["num_requests"], s["prompt_len"], 512, seed=6)
    kwargs = dict(knob)
    mode = kwargs.pop("preemption_mode", "recompute")
    return run_under_pressure(
        _model(),
        prompts,
        s["num_blocks"],
        mode,
        max_new_tokens=s["max_new_tokens"],
        block_size=s["block_size"],
        **kwargs,
    )


@lru_cache(maxsize=1)
def _model():
    from paged_edu.labs.engine_lab import tiny_model

    return tiny_model(seed=0)


@register(
    "6.1",
    "The scenario run (ex.EXERCISES['6.1'], SCENARIO in lesson6.py) preempts. Give ONE engine knob as "
    "{name: value} (max_num_seqs, max_num_batched_tokens, num_cpu_blocks or preemption_mode) that makes it "
    "run with no preemption at all, keeping the pool at 24 blocks.",
    {"max_num_seqs": 3},
)
def _check_6_1(answer) -> Verdict:
    if not isinstance(answer, dict) or len(answer) != 1 or next(iter(answer)) not in KNOBS:
        return Verdict(
            False, [f"[ ] 6.1: give one knob as {{name: value}}, name one of {KNOBS}; got {describe(answer)}"]
        )
    base = _scenario_run()
    try:
        run = _scenario_run(tuple(answer.items()))
    except (ValueError, TypeError) as exc:
        return Verdict(False, [f"[ ] 6.1: the engine refused {answer}: {exc}"])
    b, n = base.num_preemptions, run.num_preemptions
    if n == 0:
        return Verdict(True, [f"[x] 6.1: with {answer} the run has 0 preemptions (every limit at its default: {b})"])
    name, value = next(iter(answer.items()))
    change = (
        f"more than the {b} of every limit at its default: worse"
        if n > b
        else f"fewer than the {b} of every limit at its default, but not none"
        if n < b
        else "as many as with every limit at its default: no change"
    )
    why = {
        "preemption_mode": "the mode decides HOW a victim is preempted (swap or recompute), not WHETHER",
        "num_cpu_blocks": "swap space only matters in swap mode, and it changes how, not whether",
        "max_num_batched_tokens": "the token budget limits prompt chunks per step, while every running decode "
        "still grows; the number of sequences holding blocks is what overflows",
    }.get(name, "")
    if name == "max_num_seqs" and isinstance(value, int):
        s = SCENARIO
        per = math.ceil((s["prompt_len"] + s["max_new_tokens"]) / s["block_size"])
        why = (
            f"{value} admits all {s['num_requests']} requests, as the default 256 does"
            if value >= s["num_requests"]
            else f"{value} sequences at {per} blocks each need {per * value} blocks at full length; the pool has "
            f"{s['num_blocks']}"
        )
    return Verdict(False, [f"[ ] 6.1: with {answer} the run has {n} preemptions ({change}). {why}"])


def kv_blocks_left(gpu_key="h200", model_key="Llama-3-8B", gpu_memory_utilization=0.9, block_size=16, context_mib=512):
    """6.2's reference: the library's one sizing rule, vLLM's (``u * total - weights``; the context is headroom)."""
    from paged_edu.labs.troubleshooting import plan_memory

    return plan_memory(
        gpu_key,
        model_key,
        gpu_memory_utilization,
        context_bytes=context_mib * MiB,
        activation_bytes=0,
        block_size=block_size,
    ).num_blocks


@register(
    "6.2",
    "On an H200 (143,771 MiB) with Llama-3-8B in bf16, a 512 MiB CUDA context, block_size 16 and "
    "gpu_memory_utilization = 0.9, sized by vLLM's rule (the library's one rule) -- 0.9 x total - weights, the "
    "context left in the headroom, in whole blocks: how many KV blocks does the pool get?",
    kv_blocks_left(),
)
def _check_6_2(answer) -> Verdict:
    # Each tempting answer from the exercise's numbers by hand, the other sizing rule (u x free) among them.
    g, gpu = MODELS["llama-3-8b"], GPUS["h200"]
    right = kv_blocks_left()
    block = g.block_bytes(16)
    total, context, weights = gpu.memory_bytes, 512 * MiB, int(g.num_params * 2)
    free = total - context - weights
    hints = {
        int(0.9 * free) // block: "0.9 of what is FREE after the context and the weights, u x (total - context - "
        "weights): the other rule (this engine's before it took vLLM's); vLLM applies u to the TOTAL",
        int(0.9 * total - weights - context) // block: "u x total - weights - context: vLLM does not subtract the CUDA "
        "context (its snapshot of the total is taken once the context exists); it lives in the (1 - u) x total headroom",
        int(0.9 * total) // block: "0.9 of the TOTAL memory with nothing subtracted: the weights live there too",
        int(0.9 * total - weights) // (block // 2): "K only: a block holds K and V",
        int(total - weights) // block: "all the memory but the weights; only 0.9 of the total is the budget",
        int(0.9 * total - weights) // (block * 2): "fp32; Llama-3-8B's cache is bf16 (2 bytes)",
    }
    return compare(
        "KV blocks at 0.9 on an H200 for Llama-3-8B",
        answer,
        right,
        hints={k: v for k, v in hints.items() if k != right},
    )


def first_victim() -> int:
    """6.3's reference: run the scenario (every limit at its default) and read the first victim's id."""
    return _scenario_run().first_victim()


@register(
    "6.3", "In the scenario run of 6.1 (every limit at its default), which request id is preempted first?", first_victim
)
def _check_6_3(answer) -> Verdict:
    run = _scenario_run()
    right = run.first_victim()
    return compare(
        "the first victim's request id",
        answer,
        right,
        hints={
            0: "request 0 is the OLDEST; vLLM preempts the most recently admitted running sequence",
            SCENARIO["num_requests"] - 1: "the last request may not be running yet when the pool runs out: only "
            "running sequences are preempted",
        }
        if right != SCENARIO["num_requests"] - 1
        else {0: "request 0 is the OLDEST; vLLM preempts the most recently admitted running sequence"},
    )

"""Lesson 9's exercises: what overlap buys (predict, then measure), the roofline of a decode step from its
bytes, and why a decode step of small kernels wants a graph -- each checked against the library."""

from __future__ import annotations

from paged_edu.core.hardware import GPUS, MODELS
from paged_edu.labs import speed_ladder as sl
from paged_edu.lessons.exercises.framework import Verdict, compare, register
from paged_edu.sim.costmodel import CostModel, StepShape

# Exercise 9.2's decode step: SmolLM2-135M (bf16) on the H200, 256 sequences of 512 cached tokens each.
BATCH, CONTEXT = 256, 512


def split() -> dict:
    """9.1's inputs: a synchronous decode step's host and device ms on the H200 (``source`` says which run)."""
    return sl.stored_decode_split()


def overlap_step_ms() -> float:
    """9.1's reference: with the host one step ahead, a step costs the longer of the two, not their sum."""
    s = split()
    return max(s["host_ms"], s["device_ms"])


@register(
    "9.1",
    "A synchronous decode step measured ex9.split()['host_ms'] of host work and ex9.split()['device_ms'] "
    "of device work. With the host one step ahead (async scheduling), what step time (ms) do you predict?",
    overlap_step_ms,
)
def _check_9_1(answer) -> Verdict:
    s = split()
    host, device = s["host_ms"], s["device_ms"]
    return compare(
        "decode step with overlap (ms)",
        answer,
        max(host, device),
        sig_figs=3,
        hints={
            host + device: "the sum: the synchronous step, host then device; overlapped they run side by side",
            min(host, device): "the shorter of the two: the longer one still has to finish every step",
            s["step_ms"]: "the measured synchronous step, not a prediction with overlap",
            abs(host - device): "the difference; overlapped, a step lasts as long as the longer side",
        },
    )


def decode_shape() -> StepShape:
    """9.2's step: ``BATCH`` decodes (one new token each) on ``CONTEXT`` cached tokens each."""
    return StepShape.of_chunks([CONTEXT] * BATCH, [1] * BATCH, BATCH)


def roofline_decode_ms() -> float:
    """9.2's reference: the cost model's roofline for the step, in ms."""
    return 1e3 * CostModel(model=MODELS["smollm2-135m"]).roofline().step_time(decode_shape())


@register(
    "9.2",
    "SmolLM2-135M in bf16 decodes 256 sequences of 512 cached tokens on the H200. It reads every matmul "
    "weight once, the tied LM head once, and the K/V of every token in context plus the new one. At the "
    "H200's roofline bandwidth, how many ms does the step take at least?",
    roofline_decode_ms,
)
def _check_9_2(answer) -> Verdict:
    m, bw = MODELS["smollm2-135m"], GPUS["h200"].hbm_bandwidth
    weights, head, kv = m.matmul_weight_bytes, m.lm_head_bytes, m.kv_bytes_per_token * BATCH * (CONTEXT + 1)
    right = roofline_decode_ms()
    return compare(
        "roofline decode step (ms)",
        answer,
        right,
        sig_figs=3,
        hints={
            1e3 * (weights + head) / bw: "the weights only: every sequence also reads its K/V",
            1e3 * kv / bw: "the K/V only: the weights are read once per step too",
            1e3 * (weights + kv) / bw: "without the LM head's read (the tied embedding matrix, read for the logits)",
            1e3 * (weights + head + m.kv_bytes_per_token * BATCH * CONTEXT) / bw: "without the new tokens' K/V",
            right / 0.85: "at 85 % of the bandwidth: the roofline is full efficiency",
            right / 1e3: "seconds; the question asks for ms",
        },
    )


def kernels() -> dict:
    """9.3's inputs: one decode step at batch 1 on the H200 (``layer_bench.json``)."""
    return sl.stored_decode_kernels(batch=1)


def us_per_kernel() -> float:
    """9.3's reference: the GPU's busy time per kernel of the fused decode step at batch 1, in us."""
    k = kernels()
    return k["fused_busy_us"] / k["fused_kernels"]


@register(
    "9.3",
    "At batch 1 the fused decode step runs ex9.kernels()['fused_kernels'] kernels, the GPU busy for "
    "ex9.kernels()['fused_busy_us'] us in all. How long does the GPU spend on one kernel, on average (us)?",
    us_per_kernel,
)
def _check_9_3(answer) -> Verdict:
    k = kernels()
    return compare(
        "GPU time per kernel (us)",
        answer,
        us_per_kernel(),
        sig_figs=3,
        hints={
            k["unfused_busy_us"] / k["unfused_kernels"]: "the unfused step's kernels (PyTorch ops); the question "
            "is about the fused step",
            k["fused_us"] / k["fused_kernels"]: "the step's wall time per kernel; use the GPU's busy time",
            k["roofline_us"] / k["fused_kernels"]: "the roofline per kernel: what a kernel would take at full speed",
            k["fused_kernels"] / k["fused_busy_us"]: "kernels per us: inverted",
        },
    )

"""
The decode kernels' tuning: tile length, warps, pipeline depth and the split count
==================================================================================

Kept apart from the kernel bodies, as Triton's fused-attention tutorial keeps its ``configs`` apart
from ``_attn_fwd``: a kernel says *what* it computes for any ``TILE`` or ``num_splits``; these
functions say which values run, and why (each choice with the measurement behind it).

We do not autotune: a decode kernel is captured in CUDA graphs and must launch the same way every
time, and the choice must be made on the host without a device sync. So the choice is a rule of
the shapes:

* :func:`decode_config` -- ``TILE`` tokens per loop step, the padded group and head sizes, warps and
  pipeline stages (both kernels of :mod:`~paged_edu.kernels.decode`, and the whole-row experiment of
  :mod:`paged_edu.labs.triton_decode_packed` through :func:`split_plan`);
* :func:`choose_num_splits` -- how many parts each sequence is cut into (split-KV), from the batch,
  the heads, the table's width and the SM count;
* :func:`split_plan` -- that choice for a launch, and one pipeline stage for short splits.
"""

from __future__ import annotations

import torch
import triton

from paged_edu.kernels.support import num_sms

__all__ = ["choose_num_splits", "decode_config", "split_plan"]


def decode_config(head_dim: int, group: int, on_gpu: bool) -> dict:
    """Tile length, warps and pipeline depth.

    The fixed choice: 64 tokens per tile, at most 16 KiB of K and 16 KiB of V (fewer tokens for heads
    wider than 128), with the loads of the next tile in flight while this one is used
    (``num_stages=2``). A sweep on an H200 (``benchmarks/bench_kernels.py --sweep``) found this the
    best or within 3% of the best for every anchor case (32/8 heads of 128); three stages were up to
    15% slower on long sequences. At head_dim 64 (SmolLM2, ``bench_layer.py --sweep-decode``) 64-token
    tiles beat 128: 38.8 against 43.9 us at 256 x 512, within 1% of the best of 72 configs.
    """
    head_dim_pad = triton.next_power_of_2(head_dim)
    group_pad = triton.next_power_of_2(group)
    if on_gpu:
        group_pad = max(16, group_pad)  # a 16-bit tl.dot needs M >= 16 on the tensor cores
    tile = max(16, min(64, 8192 // head_dim_pad))
    return dict(TILE=tile, GROUP_PAD=group_pad, HEAD_DIM_PAD=head_dim_pad, num_warps=4, num_stages=2)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_len: int, tile: int, num_sms: int) -> int:
    """How many parts to cut each sequence into so that the GPU has enough programs.

    Without splits there are ``num_seqs * num_kv_heads`` programs, each streaming one sequence's
    K/V for one head. About ``4 * num_sms`` of them fit on the GPU at once (registers and shared
    memory allow 4-5 per SM), and several per SM are what hide the memory latency. So we cut each
    sequence into ``floor(4 * num_sms / programs)`` parts -- rounding *down*, so that all programs
    still run in one wave: 512 programs on 132 SMs run in one wave, 768 in one and a half, and
    the half wave costs more than the extra parallelism gains -- with no part shorter than two
    tiles, whose fixed costs (loading q, the pipeline's prologue, writing a partial result) would
    dominate. Only host-side numbers are used -- ``max_len`` is the width of the block table times
    B, not the actual lengths -- so the choice needs no device sync and is valid under CUDA-graph
    capture.
    """
    base = num_seqs * num_kv_heads
    max_tiles = -(-max_len // tile)
    return max(1, min((4 * num_sms) // base, max_tiles // 2, 128))


def split_plan(cfg: dict, config: dict | None, num_programs: int, max_len: int, device) -> int:
    """:func:`choose_num_splits` for ``num_programs`` (sequence, head-group) pairs; sets
    ``cfg["num_stages"] = 1`` for short splits unless ``config`` fixed it."""
    sms = (
        num_sms(device.index if device.index is not None else torch.cuda.current_device())
        if device.type == "cuda"
        else 8
    )
    num_splits = choose_num_splits(num_programs, 1, max_len, cfg["TILE"], sms)
    if "num_stages" not in (config or {}) and -(-max_len // num_splits) <= 4 * cfg["TILE"]:
        # Short splits (four tiles or fewer) run without software pipelining: filling the
        # pipeline costs more than it hides over so few steps, and the many programs keep the
        # memory busy instead (H200: 1 x 8192, 64 splits: 21.0 us vs 22.5; 8 x 2048: 31.4 vs 32.8).
        cfg["num_stages"] = 1
    return num_splits

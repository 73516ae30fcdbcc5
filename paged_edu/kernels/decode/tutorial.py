"""
Paged decode attention in Triton: flash-decoding over a block table
====================================================================

In this tutorial-style module you will learn

* how a kernel follows a *block table*: the tokens of one sequence live in blocks scattered over
  the KV pool, and every tile of keys is gathered through ``B(t // B)`` before it is used;
* the *online softmax* of the seed's equations (running max ``m``, normaliser ``l``, output
  ``o``), now over tiles of several blocks at once;
* why all query heads of a GQA group are handled by one program: they read the same K/V, so the
  bytes -- the only thing decode is short of -- are loaded once;
* *split-KV* (flash-decoding): when there are too few (sequence, KV head) pairs to fill the GPU,
  each sequence is cut into ``num_splits`` ranges processed in parallel, and a second small kernel
  merges the partial results with their log-sum-exp.

:func:`paged_decode_kernel` is the kernel :func:`paged_attention_triton` launches -- the one lesson 4
times and reads, and the engine's decode attention in steps with prompt chunks. It is written from
the pieces of :mod:`~paged_edu.kernels.decode.pieces`; the engine's pure-decode kernel
(:mod:`~paged_edu.kernels.decode.fast`) is the same pieces plus the new token's rotary embedding and
K/V store. Its tuning (tile length, warps, split count) is in :mod:`~paged_edu.kernels.decode.tuning`.

Motivation
----------
At decode time each sequence contributes one query token, so attention does ~2 FLOPs per byte of
K/V it reads: the kernel is bound by memory bandwidth, and its speed is how close it streams the
paged K/V to the bandwidth of a plain copy. Three things decide that: every byte read once (GQA
packing), enough bytes in flight (wide tiles, software pipelining, enough programs), and no
wasted launches (one kernel, or two with a cheap merge).

Layout (the seed's, also vLLM's)::

    k_cache, v_cache: (num_blocks, B, num_kv_heads, head_dim)
    address of K[t] for KV head h = base + B(t // B) * stride_block + (t % B) * stride_tok
                                         + h * stride_head + d

Grid: one program per (KV head, sequence, split). Program ``(h, n, j)`` computes, for the ``G``
query heads ``h*G .. h*G+G-1``, attention over its range of tiles, and writes either the final
output (``num_splits == 1``) or a partial output ``o_j`` with its log-sum-exp ``lse_j``. The merge
(:func:`merge_splits_kernel`) is ``O = sum_j exp(lse_j - M) o_j / sum_j exp(lse_j - M)`` with
``M = max_j lse_j``.

Why the merge is a second kernel (measured, not assumed): the merge could run inside the same
launch, by whichever split of a (sequence, KV head) finishes last -- each adds 1 to a counter with
an atomic after writing its part, and the one that reads back ``num_splits - 1`` merges, as
:mod:`~paged_edu.kernels.triton_gemm`'s split-K does. That saves 30 launches of a SmolLM2 decode
step. On the H200 it lost (``benchmarks/bench_layer.py --batches 1,16,64,256``, context 512,
64 splits at batch 1): attention per step at batch 1 took 173 us with the second kernel
(``benchmarks/records/h200/layer_bench_merge_two_launches.json``), 753 us with a merge reading one split
after another (``..._in_kernel_serial.json``: one memory latency per split, on the critical path
of the last program) and 254 us reading 16 splits at once (``..._in_kernel_chunked.json``); the
whole step 883 / 1,449 / 954 us. Inside a CUDA graph the second launch costs about 1.4 us; the
last program's wait-then-merge costs more, because nothing else runs beside it.

The kernel runs under CUDA-graph capture (no host sync, no data-dependent launch shape: the split
count comes from the table's width) and under the Triton interpreter on a CPU (bf16 is wrong there:
every load is upcast, :data:`~paged_edu.kernels.decode.pieces.UPCAST`).

Benchmark
---------
``python benchmarks/bench_kernels.py`` on an H200 (bf16, B=16, 32/8 heads, head_dim 128, random
block tables; CUDA-graph replays, L2 flushed; the copy ceiling measured in the same run) writes
``paged_edu/data/kernel_bench.json``; docs/benchmarks.md's decode table gives every case: 51-100 % of the copy
bandwidth, faster than the best vLLM / SGLang Triton kernel at every shape.

The small cases are latency-bound: 8192 tokens of one sequence are only 33 MB, which a copy
streams in ~10 us; two launches and a few memory round trips are the rest.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from paged_edu.core.validation import integer
from paged_edu.kernels.decode.pieces import (
    UPCAST,
    attend_tiles,
    group_offsets,
    merge_splits,
    tile_range,
    write_result,
)
from paged_edu.kernels.decode.tuning import decode_config, split_plan
from paged_edu.kernels.pdl import wait_for_previous_kernel
from paged_edu.kernels.triton_fused import INTERPRETING

__all__ = ["launch_inputs", "merge_splits_kernel", "paged_attention_triton", "paged_decode_kernel", "plan_launch"]


# ----------------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------------


# The table width and the split count change from one eager (mixed prefill/decode) step to the next;
# Triton would compile a variant for every value class of an int argument (== 1, divisible by 16,
# other), a compile in the middle of a step (an early engine run on the H200 took 430 ms per mixed step
# while it did: docs/benchmarks.md). They only index memory here, so no specialisation.
@triton.jit(do_not_specialize=["num_splits", "stride_bt_seq"])
def paged_decode_kernel(
    q_ptr,  # (num_seqs, H, D): one query token per sequence
    k_cache_ptr, v_cache_ptr,  # (num_blocks, B, H_kv, D) each: the paged K and V
    block_tables_ptr,  # int32 (num_seqs, max_blocks): block b of sequence n is B(b)
    seq_lens_ptr,  # int32 (num_seqs,): s, the tokens of each sequence
    out_ptr,  # (num_seqs, H, D): o / l, written when not SPLIT
    part_o_ptr,  # SPLIT: fp32 (num_seqs, H, num_splits, HEAD_DIM_PAD), each split's o_j / l_j
    part_lse_ptr,  # SPLIT: fp32 (num_seqs, H, num_splits), each split's lse_j = m_j + log2(l_j)
    qk_scale,  # softmax scale * log2(e)
    num_splits,  # splits per sequence (runtime: changing it does not recompile)
    num_q_heads,  # H
    stride_q_seq, stride_q_head,  # q's strides (its head_dim stride is 1, as for every tensor here)
    stride_k_block, stride_k_tok, stride_k_head,  # k_cache's strides
    stride_v_block, stride_v_tok, stride_v_head,  # v_cache's strides
    stride_bt_seq,  # block_tables' row stride
    stride_o_seq, stride_o_head,  # out's strides
    GROUP: tl.constexpr,  # G = H / H_kv, query heads per KV head
    GROUP_PAD: tl.constexpr,  # G rounded up to a power of two (>= 16 on a GPU, for tl.dot)
    HEAD_DIM: tl.constexpr,  # D
    HEAD_DIM_PAD: tl.constexpr,  # D rounded up to a power of two
    BLOCK_SIZE: tl.constexpr,  # B, tokens per KV block
    TILE: tl.constexpr,  # tokens per loop step: several blocks, gathered through the table
    SPLIT: tl.constexpr,  # num_splits > 1: write partial results for merge_splits_kernel
):  # fmt: skip
    """Attention of each sequence's one query over its paged K/V: ``o = softmax(q K^T * scale) V``.

    For the G query heads of KV head h of sequence n, over this split's tiles ``t`` (TILE tokens each,
    gathered through the block table), from ``(m, l, o) = (-inf, 0, 0)`` and in log2 units::

        S = q K_t^T * scale * log2(e)      m' = max(m, rowmax(S))      P = 2^(S - m')
        l' = l * 2^(m - m') + rowsum(P)    o' = o * 2^(m - m') + P V_t

    then ``o / l`` -- or, with ``SPLIT``, ``o_j / l_j`` and ``lse_j = m_j + log2(l_j)`` for the merge.
    """
    # Who: KV head h of sequence n, split j. The KV heads of one sequence are neighbours in the launch
    # order, so programs running side by side read neighbouring columns of the same token rows
    # (H200, best of each sweep: 31.2 against 31.6 us at 8 x 2048, equal at 1 x 8192;
    # benchmarks/records/h200/decode_sweep_small.json).
    kv_head = tl.program_id(0)
    seq = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)  # s
    tile_lo, tile_hi, num_full = tile_range(seq_len, split, num_splits, TILE)  # this split's tiles

    # GQA packing: the G query heads that share this KV head, padded with zero rows to GROUP_PAD -- every
    # K/V byte is loaded once for all G of them (a program per query head would load it G times).
    q_heads, g_mask, offs_d, d_mask, offs_t = group_offsets(kv_head, GROUP, GROUP_PAD, HEAD_DIM, HEAD_DIM_PAD, TILE)
    q_ptrs = q_ptr + seq * stride_q_seq + q_heads[:, None] * stride_q_head  # (GROUP_PAD, 1) row starts
    q_mask = g_mask[:, None] & d_mask[None, :]
    bt_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq  # this sequence's row of the table
    k_head_ptr = k_cache_ptr + kv_head * stride_k_head
    v_head_ptr = v_cache_ptr + kv_head * stride_v_head
    q = tl.load(q_ptrs + offs_d[None, :], mask=q_mask, other=0.0)  # (GROUP_PAD, HEAD_DIM_PAD)
    if UPCAST:
        q = q.to(tl.float32)
    DOT_PRECISION: tl.constexpr = "ieee" if q_ptr.dtype.element_ty == tl.float32 else "tf32"  # fp32: exact

    # The online softmax over the tiles, from (m, l, o) = (-inf, 0, 0).
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)  # running max (log2 units)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)  # running normaliser
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)  # unnormalised output
    m_i, l_i, acc = attend_tiles(  # the whole tiles without masks, then the partial one
        q, m_i, l_i, acc, tile_lo, num_full, tile_hi, seq_len, bt_row_ptr,
        k_head_ptr, stride_k_block, stride_k_tok, v_head_ptr, stride_v_block, stride_v_tok,
        offs_t, offs_d, d_mask, qk_scale, BLOCK_SIZE, TILE, HEAD_DIM == HEAD_DIM_PAD, DOT_PRECISION,
    )  # fmt: skip

    # o / l, or this split's partial result for the merge.
    write_result(
        m_i, l_i, acc, seq, split, num_splits, q_heads, g_mask, offs_d, d_mask,
        out_ptr, stride_o_seq, stride_o_head, part_o_ptr, part_lse_ptr, num_q_heads, HEAD_DIM_PAD, SPLIT,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# The second stage: merge the splits of each (sequence, query head)
# ----------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["num_splits"])
def merge_splits_kernel(
    part_o_ptr,  # fp32 (num_seqs, H, num_splits, HEAD_DIM_PAD): each split's o_j / l_j
    part_lse_ptr,  # fp32 (num_seqs, H, num_splits): each split's lse_j = m_j + log2(l_j)
    out_ptr,  # (num_seqs, H, D)
    num_splits,  # splits per sequence
    stride_o_seq, stride_o_head,  # out's strides
    HEAD_DIM: tl.constexpr,  # D
    HEAD_DIM_PAD: tl.constexpr,  # D rounded up to a power of two
    SPLITS_PAD: tl.constexpr,  # num_splits rounded up to a power of two
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent (paged_edu.kernels.pdl)
):  # fmt: skip
    """One program per (sequence, query head): the output from its splits' partial results."""
    wait_for_previous_kernel(USE_PDL)  # the splits' partial results
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = seq * tl.num_programs(1) + head  # (sequence, head) pair
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    s_mask = offs_s < num_splits
    lse = tl.load(part_lse_ptr + row * num_splits + offs_s, mask=s_mask, other=float("-inf"))  # (SPLITS_PAD,)
    o = tl.load(
        part_o_ptr + (row * num_splits + offs_s)[:, None] * HEAD_DIM_PAD + offs_d[None, :],
        mask=s_mask[:, None],
        other=0.0,
    )  # (SPLITS_PAD, HEAD_DIM_PAD)
    merged = merge_splits(lse, o)  # (HEAD_DIM_PAD,)
    tl.store(
        out_ptr + seq * stride_o_seq + head * stride_o_head + offs_d,
        merged.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


# ----------------------------------------------------------------------------------------------
# The Python wrapper: configuration, split count, launch
# ----------------------------------------------------------------------------------------------


def launch_inputs(q, block_tables, seq_lens, block_size: int):
    """The layouts the decode kernels index (unit stride along head_dim, a table row and ``seq_lens``),
    the output buffer, and ``max_len`` = table width x B (host-side, so capture-safe)."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    block_tables = block_tables if block_tables.stride(1) == 1 else block_tables.contiguous()
    seq_lens = seq_lens if seq_lens.stride(0) == 1 else seq_lens.contiguous()
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return q, block_tables, seq_lens, out, block_tables.shape[1] * block_size


def plan_launch(q, k_cache, block_tables, seq_lens, num_splits, config):
    """What both decode wrappers do before their kernel: the configuration (:func:`decode_config` with
    ``config``'s overrides), the kernel's inputs and output (:func:`launch_inputs`), the split count
    (:func:`split_plan` unless given) and the fp32 scratch of the splits. Returns
    ``(cfg, q, block_tables, seq_lens, out, num_splits, part_o, part_lse)``."""
    if not INTERPRETING and not q.is_cuda:
        raise RuntimeError(
            "the Triton kernel needs a CUDA GPU, or the Triton interpreter for CPU tensors: set "
            "TRITON_INTERPRET=1 before importing paged_edu (slow, for learning and tests), "
            "or use impl='torch'"
        )
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    cfg = decode_config(head_dim, num_q_heads // num_kv_heads, on_gpu=not INTERPRETING)
    cfg.update(config or {})
    q, block_tables, seq_lens, out, max_len = launch_inputs(q, block_tables, seq_lens, block_size)
    if num_splits is None:  # the plan's own choice: nothing to check (validate=False runs no Python check)
        num_splits = split_plan(cfg, config, num_seqs * num_kv_heads, max_len, q.device)
    else:
        num_splits = integer("num_splits", num_splits, low=1)
    if num_splits > 1:
        part_o = torch.empty(
            num_seqs, num_q_heads, num_splits, cfg["HEAD_DIM_PAD"], device=q.device, dtype=torch.float32
        )
        part_lse = torch.empty(num_seqs, num_q_heads, num_splits, device=q.device, dtype=torch.float32)
    else:
        part_o = part_lse = out  # unused
    return cfg, q, block_tables, seq_lens, out, num_splits, part_o, part_lse


def merge(part_o, part_lse, out, num_splits: int, cfg: dict, launch: dict) -> None:
    """Launch :func:`merge_splits_kernel` when there are splits (``launch``: the PDL options)."""
    if num_splits > 1:
        merge_splits_kernel[(out.shape[0], out.shape[1])](
            part_o, part_lse, out, num_splits, out.stride(0), out.stride(1),
            HEAD_DIM=out.shape[2], HEAD_DIM_PAD=cfg["HEAD_DIM_PAD"], SPLITS_PAD=triton.next_power_of_2(num_splits),
            num_warps=4, **launch,
        )  # fmt: skip


def paged_attention_triton(
    q: torch.Tensor,  # (num_seqs, num_q_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # int32 (num_seqs, max_blocks)
    seq_lens: torch.Tensor,  # int32 (num_seqs,)
    *,
    scale: float,
    num_splits: int | None = None,  # None: choose_num_splits; tests force values
    config: dict | None = None,  # overrides of decode_config (benchmark sweeps)
) -> torch.Tensor:  # (num_seqs, num_q_heads, head_dim)
    """Launch the kernel on validated inputs (see :func:`paged_edu.kernels.paged_attention_decode`)."""
    num_kv_heads = k_cache.shape[2]
    cfg, q, block_tables, seq_lens, out, num_splits, part_o, part_lse = plan_launch(
        q, k_cache, block_tables, seq_lens, num_splits, config
    )
    num_seqs, num_q_heads, head_dim = q.shape
    paged_decode_kernel[(num_kv_heads, num_seqs, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_o, part_lse,
        scale * math.log2(math.e), num_splits, num_q_heads,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=num_q_heads // num_kv_heads, GROUP_PAD=cfg["GROUP_PAD"],
        HEAD_DIM=head_dim, HEAD_DIM_PAD=cfg["HEAD_DIM_PAD"],
        BLOCK_SIZE=k_cache.shape[1], TILE=cfg["TILE"], SPLIT=num_splits > 1,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    merge(part_o, part_lse, out, num_splits, cfg, {"USE_PDL": False})
    return out

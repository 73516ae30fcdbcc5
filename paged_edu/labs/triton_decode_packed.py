"""
Paged decode for small heads: one program reads whole token rows
=================================================================

What you will learn
-------------------
* why the per-KV-head programs of :mod:`paged_edu.kernels.decode` waste a GPU on a small
  model: SmolLM2 has 3 KV heads of 64, so a token's row in the pool is 384 bytes and a program
  reads a 128-byte third of it; at 256 sequences x 512 tokens each of the 768 programs streams
  only 128 KiB, and their fixed costs (the first loads, the pipeline's fill, the tail) rather than
  the bytes set the time -- 39-44 us per layer where the bytes need 12 (the hypothesis tested here);
* a trick that turns "every KV head of a token" into one matrix product: put the ``H`` queries of
  a sequence into an ``(H, H_kv * D)`` matrix ``Q~`` whose row ``h`` holds ``q_h`` in the columns
  of *its* KV head ``h // G`` and zeros elsewhere. With ``K~`` the tile's whole rows
  ``(TILE, H_kv * D)``::

      (Q~ K~^T)[h, t] = sum_c Q~[h, c] K~[t, c] = q_h . k_t^{(h // G)}      (the other heads meet zeros)

  so ``S = Q~ K~^T`` is every head's scores at once, and ``P V~`` gives each row its own head's
  output in its own columns (the other columns are mixed but never stored). The tensor cores do
  ``H_kv`` times the useful FLOPs -- free, decode is bound by bytes -- and the loads are whole,
  contiguous token rows;
* that nothing else changes: the tile loops are :func:`~paged_edu.kernels.decode.pieces.attend_tiles` themselves (a
  "head" of ``H_kv * D`` columns), the split-KV merge is the same second kernel.

Grid: one program per (sequence, split), for small contiguous token rows (:func:`packs`).

Measured: it does not pay
-------------------------
On an H200 (``python benchmarks/bench_layer.py --sweep-decode``: SmolLM2's shape, bf16, 512
tokens per sequence, an 8192-token-wide table, L2 flushed) the per-KV-head kernel with 64-token
tiles stays faster at every batch -- 256 x 512: 38.7 us against 46.3 us (41.6 us for the best of
72 packed configurations); 64: 20.2 / 21.1; 16: 12.9 / 14.4; 1: 9.5 / 10.3. Fewer, longer
programs with wider loads do not stream faster: what the short programs pay is latency per tile
(block-table lookup, then the loads, then the softmax), which the packed program pays too, with
fewer programs to hide it. So it is opt-in (call :func:`paged_attention_packed`), kept
with its tests as the measured answer to "why not read whole rows?".
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from paged_edu.kernels.decode.pieces import UPCAST, attend_tiles, tile_range
from paged_edu.kernels.decode.tuning import split_plan
from paged_edu.kernels.decode.tutorial import launch_inputs, merge
from paged_edu.kernels.triton_fused import INTERPRETING

__all__ = ["packed_config", "packs", "paged_attention_packed"]


@triton.jit
def _packed_decode_kernel(
    q_ptr, stride_q_seq, stride_q_head,  # (num_seqs, num_q_heads, head_dim)
    k_cache_ptr, stride_k_block, stride_k_tok,  # (num_blocks, B, num_kv_heads, head_dim), each token's row contiguous
    v_cache_ptr, stride_v_block, stride_v_tok,  # (num_blocks, B, num_kv_heads, head_dim), each token's row contiguous
    block_tables_ptr, stride_bt_seq,  # int32 (num_seqs, max_blocks)
    seq_lens_ptr,  # int32 (num_seqs,)
    out_ptr, stride_o_seq, stride_o_head,  # (num_seqs, num_q_heads, head_dim): written when SPLIT is False
    part_o_ptr,  # fp32 (num_seqs, num_q_heads, num_splits, PART_D): split outputs
    part_lse_ptr,  # fp32 (num_seqs, num_q_heads, num_splits): split log2-sum-exp
    num_splits,  # splits per sequence
    qk_scale,  # softmax scale * log2(e)
    NUM_Q_HEADS: tl.constexpr,  # H
    GROUP: tl.constexpr,  # G = H // H_kv
    HEADS_PAD: tl.constexpr,  # H rounded up to a power of two (>= 16 on a GPU, for tl.dot)
    HEAD_DIM: tl.constexpr,  # D
    ROW: tl.constexpr,  # H_kv * D: a token's row
    ROW_PAD: tl.constexpr,  # ROW rounded up to a power of two
    PART_D: tl.constexpr,  # D rounded up to a power of two: the merge kernel's row width
    BLOCK_SIZE: tl.constexpr,  # B, tokens per KV block
    TILE: tl.constexpr,  # tokens per loop step
    SPLIT: tl.constexpr,  # False: write the output directly (num_splits == 1)
):  # fmt: skip
    seq = tl.program_id(0)
    split = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    tile_lo, tile_hi, num_full = tile_range(seq_len, split, num_splits, TILE)

    offs_h = tl.arange(0, HEADS_PAD)  # (HEADS_PAD,) query heads
    offs_c = tl.arange(0, ROW_PAD)  # (ROW_PAD,) columns of a token's row: KV head c // D, dim c % D
    offs_t = tl.arange(0, TILE)
    c_mask = offs_c < ROW
    c_dim = offs_c % HEAD_DIM
    # own[h, c]: column c belongs to query head h's KV head -- where Q~ holds q_h and where row h's
    # output is read back. (HEADS_PAD, ROW_PAD)
    own = (
        (offs_h[:, None] < NUM_Q_HEADS)
        & ((offs_c // HEAD_DIM)[None, :] == (offs_h // GROUP)[:, None])
        & c_mask[None, :]
    )
    q = tl.load(q_ptr + seq * stride_q_seq + offs_h[:, None] * stride_q_head + c_dim[None, :], mask=own, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    DOT_PRECISION: tl.constexpr = "ieee" if q_ptr.dtype.element_ty == tl.float32 else "tf32"

    m_i = tl.full([HEADS_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([HEADS_PAD], dtype=tl.float32)
    acc = tl.zeros([HEADS_PAD, ROW_PAD], dtype=tl.float32)  # row h: its output in its own columns
    bt_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    m_i, l_i, acc = attend_tiles(  # the per-head kernel's loops, over "heads" of ROW columns
        q, m_i, l_i, acc, tile_lo, num_full, tile_hi, seq_len, bt_row_ptr,
        k_cache_ptr, stride_k_block, stride_k_tok, v_cache_ptr, stride_v_block, stride_v_tok,
        offs_t, offs_c, c_mask, qk_scale, BLOCK_SIZE, TILE, ROW == ROW_PAD, DOT_PRECISION,
    )  # fmt: skip

    if SPLIT:
        empty = l_i == 0.0  # a split past the sequence's end: weight 0 in the merge
        o = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        row = (seq * NUM_Q_HEADS + offs_h) * num_splits + split  # (HEADS_PAD,)
        tl.store(part_lse_ptr + row, lse, mask=offs_h < NUM_Q_HEADS)
        tl.store(part_o_ptr + row[:, None] * PART_D + c_dim[None, :], o, mask=own)
    else:
        o = acc / l_i[:, None]
        out_ptrs = out_ptr + seq * stride_o_seq + offs_h[:, None] * stride_o_head + c_dim[None, :]
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=own)


def packs(num_q_heads: int, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the packed kernel serves this cache: small, contiguous token rows (``H_kv * D <= 256``)."""
    _, _, num_kv_heads, head_dim = k_cache.shape
    row = num_kv_heads * head_dim
    contiguous = all(c.stride(2) == head_dim and c.stride(1) == row for c in (k_cache, v_cache))
    return contiguous and triton.next_power_of_2(row) <= 256 and num_q_heads <= 64


def packed_config(row: int, num_q_heads: int, on_gpu: bool) -> dict:
    """Tiles of at most 16 KiB of K rows (32 tokens of 384 bytes), two stages, four warps."""
    row_pad = triton.next_power_of_2(row)
    heads_pad = triton.next_power_of_2(num_q_heads)
    if on_gpu:
        heads_pad = max(16, heads_pad)  # a 16-bit tl.dot needs M >= 16
    return dict(TILE=max(16, min(64, 8192 // row_pad)), HEADS_PAD=heads_pad, ROW_PAD=row_pad, num_warps=4, num_stages=2)


def paged_attention_packed(
    q: torch.Tensor,  # (num_seqs, num_q_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # int32 (num_seqs, max_blocks)
    seq_lens: torch.Tensor,  # int32 (num_seqs,)
    *,
    scale: float,
    num_splits: int | None = None,
    config: dict | None = None,  # overrides of packed_config (benchmark sweeps)
) -> torch.Tensor:  # (num_seqs, num_q_heads, head_dim)
    """Launch the packed kernel on validated inputs for which :func:`packs` holds."""
    if not packs(q.shape[1], k_cache, v_cache):
        raise ValueError(
            f"the packed kernel needs contiguous token rows of at most 256 values and at most 64 "
            f"query heads, got cache {tuple(k_cache.shape)} with {q.shape[1]} query heads"
        )
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    row = num_kv_heads * head_dim
    cfg = packed_config(row, num_q_heads, on_gpu=not INTERPRETING)
    cfg.update(config or {})
    q, block_tables, seq_lens, out, max_len = launch_inputs(q, block_tables, seq_lens, block_size)
    if num_splits is None:  # as the per-head kernel chooses, with one program per sequence and split
        num_splits = split_plan(cfg, config, num_seqs, max_len, q.device)
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    split = num_splits > 1
    part_d = triton.next_power_of_2(head_dim)
    if split:
        part_o = torch.empty(num_seqs, num_q_heads, num_splits, part_d, device=q.device, dtype=torch.float32)
        part_lse = torch.empty(num_seqs, num_q_heads, num_splits, device=q.device, dtype=torch.float32)
    else:
        part_o = part_lse = out  # unused
    _packed_decode_kernel[(num_seqs, num_splits)](
        q, q.stride(0), q.stride(1),
        k_cache, k_cache.stride(0), k_cache.stride(1),
        v_cache, v_cache.stride(0), v_cache.stride(1),
        block_tables, block_tables.stride(0), seq_lens,
        out, out.stride(0), out.stride(1), part_o, part_lse, num_splits,
        scale * math.log2(math.e),
        NUM_Q_HEADS=num_q_heads, GROUP=num_q_heads // num_kv_heads, HEADS_PAD=cfg["HEADS_PAD"],
        HEAD_DIM=head_dim, ROW=row, ROW_PAD=cfg["ROW_PAD"], PART_D=part_d,
        BLOCK_SIZE=block_size, TILE=cfg["TILE"], SPLIT=split,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    # The same second kernel as the per-head one's (its rows are PART_D = HEAD_DIM_PAD wide), launched in the usual way.
    merge(part_o, part_lse, out, num_splits, dict(cfg, HEAD_DIM_PAD=part_d), {"USE_PDL": False})
    return out

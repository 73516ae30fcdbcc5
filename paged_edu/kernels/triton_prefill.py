"""
Paged prefill / extend in Triton: a chunk of new tokens over a cached prefix
============================================================================

What you will learn
-------------------
* how chunked prefill and prefix-cache hits become one operation: sequence ``i`` brings
  ``q_len_i`` new query tokens whose K/V are already stored; they attend to the
  ``ctx_i = s_i - q_len_i`` cached tokens before them and causally to each other. New token ``j``
  sits at position ``p = ctx_i + j`` and sees keys ``0 .. p``.
* how the decode kernel generalises: the keys are still gathered tile by tile through the block
  table; the queries are now a block of ``BLOCK_Q`` tokens times the ``G`` heads of a GQA group,
  packed as ``BLOCK_Q * GROUP_PAD`` rows of one ``tl.dot`` (row ``r`` is token ``r // GROUP_PAD``,
  head ``r % GROUP_PAD``), so each K/V tile is loaded once for all of them.

Inputs are packed "varlen" style (see :func:`paged_edu.kernels.paged_attention_prefill`):
``q (num_q_tokens, num_q_heads, head_dim)`` with sequence ``i`` in rows
``cu_seqlens_q[i] : cu_seqlens_q[i + 1]``.

Grid: ``(num_seqs, ceil(max_q_len / BLOCK_Q), num_kv_heads)``. A program whose block of queries
lies past its sequence's ``q_len`` does no work (its key range is empty). We keep the causal mask
on every tile for clarity; a production kernel would skip it on tiles wholly below the diagonal.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from paged_edu.kernels.triton_decode import INTERPRETING

__all__ = ["paged_prefill_triton"]


@triton.jit
def _paged_prefill_kernel(
    q_ptr,  # (num_q_tokens, num_q_heads, head_dim)
    k_cache_ptr,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache_ptr,  # (num_blocks, B, num_kv_heads, head_dim)
    block_tables_ptr,  # int32 (num_seqs, max_blocks)
    seq_lens_ptr,  # int32 (num_seqs,): cached prefix + new tokens
    cu_seqlens_q_ptr,  # int32 (num_seqs + 1,)
    out_ptr,  # (num_q_tokens, num_q_heads, head_dim)
    qk_scale,  # softmax scale * log2(e)
    stride_q_tok, stride_q_head,  # q strides (head_dim stride is 1)
    stride_k_block, stride_k_tok, stride_k_head,  # k_cache strides
    stride_v_block, stride_v_tok, stride_v_head,  # v_cache strides
    stride_bt_seq,  # block_tables row stride
    stride_o_tok, stride_o_head,  # out strides
    GROUP: tl.constexpr,  # G = num_q_heads // num_kv_heads
    GROUP_PAD: tl.constexpr,  # G rounded up to a power of two
    HEAD_DIM: tl.constexpr,  # D
    HEAD_DIM_PAD: tl.constexpr,  # D rounded up to a power of two
    BLOCK_SIZE: tl.constexpr,  # B, tokens per KV block
    BLOCK_Q: tl.constexpr,  # new tokens per program
    TILE: tl.constexpr,  # keys per loop step
    UPCAST: tl.constexpr,  # interpreter: fp32 right after every load
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, "tf32" otherwise
):
    seq = tl.program_id(0)
    q_block = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx = seq_len - q_len  # cached tokens before the chunk

    ROWS: tl.constexpr = BLOCK_Q * GROUP_PAD
    offs_r = tl.arange(0, ROWS)  # (ROWS,) row = (token, head of the group)
    tok = q_block * BLOCK_Q + offs_r // GROUP_PAD  # (ROWS,) index of the new token in the chunk
    g = offs_r % GROUP_PAD
    row_ok = (tok < q_len) & (g < GROUP)
    head = kv_head * GROUP + g  # (ROWS,) query head
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d < HEAD_DIM
    offs_t = tl.arange(0, TILE)

    q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :],
                mask=row_ok[:, None] & d_mask[None, :], other=0.0)  # (ROWS, HEAD_DIM_PAD)
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = ctx + tok  # (ROWS,) position of each row's token in the sequence

    # Keys this block of queries needs: 0 .. ctx + last token of the block. Empty past q_len.
    last = tl.minimum((q_block + 1) * BLOCK_Q, q_len)
    key_end = tl.where(q_block * BLOCK_Q < q_len, ctx + last, 0)

    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM_PAD], dtype=tl.float32)
    bt_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for tile in range(0, tl.cdiv(key_end, TILE)):
        pos = tile * TILE + offs_t  # (TILE,) key positions
        valid = pos < key_end
        block_ids = tl.load(bt_row_ptr + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + block_ids[:, None] * stride_k_block + (pos % BLOCK_SIZE)[:, None] * stride_k_tok
                    + kv_head * stride_k_head + offs_d[None, :], mask=kv_mask, other=0.0)  # (TILE, HEAD_DIM_PAD)
        v = tl.load(v_cache_ptr + block_ids[:, None] * stride_v_block + (pos % BLOCK_SIZE)[:, None] * stride_v_tok
                    + kv_head * stride_v_head + offs_d[None, :], mask=kv_mask, other=0.0)  # (TILE, HEAD_DIM_PAD)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (ROWS, TILE)
        causal = (pos[None, :] <= q_pos[:, None]) & valid[None, :]
        s = tl.where(causal, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Rows that have seen no key yet keep m = -inf: use 0 there so no -inf - -inf = NaN appears.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # l = 0 only on padding rows, never stored
    tl.store(out_ptr + (q_start + tok)[:, None] * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_mask[None, :])


def paged_prefill_triton(
    q: torch.Tensor,  # (num_q_tokens, num_q_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # int32 (num_seqs, max_blocks)
    seq_lens: torch.Tensor,  # int32 (num_seqs,)
    cu_seqlens_q: torch.Tensor,  # int32 (num_seqs + 1,)
    *,
    scale: float,
    max_q_len: int | None = None,  # None: read it off cu_seqlens_q (a sync), or num_q_tokens while capturing
) -> torch.Tensor:  # (num_q_tokens, num_q_heads, head_dim)
    """Launch the prefill kernel on validated inputs (see :func:`paged_edu.kernels.paged_attention_prefill`)."""
    if not INTERPRETING and not q.is_cuda:
        raise RuntimeError(
            "the Triton kernel needs a CUDA GPU, or the Triton interpreter for CPU tensors: set "
            "TRITON_INTERPRET=1 before importing paged_edu, or use impl='torch'"
        )
    num_q_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    num_seqs = cu_seqlens_q.shape[0] - 1
    if q.stride(-1) != 1:
        q = q.contiguous()
    block_tables = block_tables if block_tables.stride(1) == 1 else block_tables.contiguous()
    seq_lens, cu_seqlens_q = seq_lens.contiguous(), cu_seqlens_q.contiguous()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_q_tokens == 0:
        return out
    if max_q_len is None:
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            max_q_len = num_q_tokens
        else:
            max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    group_pad = triton.next_power_of_2(group)
    head_dim_pad = triton.next_power_of_2(head_dim)
    block_q = max(1, 64 // group_pad) if not INTERPRETING else max(1, 16 // group_pad)
    tile = 64 if head_dim_pad <= 128 else 32
    grid = (num_seqs, triton.cdiv(max_q_len, block_q), num_kv_heads)
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, out,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        BLOCK_SIZE=block_size, BLOCK_Q=block_q, TILE=tile,
        UPCAST=INTERPRETING, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4, num_stages=2,
    )
    return out

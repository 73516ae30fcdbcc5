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
  packed as ``ROWS = BLOCK_Q * GROUP_PAD`` rows of one ``tl.dot`` (row ``r`` is token
  ``r // GROUP_PAD``, head ``r % GROUP_PAD``), so each K/V tile is loaded once for all of them.
* the three things that make a flash-attention kernel fast, and how little code they are:
  **causal tile skipping** (a block of queries reads keys only up to its last token: half the
  work of a long causal prompt is never done), **no masks off the diagonal** (tiles wholly below
  the diagonal run a mask-free loop; only the one or two tiles the diagonal crosses pay for
  ``where``), and **longest work first** (the programs with the most keys start first, so the
  GPU does not end on a tail of long programs).

The math (flash attention with an online softmax, in log2 units)
---------------------------------------------------------------
For the rows ``r`` of one program and key tiles ``K_t, V_t`` (``TILE`` keys each)::

    S_t = Q K_t^T                          (ROWS, TILE), fp32 accumulation
    S_t[r, c] = -inf  where key c > p(r)   (only on diagonal tiles)
    m'  = max(m, rowmax(S_t) * c)          c = scale * log2(e), so exp(x*scale) = exp2(x*c)
    P_t = exp2(S_t * c - m')               (ROWS, TILE)
    l   = l * exp2(m - m') + rowsum(P_t)
    O   = O * exp2(m - m') + P_t V_t       (ROWS, HEAD_DIM)
    out = O / l                            after the last tile

Tile ``t`` holds keys ``t*TILE .. t*TILE + TILE - 1``. With ``p_min = ctx + q_block*BLOCK_Q`` the
position of the program's first token, tiles ``t < (p_min + 1) // TILE`` are visible to every row
(no mask); tiles up to ``cdiv(ctx + last token + 1, TILE)`` cross the diagonal (masked); the rest
are never read. Tile 0 holds key 0, which every row sees, so ``m`` is finite after the first tile
and no ``-inf - -inf`` can occur.

Inputs are packed "varlen" style (see :func:`paged_edu.kernels.paged_attention_prefill`):
``q (num_q_tokens, num_q_heads, head_dim)`` with sequence ``i`` in rows
``cu_seqlens_q[i] : cu_seqlens_q[i + 1]``.

Grid: ``(num_kv_heads, num_q_tokens // BLOCK_Q + num_seqs)``, a flat list of query blocks over all
sequences -- a number the host knows without reading ``cu_seqlens_q``, so the launch needs no sync
and can be captured in a CUDA graph whatever the chunks' lengths. Sequence ``i`` owns the program
indices from ``start_i = cu_seqlens_q[i] // BLOCK_Q + i`` on (one more than it needs at most: its
chunk may not start on a multiple of ``BLOCK_Q``); a program finds its sequence by binary search
over ``start_i``, as vLLM's ``kernel_unified_attention_2d`` does (``find_seq_idx``,
``vllm/attention/ops/triton_unified_attention.py``). The indices run in *reverse* (program ``z``
takes block ``n - 1 - z``): within a sequence the last tokens, which read the most keys, start
first. A program past its sequence's ``q_len`` -- or on a padding chunk of ``q_len = 0`` -- does no
work and returns at once. ``cu_seqlens_q`` may start after row 0 of ``q``: the engine passes the whole step's queries,
decodes first, and the rows ``cu[0] .. cu[-1]`` are the prompt chunks'.

Benchmark
---------
``python benchmarks/bench_prefill.py`` on an H200 (bf16, B=16, 32/8 heads, head_dim 128, random
block tables; CUDA-graph replays, L2 flushed; every output checked against the fp32 oracle):

======================  ===========  =================================  ===================
seqs x new over cached  this kernel  best fused SDPA, contiguous        FlexAttention paged
======================  ===========  =================================  ===================
8 x 1024 over 1024      593 us       743 us (FA2, lower-right causal)   1110 us
1 x 8192                1320 us      1042 us (cuDNN, is_causal)         2563 us
64 x 128 over 2048      817 us       1020 us (FA2, lower-right causal)  1483 us
4 x 2048                402 us       374 us (cuDNN, is_causal)          829 us
======================  ===========  =================================  ===================

SDPA's fastest kernel (cuDNN) takes only a top-left causal mask, so for the cached-prefix cases the
fastest correct fused SDPA is FA2; ``benchmarks/records/h200/prefill_bench.json`` has every formulation.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from paged_edu.kernels.pdl import launch_options, wait_for_previous_kernel
from paged_edu.kernels.triton_fused import INTERPRETING

__all__ = ["paged_prefill_triton", "prefill_config"]


@triton.jit
def _attend_tile(
    q,  # (ROWS, HEAD_DIM_PAD) this program's queries
    m_i, l_i, acc,  # running max (ROWS,) [log2 units], normaliser (ROWS,), output (ROWS, HEAD_DIM_PAD)
    tile,  # which tile of TILE keys (positions tile*TILE ...)
    key_end,  # keys 0 .. key_end - 1 exist for this program (diagonal tiles mask past it)
    q_pos,  # (ROWS,) position of each row's token in its sequence
    bt_row_ptr,  # this sequence's row of the block table
    k_head_ptr, v_head_ptr,  # k_cache / v_cache advanced to this KV head
    stride_k_block, stride_k_tok, stride_v_block, stride_v_tok,  # the caches' block and token strides
    offs_t, offs_d, d_mask,  # (TILE,), (HEAD_DIM_PAD,), (HEAD_DIM_PAD,)
    qk_scale,  # scale * log2(e)
    BLOCK_SIZE: tl.constexpr,  # B, tokens per KV block
    TILE: tl.constexpr,  # keys per tile
    EVEN_D: tl.constexpr,  # head_dim is a power of two: no mask along it
    DIAGONAL: tl.constexpr,  # True: the causal mask (and the sequence end) apply to this tile
    UPCAST: tl.constexpr,  # interpreter: fp32 right after every load
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, "tf32" otherwise
):  # fmt: skip
    """One tile of keys gathered through the block table and folded into the online softmax (module docstring)."""
    pos = tile * TILE + offs_t  # (TILE,) key positions
    # Gather: key at position t lives in block B(t // B), slot t % B.
    if DIAGONAL:
        valid = pos < key_end  # table entries past the sequence may be garbage: never read them
        block_ids = tl.load(bt_row_ptr + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    else:
        block_ids = tl.load(bt_row_ptr + pos // BLOCK_SIZE).to(tl.int64)
    slot = pos % BLOCK_SIZE
    k_ptrs = k_head_ptr + block_ids[:, None] * stride_k_block + slot[:, None] * stride_k_tok + offs_d[None, :]
    v_ptrs = v_head_ptr + block_ids[:, None] * stride_v_block + slot[:, None] * stride_v_tok + offs_d[None, :]
    if DIAGONAL:
        k = tl.load(k_ptrs, mask=valid[:, None] & d_mask[None, :], other=0.0)  # (TILE, HEAD_DIM_PAD)
        v = tl.load(v_ptrs, mask=valid[:, None] & d_mask[None, :], other=0.0)  # (TILE, HEAD_DIM_PAD)
    elif EVEN_D:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=d_mask[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)

    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (ROWS, TILE) raw scores
    if DIAGONAL:
        s = tl.where(pos[None, :] <= q_pos[:, None], s, float("-inf"))  # causal: key <= own position
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # (ROWS,)
    p = tl.exp2(s * qk_scale - m_new[:, None])  # (ROWS, TILE), one FMA + exp2 per score
    alpha = tl.exp2(m_i - m_new)  # rescales what came before; 0 on the first tile
    l_i = l_i * alpha + tl.sum(p, 1)
    # O = O * alpha + P V, with the accumulator handed to the dot (the tensor cores add into it:
    # no second (ROWS, HEAD_DIM) fp32 tensor in registers).
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _find_seq(cu_seqlens_q_ptr, b, num_seqs, BLOCK_Q: tl.constexpr):
    """The last sequence ``i`` with ``cu_seqlens_q[i] // BLOCK_Q + i <= b`` (-1 if none): binary search."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid <= b:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit(do_not_specialize=["stride_bt_seq", "num_seqs"])  # both change every step (see decode.tutorial)
def _paged_prefill_kernel(
    q_ptr,  # (num_q_tokens, H, D)
    k_cache_ptr, v_cache_ptr,  # (num_blocks, B, H_kv, D) each
    block_tables_ptr,  # int32 (num_seqs, max_blocks)
    seq_lens_ptr,  # int32 (num_seqs,): cached prefix + new tokens
    cu_seqlens_q_ptr,  # int32 (num_seqs + 1,): sequence i's new tokens are rows cu[i] .. cu[i + 1] - 1
    out_ptr,  # (num_q_tokens, H, D)
    qk_scale,  # softmax scale * log2(e)
    num_seqs,  # sequences in the step
    stride_q_tok, stride_q_head,  # q's strides (its head_dim stride is 1, as for every tensor here)
    stride_k_block, stride_k_tok, stride_k_head,  # k_cache's strides
    stride_v_block, stride_v_tok, stride_v_head,  # v_cache's strides
    stride_bt_seq,  # block_tables' row stride
    stride_o_tok, stride_o_head,  # out's strides
    GROUP: tl.constexpr,  # G = num_q_heads // num_kv_heads
    GROUP_PAD: tl.constexpr,  # G rounded up to a power of two
    HEAD_DIM: tl.constexpr,  # D
    HEAD_DIM_PAD: tl.constexpr,  # D rounded up to a power of two
    BLOCK_SIZE: tl.constexpr,  # B, tokens per KV block
    BLOCK_Q: tl.constexpr,  # new tokens per program
    TILE: tl.constexpr,  # keys per loop step
    UPCAST: tl.constexpr,  # interpreter: fp32 right after every load
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, "tf32" otherwise
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent (paged_edu/kernels/pdl.py)
):  # fmt: skip
    kv_head = tl.program_id(0)
    b = tl.num_programs(1) - 1 - tl.program_id(1)  # this program's block of the flat list, longest work first
    seq = _find_seq(cu_seqlens_q_ptr, b, num_seqs, BLOCK_Q)
    owned = seq >= 0  # False: b lies before the first chunk's blocks
    seq = tl.maximum(seq, 0)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_block = tl.where(owned, b - (q_start // BLOCK_Q + seq), 0)  # which block of its chunk
    q_len = tl.where(owned, tl.load(cu_seqlens_q_ptr + seq + 1) - q_start, 0)
    if q_block * BLOCK_Q >= q_len:  # past its chunk's end, or a padding chunk: no work
        return
    # (The step's inputs above were copied in before its first kernel; q and the K/V just stored are
    # the previous kernels' outputs, and out may still be read by one.)
    wait_for_previous_kernel(USE_PDL)
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

    q = tl.load(
        q_ptr + (q_start + tok)[:, None] * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :],
        mask=row_ok[:, None] & d_mask[None, :],
        other=0.0,
    )  # (ROWS, HEAD_DIM_PAD)
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = ctx + tok  # (ROWS,) position of each row's token in the sequence

    # Keys this block needs: 0 .. ctx + its last token.
    key_end = ctx + tl.minimum((q_block + 1) * BLOCK_Q, q_len)
    num_tiles = tl.cdiv(key_end, TILE)
    # Tiles every row sees in full: their last key <= the first token's position ctx + q_block*BLOCK_Q.
    num_full = (ctx + q_block * BLOCK_Q + 1) // TILE

    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM_PAD], dtype=tl.float32)
    bt_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    k_head_ptr = k_cache_ptr + kv_head * stride_k_head
    v_head_ptr = v_cache_ptr + kv_head * stride_v_head

    # Below the diagonal: no masks, the hot loop (software-pipelined, num_stages).
    for tile in range(0, num_full):
        m_i, l_i, acc = _attend_tile(
            q, m_i, l_i, acc, tile, key_end, q_pos, bt_row_ptr, k_head_ptr, v_head_ptr,
            stride_k_block, stride_k_tok, stride_v_block, stride_v_tok, offs_t, offs_d, d_mask, qk_scale,
            BLOCK_SIZE, TILE, HEAD_DIM == HEAD_DIM_PAD, False, UPCAST, DOT_PRECISION,
        )  # fmt: skip
    # On the diagonal: ceil((BLOCK_Q + TILE - 1) / TILE) tiles at most, masked.
    for tile in range(num_full, num_tiles):
        m_i, l_i, acc = _attend_tile(
            q, m_i, l_i, acc, tile, key_end, q_pos, bt_row_ptr, k_head_ptr, v_head_ptr,
            stride_k_block, stride_k_tok, stride_v_block, stride_v_tok, offs_t, offs_d, d_mask, qk_scale,
            BLOCK_SIZE, TILE, HEAD_DIM == HEAD_DIM_PAD, True, UPCAST, DOT_PRECISION,
        )  # fmt: skip

    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a guard: every row sees key 0, so l > 0
    tl.store(
        out_ptr + (q_start + tok)[:, None] * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_mask[None, :],
    )


def prefill_config(head_dim: int, group: int, on_gpu: bool) -> dict:
    """Rows per program, keys per tile, warps and pipeline depth.

    ``ROWS`` query rows (``BLOCK_Q = ROWS // GROUP_PAD`` tokens times the group's heads) against
    ``TILE`` keys per step. On the GPU: 256 rows x 64 keys (64 tokens x 4 heads at 32/8 heads), 8
    warps, 3 stages: the best or within 4% of the best of a sweep on an H200 in every benchmark case
    (``benchmarks/bench_prefill.py --sweep``, ``benchmarks/records/h200/prefill_sweep.json``). 256 rows make
    each gathered K/V tile serve twice as many queries as 128 did (1x8192: 1,320 us against 1,441
    for 128 x 128 and 1,647 for 128 x 64). head_dim 256 uses 64 x 32 to fit shared memory. In the
    interpreter: small tiles, so that tests with a few dozen tokens still run full tiles, diagonal
    tiles and several query blocks.
    """
    group_pad = triton.next_power_of_2(group)
    head_dim_pad = triton.next_power_of_2(head_dim)
    if on_gpu:
        rows, tile = (256, 64) if head_dim_pad <= 128 else (64, 32)
        cfg = dict(ROWS=rows, TILE=tile, num_warps=8, num_stages=3)
    else:
        cfg = dict(ROWS=16, TILE=16, num_warps=4, num_stages=1)
    return dict(cfg, GROUP_PAD=group_pad, HEAD_DIM_PAD=head_dim_pad)


def paged_prefill_triton(
    q: torch.Tensor,  # (num_q_tokens, num_q_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # int32 (num_seqs, max_blocks)
    seq_lens: torch.Tensor,  # int32 (num_seqs,)
    cu_seqlens_q: torch.Tensor,  # int32 (num_seqs + 1,)
    *,
    scale: float,
    out: torch.Tensor | None = None,  # (num_q_tokens, num_q_heads, head_dim): rows cu[0]..cu[-1] written
    config: dict | None = None,  # overrides of prefill_config (benchmark sweeps, tests)
    pdl: bool = False,  # launched as a programmatic dependent (paged_edu/kernels/pdl.py)
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
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    if num_q_tokens == 0 or num_seqs == 0:
        return out
    cfg = prefill_config(head_dim, group, on_gpu=not INTERPRETING)
    cfg.update(config or {})
    block_q = max(1, cfg["ROWS"] // cfg["GROUP_PAD"])
    grid = (num_kv_heads, num_q_tokens // block_q + num_seqs)
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, out,
        scale * math.log2(math.e), num_seqs,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=cfg["GROUP_PAD"], HEAD_DIM=head_dim, HEAD_DIM_PAD=cfg["HEAD_DIM_PAD"],
        BLOCK_SIZE=block_size, BLOCK_Q=block_q, TILE=cfg["TILE"],
        UPCAST=INTERPRETING, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **launch_options(pdl, q.device),
    )  # fmt: skip
    return out

"""
Writing new tokens into the paged KV cache: a scatter by slot (and its rotary variant)
======================================================================================

Every forward pass produces K and V for its new tokens, packed as ``(num_tokens, num_kv_heads,
head_dim)``. The allocator has already said where each token goes: its *slot*
``slot = B(t // B) * B + t % B`` (``BlockAllocator.slot_mapping``). Storing is a scatter: token
``i`` goes to block ``slot // B``, offset ``slot % B``. One program per token copies its
``num_kv_heads * head_dim`` values of K and of V; slot ``-1`` means "padding, store nothing" (as in
vLLM), which lets a CUDA graph captured for a fixed batch carry unused rows.

No arithmetic happens, so bf16 is safe even in the interpreter (raw bits are copied). Without
``ROTARY`` the kernel runs twelve lines of its body: the slot and the masks, then a load and a store
for K and for V.

Rotary embedding on the way in (``ROTARY=True``)
------------------------------------------------
Just before the store, a Llama layer rotates q and k by their token's position (RoPE): for each
pair ``(x_i, x_{i+D/2})`` of a head and ``c = cos(p * inv_freq_i)``, ``s = sin(p * inv_freq_i)``
(one row of the model's ``cos_table`` / ``sin_table``, both ``(max_positions, D)``, fp32 or already
in the model's dtype)::

    x'_i       = round(round(x_i * c) - round(x_{i+D/2} * s))
    x'_{i+D/2} = round(round(x_{i+D/2} * c) + round(x_i * s))      (c, s rounded to x's dtype first)

-- exactly the rounding of PyTorch's ``x * cos + rotate_half(x) * sin`` in bf16, so the result is
bit-identical. In PyTorch that is ten small kernels for q and k; here the same program that
stores the token's K/V first rotates its q (written out for the attention kernel, padding rows
too) and its k (stored rotated). One kernel, one store mechanism: :func:`store_kv_triton` is the
same kernel with ``ROTARY=False``.

A pure-decode step goes one launch further (``Kernels.fuse_decode_store``, on by default): the decode
attention kernel rotates and stores the step's one token per sequence itself (:func:`paged_edu.kernels.decode.fast.rotary_store_decode_triton`),
with :func:`rotary_cos_sin` and :func:`rotate_rows` from here -- the same :func:`rope`, so the same bits,
provided neither kernel lets the compiler contract a product into the sum (``enable_fp_fusion=False``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from paged_edu.kernels.checks import check_rotary_store_inputs
from paged_edu.kernels.pdl import launch_options, wait_for_previous_kernel
from paged_edu.kernels.triton_fused import INTERPRETING, by_hand, round_to

__all__ = ["rope", "rotary_cos_sin", "rotary_store_kv_triton", "rotate_rows", "store_kv_triton"]


@triton.jit
def rope(x, pair, c, s, dtype: tl.constexpr, BY_HAND: tl.constexpr):
    """One rotated value, ``round(round(x * c) + round(pair * s))``: the one definition of RoPE's rounding.

    ``pair`` is ``x``'s partner in its pair; the first half of a head takes ``s`` negated
    (``x'_i = rope(x_i, x_{i+D/2}, c_i, -s_i)``: ``round(-y) = -round(y)``, so that is the module
    docstring's subtraction bit for bit), the second half ``s`` itself. All in fp32; ``c, s``
    already rounded to ``dtype``. A kernel that calls it must launch with ``enable_fp_fusion=False``:
    with contraction on, the compiled code did not keep the product's rounding on the H200
    (:mod:`~paged_edu.kernels.decode.fast`, "Storing the new token on the way in")."""
    return round_to(round_to(x * c, dtype, BY_HAND) + round_to(pair * s, dtype, BY_HAND), dtype, BY_HAND)


@triton.jit
def _rotate(x_ptrs, half, c1, s1, c2, s2, mask, dtype: tl.constexpr, BY_HAND: tl.constexpr):
    """Load both halves of some heads' rows at ``x_ptrs`` / ``x_ptrs + half``; return them rotated.

    ``c1, s1`` (pairs' first halves) and ``c2, s2`` arrive already rounded to ``dtype`` (in fp32)."""
    x1 = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)  # x_i, i < D/2
    x2 = tl.load(x_ptrs + half, mask=mask, other=0.0).to(tl.float32)  # x_{i + D/2}
    return rope(x1, x2, c1, -s1, dtype, BY_HAND).to(dtype), rope(x2, x1, c2, s2, dtype, BY_HAND).to(dtype)


@triton.jit
def rotary_cos_sin(cos_ptr, sin_ptr, row, offs_d, HEAD_DIM: tl.constexpr, dtype: tl.constexpr, BY_HAND: tl.constexpr):
    """One position's ``c, s`` along a whole head, ``(HEAD_DIM_PAD,)`` fp32 rounded to ``dtype``, ``s``
    negated on the first half: what :func:`rotate_rows` takes (``row``: the position times the
    tables' row stride; columns past ``HEAD_DIM`` are 0)."""
    d_mask = offs_d < HEAD_DIM
    c = round_to(tl.load(cos_ptr + row + offs_d, mask=d_mask, other=0.0).to(tl.float32), dtype, BY_HAND)
    s = round_to(tl.load(sin_ptr + row + offs_d, mask=d_mask, other=0.0).to(tl.float32), dtype, BY_HAND)
    return c, tl.where(offs_d < HEAD_DIM // 2, -s, s)


@triton.jit
def rotate_rows(row_ptrs, offs_d, mask, c, s, HEAD_DIM: tl.constexpr, dtype: tl.constexpr, BY_HAND: tl.constexpr):
    """Whole rows ``row_ptrs + offs_d`` rotated, in fp32 rounded to ``dtype`` (0 where masked): each
    value with its partner ``d +- D/2`` loaded beside it, so the result has the rows' own layout --
    what a kernel that goes on to use the rows (the fused decode kernel's q and k) needs."""
    HALF = HEAD_DIM // 2
    pair_d = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
    x = tl.load(row_ptrs + offs_d, mask=mask, other=0.0).to(tl.float32)
    pair = tl.load(row_ptrs + pair_d, mask=mask, other=0.0).to(tl.float32)
    return rope(x, pair, c, s, dtype, BY_HAND)


@triton.jit
def _store_kv_kernel(
    key_ptr,  # (num_tokens, H_kv, D) new keys (before rotation when ROTARY)
    value_ptr,  # (num_tokens, H_kv, D) new values
    k_cache_ptr, v_cache_ptr,  # (num_blocks, B, H_kv, D) each
    slot_mapping_ptr,  # int32/int64 (num_tokens,): destination slot, -1 = skip
    q_ptr,  # ROTARY: (num_tokens, H, D) queries to rotate
    q_out_ptr,  # ROTARY: (num_tokens, H, D) out, contiguous
    positions_ptr,  # ROTARY: int64 (num_tokens,) each token's position p
    cos_ptr, sin_ptr,  # ROTARY: (max_positions, D) tables, fp32 (or the model's dtype after .to)
    stride_key_tok, stride_key_head,  # key's strides (its head_dim stride is 1, as for every tensor here)
    stride_value_tok, stride_value_head,  # value's strides
    stride_k, stride_v,  # k_cache's and v_cache's strides (block, token, head): a tuple each
    stride_q_tok, stride_q_head,  # q's strides (ROTARY)
    stride_table,  # cos/sin row stride (ROTARY)
    NUM_KV_HEADS: tl.constexpr,  # H_kv
    HEAD_DIM: tl.constexpr,  # D
    HEADS_PAD: tl.constexpr,  # H_kv rounded up to a power of two
    HEAD_DIM_PAD: tl.constexpr,  # D rounded up to a power of two
    BLOCK_SIZE: tl.constexpr,  # B, tokens per block
    ROTARY: tl.constexpr,  # rotate q and k first (the model's fused path)
    NUM_Q_HEADS: tl.constexpr,  # H (ROTARY)
    Q_HEADS_PAD: tl.constexpr,  # H rounded up to a power of two (ROTARY)
    HALF_PAD: tl.constexpr,  # D / 2 rounded up to a power of two (ROTARY)
    BY_HAND: tl.constexpr,  # round_to rounds by hand (the interpreter, bf16)
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent (paged_edu/kernels/pdl.py)
):  # fmt: skip
    stride_k_block, stride_k_tok, stride_k_head = stride_k
    stride_v_block, stride_v_tok, stride_v_head = stride_v
    tok = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    block = slot // BLOCK_SIZE  # physical block B(t // B)
    offset = slot % BLOCK_SIZE  # t mod B
    h = tl.arange(0, HEADS_PAD)[:, None]  # (HEADS_PAD, 1)
    d = tl.arange(0, HEAD_DIM_PAD)[None, :]  # (1, HEAD_DIM_PAD)
    # (HEADS_PAD, HEAD_DIM_PAD); the slot test is broadcast as a tensor (the interpreter refuses a scalar bool).
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM) & ((h * 0 + slot) >= 0)
    k_dst = k_cache_ptr + block * stride_k_block + offset * stride_k_tok + h * stride_k_head
    # (The slot and position were copied in before the step's first kernel; q, k, v are the previous
    # kernel's output, and an earlier kernel may still read the pool.)
    wait_for_previous_kernel(USE_PDL)
    if ROTARY:
        HALF = HEAD_DIM // 2
        i = tl.arange(0, HALF_PAD)[None, :]  # (1, HALF_PAD): pair index
        table = tl.load(positions_ptr + tok).to(tl.int64) * stride_table + i  # this token's row of the tables
        dtype = q_out_ptr.dtype.element_ty
        # (1, HALF_PAD) each, rounded to the activation dtype as the PyTorch path's .to(dtype) does
        c1 = round_to(tl.load(cos_ptr + table, mask=i < HALF, other=0.0).to(tl.float32), dtype, BY_HAND)
        s1 = round_to(tl.load(sin_ptr + table, mask=i < HALF, other=0.0).to(tl.float32), dtype, BY_HAND)
        c2 = round_to(tl.load(cos_ptr + table + HALF, mask=i < HALF, other=0.0).to(tl.float32), dtype, BY_HAND)
        s2 = round_to(tl.load(sin_ptr + table + HALF, mask=i < HALF, other=0.0).to(tl.float32), dtype, BY_HAND)
        # q: every row, padding too (its attention output is dropped).
        hq = tl.arange(0, Q_HEADS_PAD)[:, None]  # (Q_HEADS_PAD, 1)
        q_mask = (hq < NUM_Q_HEADS) & (i < HALF)
        q1, q2 = _rotate(
            q_ptr + tok * stride_q_tok + hq * stride_q_head + i, HALF, c1, s1, c2, s2, q_mask, dtype, BY_HAND
        )
        q_dst = q_out_ptr + tok * (NUM_Q_HEADS * HEAD_DIM) + hq * HEAD_DIM + i
        tl.store(q_dst, q1, mask=q_mask)
        tl.store(q_dst + HALF, q2, mask=q_mask)
        # k: rotated, then stored at the slot like V below.
        k_mask = (h < NUM_KV_HEADS) & (i < HALF) & ((h * 0 + slot) >= 0)
        k1, k2 = _rotate(
            key_ptr + tok * stride_key_tok + h * stride_key_head + i, HALF, c1, s1, c2, s2, k_mask, dtype, BY_HAND
        )
        tl.store(k_dst + i, k1, mask=k_mask)
        tl.store(k_dst + i + HALF, k2, mask=k_mask)
    else:
        k = tl.load(key_ptr + tok * stride_key_tok + h * stride_key_head + d, mask=mask)
        tl.store(k_dst + d, k, mask=mask)
    v = tl.load(value_ptr + tok * stride_value_tok + h * stride_value_head + d, mask=mask)
    tl.store(v_cache_ptr + block * stride_v_block + offset * stride_v_tok + h * stride_v_head + d, v, mask=mask)


def _launch(
    key, value, k_cache, v_cache, slot_mapping, q=None, q_out=None, positions=None, cos=None, sin=None, pdl=False
):
    if not INTERPRETING and not key.is_cuda:
        raise RuntimeError(
            "the Triton store kernel needs a CUDA GPU, or TRITON_INTERPRET=1 set before importing "
            "paged_edu; use impl='torch' otherwise"
        )
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    slot_mapping = slot_mapping.contiguous()
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    rotary = q is not None
    if not rotary:  # placeholders for the unused ROTARY arguments
        q = q_out = cos = sin = key
        positions = slot_mapping
    elif q.stride(-1) != 1:
        q = q.contiguous()
    num_q_heads = q.shape[1]
    width = (num_q_heads + 2 * num_kv_heads if rotary else 2 * num_kv_heads) * head_dim  # values per token
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, q, q_out, positions, cos, sin,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride()[:3], v_cache.stride()[:3],
        q.stride(0), q.stride(1), cos.stride(0),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=k_cache.shape[1],
        ROTARY=rotary,
        NUM_Q_HEADS=num_q_heads,
        Q_HEADS_PAD=triton.next_power_of_2(num_q_heads),
        HALF_PAD=triton.next_power_of_2(max(1, head_dim // 2)),
        BY_HAND=by_hand(key.dtype),
        num_warps=4 if width >= 2048 else (2 if width >= 512 else 1),
        enable_fp_fusion=False,  # no a * b + c contracted into one FMA: PyTorch rounds the product first
        **launch_options(pdl, key.device),
    )  # fmt: skip


def store_kv_triton(
    key: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    value: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    slot_mapping: torch.Tensor,  # int (num_tokens,)
) -> None:
    """Scatter validated ``key``/``value`` rows into the caches (see the module docstring)."""
    _launch(key, value, k_cache, v_cache, slot_mapping)


def rotary_store_kv_triton(
    q: torch.Tensor,  # (num_tokens, num_q_heads, head_dim)
    key: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim), not yet rotated
    value: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    slot_mapping: torch.Tensor,  # int (num_tokens,): -1 = store nothing
    positions: torch.Tensor,  # int (num_tokens,)
    cos_table: torch.Tensor,  # (max_positions, head_dim), fp32 or the model's dtype
    sin_table: torch.Tensor,  # (max_positions, head_dim), fp32 or the model's dtype
    pdl: bool = False,  # launched as a programmatic dependent (paged_edu/kernels/pdl.py)
) -> torch.Tensor:  # q rotated, (num_tokens, num_q_heads, head_dim) contiguous
    """Rotate q and k by their positions (RoPE), store the rotated k and v at their slots, return q.

    The model's fused path (see the module docstring); the caller guarantees positions inside the
    tables and slots inside the pool (the runner built them).
    """
    check_rotary_store_inputs(q, key, value, k_cache)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    positions = positions.contiguous()
    _launch(key, value, k_cache, v_cache, slot_mapping, q, q_out, positions, cos_table, sin_table, pdl=pdl)
    return q_out

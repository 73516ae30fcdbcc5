"""
Writing new tokens into the paged KV cache: a 20-line Triton kernel
===================================================================

Every forward pass produces K and V for its new tokens, packed as ``(num_tokens, num_kv_heads,
head_dim)``. The allocator has already said where each token goes: its *slot*
``slot = B(t // B) * B + t % B`` (``BlockAllocator.slot_mapping``). Storing is a scatter: token
``i`` goes to block ``slot // B``, offset ``slot % B``. One program per token copies its
``num_kv_heads * head_dim`` values of K and of V; slot ``-1`` means "padding, store nothing" (as in
vLLM), which lets a CUDA graph captured for a fixed batch carry unused rows.

No arithmetic happens, so bf16 is safe even in the interpreter (raw bits are copied).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["store_kv_triton"]


@triton.jit
def _store_kv_kernel(
    key_ptr,  # (num_tokens, num_kv_heads, head_dim) new keys
    value_ptr,  # (num_tokens, num_kv_heads, head_dim) new values
    k_cache_ptr,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache_ptr,  # (num_blocks, B, num_kv_heads, head_dim)
    slot_mapping_ptr,  # int32/int64 (num_tokens,): destination slot, -1 = skip
    stride_key_tok, stride_key_head,  # key strides (head_dim stride is 1)
    stride_value_tok, stride_value_head,  # value strides
    stride_k_block, stride_k_tok, stride_k_head,  # k_cache strides
    stride_v_block, stride_v_tok, stride_v_head,  # v_cache strides
    NUM_KV_HEADS: tl.constexpr,  # H_kv
    HEAD_DIM: tl.constexpr,  # D
    HEADS_PAD: tl.constexpr,  # H_kv rounded up to a power of two
    HEAD_DIM_PAD: tl.constexpr,  # D rounded up to a power of two
    BLOCK_SIZE: tl.constexpr,  # B, tokens per block
):
    tok = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    block = slot // BLOCK_SIZE  # physical block B(t // B)
    offset = slot % BLOCK_SIZE  # t mod B
    h = tl.arange(0, HEADS_PAD)[:, None]  # (HEADS_PAD, 1)
    d = tl.arange(0, HEAD_DIM_PAD)[None, :]  # (1, HEAD_DIM_PAD)
    # (HEADS_PAD, HEAD_DIM_PAD); the slot test is broadcast as a tensor (the interpreter refuses a scalar bool).
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM) & ((h * 0 + slot) >= 0)
    k = tl.load(key_ptr + tok * stride_key_tok + h * stride_key_head + d, mask=mask)
    v = tl.load(value_ptr + tok * stride_value_tok + h * stride_value_head + d, mask=mask)
    tl.store(k_cache_ptr + block * stride_k_block + offset * stride_k_tok + h * stride_k_head + d, k, mask=mask)
    tl.store(v_cache_ptr + block * stride_v_block + offset * stride_v_tok + h * stride_v_head + d, v, mask=mask)


def store_kv_triton(
    key: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    value: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    slot_mapping: torch.Tensor,  # int (num_tokens,)
) -> None:
    """Scatter validated ``key``/``value`` rows into the caches (see the module docstring)."""
    from paged_edu.kernels.triton_decode import INTERPRETING

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
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads), HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=k_cache.shape[1], num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
    )

"""The seed's decode kernel, kept exactly as the seed wrote it (defects included), and its fix.

:func:`paged_attention_decode_step` is the seed document's "Step 2: Vectorized PagedAttention
Kernel (Online Softmax)", copied verbatim (only this docstring is
ours). It is here so that lesson 4 can *run* it rather than talk about it. Do not use it: the
library's kernels are :func:`paged_edu.kernels.paged_attention_decode` (``impl="loop"`` is the
same algorithm, corrected).

What really happens when it runs (torch 2.13 CPU; lesson 4 shows it live on the device it runs on):

* **fp32 inputs:** it works and matches the oracle (to ~1e-7).
* **bf16 or fp16 inputs** -- the seed's own simulation uses bf16 -- it raises on the very first
  block. The accumulators ``m_i``, ``l_i``, ``acc_o`` are created in float32; the scores come out
  of ``einsum("hd,vhd->hv", q_b, k_block)`` in bf16; ``m_new = max(m_i (fp32), m_block (bf16))``
  promotes to fp32, so ``p_block = exp(scores - m_new)`` is fp32; then
  ``einsum("hv,vhd->hd", p_block, v_block)`` multiplies an fp32 tensor by a bf16 one, and einsum
  does not promote: a ``RuntimeError``. Its wording depends on the device and on the shapes einsum
  lowers to: on torch 2.13 CPU ``expected m1 and m2 to have the same dtype, but got: float !=
  c10::BFloat16`` (the GQA case of lesson 4) or ``expected scalar type Float but found BFloat16``;
  on an H200 (torch 2.11, CUDA) ``expected scalar type Float but found BFloat16``; ``Half`` for fp16. So the seed's own simulation (bf16 on CUDA) can never reach its ``print(... "(Success)")``.

The smaller defects, which do not stop it:

* ``acc_o / (l_i + 1e-8)``: for a sequence with tokens ``l_i >= 1`` (the max term contributes
  ``exp(0) = 1``) and ``1 + 1e-8`` rounds to ``1`` in fp32, so the fudge changes nothing; it only
  turns an empty sequence (``seq_lens = 0``) into a silent zero output instead of an error.
* ``repeat_interleave`` copies every K/V block ``num_heads_q // num_heads_kv`` times for GQA,
  where viewing ``q`` as ``(num_kv_heads, group, head_dim)`` needs no copy.
* ``.item()`` per request and per block: one device-to-host sync per block on a GPU.
* ``block_size`` is a separate argument that nothing checks against ``k_cache.shape[1]``.
* the tail of the last block is handled by slicing ``k_block[:valid_tokens]`` -- correct (it is
  the mask ``M_b`` of the equations, applied by shortening the block), but a data-dependent shape.

:func:`paged_attention_decode_step_fixed` is the smallest fix: upcast ``q``, K and V to float32
where they are read, so every operand of both einsums is fp32; cast back at the end (the seed
already does). Its diff against the seed's code is three lines.
"""

from __future__ import annotations

import math

import torch

__all__ = ["paged_attention_decode_step", "paged_attention_decode_step_fixed"]


def paged_attention_decode_step(
    q: torch.Tensor,                # [B, H_q, D] (Single decode query token)
    k_cache: torch.Tensor,          # [Total_Blocks, Block_Size, H_kv, D]
    v_cache: torch.Tensor,          # [Total_Blocks, Block_Size, H_kv, D]
    block_tables: torch.Tensor,     # [B, Max_Blocks_Per_Seq] (Physical block IDs)
    seq_lens: torch.Tensor,         # [B] (Current sequence length per request)
    block_size: int = 16,
) -> torch.Tensor:
    """Executes non-contiguous paged attention across requests via online softmax."""
    batch_size, num_heads_q, head_dim = q.shape
    num_heads_kv = k_cache.shape[2]
    num_queries_per_kv = num_heads_q // num_heads_kv # Grouped-Query Attention ratio
    scale = 1.0 / math.sqrt(head_dim)

    outputs = torch.zeros_like(q)

    for b in range(batch_size):
        cur_len = seq_lens[b].item()
        num_blocks = math.ceil(cur_len / block_size)
        q_b = q[b] # [H_q, D]

        # Initialize online softmax accumulators per head
        m_i = torch.full((num_heads_q, 1), float("-inf"), device=q.device, dtype=torch.float32)
        l_i = torch.zeros((num_heads_q, 1), device=q.device, dtype=torch.float32)
        acc_o = torch.zeros((num_heads_q, head_dim), device=q.device, dtype=torch.float32)

        for block_idx in range(num_blocks):
            phys_block_id = block_tables[b, block_idx].item()
            k_block = k_cache[phys_block_id] # [Block_Size, H_kv, D]
            v_block = v_cache[phys_block_id] # [Block_Size, H_kv, D]

            # Expand KV heads for GQA if necessary
            if num_queries_per_kv > 1:
                k_block = k_block.repeat_interleave(num_queries_per_kv, dim=1)
                v_block = v_block.repeat_interleave(num_queries_per_kv, dim=1)

            # Compute valid tokens in block
            valid_tokens = min(block_size, cur_len - block_idx * block_size)
            k_block = k_block[:valid_tokens] # [Valid, H_q, D]
            v_block = v_block[:valid_tokens] # [Valid, H_q, D]

            # Block attention scores: [H_q, Valid]
            scores = torch.einsum("hd,vhd->hv", q_b, k_block) * scale

            # Online Softmax Update
            m_block = torch.max(scores, dim=-1, keepdim=True).values
            m_new = torch.maximum(m_i, m_block)
            
            p_block = torch.exp(scores - m_new)
            alpha = torch.exp(m_i - m_new)

            l_i = l_i * alpha + torch.sum(p_block, dim=-1, keepdim=True)
            acc_o = acc_o * alpha + torch.einsum("hv,vhd->hd", p_block, v_block)
            m_i = m_new

        outputs[b] = (acc_o / (l_i + 1e-8)).to(q.dtype)

    return outputs


def paged_attention_decode_step_fixed(
    q: torch.Tensor,                # [B, H_q, D] (Single decode query token)
    k_cache: torch.Tensor,          # [Total_Blocks, Block_Size, H_kv, D]
    v_cache: torch.Tensor,          # [Total_Blocks, Block_Size, H_kv, D]
    block_tables: torch.Tensor,     # [B, Max_Blocks_Per_Seq] (Physical block IDs)
    seq_lens: torch.Tensor,         # [B] (Current sequence length per request)
    block_size: int = 16,
) -> torch.Tensor:
    """Executes non-contiguous paged attention across requests via online softmax."""
    batch_size, num_heads_q, head_dim = q.shape
    num_heads_kv = k_cache.shape[2]
    num_queries_per_kv = num_heads_q // num_heads_kv # Grouped-Query Attention ratio
    scale = 1.0 / math.sqrt(head_dim)

    outputs = torch.zeros_like(q)

    for b in range(batch_size):
        cur_len = seq_lens[b].item()
        num_blocks = math.ceil(cur_len / block_size)
        q_b = q[b].float() # [H_q, D]

        # Initialize online softmax accumulators per head
        m_i = torch.full((num_heads_q, 1), float("-inf"), device=q.device, dtype=torch.float32)
        l_i = torch.zeros((num_heads_q, 1), device=q.device, dtype=torch.float32)
        acc_o = torch.zeros((num_heads_q, head_dim), device=q.device, dtype=torch.float32)

        for block_idx in range(num_blocks):
            phys_block_id = block_tables[b, block_idx].item()
            k_block = k_cache[phys_block_id].float() # [Block_Size, H_kv, D]
            v_block = v_cache[phys_block_id].float() # [Block_Size, H_kv, D]

            # Expand KV heads for GQA if necessary
            if num_queries_per_kv > 1:
                k_block = k_block.repeat_interleave(num_queries_per_kv, dim=1)
                v_block = v_block.repeat_interleave(num_queries_per_kv, dim=1)

            # Compute valid tokens in block
            valid_tokens = min(block_size, cur_len - block_idx * block_size)
            k_block = k_block[:valid_tokens] # [Valid, H_q, D]
            v_block = v_block[:valid_tokens] # [Valid, H_q, D]

            # Block attention scores: [H_q, Valid]
            scores = torch.einsum("hd,vhd->hv", q_b, k_block) * scale

            # Online Softmax Update
            m_block = torch.max(scores, dim=-1, keepdim=True).values
            m_new = torch.maximum(m_i, m_block)
            
            p_block = torch.exp(scores - m_new)
            alpha = torch.exp(m_i - m_new)

            l_i = l_i * alpha + torch.sum(p_block, dim=-1, keepdim=True)
            acc_o = acc_o * alpha + torch.einsum("hv,vhd->hd", p_block, v_block)
            m_i = m_new

        outputs[b] = (acc_o / (l_i + 1e-8)).to(q.dtype)

    return outputs

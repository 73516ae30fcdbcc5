"""Paged attention in plain PyTorch: the seed's loop, made correct, and the vectorised oracle.

What you will learn
-------------------
* how a block table turns a sequence's logical token ``t`` into a physical place
  ``(B(t // B), t mod B)`` in ``k_cache``/``v_cache`` of shape
  ``(num_blocks, block_size, num_kv_heads, head_dim)``;
* the online softmax of the seed's equations, block by block, with the running max ``m``,
  the running normaliser ``l`` and the unnormalised output ``o``:

  ``S_b = q K_B(b)^T * scale + M_b``,   ``m_new = max(m, max_j S_b)``,
  ``P_b = exp(S_b - m_new)``,   ``l = l exp(m - m_new) + sum_j P_b``,
  ``o = o exp(m - m_new) + P_b V_B(b)``,   and at the end ``O = o / l``;

* why the vectorised version (gather every block, mask the tail, one softmax) computes the same
  thing -- it is the oracle that the loop and the Triton kernel are tested against.

These functions assume valid inputs; :mod:`paged_edu.kernels` validates before calling them.

The seed's version (kept as written in :mod:`paged_edu.labs.seed_kernel`, which lesson 4 runs)
differs in these ways. It keeps ``m``, ``l`` and ``o`` in float32 but multiplies the fp32 ``P_b``
by K/V in their own dtype in one einsum, which does not promote: on bf16 or fp16 inputs -- its own
simulation uses bf16 -- it raises ``RuntimeError`` (a dtype mismatch) on the first block, so it
only ever runs in fp32. Here q, K and V are upcast where they are read. Its
``acc / (l + 1e-8)`` changes nothing for a real sequence (``l >= 1`` always holds because the max
term contributes ``exp(0) = 1``, and ``1 + 1e-8`` rounds to ``1`` in fp32); it only turns an empty
sequence into a silent zero output -- here ``o / l``, and empty sequences are rejected by the
input checks. It handles the tail of the last block by slicing it off (``k_block[:valid]``),
which is correct; here the mask ``M_b`` is explicit, as in the equations and in the kernels. Its
``repeat_interleave`` copies every K/V block ``group`` times for GQA, where a view of ``q`` as
``(num_kv_heads, group, head_dim)`` needs no copy. And it calls ``.item()`` per block (one
device-to-host sync per block on a GPU); here the table is copied to the host once.
"""

from __future__ import annotations

import torch

__all__ = ["paged_attention_loop", "paged_attention_torch", "paged_prefill_reference", "gather_kv"]


# ----------------------------------------------------------------------------------------------
# The teaching baseline: per request, per block, online softmax (the seed's Step 2, corrected)
# ----------------------------------------------------------------------------------------------


def paged_attention_loop(
    q: torch.Tensor,  # (num_seqs, num_q_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # int32 (num_seqs, max_blocks)
    seq_lens: torch.Tensor,  # int32 (num_seqs,)
    *,
    scale: float,
) -> torch.Tensor:  # (num_seqs, num_q_heads, head_dim)
    num_seqs, num_q_heads, head_dim = q.shape
    B, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads  # query heads per KV head (GQA ratio)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lens = seq_lens.tolist()  # one host copy, not one .item() per block
    tables = block_tables.tolist()

    for i in range(num_seqs):
        s = lens[i]
        # Query head h = kv * group + g reads KV head kv: a view, no copy of K/V.
        q_i = q[i].float().reshape(num_kv_heads, group, head_dim) * scale  # (H_kv, G, D)
        m = torch.full((num_kv_heads, group, 1), float("-inf"), device=q.device)  # running max
        l = torch.zeros((num_kv_heads, group, 1), device=q.device)  # running normaliser
        o = torch.zeros((num_kv_heads, group, head_dim), device=q.device)  # unnormalised output

        for b in range(-(-s // B)):  # logical blocks 0 .. ceil(s/B) - 1
            block_id = tables[i][b]  # B(b): the physical block
            k_blk = k_cache[block_id].float()  # (B, H_kv, D)
            v_blk = v_cache[block_id].float()  # (B, H_kv, D)
            S = torch.einsum("kgd,tkd->kgt", q_i, k_blk)  # (H_kv, G, B)
            # M_b: slots past the sequence's end (only in its last block) get -inf.
            valid = torch.arange(B, device=q.device) < s - b * B  # (B,)
            S = S.masked_fill(~valid, float("-inf"))
            v_blk = v_blk.masked_fill(~valid[:, None, None], 0.0)  # stale slots may hold NaN: 0 * NaN = NaN

            m_new = torch.maximum(m, S.amax(dim=-1, keepdim=True))  # (H_kv, G, 1)
            P = torch.exp(S - m_new)  # (H_kv, G, B); masked slots give exp(-inf) = 0
            alpha = torch.exp(m - m_new)  # rescales what came before; exp(-inf) = 0 at b = 0
            l = l * alpha + P.sum(dim=-1, keepdim=True)
            o = o * alpha + torch.einsum("kgt,tkd->kgd", P, v_blk)
            m = m_new

        out[i] = (o / l).reshape(num_q_heads, head_dim).to(q.dtype)  # l >= 1: no fudge needed
    return out


# ----------------------------------------------------------------------------------------------
# The oracle: gather every block of every sequence, mask, one softmax
# ----------------------------------------------------------------------------------------------


def gather_kv(
    cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # int32 (num_seqs, max_blocks)
    seq_lens: torch.Tensor,  # int32 (num_seqs,)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence's tokens side by side: ``(num_seqs, max_blocks * B, H_kv, D)`` and a mask.

    Table entries past a sequence's last block may be garbage (-1, out of range): they are
    replaced by block 0 before indexing, and the mask ``(num_seqs, max_blocks * B)`` hides them.
    """
    num_seqs, max_blocks = block_tables.shape
    B = cache.shape[1]
    num_used = (seq_lens.long() + B - 1) // B  # (num_seqs,) blocks actually in use
    col = torch.arange(max_blocks, device=block_tables.device)  # (max_blocks,)
    safe = torch.where(col[None, :] < num_used[:, None], block_tables.long(), 0)  # (num_seqs, max_blocks)
    kv = cache[safe]  # (num_seqs, max_blocks, B, H_kv, D)
    kv = kv.reshape(num_seqs, max_blocks * B, *cache.shape[2:])  # (num_seqs, L, H_kv, D)
    pos = torch.arange(max_blocks * B, device=cache.device)  # (L,)
    mask = pos[None, :] < seq_lens.long().to(cache.device)[:, None]  # (num_seqs, L)
    return kv, mask


def paged_attention_torch(
    q: torch.Tensor,  # (num_seqs, num_q_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # int32 (num_seqs, max_blocks)
    seq_lens: torch.Tensor,  # int32 (num_seqs,)
    *,
    scale: float,
) -> torch.Tensor:  # (num_seqs, num_q_heads, head_dim)
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    k, mask = gather_kv(k_cache, block_tables, seq_lens)  # (N, L, H_kv, D), (N, L)
    v, _ = gather_kv(v_cache, block_tables, seq_lens)  # (N, L, H_kv, D)
    q4 = q.float().reshape(num_seqs, num_kv_heads, group, head_dim)  # (N, H_kv, G, D)
    S = torch.einsum("nkgd,nlkd->nkgl", q4, k.float()) * scale  # (N, H_kv, G, L)
    S = S.masked_fill(~mask[:, None, None, :], float("-inf"))
    P = torch.softmax(S, dim=-1)  # every row has >= 1 valid slot (s >= 1): no NaN
    v = v.float().masked_fill(~mask[:, :, None, None], 0.0)  # stale slots may hold NaN: 0 * NaN = NaN
    o = torch.einsum("nkgl,nlkd->nkgd", P, v)  # (N, H_kv, G, D)
    return o.reshape(num_seqs, num_q_heads, head_dim).to(q.dtype)


# ----------------------------------------------------------------------------------------------
# Prefill / extend: new tokens attend causally to the cached prefix and to each other
# ----------------------------------------------------------------------------------------------


def paged_prefill_reference(
    q: torch.Tensor,  # (num_q_tokens, num_q_heads, head_dim), sequences packed
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim), new tokens already stored
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # int32 (num_seqs, max_blocks)
    seq_lens: torch.Tensor,  # int32 (num_seqs,): cached prefix + new tokens
    cu_seqlens_q: torch.Tensor,  # int32 (num_seqs + 1,)
    *,
    scale: float,
    out: torch.Tensor | None = None,  # (num_q_tokens, num_q_heads, head_dim): rows cu[0]..cu[-1] written
) -> torch.Tensor:  # (num_q_tokens, num_q_heads, head_dim)
    """Query ``j`` of sequence ``i`` sits at ``p = s_i - q_len_i + j`` and sees positions ``0..p``."""
    num_q_tokens, num_q_heads, head_dim = q.shape
    B, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    for i, s in enumerate(lens):
        start, end = cu[i], cu[i + 1]
        q_len = end - start
        if q_len == 0:  # a padding chunk (the engine's CUDA graphs)
            continue
        blocks = block_tables[i, : -(-s // B)].long()  # (ceil(s/B),) only the blocks in use
        k = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:s].float()  # (s, H_kv, D)
        v = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:s].float()  # (s, H_kv, D)
        q_i = q[start:end].float().reshape(q_len, num_kv_heads, group, head_dim)  # (q_len, H_kv, G, D)
        S = torch.einsum("qkgd,tkd->kgqt", q_i, k) * scale  # (H_kv, G, q_len, s)
        pos_q = s - q_len + torch.arange(q_len, device=q.device)  # (q_len,)
        causal = torch.arange(s, device=q.device)[None, :] <= pos_q[:, None]  # (q_len, s)
        S = S.masked_fill(~causal, float("-inf"))
        P = torch.softmax(S, dim=-1)
        o = torch.einsum("kgqt,tkd->qkgd", P, v)  # (q_len, H_kv, G, D)
        out[start:end] = o.reshape(q_len, num_q_heads, head_dim).to(q.dtype)
    return out

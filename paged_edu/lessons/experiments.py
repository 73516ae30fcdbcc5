"""Experiments that run the library on real tensors for the lessons.

Each function takes library objects, computes on real K/V and returns plain numbers a lesson shows;
the allocators they drive stay free of torch (they live in :mod:`paged_edu.core`).
"""

from __future__ import annotations

from paged_edu.core.seed_allocator import SeedAllocator


def prefix_reuse_experiment(allocator, prompts: dict, layer, *, device="cpu", dtype=None) -> dict:
    """Prefill ``prompts`` (``seq_id -> token ids``) through ``allocator`` into a real paged KV
    cache, the way an engine does -- tokens in blocks that came from the prefix cache are *not*
    computed again -- then decode one step of attention for every request with the paged kernel.

    ``layer`` is a :class:`~paged_edu.lessons.toy_kv.ToyLayer` (its K/V depend on the prefix). Returns, per
    request, its block table, which blocks were reused, and ``max_abs_diff``: the largest difference
    between the paged attention output and attention over the request's own, freshly computed K/V.
    Works with :class:`SeedAllocator` (the wrong way) and :class:`~paged_edu.core.allocator.BlockAllocator`.
    """
    import torch

    from paged_edu.kernels import paged_attention_decode
    from paged_edu.cache.kv_cache import PagedKVCache

    dtype = torch.float32 if dtype is None else dtype
    B = allocator.block_size
    cache = PagedKVCache(1, allocator.num_blocks, B, layer.num_kv_heads, layer.head_dim, dtype=dtype, device=device)
    k_cache, v_cache = cache.k_caches[0], cache.v_caches[0]  # (num_blocks, B, H_kv, D)
    results = {}
    for seq_id, tokens in prompts.items():
        table = allocator.allocate(seq_id, tokens)
        if isinstance(allocator, SeedAllocator):
            reused = allocator.hit_blocks[seq_id]
        else:  # ours: the leading num_cached_tokens came from the cache
            reused = [i * B < allocator.num_cached_tokens(seq_id) for i in range(len(table))]
        k, v = layer.kv(tokens, device=device, dtype=dtype)  # (n, H_kv, D) each
        slots = [-1 if reused[t // B] else table[t // B] * B + t % B for t in range(len(tokens))]
        cache.store(0, k, v, torch.tensor(slots, device=device))
        results[seq_id] = {"block_table": table, "reused_blocks": [b for b, r in zip(table, reused) if r]}
    group = layer.num_q_heads // layer.num_kv_heads
    for seq_id, tokens in prompts.items():
        q = layer.query(tokens, device=device, dtype=dtype)  # (H_q, D)
        table = torch.tensor([results[seq_id]["block_table"]], dtype=torch.int32, device=device)
        seq_lens = torch.tensor([len(tokens)], dtype=torch.int32, device=device)
        out = paged_attention_decode(q[None], k_cache, v_cache, table, seq_lens)[0]  # (H_q, D)
        k, v = layer.kv(tokens, device=device, dtype=torch.float32)  # the truth, (n, H_kv, D)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (n, H_q, D)
        scores = torch.einsum("hd,thd->ht", q.float(), k) / layer.head_dim ** 0.5  # (H_q, n)
        truth = torch.einsum("ht,thd->hd", scores.softmax(-1), v)  # (H_q, D)
        results[seq_id]["max_abs_diff"] = (out.float() - truth).abs().max().item()
    return results

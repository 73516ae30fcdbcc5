"""Experiments that run the library on real tensors (and the simulator's models) for lessons 1-3.

Each function takes stated inputs, computes on real K/V or with the library's own models, and
returns plain numbers (and small tensors for heat-maps) that a lesson prints; nothing here is
hard-coded. The allocators they drive stay free of torch (:mod:`paged_edu.core`).

* lesson 1: :func:`measure_cache_memory` (a preset's cache allocated on the device, bytes counted
  three ways), :func:`contiguous_idle_share` (the baseline's idle share on a workload);
* lesson 2: :func:`address_check` (the seed's address formula *as written* and the corrected one,
  both run against the real cache), :func:`decode_throughput` (what a bigger batch buys);
* lesson 3: :func:`cow_experiment` (K values around one copy-on-write) and
  :func:`shared_prefix_blocks` (memory of a shared prefix: seed's formula, block-rounded formula,
  allocator); the seed allocator's defects on tensors are in :mod:`paged_edu.labs.seed_defects`.
"""

from __future__ import annotations

import math

import torch

from paged_edu.cache.kv_cache import PagedKVCache
from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.hardware import ModelGeometry
from paged_edu.core.memory import kv_bytes

__all__ = [
    "TORCH_DTYPES",
    "address_check",
    "contiguous_idle_share",
    "cow_experiment",
    "decode_throughput",
    "measure_cache_memory",
    "shared_prefix_blocks",
]

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# -- lesson 1 -------------------------------------------------------------------------------------
def measure_cache_memory(spec: ModelGeometry, num_tokens: int, *, block_size: int = 16, device="cpu") -> dict:
    """Allocate the paged cache of ``spec`` for ``num_tokens`` (rounded up to blocks) on ``device``
    and count its bytes: the formula ``M_KV``, ``sum(numel * element_size)`` over the tensors, and
    on a GPU the drop in ``torch.cuda.mem_get_info()``'s free bytes and in
    ``torch.cuda.memory_allocated()``. The cache is released before returning."""
    if spec.is_mla:
        raise ValueError(f"{spec.name} stores an MLA latent, not K and V; pick a K/V preset")
    device = torch.device(device)
    num_blocks = math.ceil(num_tokens / block_size)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        free_before, total = torch.cuda.mem_get_info(device)
        allocated_before = torch.cuda.memory_allocated(device)
    cache = PagedKVCache(
        spec.num_layers,
        num_blocks,
        block_size,
        spec.num_kv_heads,
        spec.head_dim,
        dtype=TORCH_DTYPES[spec.kv_dtype],
        device=device,
    )
    tensors = cache.k_caches + cache.v_caches
    result = {
        "num_tokens": num_blocks * block_size,
        "num_blocks": num_blocks,
        "num_tensors": len(tensors),
        "shape": tuple(tensors[0].shape),
        "m_kv": kv_bytes(spec, num_blocks * block_size),
        "numel_bytes": sum(t.numel() * t.element_size() for t in tensors),
        "device": str(cache.device),
        "mem_get_info_drop": None,
        "memory_allocated_drop": None,
        "gpu_total_bytes": None,
    }
    if cuda:
        torch.cuda.synchronize(device)
        free_after, _ = torch.cuda.mem_get_info(device)
        result.update(
            mem_get_info_drop=free_before - free_after,
            gpu_total_bytes=total,
            memory_allocated_drop=torch.cuda.memory_allocated(device) - allocated_before,
        )
    del cache, tensors
    if cuda:
        torch.cuda.empty_cache()
    return result


def contiguous_idle_share(requests, max_seq_len: int) -> dict:
    """The contiguous baseline's idle share for ``requests`` (``prompt_len``/``output_len`` records,
    e.g. :func:`paged_edu.sim.workloads.sharegpt`), each reserving ``max_seq_len`` slots.

    ``at_finish``: reserved slots without a token when every request has reached its final length,
    ``1 - sum(s) / (N * L_max)``. ``over_lifetime``: the same averaged over every decode step of every
    request (a request holds ``prompt + k`` tokens at its ``k``-th step), which is what the server
    really wastes while requests run. Both depend only on the lengths and ``L_max``.
    """
    if max_seq_len < max(r.total_len for r in requests):
        raise ValueError(f"max_seq_len={max_seq_len} is shorter than the longest request")
    held = sum(r.total_len for r in requests)
    # sum over steps k = 0 .. output-1 of (prompt + k + 1) tokens, against output * L_max reserved
    step_tokens = sum(r.output_len * r.prompt_len + r.output_len * (r.output_len + 1) // 2 for r in requests)
    steps = sum(r.output_len for r in requests)
    return {
        "num_requests": len(requests),
        "max_seq_len": max_seq_len,
        "mean_len": held / len(requests),
        "at_finish": 1 - held / (len(requests) * max_seq_len),
        "over_lifetime": 1 - step_tokens / (steps * max_seq_len),
    }


# -- lesson 2 -------------------------------------------------------------------------------------
def _landing(cache: PagedKVCache, k: torch.Tensor, block_table, address: int) -> dict:
    """Which element of ``k`` (``(num_blocks, B, H_kv, D)``) a byte ``address`` points at."""
    size = k.element_size()
    offset = address - k.data_ptr()
    element, misaligned = divmod(offset, size)
    B, H, D = cache.block_size, cache.num_kv_heads, cache.head_dim
    block, rest = divmod(element, B * H * D)
    slot, rest = divmod(rest, H * D)
    head, dim = divmod(rest, D)
    logical = block_table.index(block) * B + slot if block in block_table else None
    return {
        "byte_offset": offset,
        "misaligned_bytes": misaligned,
        "block": block,
        "slot_in_block": slot,
        "token": logical,
        "head": head,
        "dim": dim,
        "read": k.reshape(-1)[element : element + D].clone(),
    }


def address_check(
    cache: PagedKVCache, block_table: list[int], t: int, expected_k: torch.Tensor, kv_head: int = 0, layer: int = 0
) -> dict:
    """The address of token ``t``'s key for ``kv_head``, three ways, each read back from the cache.

    * the strides from the symbols, ``S_token = H_kv d_head sizeof`` and ``S_block = B S_token``
      (``S_head = d_head sizeof``), compared with the tensor's real strides;
    * the seed's formula *as written*, ``BasePtr + B(t//B) S_block + (t mod B) d_head``: ``S_block``
      in bytes but the offset in elements of one head;
    * the corrected formula ``BasePtr + B(t//B) S_block + (t mod B) S_token + h S_head``.

    For each formula: which block, slot (and the sequence's token), head and dimension it lands on,
    and whether the ``d_head`` values read there equal ``expected_k[t, kv_head]``.
    """
    k = cache.k_caches[layer]  # (num_blocks, B, H_kv, D)
    B, H, D, size = cache.block_size, cache.num_kv_heads, cache.head_dim, k.element_size()
    symbols = {"S_token": H * D * size, "S_block": B * H * D * size, "S_head": D * size}
    strides = cache.strides_bytes()
    i, j = divmod(t, B)
    block = block_table[i]
    base = k.data_ptr()
    seed = base + block * symbols["S_block"] + j * D
    right = base + block * symbols["S_block"] + j * symbols["S_token"] + kv_head * symbols["S_head"]
    truth = expected_k[t, kv_head].to(k.dtype)
    out = {
        "t": t,
        "i": i,
        "j": j,
        "block": block,
        "kv_head": kv_head,
        "base": base,
        "sizeof": size,
        "num_kv_heads": H,
        "head_dim": D,
        "symbols": symbols,
        "strides": strides,
        "strides_match": all(symbols[n] == strides[n] for n in symbols),
        "seed_address": seed,
        "right_address": right,
        "right_is_data_ptr": right == k[block, j, kv_head].data_ptr(),
    }
    for name, address in (("seed", seed), ("right", right)):
        land = _landing(cache, k, block_table, address)
        land["k_matches"] = land["misaligned_bytes"] == 0 and bool(torch.equal(land.pop("read"), truth))
        out[name] = land
    return out


def decode_throughput(model, gpu, batches, context: int) -> list[dict]:
    """The simulator's roofline (:class:`paged_edu.sim.costmodel.CostModel`) for pure decode steps
    of ``batch`` sequences holding ``context`` tokens each: step time, tokens/s, and the share of
    the bytes a step moves that are K/V reads (the rest are the weights, read once per step)."""
    from paged_edu.sim.costmodel import CostModel, StepShape

    cost = CostModel(model=model, gpu=gpu)
    rows = []
    for batch in batches:
        shape = StepShape()
        for _ in range(batch):
            shape.add(context, 1, True)
        step = cost.step_time(shape)
        moved = cost.bytes_moved(shape)
        rows.append(
            {
                "batch": batch,
                "step_s": step,
                "tokens_per_s": batch / step,
                "kv_share": 1 - model.matmul_weight_bytes / moved,
            }
        )
    return rows


# -- lesson 3 -------------------------------------------------------------------------------------
def cow_experiment(kv, parent_tokens: list[int], new_token: int, *, kv_head: int = 0, dims: int = 16) -> dict:
    """Fork ``parent`` in ``kv.allocator``, append ``new_token`` to the child (a copy-on-write when the
    last block is partly filled), apply the copy on the device and store the child's K/V.

    Returns the K values of the shared block (``src``) and of its copy (``dst``) -- slots x the
    first ``dims`` dimensions of ``kv_head`` -- before the copy, right after it, and after the
    child's write, the bytes the copy moved (K and V of one block, every layer of ``kv.cache``) and
    the checks: the copy equals the source, the source is untouched, each sequence reads its own K/V.
    """
    a = kv.allocator
    a.allocate("parent", parent_tokens)
    kv.write_prompt("parent", parent_tokens)
    a.fork("parent", "child")
    kv.fork("parent", "child")
    a.append_slots("child")
    copies = a.take_copies()
    if len(copies) != 1:
        raise ValueError(f"expected one copy-on-write, got {copies}: the parent's last block must be partly filled")
    src, dst = copies[0]

    def k_of(block):  # (B, dims) on the CPU, fp32
        return kv.k_cache[block, :, kv_head, :dims].float().cpu().clone()

    stages = {"before copy": (k_of(src), k_of(dst))}
    check = kv.copy_block(src, dst)
    stages["after copy"] = (k_of(src), k_of(dst))
    kv.write_last("child", new_token)
    a.mark_computed("child", a.num_tokens("child"), [new_token])
    stages["after the child's write"] = (k_of(src), k_of(dst))
    cache = kv.cache
    copied = 2 * cache.num_layers * cache.block_size * cache.num_kv_heads * cache.head_dim * kv.k_cache.element_size()
    return {
        "src": src,
        "dst": dst,
        "stages": stages,
        "bytes_copied": copied,
        "block_bytes": cache.block_bytes,
        "copy_equal": check["copy_equal"],
        "source_untouched": kv.block_unchanged(check),
        "slot_written": a.slot("child", a.num_tokens("child") - 1) % cache.block_size,
        "reads_back": {s: kv.reads_back(s) for s in ("parent", "child")},
        "tables": {s: a.block_table(s) for s in ("parent", "child")},
    }


def shared_prefix_blocks(prefix_len: int, gen_lens: list[int], block_size: int) -> dict:
    """Blocks held by requests that share a ``prefix_len``-token prompt head and add ``gen_lens[k]``
    private tokens each: the allocator's count, the block-rounded formula, and the seed's.

    With blocks, only the ``floor(L_prefix / B)`` *full* prefix blocks can be shared; the partial last
    prefix block also holds private tokens, so each request owns ``ceil((L_prefix + L_k)/B) -
    floor(L_prefix/B)`` blocks. The seed's ``M_KV(L_prefix) + sum_k M_KV(L_k)`` counts the prefix once
    and each request's own tokens, right only when ``L_prefix mod B == 0``.
    """
    B = block_size
    shared = prefix_len // B
    rounded = shared + sum(math.ceil((prefix_len + g) / B) - shared for g in gen_lens)
    seed_tokens = prefix_len + sum(gen_lens)
    need = sum(math.ceil((prefix_len + g) / B) for g in gen_lens)
    allocator = BlockAllocator(max(1, need), B)
    prefix = list(range(1, prefix_len + 1))
    for k, g in enumerate(gen_lens):
        allocator.allocate(k, prefix + [10_000 + 1_000 * k + j for j in range(g)])
    return {
        "allocator": allocator.num_used_blocks,
        "block_rounded": rounded,
        "seed_tokens": seed_tokens,
        "seed_blocks": math.ceil(seed_tokens / B),
        "seed_blocks_per_term": math.ceil(prefix_len / B) + sum(math.ceil(g / B) for g in gen_lens),
    }

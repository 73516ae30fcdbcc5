"""The seed allocator's four defects, each run on real K/V tensors next to the correct allocator.

A tiny prefill/decode loop (:class:`TensorRun`) drives either allocator the way an engine does --
tokens in blocks the prefix cache says it holds are *not* computed again; an append writes the new
token's K/V at the slot the allocator returns, after any copy-on-write it queued -- into a real
one-layer :class:`~paged_edu.cache.kv_cache.PagedKVCache`, then measures each request's paged
attention output against attention over its own, freshly computed K/V (``max_abs_diff``).

1. :func:`prefix_reuse_experiment` -- the position-blind per-block hash serves another prefix's K/V;
2. :func:`stale_entry_experiment` -- a hash left behind by ``free`` hits a block since overwritten;
3. :func:`no_rollback_experiment` -- a prompt that fails half-way keeps the blocks it took;
4. :func:`no_copy_on_write_experiment` -- an append into a shared, partly filled block rewrites
   the other request's K/V.
"""

from __future__ import annotations

import torch

from paged_edu.cache.kv_cache import PagedKVCache
from paged_edu.core.block_pool import OutOfBlocksError
from paged_edu.labs.seed_allocator import SeedAllocator

__all__ = [
    "TensorRun",
    "no_copy_on_write_experiment",
    "no_rollback_experiment",
    "prefix_reuse_experiment",
    "stale_entry_experiment",
]


class TensorRun:
    """Prefill and decode through ``allocator`` into one layer of real K/V (``layer``: a ToyLayer)."""

    def __init__(self, allocator, layer, *, device="cpu", dtype=None) -> None:
        self.allocator, self.layer = allocator, layer
        self.device, self.dtype = torch.device(device), torch.float32 if dtype is None else dtype
        self.seed = isinstance(allocator, SeedAllocator)
        B = allocator.block_size
        self.cache = PagedKVCache(
            1, allocator.num_blocks, B, layer.num_kv_heads, layer.head_dim, dtype=self.dtype, device=self.device
        )
        self.tokens: dict = {}

    def table(self, seq_id) -> list[int]:
        return self.allocator.block_table(seq_id)

    def _store(self, seq_id, positions: list[int]) -> None:
        B, table = self.allocator.block_size, self.table(seq_id)
        k, v = self.layer.kv(self.tokens[seq_id], device=self.device, dtype=self.dtype)  # (n, H_kv, D)
        slots = torch.tensor([table[t // B] * B + t % B for t in positions], dtype=torch.int64, device=self.device)
        idx = torch.tensor(positions, dtype=torch.int64, device=self.device)
        self.cache.store(0, k[idx].contiguous(), v[idx].contiguous(), slots)

    def prefill(self, seq_id, tokens: list[int]) -> list[int]:
        """Allocate and store the K/V of every token whose block did not come from the cache;
        return the blocks that did."""
        table = self.allocator.allocate(seq_id, tokens)
        self.tokens[seq_id] = list(tokens)
        B = self.allocator.block_size
        if self.seed:
            reused = self.allocator.hit_blocks[seq_id]
        else:  # ours: the leading num_cached_tokens came from the cache
            reused = [i * B < self.allocator.num_cached_tokens(seq_id) for i in range(len(table))]
        self._store(seq_id, [t for t in range(len(tokens)) if not reused[t // B]])
        return [b for b, r in zip(table, reused) if r]

    def append(self, seq_id, token: int) -> None:
        """One decode step's write: the new token's K/V at the slot the allocator gives it."""
        n = len(self.tokens[seq_id])
        if self.seed:
            self.allocator.append_token_slot(seq_id, n)  # DEFECT 4: never copies a shared block
        else:
            self.allocator.append_slots(seq_id)  # the slot, by count
            self.cache.copy_blocks(self.allocator.take_copies())  # copy-on-write first, then write
        self.tokens[seq_id].append(token)
        self._store(seq_id, [n])
        if not self.seed:  # its K/V is written: the allocator learns its id (and may publish its block)
            self.allocator.mark_computed(seq_id, n + 1, [token])

    def fork(self, parent, child) -> None:
        """Parallel sampling's fork. The seed has no fork method; with its data structures a fork
        is the parent's table shared, every ref count + 1 (what its ref counts are there for)."""
        if self.seed:
            self.allocator.block_tables[child] = list(self.allocator.block_tables[parent])
            for block in self.allocator.block_tables[child]:
                self.allocator.ref_counts[block] += 1
        else:
            self.allocator.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])

    def free(self, seq_id) -> None:
        self.allocator.free(seq_id)
        del self.tokens[seq_id]

    def stored_k(self, seq_id, t: int) -> torch.Tensor:
        """``K[t]`` as the cache holds it for ``seq_id``: ``(H_kv, D)``."""
        B = self.allocator.block_size
        return self.cache.k_caches[0][self.table(seq_id)[t // B], t % B].clone()

    def attention_error(self, seq_id) -> float:
        """max |paged decode attention - attention over the sequence's own K/V| for its last token."""
        from paged_edu.kernels import paged_attention_decode

        tokens, layer = self.tokens[seq_id], self.layer
        q = layer.query(tokens, device=self.device, dtype=self.dtype)  # (H_q, D)
        table = torch.tensor([self.table(seq_id)], dtype=torch.int32, device=self.device)
        seq_lens = torch.tensor([len(tokens)], dtype=torch.int32, device=self.device)
        k_cache, v_cache = self.cache.k_caches[0], self.cache.v_caches[0]
        out = paged_attention_decode(q[None], k_cache, v_cache, table, seq_lens)[0]  # (H_q, D)
        group = layer.num_q_heads // layer.num_kv_heads
        k, v = layer.kv(tokens, device=self.device, dtype=torch.float32)  # the truth, (n, H_kv, D)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (n, H_q, D)
        scores = torch.einsum("hd,thd->ht", q.float(), k) / layer.head_dim**0.5  # (H_q, n)
        truth = torch.einsum("ht,thd->hd", scores.softmax(-1), v)  # (H_q, D)
        return (out.float() - truth).abs().max().item()


def prefix_reuse_experiment(allocator, prompts: dict, layer, *, device="cpu", dtype=None) -> dict:
    """Defect 1. Prefill ``prompts`` (``seq_id -> token ids``) in order, then decode attention for each:
    per request its block table, the blocks reused from the cache, and ``max_abs_diff``."""
    run = TensorRun(allocator, layer, device=device, dtype=dtype)
    results = {
        s: {"reused_blocks": run.prefill(s, tokens), "block_table": run.table(s)} for s, tokens in prompts.items()
    }
    for s in prompts:
        results[s]["max_abs_diff"] = run.attention_error(s)
    return results


def stale_entry_experiment(allocator, layer, *, device="cpu", dtype=None) -> dict:
    """Defect 2. ``A`` (6 tokens) is served and freed; ``D`` (12 tokens) is served -- with the seed it
    takes ``A``'s old first block and overwrites its K/V -- and freed; then ``E`` arrives with ``A``'s
    first block of tokens.

    Needs a pool of 4 blocks of 4. Returns the tables, the blocks ``E`` reused, whether ``D`` had
    written into them, and ``E``'s attention error."""
    if (allocator.num_blocks, allocator.block_size) != (4, 4):
        raise ValueError("the script is written for num_blocks=4, block_size=4")
    run = TensorRun(allocator, layer, device=device, dtype=dtype)
    run.prefill("A", [1, 2, 3, 4, 5, 6])
    a_table = run.table("A")
    run.free("A")
    run.prefill("D", list(range(100, 112)))
    d_table = run.table("D")
    run.free("D")
    reused = run.prefill("E", [1, 2, 3, 4, 7])
    return {
        "a_table": a_table,
        "d_table": d_table,
        "e_table": run.table("E"),
        "e_reused": reused,
        "reused_overwritten_by_d": [b in d_table for b in reused],
        "e_error": run.attention_error("E"),
    }


def no_rollback_experiment(allocator, layer, *, device="cpu", dtype=None) -> dict:
    """Defect 3. A prompt ``X`` needing 6 blocks is refused by a pool of 4; then ``Y`` (one block)
    asks. Returns the free blocks before and after the refusal, the error, and whether ``Y`` got in
    (and its attention error if it did)."""
    run = TensorRun(allocator, layer, device=device, dtype=dtype)
    B = allocator.block_size
    before = allocator.num_free_blocks
    try:
        run.prefill("X", list(range(1, 6 * B + 1)))
        error = None
    except (MemoryError, OutOfBlocksError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    after = allocator.num_free_blocks
    try:
        run.prefill("Y", list(range(500, 500 + B)))
        y = run.attention_error("Y")
    except (MemoryError, OutOfBlocksError) as exc:
        y = f"{type(exc).__name__}: {exc}"
    return {"free_before": before, "free_after": after, "leaked": before - after, "error": error, "y": y}


def no_copy_on_write_experiment(allocator, layer, *, device="cpu", dtype=None) -> dict:
    """Defect 4. ``parent`` (5 tokens, B = 4: its last block holds one) is forked; the child appends
    token 50, then the parent appends token 60 -- both at position 5.

    Returns whether the child's stored ``K[5]`` is its own right after its write and after the
    parent's, both tables, and each sequence's attention error at the end."""
    if allocator.block_size != 4:
        raise ValueError("the script is written for block_size=4")
    run = TensorRun(allocator, layer, device=device, dtype=dtype)
    run.prefill("parent", [1, 2, 3, 4, 5])
    run.fork("parent", "child")
    run.append("child", 50)
    own = layer.kv(run.tokens["child"], device=device, dtype=run.dtype)[0][5]  # the child's true K[5]
    after_own = bool(torch.equal(run.stored_k("child", 5), own))
    run.append("parent", 60)
    after_parent = bool(torch.equal(run.stored_k("child", 5), own))
    return {
        "tables": {s: run.table(s) for s in ("parent", "child")},
        "child_k5_after_its_write": after_own,
        "child_k5_after_parent_write": after_parent,
        "errors": {s: run.attention_error(s) for s in ("parent", "child")},
    }

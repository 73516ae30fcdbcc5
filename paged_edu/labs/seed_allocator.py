"""THE WRONG WAY: a small re-creation of the seed document's ``PagedBlockAllocator``.

Kept only so lesson 3 can *show* what goes wrong; never use it for anything else. The correct
allocator is :class:`paged_edu.core.allocator.BlockAllocator`.

The seed names a full block by ``sha256(str(tokens of that block))`` -- a hash of the block's own
tokens, blind to everything before it. But the K and V of token ``t`` in any layer past the first
depend on every token ``<= t`` (attention has mixed the prefix into the hidden state), so two
prompts whose block ``i`` holds the same tokens after *different* prefixes need *different* KV.
Its other defects, reproduced on purpose and each reachable from a method below:

1. **Position-blind hash** (:meth:`SeedAllocator.allocate`): block ``i`` of one prompt is reused
   for block ``j`` of another whenever the token chunks are equal, whatever came before.
2. **Stale cache entries** (:meth:`SeedAllocator.free`): freeing a block returns it to the free
   list but leaves its hash in ``prefix_cache``; when the block is handed out again and
   overwritten, a later prompt still "hits" it and reads somebody else's KV.
3. **No rollback** (:meth:`SeedAllocator.allocate`): when the pool runs dry half-way through a
   prompt, the blocks already taken and the ref counts already bumped are not given back.
4. **No copy-on-write** (:meth:`SeedAllocator.append_token_slot`): appending into a shared,
   partly filled last block writes into the block the other sequence reads (the seed's version
   only allocates at block boundaries and never checks the ref count).

The method names follow the seed (``allocate_prompt``, ``append_token_slot``, ``free_request``).
One thing is added for the lesson: ``hit_blocks[request_id]`` records which blocks came from the
prefix cache, so an engine knows which tokens it need not compute -- that is what the cache is for.

:func:`prefix_reuse_experiment` runs the same prompts through either allocator on real tensors and
reports how far each request's attention output is from the truth.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque

from paged_edu.core.validation import integer

__all__ = ["SeedAllocator"]


class SeedAllocator:
    """The seed's allocator, defects included (see the module docstring). Teaching use only."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        self.num_blocks = integer("num_blocks", num_blocks, low=1)
        self.block_size = integer("block_size", block_size, low=1)
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[str, list[int]] = {}
        self.ref_counts: dict[int, int] = {i: 0 for i in range(num_blocks)}
        self.prefix_cache: dict[str, int] = {}  # hash(tokens of ONE block) -> block id
        self.hit_blocks: dict[str, list[bool]] = {}  # per block: reused from the cache? (lesson aid)

    @staticmethod
    def _hash_tokens(tokens: list[int]) -> str:
        # DEFECT 1: the hash covers this block's tokens only, not the prefix before them.
        return hashlib.sha256(str(list(tokens)).encode("utf-8")).hexdigest()

    def allocate_prompt(self, request_id: str, prompt_tokens: list[int]) -> list[int]:
        """Block table for a prompt, reusing any block whose *own* tokens hashed the same."""
        B = self.block_size
        table: list[int] = []
        hits: list[bool] = []
        for i in range(math.ceil(len(prompt_tokens) / B)):
            chunk = list(prompt_tokens[i * B:(i + 1) * B])
            chunk_hash = self._hash_tokens(chunk) if len(chunk) == B else None
            if chunk_hash and chunk_hash in self.prefix_cache:
                phys_id = self.prefix_cache[chunk_hash]  # may be stale (DEFECT 2)
                self.ref_counts[phys_id] += 1
                hits.append(True)
            else:
                if not self.free_blocks:
                    # DEFECT 3: the blocks taken so far for this prompt are not given back.
                    raise MemoryError("GPU HBM Exhausted: No free blocks available for allocation.")
                phys_id = self.free_blocks.popleft()
                self.ref_counts[phys_id] = 1
                if chunk_hash:
                    self.prefix_cache[chunk_hash] = phys_id
                hits.append(False)
            table.append(phys_id)
        self.block_tables[request_id] = table
        self.hit_blocks[request_id] = hits
        return table

    # The correct allocator's name for the same operation, so lesson code reads alike.
    allocate = allocate_prompt

    def append_token_slot(self, request_id: str, current_seq_len: int) -> int:
        """The block the next token goes into; a new block only at a block boundary.

        DEFECT 4: a shared, partly filled last block is written in place (no copy-on-write).
        """
        table = self.block_tables[request_id]
        if current_seq_len % self.block_size == 0:
            if not self.free_blocks:
                raise MemoryError("GPU HBM Exhausted during autoregressive decode step.")
            new_block = self.free_blocks.popleft()
            self.ref_counts[new_block] = 1
            table.append(new_block)
        return table[-1]

    def free_request(self, request_id: str) -> None:
        """Release a request's blocks.

        DEFECT 2: ``prefix_cache`` keeps pointing at freed blocks, which are handed out again.
        """
        if request_id not in self.block_tables:
            return
        for phys_id in self.block_tables.pop(request_id):
            self.ref_counts[phys_id] -= 1
            if self.ref_counts[phys_id] == 0:
                self.free_blocks.append(phys_id)

    free = free_request

    def block_table(self, request_id: str) -> list[int]:
        return list(self.block_tables[request_id])

    def ref_count(self, block_id: int) -> int:
        return self.ref_counts[block_id]

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def __repr__(self) -> str:
        return (f"SeedAllocator(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"free={len(self.free_blocks)}, cached_hashes={len(self.prefix_cache)})  # the WRONG way")

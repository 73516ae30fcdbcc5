"""A prefix index: which cached blocks hold a prompt's longest computed prefix (lesson 3, lesson 8).

The :class:`~paged_edu.core.block_pool.BlockPool` owns the blocks (ref counts and the free
list); an index only *names* some of them as cached and says which cached ones may be evicted.
:class:`~paged_edu.core.allocator.BlockAllocator` keeps the block tables and drives one index
through this interface, whichever it is:

* ``lookup(packed, max_blocks) -> PrefixMatch`` -- the longest cached prefix (whole blocks, at most
  ``max_blocks``); changes nothing;
* ``lock(match) -> key`` -- hold the matched blocks for a new sequence (they cannot be evicted
  while it lives); ``key`` is the index's per-sequence state, passed back below;
* ``extend(key, block_tokens)`` -- the sequence's next block just became full;
* ``publish(key, table, start, end, block_tokens, ref_count, dedupe) -> (end, replaced)`` -- offer
  the table's full blocks ``start .. end-1`` (``block_tokens``: their tokens, from block ``start``
  on), whose K/V is written, to later prompts. ``replaced``
  lists ``(position, cached block)`` where the index already held these tokens in another block
  and ``dedupe`` allows the sequence to hold the cached copy instead (the caller swaps the table
  entry, so *publish first, then read block tables*);
* ``fork(key) -> key`` / ``unlock(key)`` -- a second holder of the same blocks / a holder gone;
* ``evict(n) -> [block ids]`` -- drop ``n <= num_evictable`` cached blocks nobody holds;
* ``is_cached(b)``, ``hash_of(b)``; ``on_share(b)`` / ``on_free(b)`` -- a cached block's ref count
  left / reached 0; ``num_evictable``, ``num_cached_blocks``.

Two implementations: :class:`HashChainIndex` here (vLLM's ``BlockHashToBlockMap`` over chained
block hashes, an LRU of free cached blocks) and :class:`~paged_edu.core.radix_cache.RadixIndex`
(SGLang's radix tree, locked paths, LRU leaves). Plain Python, no torch.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass

from paged_edu.core.block_hash import ROOT_HASH, extend_chain, full_blocks, hash_chain

__all__ = ["HashChainIndex", "PrefixMatch"]


@dataclass(slots=True)
class PrefixMatch:
    """What :meth:`lookup` found: the cached blocks of the longest prefix, how many of them are
    evictable now (sharing them takes them out of the free pool), and the index's own note."""

    block_ids: list[int]
    num_evictable: int
    note: object = None  # hash chain: the prompt's block hashes; radix: the tree path


class HashChainIndex:
    """vLLM's prefix cache: ``hash_to_block`` maps a full block's chained hash to the block;
    ``block_hash[b]`` is the reverse; ``evictable`` holds cached blocks with ref count 0, least
    recently freed first. A sequence's key is the list of its full blocks' chained hashes."""

    def __init__(self, num_blocks: int, block_size: int, enabled: bool = True) -> None:
        self.block_size = block_size
        self.enabled = enabled
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()

    @property
    def num_evictable(self) -> int:
        return len(self.evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_to_block)

    def is_cached(self, block_id: int) -> bool:
        return self.block_hash[block_id] is not None

    def hash_of(self, block_id: int) -> bytes | None:
        return self.block_hash[block_id]

    def lookup(self, packed: array, max_blocks: int) -> PrefixMatch:
        hashes = hash_chain(full_blocks(packed, self.block_size)) if self.enabled else []
        hits: list[int] = []
        num_evictable = 0
        for block_hash in hashes[:max_blocks]:
            block_id = self.hash_to_block.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
            num_evictable += block_id in self.evictable
        return PrefixMatch(hits, num_evictable, hashes)

    def lock(self, match: PrefixMatch) -> list[bytes]:
        return match.note  # the pool's ref counts keep held blocks out of ``evictable``

    def extend(self, key: list[bytes], block_tokens: array) -> None:
        if self.enabled:
            key.append(extend_chain(key[-1] if key else ROOT_HASH, block_tokens))

    def publish(self, key, table, start, end, block_tokens, ref_count, dedupe):
        """The first writer of a hash wins: a block whose hash is cached already stays uncached."""
        if self.enabled:
            for i in range(start, end):
                block_hash = key[i]
                if block_hash not in self.hash_to_block:
                    self.hash_to_block[block_hash] = table[i]
                    self.block_hash[table[i]] = block_hash
        return end, ()

    def fork(self, key: list[bytes]) -> list[bytes]:
        return list(key)

    def unlock(self, key: list[bytes]) -> None:
        pass

    def on_share(self, block_id: int) -> None:
        del self.evictable[block_id]

    def on_free(self, block_id: int) -> None:
        self.evictable[block_id] = None

    def evict(self, n: int) -> list[int]:
        evicted = []
        for _ in range(n):
            block_id, _ = self.evictable.popitem(last=False)
            del self.hash_to_block[self.block_hash[block_id]]
            self.block_hash[block_id] = None
            evicted.append(block_id)
        return evicted

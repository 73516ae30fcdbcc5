"""A prefix index: which cached blocks hold a prompt's longest computed prefix (lesson 3, lesson 8).

The :class:`~paged_edu.core.block_pool.BlockPool` owns the blocks (ref counts and the free
list); an index only *names* some of them as cached and says which cached ones may be evicted.
:class:`~paged_edu.core.allocator.BlockAllocator` keeps the block tables and drives one index
through this interface, whichever it is:

* ``lookup(packed, max_blocks, root) -> PrefixMatch`` -- the longest cached prefix (whole blocks, at
  most ``max_blocks``) of a request whose salt and extra keys give ``root``
  (:func:`~paged_edu.core.block_hash.prefix_root`; ``ROOT_HASH``: none); changes nothing;
* ``lock(match) -> key`` -- hold the matched blocks for a new sequence (they cannot be evicted
  while it lives); ``key`` is the index's per-sequence state, passed back below;
* ``extend(key, block_tokens)`` -- the sequence's next block just became full;
* ``publish(key, table, start, end, block_tokens, ref_count, dedupe) -> (end, replaced, stored)`` -- offer
  the table's full blocks ``start .. end-1`` (``block_tokens``: their tokens, from block ``start``
  on), whose K/V is written, to later prompts. ``replaced``
  lists ``(position, cached block)`` where the index already held these tokens in another block
  and ``dedupe`` allows the sequence to hold the cached copy instead (the caller swaps the table
  entry, so *publish first, then read block tables*); ``stored`` lists the blocks that entered the
  cache (the allocator's ``store`` event);
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
from dataclasses import dataclass, field

from paged_edu.core.block_hash import ROOT_HASH, extend_chain, full_blocks, hash_chain

__all__ = ["ChainKey", "HashChainIndex", "PrefixMatch"]


@dataclass(slots=True)
class PrefixMatch:
    """What :meth:`lookup` found: the cached blocks of the longest prefix, how many of them are
    evictable now (sharing them takes them out of the free pool), and the index's own note."""

    block_ids: list[int]
    num_evictable: int
    note: object = None  # hash chain: the prompt's :class:`ChainKey`; radix: the tree path and the root


@dataclass(slots=True)
class ChainKey:
    """A sequence's state in the hash chain: ``h_{-1}`` (its salt's root) and its full blocks' hashes."""

    root: bytes = ROOT_HASH
    hashes: list[bytes] = field(default_factory=list)


class HashChainIndex:
    """vLLM's prefix cache: ``hash_to_block`` maps a full block's chained hash to the block;
    ``block_hash[b]`` is the reverse; ``evictable`` holds cached blocks with ref count 0, least
    recently freed first. A sequence's key is a :class:`ChainKey`: its full blocks' chained hashes."""

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

    def lookup(self, packed: array, max_blocks: int, root: bytes = ROOT_HASH) -> PrefixMatch:
        hashes = hash_chain(full_blocks(packed, self.block_size), root) if self.enabled else []
        hits: list[int] = []
        num_evictable = 0
        for block_hash in hashes[:max_blocks]:
            block_id = self.hash_to_block.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
            num_evictable += block_id in self.evictable
        return PrefixMatch(hits, num_evictable, ChainKey(root, hashes))

    def lock(self, match: PrefixMatch) -> ChainKey:
        return match.note  # the pool's ref counts keep held blocks out of ``evictable``

    def extend(self, key: ChainKey, block_tokens: array) -> None:
        if self.enabled:
            hashes = key.hashes
            hashes.append(extend_chain(hashes[-1] if hashes else key.root, block_tokens))

    def publish(self, key, table, start, end, block_tokens, ref_count, dedupe):
        """The first writer of a hash wins: a block whose hash is cached already stays uncached."""
        stored = []
        if self.enabled:
            hashes = key.hashes
            for i in range(start, end):
                block_hash = hashes[i]
                if block_hash not in self.hash_to_block:
                    self.hash_to_block[block_hash] = table[i]
                    self.block_hash[table[i]] = block_hash
                    stored.append(table[i])
        return end, (), stored

    def fork(self, key: ChainKey) -> ChainKey:
        return ChainKey(key.root, list(key.hashes))

    def unlock(self, key: ChainKey) -> None:
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

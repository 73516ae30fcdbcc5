"""The paged block allocator: block tables, reference counts, prefix caching, copy-on-write.

This is the operating-system half of PagedAttention. The KV cache is a pool of ``num_blocks``
physical blocks of ``B = block_size`` token slots each (:class:`~paged_edu.core.block_pool.BlockPool`).
Every sequence owns a *block table* ``B(i)`` that maps its logical block ``i = t // B`` to a
physical block; token ``t`` lives in slot ``B(t // B) * B + t % B``. Blocks are shared by
reference counting:

* **prefix caching** -- a full block is named by a *chained* hash of everything before it
  (:mod:`~paged_edu.core.block_hash`); an admitted prompt reuses the cached blocks of its longest
  cached prefix, so their K/V is not computed again.
* **fork** -- parallel samples share every block of their parent.
* **copy-on-write** -- a sequence about to write into a shared, partly filled last block first
  gets a private copy. The copies are queued as ``(src, dst)`` pairs for the KV cache to apply on
  the device (:meth:`BlockAllocator.take_copies`).

Blocks whose reference count drops to 0 keep their hash and stay reusable (the *evictable* cache)
until the pool needs them; then the least-recently-freed one goes first. Never-cached free blocks
are always handed out before an evictable one is evicted.

Every operation either completes or raises leaving the allocator exactly as it was. Events go to
subscribers only after the operation has committed, and a subscriber that raises is reported as
a warning without reaching the caller: no subscriber can lose blocks or leave state half-changed.
Plain Python, no torch, so a learner can read and test it anywhere.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from paged_edu.core.block_hash import ROOT_HASH, chained_block_hashes, extend_chain, full_blocks, hash_block, hash_chain
from paged_edu.core.block_events import BlockEvent, Subscribers
from paged_edu.core.block_pool import BlockPool, OutOfBlocksError, PrefixCacheStats
from paged_edu.core.seq_lookup import SequenceLookup, UnknownSequenceError
from paged_edu.core.validation import MAX_NUM_BLOCKS, MAX_TOKEN_ID, flag, integer, new_id, token_array, token_id as check_token_id

__all__ = [
    "BlockAllocator",
    "BlockEvent",
    "OutOfBlocksError",
    "PrefixCacheStats",
    "UnknownSequenceError",
    "chained_block_hashes",
    "hash_block",
]

SeqId = Hashable


@dataclass(slots=True)
class _SeqBlocks:
    """What block management keeps per sequence: its block table, and the tokens it needs to hash
    the next block. The tokens of its *full* blocks live in the pool (``BlockPool.token_ids``), once
    per physical block however many sequences share it; only the partly filled last block's tokens
    (``tail``) are the sequence's own until that block fills up and is hashed."""

    block_table: list[int]
    tail: array  # tokens of the partly filled last block (empty when the last block is full)
    block_hashes: list[bytes]  # chained hash of each full block, in order: one per full block
    num_cached_tokens: int = 0  # leading tokens whose blocks came from the prefix cache
    num_published_blocks: int = 0  # leading full blocks already offered to the prefix cache


@dataclass(slots=True)
class _Plan:
    """What admitting a prompt takes (:meth:`BlockAllocator._plan`)."""

    blocks: list[array]  # the tokens of each full block
    hashes: list[bytes]  # their chained hashes
    hits: list[int]  # cached blocks for the leading full blocks
    num_fresh: int  # blocks to take from the free pool for the rest
    num_revived: int  # hits that are free now (ref count 0): sharing them takes them out of the pool


class BlockAllocator(SequenceLookup):
    """A pool of ``num_blocks`` KV blocks of ``block_size`` slots, with prefix caching and CoW.

    ``cache_when_computed`` is the caching policy: off (the default), a block enters the prefix
    cache the moment it is full -- right for a caller that computes a whole prompt in the step that
    allocates it. On, a block is published only once :meth:`mark_computed` says its K/V is written --
    what a scheduler that spreads a prompt over several steps (chunked prefill) or preempts
    half-computed prompts needs, so that no other sequence hits a block whose K/V does not exist yet.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        cache_when_computed: bool = False,
    ) -> None:
        self.num_blocks = integer("num_blocks", num_blocks, low=1, high=MAX_NUM_BLOCKS)
        self.block_size = integer("block_size", block_size, low=1)
        self.enable_prefix_caching = flag("enable_prefix_caching", enable_prefix_caching)
        self._cache_when_computed = flag("cache_when_computed", cache_when_computed)
        self.pool = BlockPool(self.num_blocks, self.block_size)
        self._seqs: dict[SeqId, _SeqBlocks] = {}
        self._copies: list[tuple[int, int]] = []
        self._subscribers = Subscribers("allocator")
        self.stats = PrefixCacheStats()

    # -- events --------------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[BlockEvent], None]) -> Callable[[], None]:
        """Call ``callback(event)`` after every change; returns a function that unsubscribes.

        Events are delivered after the operation has committed, so a callback sees the new state.
        An exception in a callback does not reach the allocator's caller: it is reported with
        ``warnings.warn`` (a ``RuntimeWarning``) and the other subscribers still get the event.
        """
        return self._subscribers.add(callback)

    # -- queries -------------------------------------------------------------------------------
    def token_ids(self, seq_id: SeqId) -> list[int]:
        """The sequence's tokens, read from its blocks (as attention reads K/V through the table)."""
        seq = self._seq(seq_id)
        tokens = array("q")
        for block_id in seq.block_table[: len(seq.block_hashes)]:  # the full blocks
            tokens += self.pool.token_ids[block_id]
        tokens += seq.tail
        return tokens.tolist()

    def num_tokens(self, seq_id: SeqId) -> int:
        return self._length(self._seq(seq_id))

    def _length(self, seq: _SeqBlocks) -> int:
        """Tokens in ``seq``: ``B`` per full block (each has its hash), plus the tail's."""
        return len(seq.block_hashes) * self.block_size + len(seq.tail)

    def num_cached_tokens(self, seq_id: SeqId) -> int:
        """Leading prompt tokens whose KV came from the prefix cache (a multiple of B, < prompt)."""
        return self._seq(seq_id).num_cached_tokens

    def ref_count(self, block_id: int) -> int:
        return self.pool.ref_count[self._check_block(block_id)]

    def block_hash(self, block_id: int) -> bytes | None:
        """The chained hash the prefix cache holds this block under, or None."""
        return self.pool.block_hash[self._check_block(block_id)]

    def is_evictable(self, block_id: int) -> bool:
        return self._check_block(block_id) in self.pool.evictable

    def _check_block(self, block_id: int) -> int:
        return integer("block id", block_id, low=0, high=self.num_blocks - 1)

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0, evictable cached ones included."""
        return self.pool.num_free

    @property
    def num_evictable_blocks(self) -> int:
        return len(self.pool.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.pool.num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences."""
        return self.num_used_blocks / self.num_blocks

    def slot_mapping(self, seq_id: SeqId, start: int = 0, end: int | None = None) -> list[int]:
        """Physical slots of tokens ``start .. end-1`` (all of them by default)."""
        seq = self._seq(seq_id)
        start = integer("start", start)
        n = self._length(seq)
        end = n if end is None else integer("end", end)
        if not 0 <= start <= end <= n:
            raise ValueError(f"token range [{start}, {end}) is outside sequence {seq_id!r} of {n} tokens")
        B, table = self.block_size, seq.block_table
        return [table[t // B] * B + t % B for t in range(start, end)]

    def num_new_blocks_for(self, token_ids: Sequence[int]) -> int:
        """Free blocks an :meth:`allocate` of ``token_ids`` would consume now (cache hits counted)."""
        plan = self._plan(token_array("token_ids", token_ids))
        return plan.num_fresh + plan.num_revived

    def num_cached_tokens_for(self, token_ids: Sequence[int]) -> int:
        """Leading tokens of ``token_ids`` an :meth:`allocate` now would hit (changes nothing)."""
        return len(self._plan(token_array("token_ids", token_ids)).hits) * self.block_size

    def take_copies(self) -> list[tuple[int, int]]:
        """The ``(src_block, dst_block)`` copy-on-write copies made since the last call."""
        copies, self._copies = self._copies, []
        return copies

    @property
    def cache_when_computed(self) -> bool:
        """The caching policy given to the constructor (see the class docstring)."""
        return self._cache_when_computed

    @cache_when_computed.setter
    def cache_when_computed(self, value: bool) -> None:
        # Kept for old callers; pass ``cache_when_computed=`` to the constructor instead.
        if self._seqs:
            raise ValueError("cache_when_computed can only change while the allocator holds no sequence")
        self._cache_when_computed = bool(value)

    # -- internals -----------------------------------------------------------------------------
    def _plan(self, packed: array) -> _Plan:
        """What admitting ``packed`` takes (see :class:`_Plan`). The cache is looked up for the
        leading full blocks, stopping at the first miss -- for at most ``ceil(n/B) - 1`` of them,
        since the prompt's last token is always computed, so its block is never a shared one."""
        n, B = len(packed), self.block_size
        blocks = full_blocks(packed, B)
        hashes = hash_chain(blocks)
        hits: list[int] = []
        num_revived = 0
        if self.enable_prefix_caching:
            for block_hash in hashes[: (n - 1) // B]:
                block_id = self.pool.hash_to_block.get(block_hash)
                if block_id is None:
                    break
                hits.append(block_id)
                if self.pool.ref_count[block_id] == 0:
                    num_revived += 1
        return _Plan(blocks, hashes, hits, -(-n // B) - len(hits), num_revived)

    def _publish(self, seq: _SeqBlocks, num_blocks: int) -> None:
        """Offer the sequence's first ``num_blocks`` full blocks (``<= len(block_hashes)``) to the cache."""
        if self.enable_prefix_caching:
            for i in range(seq.num_published_blocks, num_blocks):
                self.pool.cache(seq.block_table[i], seq.block_hashes[i])
        seq.num_published_blocks = max(seq.num_published_blocks, num_blocks)

    # -- operations ----------------------------------------------------------------------------
    def allocate(self, seq_id: SeqId, token_ids: Sequence[int], *, record_stats: bool = True) -> list[int]:
        """Admit a prompt: reuse cached leading blocks, take fresh ones for the rest.

        Returns the block table, ``ceil(n/B)`` blocks. Raises :class:`OutOfBlocksError` (nothing
        changed) when the pool cannot supply the fresh blocks. ``record_stats=False`` (a swap-in,
        whose prompt was counted at its first admission) leaves :attr:`stats` alone.
        """
        new_id("sequence id", seq_id, self._seqs)
        packed = token_array("token_ids", token_ids)
        n, B = len(packed), self.block_size
        if n == 0:
            raise ValueError("cannot allocate an empty prompt: it needs at least one token")
        plan = self._plan(packed)
        available = self.pool.num_free - plan.num_revived
        if plan.num_fresh > available:
            raise OutOfBlocksError(
                f"sequence {seq_id!r} needs {plan.num_fresh} free blocks for {n} tokens "
                f"({len(plan.hits)} cached), only {available} available"
            )

        # Commit: nothing below can fail.
        hits = plan.hits
        self.pool.share(hits)
        fresh, evicted = self.pool.take(plan.num_fresh)
        table = hits + fresh
        for i in range(len(hits), len(plan.blocks)):  # the full blocks' tokens (hits hold theirs already)
            self.pool.token_ids[table[i]] = plan.blocks[i]
        num_cached = len(hits) * B
        seq = _SeqBlocks(table, packed[len(plan.blocks) * B:], plan.hashes, num_cached, len(hits))
        self._seqs[seq_id] = seq
        if not self._cache_when_computed:
            self._publish(seq, len(plan.hashes))
        if record_stats:
            self.stats.queried_tokens += n
            self.stats.hit_tokens += num_cached

        if self._subscribers.callbacks:
            for block_id in evicted:
                self._subscribers.deliver(BlockEvent("evict", None, [block_id]))
            if hits:
                self._subscribers.deliver(BlockEvent("cache_hit", seq_id, list(hits), num_cached))
            self._subscribers.deliver(BlockEvent("allocate", seq_id, list(table), n))
        return list(table)

    def append(self, seq_id: SeqId, token_id: int) -> int:
        """Append one token; return its physical slot ``block_id * B + offset``.

        Takes a new block when the last one is full; copies a shared, partly filled last block
        first (copy-on-write, queued for :meth:`take_copies`).
        """
        seq = self._seq(seq_id)
        if not (type(token_id) is int and 0 <= token_id <= MAX_TOKEN_ID):  # a plain int in range needs no more
            token_id = check_token_id("token id", token_id)
        B = self.block_size
        offset = len(seq.tail)  # the new token's place in the last block
        block_id = seq.block_table[-1]
        if offset == 0 or self.pool.ref_count[block_id] > 1:  # full, or shared: a new block, or a copy
            block_id, events = self._take_last_block(seq_id, seq)
        else:
            events = ()
        seq.tail.append(token_id)
        if offset == B - 1:
            self._seal_last_block(seq)
        slot = block_id * B + offset

        if self._subscribers.callbacks:
            for event in events:  # evict, copy_on_write: when a block was taken
                self._subscribers.deliver(event)
            self._subscribers.deliver(BlockEvent("append", seq_id, [block_id], 1, slot))
        return slot

    def _take_last_block(self, seq_id: SeqId, seq: _SeqBlocks) -> tuple[int, list[BlockEvent]]:
        """A block of its own with room for ``seq``'s next token: a new one when the last block is
        full, else a copy of the shared last block (queued for :meth:`take_copies`).
        Returns ``(block id, the events to emit once the append is done)``."""
        shared = seq.block_table[-1] if seq.tail else None
        try:
            [block_id], evicted = self.pool.take(1)
        except OutOfBlocksError:
            purpose = "a new block" if shared is None else "copy-on-write"
            raise OutOfBlocksError(f"no free block for {purpose} in sequence {seq_id!r}") from None
        if shared is None:
            seq.block_table.append(block_id)
        else:  # copy on write: the K/V is copied by the cache; the tail's tokens are already ours
            self.pool.release([shared])
            seq.block_table[-1] = block_id
            self._copies.append((shared, block_id))
        events = []
        if self._subscribers.callbacks:
            if evicted:  # the block just taken was evicted from the cache
                events.append(BlockEvent("evict", None, [block_id]))
            if shared is not None:
                events.append(BlockEvent("copy_on_write", seq_id, [shared, block_id]))
        return block_id, events

    def _seal_last_block(self, seq: _SeqBlocks) -> None:
        """``seq``'s last block just became full: its tokens move to the pool, the hash chain grows
        by one, and the block is published unless the policy waits for :meth:`mark_computed`."""
        parent = seq.block_hashes[-1] if seq.block_hashes else ROOT_HASH
        seq.block_hashes.append(extend_chain(parent, seq.tail))
        self.pool.token_ids[seq.block_table[-1]], seq.tail = seq.tail, array("q")
        if not self._cache_when_computed:
            self._publish(seq, len(seq.block_hashes))

    def mark_computed(self, seq_id: SeqId, num_computed_tokens: int) -> None:
        """Record that the first ``num_computed_tokens`` tokens' K/V is written; publish their full blocks."""
        seq = self._seq(seq_id)
        num_computed_tokens = integer(f"num_computed_tokens for sequence {seq_id!r}", num_computed_tokens,
                                      low=0, high=self._length(seq))
        self._publish(seq, min(num_computed_tokens // self.block_size, len(seq.block_hashes)))

    def fork(self, parent_id: SeqId, child_id: SeqId) -> list[int]:
        """A child that shares every block of its parent (parallel sampling, beam search)."""
        parent = self._seq(parent_id)
        new_id("sequence id", child_id, self._seqs)
        self.pool.share(parent.block_table)
        self._seqs[child_id] = _SeqBlocks(list(parent.block_table), array("q", parent.tail), list(parent.block_hashes),
                                          parent.num_cached_tokens, parent.num_published_blocks)
        if self._subscribers.callbacks:
            self._subscribers.deliver(BlockEvent("fork", child_id, list(parent.block_table), self._length(parent)))
        return list(parent.block_table)

    def free(self, seq_id: SeqId) -> None:
        """Release a sequence. Blocks go tail first, so a prompt's tail is evicted before its head."""
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        self.pool.release(reversed(seq.block_table))
        if self._subscribers.callbacks:
            self._subscribers.deliver(BlockEvent("free", seq_id, list(seq.block_table), self._length(seq)))

    def __repr__(self) -> str:
        return (
            f"BlockAllocator(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"free={self.num_free_blocks}, evictable={self.num_evictable_blocks}, seqs={len(self._seqs)})"
        )

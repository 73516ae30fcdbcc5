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
* **counts, not token values** -- :meth:`BlockAllocator.append_slots` reserves slots for tokens
  whose ids need not exist yet (still being sampled); the ids arrive with
  :meth:`BlockAllocator.mark_computed`, and a full block is hashed once its ids are known and
  published once its K/V is computed (the protocol: :mod:`paged_edu.sched.memory_manager`). The
  allocator keeps only the ids its prefix index has not taken yet.

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

from paged_edu.core.block_hash import ROOT_HASH, prefix_root
from paged_edu.core.block_events import BlockEvent, EventQueue, Subscribers
from paged_edu.core.block_pool import BlockPool, OutOfBlocksError, PrefixCacheStats
from paged_edu.core.host_memory import check_host_fits
from paged_edu.core.prefix_index import HashChainIndex, PrefixMatch
from paged_edu.core.seq_lookup import SequenceLookup
from paged_edu.core.validation import MAX_NUM_BLOCKS, cache_key, flag, integer, new_id, token_array

__all__ = ["BlockAllocator", "pool_size"]

SeqId = Hashable


@dataclass(slots=True)
class _SeqBlocks:
    """What block management keeps per sequence: its block table, how many slots it has reserved,
    how many of their token ids are known, and the known tokens the prefix index has not taken yet.

    Slots are reserved by count (:meth:`BlockAllocator.append_slots`): a token may have a slot before
    its id exists (it is still being sampled). Ids arrive later (:meth:`BlockAllocator.mark_computed`);
    a block is hashed once its ``B`` ids are known and published once its K/V is computed. ``pending``
    holds the known tokens from the first unpublished block on; the index keeps what it publishes
    (the hash chain its hashes, the radix tree its keys), so no token is stored twice for long."""

    block_table: list[int]
    num_tokens: int  # slots reserved (tokens placed, their ids known or not)
    num_known: int  # leading tokens whose ids are known (<= num_tokens)
    pending: array  # known tokens from block ``num_published_blocks`` on, not yet given to the index (if any)
    key: object  # the prefix index's state for this sequence (hash chain: its blocks' hashes)
    num_cached_tokens: int = 0  # leading tokens whose blocks came from the prefix cache
    num_published_blocks: int = 0  # leading full blocks already offered to the prefix cache
    table_version: int = 0  # changes when a block of the table is replaced (see block_table_versions)


def pool_size(num_blocks: int, block_size: int) -> tuple[int, int]:
    """``(num_blocks, block_size)`` checked before anything is built from them: integers, at most
    ``MAX_NUM_BLOCKS`` blocks (block ids travel in int32 block tables), and an allocator the host's
    memory can hold (:func:`~paged_edu.core.host_memory.check_host_fits`)."""
    num_blocks = integer("num_blocks", num_blocks, low=1, high=MAX_NUM_BLOCKS)
    block_size = integer("block_size", block_size, low=1)
    check_host_fits("num_blocks", num_blocks, block_size)
    return num_blocks, block_size


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
        self.num_blocks, self.block_size = pool_size(num_blocks, block_size)
        prefix_caching = flag("enable_prefix_caching", enable_prefix_caching)
        self._init_blocks(
            HashChainIndex(self.num_blocks, self.block_size, prefix_caching), prefix_caching, cache_when_computed
        )

    def _init_blocks(self, index, enable_prefix_caching: bool, cache_when_computed: bool) -> None:
        """The pool over ``index`` (a prefix index, :mod:`~paged_edu.core.prefix_index`) and no sequence."""
        self.enable_prefix_caching = flag("enable_prefix_caching", enable_prefix_caching)
        self._cache_when_computed = flag("cache_when_computed", cache_when_computed)
        self.index = index
        self.pool = BlockPool(self.num_blocks, self.block_size, index)
        self._seqs: dict[SeqId, _SeqBlocks] = {}
        self._copies: list[tuple[int, int]] = []
        self.latest_table_version = 0  # the last number handed out (a table made or edited in place takes the next)
        self._events = EventQueue()  # both channels' events, delivered in the order things happened
        self._subscribers = Subscribers("allocator", self._events)
        self._cache_subscribers = Subscribers("prefix cache", self._events)
        self._cache_events: list[BlockEvent] = []  # for cache subscribers, once the operation is done
        self.stats = PrefixCacheStats()

    def _new_table_version(self) -> int:
        """A number no table had (see :meth:`block_table_versions`); :attr:`latest_table_version` is it."""
        self.latest_table_version += 1
        return self.latest_table_version

    # -- events --------------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[BlockEvent], None]) -> Callable[[], None]:
        """Call ``callback(event)`` after every change; returns a function that unsubscribes.

        Events are delivered after the operation has committed, so a callback sees the new state.
        An exception in a callback does not reach the allocator's caller: it is reported with
        ``warnings.warn`` (a ``RuntimeWarning``) and the other subscribers still get the event. A
        callback may change the allocator: the events of what it does reach every subscriber after
        the event it was called with (and the rest of its operation's), in the order things happened.
        """
        return self._subscribers.add(callback)

    def subscribe_cache(self, callback: Callable[[BlockEvent], None]) -> Callable[[], None]:
        """Call ``callback(event)`` whenever the prefix cache's contents change (vLLM's KV cache
        events, ``vllm/distributed/kv_events.py``): ``store`` (blocks entered the cache: vLLM's
        ``BlockStored``), ``evict`` (one block left it, to make room or by
        :meth:`reset_prefix_cache`: ``BlockRemoved``), ``clear`` (:meth:`reset_prefix_cache`
        emptied it: ``AllBlocksCleared``). Replaying them gives the set of cached blocks; a widget
        can draw the cache from them. Delivered after the operation has committed, after its
        :meth:`subscribe` events, isolated the same way. Returns a function that unsubscribes."""
        return self._cache_subscribers.add(callback)

    def _deliver_cache_events(self) -> None:
        """Hand the cache events of the operation just committed to the queue, after its
        :meth:`subscribe` events (posted already)."""
        if self._cache_events:
            events, self._cache_events = self._cache_events, []
            for event in events:
                self._cache_subscribers.post(event)

    def _flush_events(self) -> None:
        """The operation just committed: deliver its events, and every event posted before them, in
        order (:mod:`~paged_edu.core.block_events`: what a callback does meanwhile is delivered after
        this operation's events, to every subscriber)."""
        self._deliver_cache_events()
        self._events.flush()

    # -- queries -------------------------------------------------------------------------------
    def num_tokens(self, seq_id: SeqId) -> int:
        """Slots the sequence has reserved: its tokens, those whose ids are not known yet included."""
        return self._seq(seq_id).num_tokens

    def num_known_tokens(self, seq_id: SeqId) -> int:
        """Leading tokens of the sequence whose ids the allocator has been given."""
        return self._seq(seq_id).num_known

    def num_cached_tokens(self, seq_id: SeqId) -> int:
        """Leading prompt tokens whose KV came from the prefix cache (a multiple of B, < prompt)."""
        return self._seq(seq_id).num_cached_tokens

    def ref_count(self, block_id: int) -> int:
        return self.pool.ref_count[self._check_block(block_id)]

    def block_hash(self, block_id: int) -> bytes | None:
        """The chained hash the prefix cache holds this block under, or None."""
        return self.index.hash_of(self._check_block(block_id))

    def is_evictable(self, block_id: int) -> bool:
        """Cached, and held by no block table: the pool may evict it."""
        block_id = self._check_block(block_id)
        return self.pool.ref_count[block_id] == 0 and self.index.is_cached(block_id)

    def _check_block(self, block_id: int) -> int:
        return integer("block id", block_id, low=0, high=self.num_blocks - 1)

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0, evictable cached ones included."""
        return self.pool.num_free

    @property
    def num_evictable_blocks(self) -> int:
        return self.index.num_evictable

    @property
    def num_cached_blocks(self) -> int:
        """Blocks the prefix cache holds (held by sequences or evictable)."""
        return self.index.num_cached_blocks

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
        n = seq.num_tokens
        end = n if end is None else integer("end", end)
        if not 0 <= start <= end <= n:
            raise ValueError(f"token range [{start}, {end}) is outside sequence {seq_id!r} of {n} tokens")
        B, table = self.block_size, seq.block_table
        return [table[t // B] * B + t % B for t in range(start, end)]

    def num_new_blocks_for(
        self, token_ids: Sequence[int], *, cache_salt: str | None = None, extra_keys: Sequence[str] = ()
    ) -> int:
        """Free blocks an :meth:`allocate` of ``token_ids`` would consume now (cache hits counted)."""
        packed = token_array("token_ids", token_ids)
        match = self._lookup(packed, self._root(cache_salt, extra_keys))
        return -(-len(packed) // self.block_size) - len(match.block_ids) + match.num_evictable

    def num_cached_tokens_for(
        self, token_ids: Sequence[int], *, cache_salt: str | None = None, extra_keys: Sequence[str] = ()
    ) -> int:
        """Leading tokens of ``token_ids`` an :meth:`allocate` now would hit (changes nothing)."""
        root = self._root(cache_salt, extra_keys)
        return len(self._lookup(token_array("token_ids", token_ids), root).block_ids) * self.block_size

    def take_copies(self) -> list[tuple[int, int]]:
        """The ``(src_block, dst_block)`` copy-on-write copies made since the last call."""
        copies, self._copies = self._copies, []
        return copies

    @property
    def cache_when_computed(self) -> bool:
        """The caching policy given to the constructor (see the class docstring)."""
        return self._cache_when_computed

    # -- internals -----------------------------------------------------------------------------
    def _lookup(self, packed: array, root: bytes = ROOT_HASH) -> PrefixMatch:
        """The longest cached prefix of ``packed``, for at most ``ceil(n/B) - 1`` blocks: the prompt's
        last token is always computed, so its block is never a shared one. Changes nothing."""
        return self.index.lookup(packed, max(len(packed) - 1, 0) // self.block_size, root)

    @staticmethod
    def _root(cache_salt: str | None, extra_keys: Sequence[str]) -> bytes:
        """The hash before a request's first block: its salt and extra keys, checked."""
        if cache_salt is None and not extra_keys:
            return ROOT_HASH
        if cache_salt is not None:
            cache_key("cache_salt", cache_salt)
        if isinstance(extra_keys, str) or not isinstance(extra_keys, (tuple, list)):
            raise TypeError(f"extra_keys must be a tuple of str, got {type(extra_keys).__name__}")
        for i, key in enumerate(extra_keys):
            cache_key(f"extra_keys[{i}]", key)
        return prefix_root(cache_salt, tuple(extra_keys))

    def _publish(self, seq_id: SeqId, seq: _SeqBlocks, num_blocks: int, dedupe: bool) -> list[BlockEvent]:
        """Offer the sequence's first ``num_blocks`` full blocks (whose ids are known) to the cache.

        With ``dedupe`` (their K/V is written), a block whose tokens the index already holds in
        another block is swapped for the cached copy and released: ``seq.block_table`` changes
        here, so read block tables only after publishing. Returns the events to deliver."""
        if num_blocks <= seq.num_published_blocks:
            return []
        start = seq.num_published_blocks
        end, replaced, stored = self.index.publish(
            seq.key, seq.block_table, start, num_blocks, seq.pending, self.pool.ref_count, dedupe
        )
        if end > start:  # the index keeps what it took: the sequence forgets those tokens
            del seq.pending[: (end - start) * self.block_size]
            seq.num_published_blocks = end
        if stored and self._cache_subscribers.callbacks:
            self._cache_events.append(BlockEvent("store", seq_id, list(stored), len(stored) * self.block_size))
        events = []
        for i, cached in replaced:  # computed twice: hold the cache's copy, drop our own
            own = seq.block_table[i]
            self.pool.share([cached])
            self.pool.release([own])
            seq.block_table[i] = cached
            seq.table_version = self._new_table_version()
            if self._subscribers.callbacks:
                events.append(BlockEvent("replace", seq_id, [own, cached]))
        return events

    # -- operations ----------------------------------------------------------------------------
    def allocate(
        self,
        seq_id: SeqId,
        token_ids: Sequence[int],
        *,
        record_stats: bool = True,
        cache_salt: str | None = None,
        extra_keys: Sequence[str] = (),
    ) -> list[int]:
        """Admit a prompt: reuse cached leading blocks, take fresh ones for the rest.

        ``cache_salt`` (a non-empty str of at most 256 characters) and ``extra_keys`` (a tuple of
        such str, e.g. a LoRA adapter's name) enter the hash before the first block (the radix
        index: the salt's own child of the root): the prompt hits only blocks cached under the same
        salt and keys, and its blocks are cached under them. None and ``()``: as without salting.

        Returns the block table, ``ceil(n/B)`` blocks. Raises :class:`OutOfBlocksError` (nothing
        changed) when the pool cannot supply the fresh blocks. ``record_stats=False`` (a swap-in,
        whose prompt was counted at its first admission, or a preempted sequence's re-admission,
        which its scheduler records apart) leaves :attr:`stats` alone.
        """
        new_id("sequence id", seq_id, self._seqs)
        packed = token_array("token_ids", token_ids)
        n, B = len(packed), self.block_size
        if n == 0:
            raise ValueError("cannot allocate an empty prompt: it needs at least one token")
        match = self._lookup(packed, self._root(cache_salt, extra_keys))
        hits = match.block_ids
        num_fresh = -(-n // B) - len(hits)
        available = self.pool.num_free - match.num_evictable
        if num_fresh > available:
            raise OutOfBlocksError(
                f"sequence {seq_id!r} needs {num_fresh} free blocks for {n} tokens "
                f"({len(hits)} cached), only {available} available"
            )

        # Commit: nothing below can fail.
        key = self.index.lock(match)  # before taking fresh blocks, so the hit cannot be evicted
        self.pool.share(hits)
        fresh, evicted = self.pool.take(num_fresh)
        table = hits + fresh
        num_cached = len(hits) * B
        pending = packed[num_cached:] if self.enable_prefix_caching else array("q")  # see _learn
        seq = _SeqBlocks(table, n, n, pending, key, num_cached, len(hits), self._new_table_version())
        self._seqs[seq_id] = seq
        published = self._publish(seq_id, seq, n // B, dedupe=False) if not self._cache_when_computed else ()
        if record_stats:
            self.stats.record(n, num_cached, cache_salt=cache_salt)

        if self._subscribers.callbacks:
            for block_id in evicted:
                self._subscribers.post(BlockEvent("evict", None, [block_id]))
            if hits:
                self._subscribers.post(BlockEvent("cache_hit", seq_id, list(hits), num_cached))
            self._subscribers.post(BlockEvent("allocate", seq_id, list(table), n))
            for event in published:
                self._subscribers.post(event)
        if self._cache_subscribers.callbacks:
            self._cache_events[:0] = [BlockEvent("evict", None, [b]) for b in evicted]  # before the stores
        self._flush_events()
        return list(seq.block_table)

    def append_slots(self, seq_id: SeqId, num_tokens: int = 1) -> list[int]:
        """Reserve slots for the sequence's next ``num_tokens`` tokens, whose ids need not exist yet;
        return their physical slots ``block_id * B + offset``.

        Takes new blocks as the last one fills; copies a shared, partly filled last block first
        (copy-on-write, queued for :meth:`take_copies`). Nothing is hashed or published here: the
        ids arrive with :meth:`mark_computed`. Raises :class:`OutOfBlocksError`, changing nothing,
        when the pool is short.
        """
        try:
            seq = self._seqs[seq_id]
        except (KeyError, TypeError):
            seq = self._seq(seq_id)  # raises UnknownSequenceError
        if type(num_tokens) is not int or num_tokens != 1:  # 1.0 and True equal 1: not an int, refused
            return self._append_many(seq_id, seq, integer("num_tokens", num_tokens, low=0))
        B = self.block_size
        n = seq.num_tokens
        offset = n % B  # the new token's place in the last block
        block_id = seq.block_table[-1]
        if offset == 0 or self.pool.ref_count[block_id] > 1:  # full, or shared: a new block, or a copy
            block_id, events = self._take_last_block(seq_id, seq, offset)
        else:
            events = ()
        seq.num_tokens = n + 1
        slot = block_id * B + offset
        subscribers = self._subscribers
        if subscribers.callbacks:
            for event in events:  # evict, copy_on_write: when a block was taken
                subscribers.post(event)
            subscribers.post(BlockEvent("append", seq_id, [block_id], 1, slot))
            self._flush_events()
        elif self._cache_events:  # a block taken from the cache: tell the cache subscribers
            self._flush_events()
        return [slot]

    def append_slots_upto(self, seq_ids: Sequence[SeqId], num_tokens: Sequence[int]) -> int:
        """``append_slots(seq_id)`` for each sequence of ``seq_ids``, in order, that holds fewer slots
        than ``num_tokens[i]`` -- one call for a decode step's running sequences, each one slot short
        (the token it sampled last). Stops at the first the pool cannot serve, leaving it and the rest
        unchanged; returns how many it served (``len(seq_ids)``: all).

        Speed: the common append -- room in an unshared last block, no subscriber -- is a count,
        kept here; the rest (a new block, a copy on write, events) is :meth:`append_slots`'s. One
        call instead of two per sequence: with the scheduler's bulk decode
        (``Scheduler._schedule_decodes``), 0.28 instead of 0.6 us per decode scheduled.
        """
        seqs, B, ref_count = self._seqs, self.block_size, self.pool.ref_count
        counted = not self._subscribers.callbacks  # a subscriber hears of every append: append_slots
        for i, (seq_id, want) in enumerate(zip(seq_ids, num_tokens)):
            try:
                seq = seqs[seq_id]
            except (KeyError, TypeError):
                seq = self._seq(seq_id)  # raises UnknownSequenceError
            n = seq.num_tokens
            if n == want:
                continue
            if counted and n % B and ref_count[seq.block_table[-1]] == 1:  # append_slots' no-new-block case
                seq.num_tokens = n + 1
                continue
            try:
                self.append_slots(seq_id)
            except OutOfBlocksError:
                return i
        return len(seq_ids)

    def _append_many(self, seq_id: SeqId, seq: _SeqBlocks, num_tokens: int) -> list[int]:
        """:meth:`append_slots` for ``num_tokens != 1``: every block it needs is taken up front."""
        if num_tokens == 0:
            return []
        B = self.block_size
        offset = seq.num_tokens % B
        copy = offset != 0 and self.pool.ref_count[seq.block_table[-1]] > 1
        room = (B - offset) % B
        need = -(-max(num_tokens - room, 0) // B) + copy
        if need > self.pool.num_free:
            raise OutOfBlocksError(
                f"sequence {seq_id!r} needs {need} free blocks for {num_tokens} slots, "
                f"only {self.pool.num_free} available"
            )
        events = []
        if copy:
            events += self._take_last_block(seq_id, seq, offset)[1]
        for _ in range(need - copy):
            events += self._take_last_block(seq_id, seq, 0)[1]
        start = seq.num_tokens
        seq.num_tokens += num_tokens
        slots = self.slot_mapping(seq_id, start)
        if self._subscribers.callbacks:
            for event in events:
                self._subscribers.post(event)
            blocks = sorted({slot // B for slot in slots}, key=seq.block_table.index)
            self._subscribers.post(BlockEvent("append", seq_id, blocks, num_tokens, slots[-1]))
        self._flush_events()  # evict / store events for cache subscribers
        return slots

    def _take_last_block(self, seq_id: SeqId, seq: _SeqBlocks, offset: int) -> tuple[int, list[BlockEvent]]:
        """A block of its own with room for ``seq``'s next token: a new one when the last block is
        full (``offset == 0``), else a copy of the shared last block (queued for :meth:`take_copies`).
        Returns ``(block id, the events to emit once the append is done)``."""
        shared = seq.block_table[-1] if offset else None
        try:
            [block_id], evicted = self.pool.take(1)
        except OutOfBlocksError:
            purpose = "a new block" if shared is None else "copy-on-write"
            raise OutOfBlocksError(f"no free block for {purpose} in sequence {seq_id!r}") from None
        if shared is None:
            seq.block_table.append(block_id)
        else:  # copy on write: the K/V is copied by the cache; the known tokens are the sequence's own
            self.pool.release([shared])
            seq.block_table[-1] = block_id
            seq.table_version = self._new_table_version()
            self._copies.append((shared, block_id))
        if evicted and self._cache_subscribers.callbacks:
            self._cache_events.append(BlockEvent("evict", None, [block_id]))
        events = []
        if self._subscribers.callbacks:
            if evicted:  # the block just taken was evicted from the cache
                events.append(BlockEvent("evict", None, [block_id]))
            if shared is not None:
                events.append(BlockEvent("copy_on_write", seq_id, [shared, block_id]))
        return block_id, events

    def _learn(self, seq_id: SeqId, seq: _SeqBlocks, token_ids, end: int) -> None:
        """``token_ids`` are the ids of ``seq``'s tokens ``end - len(token_ids) .. end - 1``: those not
        known yet are kept, and each block they complete is hashed (the index's key grows by one
        block). Checks everything before changing anything."""
        packed = token_array("token_ids", token_ids)
        begin = end - len(packed)
        known = seq.num_known
        if begin > known:
            raise ValueError(
                f"sequence {seq_id!r}: ids of tokens {known} .. {begin - 1} are missing "
                f"(token_ids must cover every token up to num_computed_tokens={end} not given before)"
            )
        if end <= known:
            return
        seq.num_known = end
        if not self.enable_prefix_caching:  # no index to hash them for: nothing to keep (mark_computed of
            return  # 16 ids: 2.2 -> 1.75 us; the beam benchmark makes 850,000 such calls)
        B = self.block_size
        pending = seq.pending
        pending += packed[known - begin :]
        base = seq.num_published_blocks  # pending starts at this block
        for block in range(known // B, end // B):  # each block these ids complete: hash it
            self.index.extend(seq.key, pending[(block - base) * B : (block - base + 1) * B])

    def mark_computed(self, seq_id: SeqId, num_computed_tokens: int, token_ids: Sequence[int] | None = None) -> None:
        """The first ``num_computed_tokens`` tokens' K/V is written; ``token_ids``, if given, are the
        ids of the last ``len(token_ids)`` of them (ending at ``num_computed_tokens``): it must reach
        back to the first token whose id the allocator does not know (ids it knows are not read again).

        A full block is published when its ids are known and, under ``cache_when_computed``, its K/V
        is computed (otherwise as soon as its ids are known). A published block the cache already
        holds in another block may be swapped for that copy (the radix index does): read the block
        table *after* this call, never before. Bad input raises and changes nothing.
        """
        seq = self._seq(seq_id)
        if not (type(num_computed_tokens) is int and 0 <= num_computed_tokens <= seq.num_tokens):
            num_computed_tokens = integer(
                f"num_computed_tokens for sequence {seq_id!r}", num_computed_tokens, low=0, high=seq.num_tokens
            )
        if token_ids is not None:
            self._learn(seq_id, seq, token_ids, num_computed_tokens)
        num_full = seq.num_known // self.block_size
        computed = num_computed_tokens // self.block_size
        computed = computed if computed < num_full else num_full  # min(): 0.08 us more a call (this CPU)
        if self._cache_when_computed:
            events = self._publish(seq_id, seq, computed, dedupe=True)
        elif seq.num_published_blocks < num_full:  # published as its ids arrive; computed ones may dedupe
            events = self._publish(seq_id, seq, computed, dedupe=True)
            events += self._publish(seq_id, seq, num_full, dedupe=False)
        else:
            return
        if events or self._cache_events:  # else nothing to deliver (most calls): no _flush_events call, 0.2 us
            for event in events:
                self._subscribers.post(event)
            self._flush_events()

    def fork(self, parent_id: SeqId, child_id: SeqId) -> list[int]:
        """A child that shares every block of its parent (parallel sampling, beam search)."""
        parent = self._seq(parent_id)
        new_id("sequence id", child_id, self._seqs)
        self.pool.share(parent.block_table)
        self._seqs[child_id] = _SeqBlocks(
            list(parent.block_table),
            parent.num_tokens,
            parent.num_known,
            array("q", parent.pending),
            self.index.fork(parent.key),
            parent.num_cached_tokens,
            parent.num_published_blocks,
            self._new_table_version(),
        )
        if self._subscribers.callbacks:
            self._subscribers.post(BlockEvent("fork", child_id, list(parent.block_table), parent.num_tokens))
            self._flush_events()
        return list(parent.block_table)

    def free(self, seq_id: SeqId) -> None:
        """Release a sequence. Blocks go tail first, so a prompt's tail is evicted before its head."""
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        self.index.unlock(seq.key)
        self.pool.release(reversed(seq.block_table))
        if self._subscribers.callbacks:
            self._subscribers.post(BlockEvent("free", seq_id, list(seq.block_table), seq.num_tokens))
            self._flush_events()

    def reset_prefix_cache(self) -> int:
        """Forget every cached block that no live sequence holds (vLLM's ``reset_prefix_cache``, e.g.
        after new weights make the cached K/V wrong): they become plain free blocks. Returns how
        many cached blocks it could not drop because sequences hold them (0: nothing is cached any
        more). Events: one ``evict`` per dropped block; to cache subscribers, ``clear`` (naming the
        dropped blocks) instead when the cache is empty afterwards (vLLM's ``AllBlocksCleared``)."""
        dropped = self.pool.drop_cached()
        left = self.index.num_cached_blocks
        if self._subscribers.callbacks:
            for block_id in dropped:
                self._subscribers.post(BlockEvent("evict", None, [block_id]))
        if self._cache_subscribers.callbacks and dropped:
            if left == 0:
                self._cache_events.append(BlockEvent("clear", None, dropped))
            else:
                self._cache_events += [BlockEvent("evict", None, [b]) for b in dropped]
        self._flush_events()
        return left

    def __repr__(self) -> str:
        return (
            f"BlockAllocator(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"free={self.num_free_blocks}, evictable={self.num_evictable_blocks}, seqs={len(self._seqs)})"
        )

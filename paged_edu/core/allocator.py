"""The paged block allocator: block tables, reference counts, prefix caching, copy-on-write.

This is the operating-system half of PagedAttention. The KV cache is a pool of ``num_blocks``
physical blocks of ``B = block_size`` token slots each. Every sequence owns a *block table*
``B(i)`` that maps its logical block ``i = t // B`` to a physical block; token ``t`` lives in slot
``B(t // B) * B + t % B``. Blocks are shared by reference counting:

* **prefix caching** -- a full block is named by a *chained* hash of everything before it,
  ``h_i = H(h_{i-1}, tokens of block i)``. Two prompts share block ``i`` only when their first
  ``(i + 1) * B`` tokens agree, so a block's KV (which depends on every earlier token through
  attention) is reused exactly when it is valid. A per-block hash that ignores the prefix -- the
  seed document's ``sha256(str(chunk))`` -- would hand one prefix's KV to another.
* **fork** -- parallel samples share every block of their parent.
* **copy-on-write** -- a sequence about to write into a shared, partly filled last block first
  gets a private copy. The copies are queued as ``(src, dst)`` pairs for the KV cache to apply on
  the device (:meth:`BlockAllocator.take_copies`).

Blocks whose reference count drops to 0 keep their hash and stay reusable (the *evictable* cache)
until the pool needs them; then the least-recently-freed one goes first. Never-cached free blocks
are always handed out before an evictable one is evicted.

Every operation either completes or raises leaving the allocator exactly as it was. This module is
plain Python: no torch, so a learner can read and test it anywhere.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from paged_edu.core.validation import as_int, token_array as _token_array

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


class OutOfBlocksError(MemoryError):
    """Raised when the pool has too few free blocks; the allocator is left unchanged."""


class UnknownSequenceError(KeyError):
    """Raised for a sequence id the allocator does not hold."""

    def __str__(self) -> str:  # KeyError would repr() the message; we want it readable.
        return str(self.args[0]) if self.args else "unknown sequence id"


# ----------------------------------------------------------------------------------------------
# Hashing
# ----------------------------------------------------------------------------------------------

_ROOT_HASH = b""  # h_{-1}: the empty prefix.


def hash_block(parent_hash: bytes, token_bytes: bytes) -> bytes:
    """``h_i = H(h_{i-1}, tokens of block i)``: SHA-256 over the parent's digest and the tokens.

    Stable across processes (unlike Python's salted ``hash()``), so a cache hit means the same
    thing in every run and every notebook.
    """
    return hashlib.sha256(parent_hash + token_bytes).digest()


def chained_block_hashes(token_ids: Sequence[int], block_size: int, parent: bytes = _ROOT_HASH) -> list[bytes]:
    """The chained hashes of every *full* block of ``token_ids`` (a partial tail has none)."""
    return _chain(_token_array(token_ids), block_size, parent)


def _chain(packed: array, block_size: int, parent: bytes = _ROOT_HASH) -> list[bytes]:
    """:func:`chained_block_hashes` of tokens already validated and packed."""
    hashes = []
    for start in range(0, len(packed) - block_size + 1, block_size):
        parent = hash_block(parent, packed[start:start + block_size].tobytes())
        hashes.append(parent)
    return hashes


# ----------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class BlockEvent:
    """One thing the allocator did, for widgets, the engine and the simulator.

    ``kind`` is one of ``allocate``, ``cache_hit``, ``append``, ``copy_on_write``, ``fork``,
    ``free``, ``evict``. ``block_ids`` are the physical blocks involved: the new table
    (allocate, fork), the reused blocks (cache_hit), the block written (append), ``[src, dst]``
    (copy_on_write), the released blocks (free) or the evicted block (evict).
    """

    kind: str
    seq_id: SeqId | None
    block_ids: list[int]
    num_tokens: int = 0  # tokens involved: cached tokens for cache_hit, the prompt for allocate
    slot: int = -1  # the physical slot written (append)


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache statistics in tokens: how many prompt tokens were looked up, how many hit."""

    queried_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


@dataclass(slots=True)
class _Sequence:
    token_ids: list[int]
    block_table: list[int]
    block_hashes: list[bytes]  # chained hash of each full block, in order
    num_cached_tokens: int = 0
    num_published_blocks: int = 0  # leading full blocks already offered to the prefix cache


# ----------------------------------------------------------------------------------------------
# The allocator
# ----------------------------------------------------------------------------------------------


class BlockAllocator:
    """A pool of ``num_blocks`` KV blocks of ``block_size`` slots, with prefix caching and CoW."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        cache_when_computed: bool = False,
    ) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._cache_when_computed = bool(cache_when_computed)

        self._ref_count: list[int] = [0] * num_blocks
        self._block_hash: list[bytes | None] = [None] * num_blocks  # set while the cache maps it
        self._hash_to_block: dict[bytes, int] = {}
        # Free blocks that hold nothing reusable, handed out first.
        self._free_block_ids: deque[int] = deque(range(num_blocks))
        # Free blocks that still hold cached KV, least-recently-freed first.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._seqs: dict[SeqId, _Sequence] = {}
        self._copies: list[tuple[int, int]] = []
        self._subscribers: tuple[Callable[[BlockEvent], None], ...] = ()
        self.stats = PrefixCacheStats()

    # -- events --------------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[BlockEvent], None]) -> Callable[[], None]:
        """Call ``callback(event)`` after every change; returns a function that unsubscribes."""
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self._subscribers = (*self._subscribers, callback)

        def unsubscribe() -> None:
            self._subscribers = tuple(cb for cb in self._subscribers if cb is not callback)

        return unsubscribe

    def _emit(self, kind: str, seq_id: SeqId | None, block_ids: list[int], num_tokens: int = 0, slot: int = -1) -> None:
        event = BlockEvent(kind, seq_id, block_ids, num_tokens, slot)
        for callback in self._subscribers:  # a tuple: (un)subscribing inside a callback is safe
            callback(event)

    # -- queries -------------------------------------------------------------------------------
    def _seq(self, seq_id: SeqId) -> _Sequence:
        try:
            return self._seqs[seq_id]
        except (KeyError, TypeError):
            raise UnknownSequenceError(f"unknown sequence id {seq_id!r}") from None

    def __contains__(self, seq_id: SeqId) -> bool:
        return seq_id in self._seqs

    @property
    def seq_ids(self) -> list[SeqId]:
        return list(self._seqs)

    def block_table(self, seq_id: SeqId) -> list[int]:
        return list(self._seq(seq_id).block_table)

    def token_ids(self, seq_id: SeqId) -> list[int]:
        return list(self._seq(seq_id).token_ids)

    def num_tokens(self, seq_id: SeqId) -> int:
        return len(self._seq(seq_id).token_ids)

    def num_cached_tokens(self, seq_id: SeqId) -> int:
        """Leading prompt tokens whose KV came from the prefix cache (a multiple of B, < prompt)."""
        return self._seq(seq_id).num_cached_tokens

    def ref_count(self, block_id: int) -> int:
        return self._ref_count[self._check_block(block_id)]

    def block_hash(self, block_id: int) -> bytes | None:
        """The chained hash the prefix cache holds this block under, or None."""
        return self._block_hash[self._check_block(block_id)]

    def is_evictable(self, block_id: int) -> bool:
        return self._check_block(block_id) in self._evictable

    def _check_block(self, block_id: int) -> int:
        block_id = as_int(block_id, "block id must be an int")
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block id must be in [0, {self.num_blocks}), got {block_id}")
        return block_id

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0, evictable cached ones included."""
        return len(self._free_block_ids) + len(self._evictable)

    @property
    def num_evictable_blocks(self) -> int:
        return len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences."""
        return self.num_used_blocks / self.num_blocks

    def slot(self, seq_id: SeqId, position: int) -> int:
        """Physical slot of token ``position``: ``B(position // B) * B + position % B``."""
        seq = self._seq(seq_id)
        if not 0 <= position < len(seq.token_ids):
            raise ValueError(f"position {position} is outside sequence {seq_id!r} of {len(seq.token_ids)} tokens")
        B = self.block_size
        return seq.block_table[position // B] * B + position % B

    def slot_mapping(self, seq_id: SeqId, start: int = 0, end: int | None = None) -> list[int]:
        """Physical slots of tokens ``start .. end-1`` (all of them by default)."""
        seq = self._seq(seq_id)
        end = len(seq.token_ids) if end is None else end
        if not 0 <= start <= end <= len(seq.token_ids):
            raise ValueError(f"token range [{start}, {end}) is outside sequence {seq_id!r} of {len(seq.token_ids)} tokens")
        B, table = self.block_size, seq.block_table
        return [table[t // B] * B + t % B for t in range(start, end)]

    def num_new_blocks_for(self, token_ids: Sequence[int]) -> int:
        """Free blocks an :meth:`allocate` of ``token_ids`` would consume now (cache hits counted)."""
        packed = _token_array(token_ids)
        _, _, num_needed, revived = self._plan(packed)
        return num_needed + revived

    def take_copies(self) -> list[tuple[int, int]]:
        """The ``(src_block, dst_block)`` copy-on-write copies made since the last call."""
        copies, self._copies = self._copies, []
        return copies

    @property
    def cache_when_computed(self) -> bool:
        """Publish full blocks only once :meth:`mark_computed` says their K/V is written.

        Off (the default), a block enters the cache the moment it is full: right for a caller that
        computes a whole prompt in the step that allocates it. A scheduler that spreads a prompt over
        several steps (chunked prefill) or preempts half-computed prompts turns it on, so that no
        other sequence can hit a block whose K/V does not exist yet.
        """
        return self._cache_when_computed

    @cache_when_computed.setter
    def cache_when_computed(self, value: bool) -> None:
        if self._seqs:
            raise ValueError("cache_when_computed can only change while the allocator holds no sequence")
        self._cache_when_computed = bool(value)

    def mark_computed(self, seq_id: SeqId, num_computed_tokens: int) -> None:
        """Record that the first ``num_computed_tokens`` tokens' K/V is written; publish their full blocks."""
        seq = self._seq(seq_id)
        if not isinstance(num_computed_tokens, int) or not 0 <= num_computed_tokens <= len(seq.token_ids):
            raise ValueError(
                f"num_computed_tokens must be an int in [0, {len(seq.token_ids)}] for sequence {seq_id!r}, "
                f"got {num_computed_tokens!r}"
            )
        self._publish(seq, num_computed_tokens // self.block_size)

    def _publish(self, seq: _Sequence, num_blocks: int) -> None:
        end = min(num_blocks, len(seq.block_hashes))
        for i in range(seq.num_published_blocks, end):
            self._cache_block(seq.block_table[i], seq.block_hashes[i])
        if end > seq.num_published_blocks:
            seq.num_published_blocks = end

    # -- internals -----------------------------------------------------------------------------
    def _plan(self, packed: array) -> tuple[list[bytes], list[int], int, int]:
        """What admitting ``packed`` takes: ``(hashes, hits, num_needed, revived)``.

        ``hashes``: the chained hash of every full block. ``hits``: cached blocks for the leading
        full blocks, stopping at the first miss -- at most ``ceil(n/B) - 1`` of them, since the
        prompt's last token is always computed, so its block is never a shared one.
        ``num_needed``: fresh blocks to take; ``revived``: hits that are evictable now (ref count 0),
        which leave the free pool too.
        """
        n = len(packed)
        hashes = _chain(packed, self.block_size)
        hits: list[int] = []
        if self.enable_prefix_caching:
            for h in hashes[: (n - 1) // self.block_size]:
                block_id = self._hash_to_block.get(h)
                if block_id is None:
                    break
                hits.append(block_id)
        revived = sum(1 for b in hits if self._ref_count[b] == 0)
        return hashes, hits, -(-n // self.block_size) - len(hits), revived

    def _take_free_block(self) -> int:
        """Pop a free block: never-cached ones first, else evict the least-recently-freed."""
        if self._free_block_ids:
            block_id = self._free_block_ids.popleft()
        else:
            block_id, _ = self._evictable.popitem(last=False)
            old_hash = self._block_hash[block_id]
            del self._hash_to_block[old_hash]
            self._block_hash[block_id] = None
            if self._subscribers:
                self._emit("evict", None, [block_id])
        self._ref_count[block_id] = 1
        return block_id

    def _cache_block(self, block_id: int, block_hash: bytes) -> None:
        """Publish a full block under its chained hash (first writer wins)."""
        if self.enable_prefix_caching and block_hash not in self._hash_to_block:
            self._hash_to_block[block_hash] = block_id
            self._block_hash[block_id] = block_hash

    def _release(self, block_id: int) -> None:
        self._ref_count[block_id] -= 1
        if self._ref_count[block_id] == 0:
            if self._block_hash[block_id] is not None:
                self._evictable[block_id] = None  # most recently freed: evicted last
            else:
                self._free_block_ids.append(block_id)

    def _new_seq_id(self, seq_id: SeqId) -> None:
        try:
            exists = seq_id in self._seqs
        except TypeError:
            raise TypeError(f"sequence id must be hashable, got {type(seq_id).__name__}") from None
        if exists:
            raise ValueError(f"sequence id {seq_id!r} already exists")

    # -- operations ----------------------------------------------------------------------------
    def allocate(self, seq_id: SeqId, token_ids: Sequence[int], *, record_stats: bool = True) -> list[int]:
        """Admit a prompt: reuse cached leading blocks, take fresh ones for the rest.

        Returns the block table, ``ceil(n/B)`` blocks. Raises :class:`OutOfBlocksError` (nothing
        changed) when the pool cannot supply the fresh blocks.
        """
        self._new_seq_id(seq_id)
        packed = _token_array(token_ids)
        n = len(packed)
        if n == 0:
            raise ValueError("cannot allocate an empty prompt: it needs at least one token")
        B = self.block_size
        hashes, hits, num_needed, revived = self._plan(packed)
        if num_needed > self.num_free_blocks - revived:
            raise OutOfBlocksError(
                f"sequence {seq_id!r} needs {num_needed} free blocks for {n} tokens "
                f"({len(hits)} cached), only {self.num_free_blocks - revived} available"
            )

        # Commit: nothing below can fail.
        for block_id in hits:
            if self._ref_count[block_id] == 0:
                del self._evictable[block_id]
            self._ref_count[block_id] += 1
        table = list(hits)
        for _ in range(num_needed):
            table.append(self._take_free_block())
        num_cached = len(hits) * B
        seq = _Sequence(packed.tolist(), table, hashes, num_cached, len(hits))
        self._seqs[seq_id] = seq
        if not self._cache_when_computed:
            self._publish(seq, len(hashes))
        if record_stats:  # off for a swap-in: the prompt was counted at its first admission
            self.stats.queried_tokens += n
            self.stats.hit_tokens += num_cached
        if self._subscribers:
            if hits:
                self._emit("cache_hit", seq_id, list(hits), num_cached)
            self._emit("allocate", seq_id, list(table), n)
        return list(table)

    def append(self, seq_id: SeqId, token_id: int) -> int:
        """Append one token; return its physical slot ``block_id * B + offset``.

        Takes a new block when the last one is full; copies a shared, partly filled last block
        first (copy-on-write, queued for :meth:`take_copies`).
        """
        try:
            seq = self._seqs[seq_id]
        except (KeyError, TypeError):
            seq = self._seq(seq_id)  # raises the readable error
        if type(token_id) is not int:
            token_id = as_int(token_id, "token id must be an int")
        if token_id < 0:
            raise ValueError(f"token ids must be non-negative, got {token_id}")
        if token_id >= 1 << 63:  # hashed as int64, like allocate's tokens
            raise ValueError(f"token ids must fit in 64 bits, got {token_id}")
        B = self.block_size
        tokens, table = seq.token_ids, seq.block_table
        offset = len(tokens) % B
        if offset == 0:
            if not self.num_free_blocks:
                raise OutOfBlocksError(f"no free block to append to sequence {seq_id!r}")
            block_id = self._take_free_block()
            table.append(block_id)
        else:
            block_id = table[-1]
            if self._ref_count[block_id] > 1:
                if not self.num_free_blocks:
                    raise OutOfBlocksError(f"no free block for copy-on-write in sequence {seq_id!r}")
                src = block_id
                block_id = self._take_free_block()
                self._ref_count[src] -= 1
                table[-1] = block_id
                self._copies.append((src, block_id))
                if self._subscribers:
                    self._emit("copy_on_write", seq_id, [src, block_id])
        tokens.append(token_id)
        if offset == B - 1:  # the block just became full: publish it
            parent = seq.block_hashes[-1] if seq.block_hashes else _ROOT_HASH
            block_hash = hash_block(parent, array("q", tokens[-B:]).tobytes())
            seq.block_hashes.append(block_hash)
            if not self._cache_when_computed:
                self._publish(seq, len(seq.block_hashes))
        slot = block_id * B + offset
        if self._subscribers:
            event = BlockEvent("append", seq_id, [block_id], 1, slot)
            for callback in self._subscribers:
                callback(event)
        return slot

    def fork(self, parent_id: SeqId, child_id: SeqId) -> list[int]:
        """A child that shares every block of its parent (parallel sampling, beam search)."""
        parent = self._seq(parent_id)
        self._new_seq_id(child_id)
        for block_id in parent.block_table:
            self._ref_count[block_id] += 1
        self._seqs[child_id] = _Sequence(
            list(parent.token_ids), list(parent.block_table), list(parent.block_hashes), parent.num_cached_tokens,
            parent.num_published_blocks,
        )
        if self._subscribers:
            self._emit("fork", child_id, list(parent.block_table), len(parent.token_ids))
        return list(parent.block_table)

    def free(self, seq_id: SeqId) -> None:
        """Release a sequence. Blocks go tail first, so a prompt's tail is evicted before its head."""
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        if self._subscribers:
            self._emit("free", seq_id, list(seq.block_table), len(seq.token_ids))

    def __repr__(self) -> str:
        return (
            f"BlockAllocator(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"free={self.num_free_blocks}, evictable={len(self._evictable)}, seqs={len(self._seqs)})"
        )

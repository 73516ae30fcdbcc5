"""What the scheduler needs of a memory manager: a ``typing.Protocol``.

The scheduler never asks what kind of manager it holds. The paged
:class:`~paged_edu.core.allocator.BlockAllocator` implements this protocol; so do the simulator's
contiguous reservations (:class:`paged_edu.sim.managers.ContiguousManager`, whose "blocks" are
single slots), and the radix-tree prefix cache :class:`~paged_edu.core.radix_cache.RadixAllocator`.

A manager's caching policy is its own constructor's business: a prefix cache that may publish a
block before its K/V exists (``BlockAllocator(..., cache_when_computed=False)``) cannot serve a
scheduler that computes prompts over several steps, and :class:`~paged_edu.sched.scheduler.Scheduler`
refuses it (see :func:`publishes_before_computed`).

A request with a cache salt is admitted with ``allocate(..., cache_salt=salt)`` and
ordered with ``num_cached_tokens_for(..., cache_salt=salt)``: the keywords :func:`cache_keys` gives,
none for an unsalted request, so a manager that knows nothing of salts still serves those.

**Counts, not token values.** Room for tokens is reserved by count: ``append_slots(seq_id,
num_tokens=1)`` returns the new tokens' slots and needs none of their ids; ``num_tokens(seq_id)``
counts the slots held, placeholders included. The ids arrive with ``mark_computed(seq_id,
num_computed_tokens, token_ids)``: ``token_ids`` are the ids of the last ``len(token_ids)`` computed
tokens (ending at ``num_computed_tokens``) and must reach back to the first id the manager lacks. A
full block is hashed once its ids are known and published once its K/V is computed too, since a
block is named by its tokens and may be hit only once its K/V exists. So the manager keeps no copy
of the sequence's tokens beyond those its prefix index has not taken yet. Prompts, whose ids are
known, keep ``allocate(seq_id, token_ids)``. vLLM v1 splits it the same way: ``KVCacheManager.allocate_slots(request,
num_new_tokens)`` (``vllm/v1/core/kv_cache_manager.py``) takes a count, and caches only
``min(num_computed_tokens + num_new_tokens, request.num_tokens)`` tokens -- those whose ids the
request holds -- through ``BlockPool.cache_full_blocks`` (``vllm/v1/core/block_pool.py``).

**Why: a slot for a token still being sampled.** The synchronous scheduler reserves, at step
``k + 1``, the slot of the token step ``k`` sampled, and passes its id with the ``mark_computed``
after the step that fills its block (a block's ids go together, one call per block). An overlapping scheduler (async scheduling) schedules step ``k + 1`` while step ``k`` still
runs on the GPU: it calls ``append_slots`` for a token that does not exist yet (a *placeholder*;
the runner feeds the sampled id from the device into step ``k + 1``'s input), and passes the id at
the ``mark_computed`` after step ``k + 1``, by which time step ``k``'s output has reached the host.
vLLM's async scheduler does the same (``vllm/v1/core/sched/async_scheduler.py``):
``_update_after_schedule`` adds one to ``request.num_output_placeholders`` for each token scheduled
before its id exists, and ``_update_request_with_output``, once the ids arrive, subtracts them and
calls ``kv_cache_manager.cache_blocks(request, request.num_computed_tokens -
request.num_output_placeholders)``: no block is cached past the last known token.

Plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Protocol, runtime_checkable

__all__ = [
    "CacheStats",
    "MemoryManager",
    "PrefixLookup",
    "block_table_versions_reader",
    "block_tables_reader",
    "cache_keys",
    "is_empty",
    "latest_table_version_reader",
    "publishes_before_computed",
]


@runtime_checkable
class CacheStats(Protocol):
    """Prefix-cache counters: the share of looked-up prompt tokens that hit the cache.

    ``record(num_tokens, num_hits, preempted=True)`` is how the scheduler counts a preempted
    sequence's re-admission apart (the manager records first admissions itself); see
    :class:`~paged_edu.core.block_pool.PrefixCacheStats`."""

    @property
    def hit_rate(self) -> float: ...

    def record(self, num_tokens: int, num_hits: int, preempted: bool = False) -> None: ...


@runtime_checkable
class MemoryManager(Protocol):
    """Block tables for sequences, over a pool of ``num_blocks`` blocks of ``block_size`` slots.

    Every call that cannot be served raises :class:`~paged_edu.core.block_pool.OutOfBlocksError`
    and changes nothing.
    """

    num_blocks: int
    block_size: int
    stats: CacheStats

    def allocate(self, seq_id: Hashable, token_ids: Sequence[int], *, record_stats: bool = True) -> list[int]:
        """A block table for a new sequence holding ``token_ids``; leading blocks may be cache hits."""

    def append_slots(self, seq_id: Hashable, num_tokens: int = 1) -> list[int]:
        """Slots for the next ``num_tokens`` tokens, ids not needed (may copy a shared last block on write)."""

    def num_tokens(self, seq_id: Hashable) -> int:
        """Slots the sequence holds: its tokens, placeholders (ids not known yet) included."""

    def fork(self, parent_id: Hashable, child_id: Hashable) -> list[int]:
        """A child sharing every block of its parent (parallel sampling, beams)."""

    def free(self, seq_id: Hashable) -> None:
        """Release a sequence's blocks."""

    def block_table(self, seq_id: Hashable) -> list[int]: ...

    def num_cached_tokens(self, seq_id: Hashable) -> int:
        """Leading tokens served by the cache at the last allocate (their K/V exists already)."""

    def mark_computed(self, seq_id: Hashable, num_computed_tokens: int, token_ids: Sequence[int] | None = None) -> None:
        """The first ``num_computed_tokens`` tokens' K/V is written, and ``token_ids`` are the ids of the
        tokens after those already known: full blocks whose ids are known and whose K/V is written may be
        shared. Publishing may swap a block for the cache's copy: read block tables after this call."""

    def take_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write ``(src_block, dst_block)`` copies made since the last call."""

    def __contains__(self, seq_id: object) -> bool: ...

    @property
    def num_free_blocks(self) -> int: ...

    @property
    def usage(self) -> float:
        """Share of the pool's blocks in use, in [0, 1]."""


@runtime_checkable
class PrefixLookup(Protocol):
    """What the longest-prefix-match policy (``Scheduler(policy="lpm")``) asks of a manager besides
    :class:`MemoryManager`: a look-up that changes nothing. A manager without one serves FCFS."""

    def num_cached_tokens_for(self, token_ids: Sequence[int]) -> int:
        """Leading tokens of ``token_ids`` an allocate now would hit; changes nothing."""


def cache_keys(seq) -> dict:
    """The prefix-cache keywords a sequence's ``allocate`` / ``num_cached_tokens_for`` take:
    ``{"cache_salt": salt}`` for a salted one, ``{}`` otherwise (also for anything that has no
    ``cache_salt``: the admission policy takes any object with ``seq_id`` and ``token_ids``)."""
    salt = getattr(seq, "cache_salt", None)
    return {} if salt is None else {"cache_salt": salt}


def block_tables_reader(manager: MemoryManager) -> Callable[[list], list[list[int]]]:
    """``seq_ids -> their block tables``: the manager's ``block_tables(seq_ids)`` where it has one (the
    paged and radix allocators: their own lists, read at once, no copies), else one ``block_table`` call
    per sequence -- a manager needs only :class:`MemoryManager` to serve the engine."""
    bulk = getattr(manager, "block_tables", None)
    if callable(bulk):
        return bulk
    block_table = manager.block_table
    return lambda seq_ids: [block_table(i) for i in seq_ids]


def block_table_versions_reader(manager: MemoryManager) -> Callable[[list], list[int]] | None:
    """``seq_ids -> their tables' version numbers`` where the manager keeps them (the paged and radix
    allocators: :meth:`~paged_edu.core.seq_lookup.SequenceLookup.block_table_versions`), else None:
    then a reader cannot tell an edited table from an unchanged one and must read every table whole."""
    versions = getattr(manager, "block_table_versions", None)
    return versions if callable(versions) else None


def latest_table_version_reader(manager: MemoryManager) -> Callable[[], int] | None:
    """``() -> the last table version handed out`` where the manager numbers its tables (the paged and
    radix allocators' ``latest_table_version``), else None: while it stands still, no table was made
    or edited in place since a reader last looked."""
    if not hasattr(manager, "latest_table_version") or block_table_versions_reader(manager) is None:
        return None
    return lambda: manager.latest_table_version


def publishes_before_computed(manager: MemoryManager) -> bool:
    """Would ``manager`` offer a full block to other sequences before its K/V is computed?

    True for a prefix-caching :class:`~paged_edu.core.allocator.BlockAllocator` built without
    ``cache_when_computed=True``; managers without a prefix cache never publish anything.
    """
    return bool(getattr(manager, "enable_prefix_caching", False)) and not getattr(manager, "cache_when_computed", True)


def is_empty(manager: MemoryManager) -> bool:
    """Does ``manager`` hold no sequence and cache nothing -- every block free *and* uncached?

    A prefix cache's evictable blocks count as free but keep their K/V's names: an engine that
    starts on such a manager would hit K/V that exists only in another engine's KV cache. Managers
    without a prefix cache have no ``num_cached_blocks`` and cache nothing.
    """
    return manager.num_free_blocks == manager.num_blocks and getattr(manager, "num_cached_blocks", 0) == 0

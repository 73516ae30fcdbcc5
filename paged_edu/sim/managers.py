"""Memory managers for the simulator: the paged allocator and contiguous reservations, one interface.

Both implement the scheduler's :class:`~paged_edu.sched.memory_manager.MemoryManager` protocol:

* :class:`PagedManager` -- the real :class:`~paged_edu.core.allocator.BlockAllocator` (blocks of ``B``
  slots, optional prefix caching), plus the bookkeeping the memory breakdown needs;
  :class:`RadixManager` the same over the radix-tree cache (``paged-radix``);
* :class:`ContiguousManager` -- one contiguous range per request, placed by first fit in one
  address space (:class:`~paged_edu.core.contiguous.ContiguousAllocator`), sized by a policy:
  ``max`` reserves ``L_max`` (FasterTransformer, Orca (Max)), ``pow2`` the prompt plus the next
  power of two of the output (Orca (Pow2)), ``oracle`` exactly what the request will store
  (Orca (Oracle)). Its "blocks" are single slots.

Both also answer the simulator's measurement calls: ``snapshot`` (allocated / token states /
reserved / internal fragmentation, in slots), ``free_for`` (is a waiting request kept out only by
external fragmentation?), ``sharing`` (blocks used vs. what the same tables would take unshared)
and ``last_free`` (tokens and slots each sequence held when it was last freed).
"""

from __future__ import annotations

from dataclasses import dataclass

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.block_pool import OutOfBlocksError, PrefixCacheStats
from paged_edu.core.seq_lookup import UnknownSequenceError
from paged_edu.core.radix_cache import RadixAllocator
from paged_edu.core.contiguous import ContiguousAllocator, FragmentationError
from paged_edu.core.host_memory import check_host_fits
from paged_edu.core.validation import FieldValueError, choice, integer
from paged_edu.sched.sequence import Sequence
from paged_edu.sim.arrivals import L_MAX

__all__ = [
    "BLOCK_SIZES",
    "MANAGERS",
    "ContiguousManager",
    "PagedManager",
    "RadixManager",
    "build_manager",
    "check_holds_a_block",
    "make_manager",
]

MANAGERS = ("contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged", "paged-prefix", "paged-radix")
# What runs when no manager is named: the paper's baselines and the paged cache with and without
# prefix caching (the seed's table); the radix tree is asked for by name (lesson 8 compares it).
DEFAULT_MANAGERS = MANAGERS[:-1]
BLOCK_SIZES = (8, 16, 32, 64, 128)


def _next_pow2(x: int) -> int:
    return 1 << (x - 1).bit_length()


class _PagedBookkeeping:
    """What the simulator's memory breakdown needs of a paged manager, over any block allocator."""

    kind = "paged"

    def _init_bookkeeping(self) -> None:
        self.final_len: dict[int, int] = {}  # seq_id -> tokens it will have stored at its end
        self.last_free: dict[int, tuple[int, int]] = {}  # seq_id -> (tokens, slots) at its last free
        self.fragmented: set[int] = set()  # paging never refuses a request for fragmentation

    def expect(self, seq_id: int, final_len: int, num_samples: int = 1, prompt_len: int | None = None) -> None:
        """Register the tokens a sequence will have stored at its end (for the memory breakdown)."""
        self.final_len[seq_id] = final_len

    def slots_to_admit(self, prompt_len: int, total_len: int, num_samples: int) -> int:
        """Slots a request needs free to be admitted: its samples share the prompt's blocks."""
        return num_samples * prompt_len

    def fork(self, parent_id, child_id):
        table = super().fork(parent_id, child_id)
        self.final_len[child_id] = self.final_len.get(parent_id, 0)
        return table

    def free(self, seq_id) -> None:
        if seq_id in self:  # record what the sequence held, then let the allocator free it
            self.last_free[seq_id] = (self.num_tokens(seq_id), len(self.block_table(seq_id)) * self.block_size)
        super().free(seq_id)

    @property
    def capacity_slots(self) -> int:
        return self.num_blocks * self.block_size

    def snapshot(self, running: list[Sequence]) -> tuple[int, int, int, int]:
        """``(allocated, token_states, reserved, internal_frag)`` slots now.

        Physical: a block shared by several sequences counts once. The partly filled last block of
        each sequence is split into slots it will still fill (reserved) and slots it never will.
        """
        B = self.block_size
        allocated = (self.num_blocks - self.num_free_blocks) * B
        # held[seq_id].num_tokens: num_tokens(seq_id) without its two calls (here and in sharing: the
        # beam benchmark's snapshots 0.86 -> 0.75 s, with _Meters' lengths summed over a list)
        final, held = self.final_len, self._seqs
        slack_total = reserved = 0
        for seq in running:
            n = held[seq.seq_id].num_tokens
            slack = -n % B
            if slack:
                slack_total += slack
                future = final.get(seq.seq_id, n) - n
                reserved += slack if future >= slack else max(future, 0)
        token_states = max(allocated - slack_total, 0)
        return allocated, token_states, reserved, allocated - token_states - reserved

    def free_for(self, seq: Sequence) -> tuple[int, bool]:
        """Free slots, and whether only fragmentation keeps ``seq`` out (never, for paging)."""
        return self.num_free_blocks * self.block_size, False

    def sharing(self, running: list[Sequence]) -> tuple[int, int]:
        """``(blocks in use, blocks the same tables would take without sharing)``."""
        B, held = self.block_size, self._seqs
        unshared = sum([-(-held[seq.seq_id].num_tokens // B) for seq in running])
        return self.num_blocks - self.num_free_blocks, unshared


class PagedManager(_PagedBookkeeping, BlockAllocator):
    """The paged allocator (chained-hash prefix cache), plus the simulator's bookkeeping."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        # The scheduler computes prompts over several steps: publish blocks once their K/V exists.
        super().__init__(num_blocks, block_size, enable_prefix_caching, cache_when_computed=True)
        self._init_bookkeeping()


class RadixManager(_PagedBookkeeping, RadixAllocator):
    """The radix-tree prefix cache (:mod:`~paged_edu.core.radix_cache`), plus the simulator's bookkeeping."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size, cache_when_computed=True)
        self._init_bookkeeping()


@dataclass(slots=True)
class _Range:
    """One contiguous reservation: ``1 + spare`` sub-ranges of ``cap`` slots for a family."""

    cap: int
    final: int  # tokens one sample will store by its end
    spare: int  # sub-ranges set aside for samples not forked yet
    members: int  # live sequences inside


@dataclass(slots=True)
class _Slot:
    key: int  # the _Range it lives in
    start: int  # its first slot
    cap: int
    final: int
    num_tokens: int


class ContiguousManager:
    """Contiguous reservations (first fit) behind the allocator methods the scheduler calls.

    ``policy`` is ``"max"`` (``L_max`` slots), ``"pow2"`` (the prompt plus the next power of two
    >= the output tokens it stores, at most ``L_max``: the paper's example reserves 32 for an output
    of 25) or ``"oracle"`` (exactly the tokens the sequence will store). The simulator
    tells the manager each sequence's final length and sample count with :meth:`expect` before it
    is admitted; a sequence that will still fork ``k`` samples reserves ``1 + k`` sub-ranges in one
    range, so that its forks cannot fail. A "block" here is one slot (``block_size = 1``).
    """

    kind = "contiguous"
    block_size = 1

    def __init__(self, num_slots: int, policy: str, max_seq_len: int = L_MAX) -> None:
        self.policy = choice("policy", policy, ("max", "pow2", "oracle"))
        self.max_seq_len = max_seq_len
        self.space = ContiguousAllocator(num_slots, max_seq_len)
        self.num_blocks = num_slots
        self._ranges: dict[int, _Range] = {}
        self._slots: dict[int, _Slot] = {}
        self._expected: dict[int, tuple[int, int]] = {}  # seq_id -> (final_len, prompt_len)
        self._pending: dict[int, int] = {}  # seq_id -> samples it will still fork
        self._next_key = 0
        self._reserved_slots = 0
        self.fragmented: set[int] = set()  # sequences refused although enough slots were free
        self.last_free: dict[int, tuple[int, int]] = {}  # seq_id -> (tokens, slots) at its last free
        self.stats = PrefixCacheStats()  # no prefix cache: never queried, never hit

    # -- policy --------------------------------------------------------------------------------
    def expect(self, seq_id: int, final_len: int, num_samples: int = 1, prompt_len: int | None = None) -> None:
        """Register the tokens a sequence will have stored at its end and its sample count."""
        self._expected[seq_id] = (final_len, final_len if prompt_len is None else prompt_len)
        self._pending[seq_id] = num_samples - 1

    def reserve_size(self, seq_id: int, num_tokens: int) -> int:
        """Slots one sample of ``seq_id`` reserves."""
        final, prompt = self._expected.get(seq_id, (num_tokens, num_tokens))
        return self.reserve_for(final, prompt, num_tokens)

    def reserve_for(self, final_len: int, prompt_len: int, num_tokens: int) -> int:
        """Slots one sample reserves when it holds ``num_tokens`` and will end with ``final_len``."""
        final, prompt = final_len, prompt_len
        if self.policy == "max":
            return max(self.max_seq_len, num_tokens)
        if self.policy == "oracle":
            return max(final, num_tokens)
        return max(num_tokens, min(self.max_seq_len, prompt + _next_pow2(max(final - prompt, 1))))

    def slots_to_admit(self, prompt_len: int, total_len: int, num_samples: int) -> int:
        """Slots a request needs free to be admitted: one sub-range per sample, as the policy sizes it."""
        return num_samples * max(total_len, self.reserve_for(total_len - 1, prompt_len, prompt_len))

    def admission_size(self, seq_id: int, num_tokens: int) -> int:
        """Slots an admission of ``seq_id`` asks for: one sub-range per sample still to come."""
        return self.reserve_size(seq_id, num_tokens) * (1 + self._pending.get(seq_id, 0))

    # -- the allocator subset the scheduler uses -----------------------------------------------
    def allocate(self, seq_id, token_ids, *, record_stats: bool = True, cache_salt: str | None = None) -> list[int]:
        if seq_id in self._slots:
            raise ValueError(f"sequence id {seq_id!r} already exists")
        n = len(token_ids)
        if n == 0:
            raise ValueError("cannot allocate an empty prompt: it needs at least one token")
        cap = self.reserve_size(seq_id, n)
        spare = self._pending.get(seq_id, 0)
        key = self._next_key
        try:
            size = cap * (1 + spare)
            start = self.space.reserve(key, size)
        except FragmentationError:
            self.fragmented.add(seq_id)
            raise
        self._next_key += 1
        final = self._expected.get(seq_id, (n,))[0]
        self._ranges[key] = _Range(cap, final, spare, 1)
        self._slots[seq_id] = _Slot(key, start, cap, final, n)
        self._reserved_slots += size
        return list(range(start, start + cap))

    def append_slots(self, seq_id, num_tokens: int = 1) -> list[int]:
        slot = self._slot(seq_id)
        if type(num_tokens) is not int:  # 1.0 and True are refused, as by the paged allocator
            num_tokens = integer("num_tokens", num_tokens, low=0)
        if slot.num_tokens + num_tokens > slot.cap:
            raise OutOfBlocksError(f"sequence {seq_id!r} is full: its reservation holds {slot.cap} tokens")
        slot.num_tokens += num_tokens
        return list(range(slot.start + slot.num_tokens - num_tokens, slot.start + slot.num_tokens))

    def num_tokens(self, seq_id) -> int:
        return self._slot(seq_id).num_tokens

    def fork(self, parent_id, child_id) -> list[int]:
        """The child takes a spare sub-range of its parent's reservation and copies the tokens."""
        parent = self._slot(parent_id)
        if child_id in self._slots:
            raise ValueError(f"sequence id {child_id!r} already exists")
        rng = self._ranges[parent.key]
        if rng.spare == 0:
            raise OutOfBlocksError(
                f"sequence {parent_id!r} has no spare reservation for another sample "
                "(declare num_samples with expect() before admission)"
            )
        rng.spare -= 1
        rng.members += 1
        self._pending[parent_id] = max(self._pending.get(parent_id, 0) - 1, 0)
        start = self.space.reservation(parent.key)[0] + (rng.spare + 1) * rng.cap
        self._slots[child_id] = _Slot(parent.key, start, parent.cap, parent.final, parent.num_tokens)
        self._expected[child_id] = self._expected.get(parent_id, (parent.final, parent.num_tokens))
        return list(range(start, start + parent.cap))

    def free(self, seq_id) -> None:
        slot = self._slot(seq_id)
        del self._slots[seq_id]
        self.last_free[seq_id] = (slot.num_tokens, slot.cap)
        rng = self._ranges[slot.key]
        rng.members -= 1
        if rng.members == 0:
            _, size = self.space.reservation(slot.key)
            self._reserved_slots -= size
            self.space.free(slot.key)
            del self._ranges[slot.key]

    def _slot(self, seq_id) -> _Slot:
        try:
            return self._slots[seq_id]
        except (KeyError, TypeError):
            raise UnknownSequenceError(f"unknown sequence id {seq_id!r}") from None

    def block_table(self, seq_id) -> list[int]:
        slot = self._slot(seq_id)
        return list(range(slot.start, slot.start + slot.cap))

    def num_cached_tokens(self, seq_id) -> int:
        self._slot(seq_id)
        return 0  # nothing is shared

    def num_cached_tokens_for(self, token_ids, *, cache_salt: str | None = None) -> int:
        return 0  # no prefix cache (so no salt to keep apart)

    def take_copies(self) -> list[tuple[int, int]]:
        return []

    def mark_computed(self, seq_id, num_computed_tokens: int, token_ids=None) -> None:
        """Nothing is shared, so nothing waits to be published and no id is kept (called for every
        token: B = 1)."""

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._slots

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self._reserved_slots

    @property
    def usage(self) -> float:
        return self._reserved_slots / self.num_blocks

    @property
    def capacity_slots(self) -> int:
        return self.num_blocks

    # -- measurements --------------------------------------------------------------------------
    def snapshot(self, running: list[Sequence]) -> tuple[int, int, int, int]:
        """``(allocated, token_states, reserved, internal_frag)`` slots now."""
        tokens = reserved = 0
        for slot in self._slots.values():
            tokens += slot.num_tokens
            if slot.final > slot.num_tokens:
                reserved += min(slot.cap, slot.final) - slot.num_tokens
        for rng in self._ranges.values():  # spare sub-ranges: samples still to fork will fill them
            if rng.spare:
                reserved += rng.spare * min(rng.cap, rng.final)
        allocated = self._reserved_slots
        return allocated, tokens, reserved, allocated - tokens - reserved

    def free_for(self, seq: Sequence) -> tuple[int, bool]:
        """Free slots, and whether only external fragmentation keeps ``seq`` from being admitted."""
        free = self.num_blocks - self._reserved_slots
        need = self.admission_size(seq.seq_id, seq.num_tokens)
        return free, need <= free and self.space.largest_free_gap < need

    def sharing(self, running: list[Sequence]) -> tuple[int, int]:
        return self._reserved_slots, self._reserved_slots


def make_manager(name: str, num_kv_slots: int, block_size: int = 16, max_seq_len: int = L_MAX):
    """Build a memory manager by name over ``num_kv_slots`` token slots, its arguments checked."""
    choice("manager", name, MANAGERS)
    num_kv_slots = integer("num_kv_slots", num_kv_slots, low=1)
    block_size = integer("block_size", block_size, low=1)
    check_holds_a_block(name, num_kv_slots, block_size)
    return build_manager(name, num_kv_slots, block_size, max_seq_len)


def check_holds_a_block(name: str, num_kv_slots: int, block_size: int) -> None:
    """A paged pool must hold at least one block, and the host its allocator (a contiguous one has no
    blocks, and keeps a list of gaps whatever its size)."""
    if name.startswith("contiguous"):
        return
    if num_kv_slots < block_size:
        raise FieldValueError("num_kv_slots", f"num_kv_slots={num_kv_slots} holds not even one block of {block_size}")
    num_blocks = num_kv_slots // block_size
    check_host_fits("num_kv_slots", num_blocks, block_size, given=f"num_kv_slots={num_kv_slots:,}")


def build_manager(name: str, num_kv_slots: int, block_size: int = 16, max_seq_len: int = L_MAX):
    """:func:`make_manager` without its checks, for arguments the caller checked (``simulate``'s prepare)."""
    if name.startswith("contiguous"):
        return ContiguousManager(num_kv_slots, name.split("-")[1], max_seq_len)
    if name == "paged-radix":
        return RadixManager(num_kv_slots // block_size, block_size)
    return PagedManager(num_kv_slots // block_size, block_size, name == "paged-prefix")

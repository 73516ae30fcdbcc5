"""The contiguous baseline: every request reserves one contiguous range of slots up front.

This is how servers managed the KV cache before PagedAttention (FasterTransformer, Orca): a request
gets ``reserve`` consecutive token slots -- ``L_max`` by default -- in one address space, placed by
first fit. The class keeps the books so the seed's three pathologies can be *measured*:

1. **reserved but idle** -- ``used_slots / reserved_slots`` (``eta_naive``) is small when requests
   end early;
2. **external fragmentation** -- :class:`FragmentationError` when an admission fails although the
   free slots add up to enough (no single gap is large enough);
3. **duplicated prompts** -- a shared system prompt is stored once per request
   (:meth:`ContiguousAllocator.duplicated_prompt_tokens`).

Plain Python, no torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from paged_edu.core.block_pool import OutOfBlocksError
from paged_edu.core.seq_lookup import UnknownSequenceError
from paged_edu.core.validation import integer, new_id, token_list
from paged_edu.core.validation import token_id as check_token_id

__all__ = ["ContiguousAllocator", "FragmentationError", "Reservation"]


class FragmentationError(OutOfBlocksError):
    """Enough slots are free in total, but no contiguous gap can hold the reservation."""


@dataclass(slots=True)
class Reservation:
    start: int  # first slot of the range
    size: int  # slots reserved
    token_ids: list[int]  # tokens stored so far, at start .. start + len - 1


class ContiguousAllocator:
    """First-fit contiguous reservations over ``num_slots`` token slots."""

    def __init__(self, num_slots: int, max_seq_len: int) -> None:
        self.num_slots = num_slots = integer("num_slots", num_slots, low=1)
        self.max_seq_len = integer("max_seq_len", max_seq_len, low=1)
        self._free: list[tuple[int, int]] = [(0, num_slots)]  # sorted (start, size) gaps
        self._seqs: dict[Hashable, Reservation] = {}

    # -- queries -------------------------------------------------------------------------------
    def _res(self, seq_id: Hashable) -> Reservation:
        try:
            return self._seqs[seq_id]
        except (KeyError, TypeError):
            raise UnknownSequenceError(f"unknown sequence id {seq_id!r}") from None

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    @property
    def seq_ids(self) -> list[Hashable]:
        return list(self._seqs)

    def num_tokens(self, seq_id: Hashable) -> int:
        """Tokens stored in the sequence's reservation."""
        return len(self._res(seq_id).token_ids)

    def reservation(self, seq_id: Hashable) -> tuple[int, int]:
        """``(start, size)`` of a sequence's range."""
        res = self._res(seq_id)
        return res.start, res.size

    @property
    def free_gaps(self) -> list[tuple[int, int]]:
        return list(self._free)

    @property
    def free_slots(self) -> int:
        return sum(size for _, size in self._free)

    @property
    def largest_free_gap(self) -> int:
        return max((size for _, size in self._free), default=0)

    @property
    def reserved_slots(self) -> int:
        return sum(res.size for res in self._seqs.values())

    @property
    def used_slots(self) -> int:
        """Slots holding a token."""
        return sum(len(res.token_ids) for res in self._seqs.values())

    @property
    def utilization(self) -> float:
        """Token slots used / slots reserved (``eta_naive`` over the live requests)."""
        reserved = self.reserved_slots
        return self.used_slots / reserved if reserved else 0.0

    def duplicated_prompt_tokens(self) -> int:
        """Tokens stored again that an earlier live request already holds as a common prefix.

        Paged prefix caching would store each of them once; here every request pays for its own copy.
        """
        seen: list[list[int]] = []
        duplicated = 0
        for res in self._seqs.values():
            best = 0
            for other in seen:
                n = 0
                for a, b in zip(res.token_ids, other):
                    if a != b:
                        break
                    n += 1
                best = max(best, n)
            duplicated += best
            seen.append(res.token_ids)
        return duplicated

    # -- operations ----------------------------------------------------------------------------
    def allocate(self, seq_id: Hashable, token_ids: Sequence[int], reserve: int | None = None) -> tuple[int, int]:
        """Reserve ``reserve`` (default ``L_max``) consecutive slots by first fit; store the prompt.

        Returns ``(start, size)``. Raises :class:`FragmentationError` when the free slots suffice
        in total but no gap does, :class:`OutOfBlocksError` when they do not suffice at all; in both
        cases nothing changes.
        """
        tokens = token_list("token_ids", token_ids)
        if not tokens:
            raise ValueError("cannot allocate an empty prompt: it needs at least one token")
        size = integer("reserve", self.max_seq_len if reserve is None else reserve, low=len(tokens))
        start = self.reserve(seq_id, size)
        self._seqs[seq_id].token_ids = tokens
        return start, size

    def reserve(self, seq_id: Hashable, size: int) -> int:
        """Reserve ``size`` consecutive slots for ``seq_id`` by first fit, holding no token yet.

        Returns the first slot. What a server without paging does at admission; the tokens come
        with :meth:`append` (or :meth:`allocate`, which stores a prompt too). Raises
        :class:`FragmentationError` / :class:`OutOfBlocksError` as :meth:`allocate`, changing nothing.
        """
        new_id("sequence id", seq_id, self._seqs)
        size = integer("size", size, low=1)
        for i, (start, gap) in enumerate(self._free):
            if gap >= size:
                if gap == size:
                    del self._free[i]
                else:
                    self._free[i] = (start + size, gap - size)
                self._seqs[seq_id] = Reservation(start, size, [])
                return start
        free = self.free_slots
        if free >= size:
            raise FragmentationError(
                f"sequence {seq_id!r} needs {size} contiguous slots: {free} are free in total "
                f"but the largest gap is {self.largest_free_gap} (external fragmentation)"
            )
        raise OutOfBlocksError(f"sequence {seq_id!r} needs {size} slots, only {free} are free")

    def append(self, seq_id: Hashable, token_id: int) -> int:
        """Store one more token inside the reservation; return its slot."""
        res = self._res(seq_id)
        token_id = check_token_id("token id", token_id)
        if len(res.token_ids) >= res.size:
            raise OutOfBlocksError(f"sequence {seq_id!r} is full: its reservation holds {res.size} tokens")
        res.token_ids.append(token_id)
        return res.start + len(res.token_ids) - 1

    def free(self, seq_id: Hashable) -> None:
        """Return the range to the free list, merging it with neighbouring gaps."""
        res = self._res(seq_id)
        del self._seqs[seq_id]
        starts = [s for s, _ in self._free]
        i = bisect.bisect_left(starts, res.start)
        start, size = res.start, res.size
        if i < len(self._free) and start + size == self._free[i][0]:  # merge with the next gap
            size += self._free.pop(i)[1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == start:  # and the previous one
            prev_start, prev_size = self._free.pop(i - 1)
            start, size, i = prev_start, prev_size + size, i - 1
        self._free.insert(i, (start, size))

    def __repr__(self) -> str:
        return (
            f"ContiguousAllocator(num_slots={self.num_slots}, max_seq_len={self.max_seq_len}, "
            f"reserved={self.reserved_slots}, used={self.used_slots}, free={self.free_slots})"
        )

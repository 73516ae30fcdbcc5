"""What every block allocator answers about its sequences, from ``self._seqs`` (id -> state with a
``block_table`` and ``num_tokens``, its reserved slots): shared by the hash-cache and radix-cache allocators."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import NoReturn

from paged_edu.core.validation import integer

__all__ = ["SequenceLookup", "UnknownSequenceError"]


class UnknownSequenceError(KeyError):
    """Raised for a sequence id the allocator does not hold."""

    def __str__(self) -> str:  # KeyError would repr() the message; we want it readable.
        return str(self.args[0]) if self.args else "unknown sequence id"


class SequenceLookup:
    """Lookups by sequence id: the state, membership, ids, block table and the slot of a token."""

    _seqs: dict

    def _seq(self, seq_id: Hashable):
        try:
            return self._seqs[seq_id]
        except (KeyError, TypeError):  # TypeError: an unhashable id
            raise UnknownSequenceError(f"unknown sequence id {seq_id!r}") from None

    def __contains__(self, seq_id: object) -> bool:
        try:
            return seq_id in self._seqs
        except TypeError:  # unhashable: certainly not held
            return False

    @property
    def seq_ids(self) -> list:
        return list(self._seqs)

    def block_table(self, seq_id: Hashable) -> list[int]:
        return list(self._seq(seq_id).block_table)

    def block_tables(self, seq_ids: Iterable[Hashable]) -> list[list[int]]:
        """The block tables of ``seq_ids``, in order: the allocator's own lists, not copies.

        What the engine reads every step to build its batch: one call, where :meth:`block_table` per
        sequence copies each list (at 512 running sequences of ~40 blocks, a tenth of the host's work
        a step). Read them at once and never change or keep them: the allocator's next call may.
        """
        seqs = self._seqs
        try:
            return [seqs[i].block_table for i in seq_ids]
        except (KeyError, TypeError):
            self._raise_first_unknown(seq_ids)

    def block_table_versions(self, seq_ids: Iterable[Hashable]) -> list[int]:
        """A number per sequence that changes whenever its block table changes *other than by new
        blocks at its end*: a new table (allocated, forked), a copy-on-write of its last block, a block
        swapped for the prefix cache's copy. No two tables ever share a number.

        What a reader that keeps copies of the tables needs (the engine's
        :class:`~paged_edu.engine.input_batch.InputBatch`): where the number is the one it copied,
        the copy is still right up to its length, and only blocks added since are new. (vLLM's
        scheduler tells its workers each step's ``new_block_ids`` for the same purpose.) The numbers
        come from one counter, ``latest_table_version`` its last: while it stands still, no table was
        made or edited, and a reader need not look at any version.
        """
        seqs = self._seqs
        try:
            return [seqs[i].table_version for i in seq_ids]
        except (KeyError, TypeError):
            self._raise_first_unknown(seq_ids)

    def _raise_first_unknown(self, seq_ids: Iterable[Hashable]) -> NoReturn:
        """The bulk readers' error, called while their KeyError or TypeError is handled:
        :class:`UnknownSequenceError` naming the first id not held (else that error again)."""
        for i in seq_ids:
            self._seq(i)
        raise  # the error being handled (seq_ids was an iterator, now spent)

    def slot(self, seq_id: Hashable, position: int) -> int:
        """Physical slot of token ``position``: ``B(position // B) * B + position % B``."""
        seq = self._seq(seq_id)
        position = integer("position", position)
        if not 0 <= position < seq.num_tokens:
            raise ValueError(f"position {position} is outside sequence {seq_id!r} of {seq.num_tokens} tokens")
        B = self.block_size
        return seq.block_table[position // B] * B + position % B

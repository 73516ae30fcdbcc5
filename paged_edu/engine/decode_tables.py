"""The decode steps' block tables, kept from one step to the next: a step writes only what changed.

What you will learn
-------------------
A decode step hands the attention kernel every running sequence's block table as one zero-padded
``(C, W)`` int32 matrix. Built from the allocator's lists each step, that reads every block id of
every sequence through Python -- at 384 sequences of ~18 blocks, ~7,000 ints a step -- although
from one step to the next a table hardly changes: a sequence gains one block every ``B`` tokens.

So :class:`DecodeTables` keeps one row per sequence in a matrix that lives across steps, with the
length and the *version* it copied (the allocator's
:meth:`~paged_edu.core.seq_lookup.SequenceLookup.block_table_versions`: a number that changes when
a table changes other than by growing -- a new table, a copy-on-write of its last block, a block
swapped for the prefix cache's copy). Each step, over the step's ``C`` sequences:

* a row whose version differs (or that is new) is **rewritten** from the allocator's list;
* a row whose table **grew** gets only its new blocks, ``table[copied:length]``;
* the step's rows are **gathered**, in the step's order, into the ``(C, W)`` matrix: one numpy
  indexing, ``W = max length``.

That is a few array operations over ``C`` numbers and one small write per changed row, instead of
one Python int per block. vLLM's GPU worker keeps its tables the same way
(``vllm/v1/worker/block_table.py``: a numpy row per request and its ``num_blocks_per_row``), told
each step's new blocks by the scheduler (``CachedRequestData.new_block_ids``,
``vllm/v1/core/sched/output.py``). A memory manager without version numbers (one that implements
only the :class:`~paged_edu.sched.memory_manager.MemoryManager` protocol) gets no
``DecodeTables``: the engine reads its tables whole every step, as before.

Invariant (what a test checks against a fresh pack after random allocator operations): a row
holds its sequence's table up to the copied length and zeros after it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np

__all__ = ["DecodeTables"]


class DecodeTables:
    """One persistent row per decoding sequence; :meth:`matrix` is the step's ``(C, W)`` tables.

    ``versions(seq_ids)`` is the manager's ``block_table_versions``. Rows of sequences that stopped
    decoding (finished, preempted, still in their prompt) are given back when rows run short.
    """

    def __init__(self, versions: Callable[[list], list[int]]) -> None:
        self._versions = versions
        self._row_of: dict[Hashable, int] = {}  # seq_id -> its row
        self._free_rows: list[int] = []
        self.table = np.zeros((0, 0), dtype=np.int32)  # (rows, width): each row a zero-padded table
        self._length = np.zeros(0, dtype=np.int64)  # (rows,) blocks copied into each row
        self._version = np.zeros(0, dtype=np.int64)  # (rows,) the version each row was copied at
        self.num_rows_written = 0  # rows rewritten or grown, over all steps (what the cache saves is the rest)

    def matrix(self, seq_ids: list, tables: Sequence[Sequence[int]], lens: np.ndarray) -> np.ndarray:
        """The zero-padded ``(C, max(lens))`` int32 tables of ``seq_ids`` (a new array: the rows may
        change next step). ``tables`` are the manager's lists for them, ``lens`` their lengths."""
        C = len(seq_ids)
        versions = np.fromiter(self._versions(seq_ids), dtype=np.int64, count=C)  # (C,)
        rows = self._rows(seq_ids)  # (C,)
        W = int(lens.max())
        if W > self.table.shape[1]:
            self._grow(self.table.shape[0], max(W, 2 * self.table.shape[1]))
        copied = self._length[rows]  # (C,)
        edited = (self._version[rows] != versions) | (copied > lens)  # (C,) rewrite these whole
        grown = ~edited & (copied < lens)  # (C,) append to these
        rewrite, extend = np.flatnonzero(edited).tolist(), np.flatnonzero(grown).tolist()
        for k in rewrite:
            row, n, old = rows[k], lens[k], copied[k]
            self.table[row, :n] = tables[k]
            self.table[row, n:old] = 0
        for k in extend:
            self.table[rows[k], copied[k] : lens[k]] = tables[k][copied[k] :]
        self.num_rows_written += len(rewrite) + len(extend)
        self._version[rows] = versions
        self._length[rows] = lens
        return self.table[rows, :W]  # (C, W)

    def _rows(self, seq_ids: list) -> np.ndarray:
        """Each sequence's row, ``(C,)``; a sequence new to the decode steps gets one (version -1:
        rewritten on first use)."""
        row_of = self._row_of
        try:
            return np.fromiter(map(row_of.__getitem__, seq_ids), dtype=np.int64, count=len(seq_ids))
        except KeyError:
            pass
        new = [i for i in seq_ids if i not in row_of]
        if len(new) > len(self._free_rows):  # give back the rows of sequences not in this step
            live = set(seq_ids)
            for i in [i for i in row_of if i not in live]:
                self._release(i)
        if len(new) > len(self._free_rows):
            rows, width = self.table.shape
            self._grow(max(rows + len(new) - len(self._free_rows), 2 * rows, 16), width)
        for i in new:
            row = row_of[i] = self._free_rows.pop()
            self._version[row] = -1
        return np.fromiter(map(row_of.__getitem__, seq_ids), dtype=np.int64, count=len(seq_ids))

    def _release(self, seq_id: Hashable) -> None:
        row = self._row_of.pop(seq_id)
        self.table[row, : self._length[row]] = 0  # rows are zero past their length
        self._length[row] = 0
        self._free_rows.append(row)

    def _grow(self, rows: int, width: int) -> None:
        old_rows, old_width = self.table.shape
        table = np.zeros((rows, width), dtype=np.int32)
        table[:old_rows, :old_width] = self.table
        self.table = table
        self._length = np.concatenate([self._length, np.zeros(rows - old_rows, dtype=np.int64)])
        self._version = np.concatenate([self._version, np.full(rows - old_rows, -1, dtype=np.int64)])
        self._free_rows.extend(range(rows - 1, old_rows - 1, -1))  # popped lowest first

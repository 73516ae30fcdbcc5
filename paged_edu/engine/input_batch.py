"""The persistent input batch: the decode batch kept from one step to the next, written where it changes.

What you will learn
-------------------
:func:`~paged_edu.engine.batch.pack_chunks` builds any step's :class:`~paged_edu.engine.batch.StepBatch`
from the scheduler's chunks -- reading every sequence's new token, position and block table through
Python. Yet from one decode step to the next almost nothing changes: the same sequences decode again,
each one position further on, with the token the last step drew, and a table gains a block every
``B`` tokens. So the runner keeps its decode batch across steps, as vLLM's worker does: its
``InputBatch`` (``vllm/v1/worker/gpu_input_batch.py``) holds a row per request -- tokens, computed
count, sampling parameters, block table -- in preallocated arrays, and each step writes only what the
scheduler says changed (``CachedRequestData.new_block_ids``, ``vllm/v1/core/sched/output.py``,
appended by ``BlockTable.append_row``).

:class:`InputBatch` keeps

* one **row** per decoding sequence (``row_of[seq_id]``): its block table ``table[r, :length[r]]``
  (zeros after) and the allocator's version number it was copied at, ``version[r]``
  (:meth:`~paged_edu.core.seq_lookup.SequenceLookup.block_table_versions`: it changes when a table is
  edited other than by growing -- a copy-on-write, a block swapped for the prefix cache's copy);
* the **last committed decode step**: its sequences in batch order, their rows and positions.

A decode step of the same sequences in the same order -- the steady state -- is built from these
alone (:meth:`InputBatch._next_decode`). In the worked examples ``B = 4`` and the last step decoded
``A`` at position 5 and ``C`` at 9 from rows ``[0, 2]``:

* ``positions = last + 1``: ``[6, 10]``;
* ``input_ids = -1 - arange(C)``: ``[-1, -2]``, placeholders for "token ``i`` the last step drew",
  still on the device, where the runner gathers them (one copy: async scheduling's placeholders, the
  same mechanism, :mod:`~paged_edu.engine.overlap`);
* a row grows only where its sequence needs a block it lacks (``positions // B + 1 > length``: about
  one sequence in ``B`` a step), read from the allocator for that row alone; rows are rewritten only
  where a version changed, looked at only when the allocator's ``latest_table_version`` moved;
* the table matrix is ``table[rows, :W]`` and the slots ``table[i, pos // B] * B + pos % B``: numpy
  over ``C`` numbers.

Any other step -- a sequence finished, joined or was preempted; a prompt chunk -- is packed from its
chunks (:meth:`InputBatch._pack`, the readable base), its decode rows kept the same way, and starts
the next steady state. A step's record becomes "the last committed step" only once the step commits
(:meth:`InputBatch.commit`: not undone, its tokens drawn); :meth:`InputBatch.rollback` forgets a step
that failed, so its retry is packed afresh.

What it buys, measured (``benchmarks/bench_host.py`` on this repository's 2-core CPU, medians of
runs interleaved with the commit before it): see the ``InputBatch`` entry of ``docs/benchmarks.md``.

Invariants (what ``tests/engine/test_input_batch.py`` checks against :func:`pack_chunks` of the
sequences after random steps): a row holds its sequence's table up to its length and zeros after it;
every batch equals the one packed afresh, its placeholders read as the last step's tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from paged_edu.engine.batch import StepBatch, pack_chunks, pack_decodes, token_slice

__all__ = ["InputBatch"]


@dataclass(slots=True)
class _DecodeStep:
    """A pure-decode step as the batch built it: who, in which rows, at which positions."""

    seqs: list  # (C,) the scheduler's Sequence objects, in batch order
    rows: np.ndarray  # (C,) int64: each one's row of the kept tables
    positions: np.ndarray  # (C,) int64: the position each one computed


class InputBatch:
    """The runner's decode batch, kept across steps (module docstring). Each step: :meth:`prepare`, then
    :meth:`launched` with the tokens drawn, then :meth:`commit` -- or :meth:`rollback` if it failed.

    ``block_tables(seq_ids)`` / ``versions(seq_ids)`` / ``latest_version()`` read the memory manager
    (:mod:`paged_edu.sched.memory_manager`'s readers). Without version numbers (a manager with the
    protocol only, lesson 5's) nothing is kept: every step is packed from the manager's lists.
    """

    def __init__(
        self,
        block_size: int,
        block_tables: Callable[[list], list[list[int]]],
        versions: Callable[[list], list[int]] | None = None,
        latest_version: Callable[[], int] | None = None,
    ) -> None:
        self.block_size = block_size
        self._block_tables = block_tables
        self._versions = versions
        self._latest_version = latest_version
        self._row_of: dict[Hashable, int] = {}  # seq_id -> its row
        self._free_rows: list[int] = []
        self.table = np.zeros((0, 0), dtype=np.int32)  # (rows, width): each row a zero-padded block table
        self._length = np.zeros(0, dtype=np.int64)  # (rows,) blocks copied into each row
        self._version = np.zeros(0, dtype=np.int64)  # (rows,) the version each row was copied at
        self._checked_version = -1  # the allocator's latest version when the last step's rows were checked
        self._launched: _DecodeStep | None = None  # the step prepared last, until it commits
        self._committed: _DecodeStep | None = None  # the last decode step that committed
        self.tokens = None  # (N,) the last committed step's tokens, on the device: what placeholders -1 - i read
        self._launched_tokens = None
        self.num_rows_written = 0  # rows rewritten or grown, over all steps (what keeping saves is the rest)
        self.num_steady_steps = 0  # decode steps built from the kept arrays alone

    # -- one step ---------------------------------------------------------------------------------
    def prepare(self, scheduled: Sequence, samples_one_each: bool) -> StepBatch:
        """The step's :class:`StepBatch` from the scheduler's ``ScheduledSeq`` s. ``samples_one_each``:
        every chunk draws exactly one token, in order (the sampling plan says so) -- a pure-decode step
        that the next one can continue from."""
        seqs = [item.seq for item in scheduled]  # the one pass over the step's sequences
        last = self._committed
        if last is not None and seqs == last.seqs and self._continues(scheduled, last):
            batch, rows = self._next_decode(last), last.rows
            self.num_steady_steps += 1
        else:
            batch, rows = self._pack(scheduled, seqs)
        keep = rows is not None and samples_one_each
        self._launched = _DecodeStep(seqs, rows, batch.positions) if keep else None
        self._launched_tokens = None
        return batch

    def launched(self, tokens) -> None:
        """The prepared step's tokens were drawn (``(N,)`` on the device, or None if it drew none)."""
        self._launched_tokens = tokens

    def commit(self) -> None:
        """The prepared step was not undone: the next step continues from it."""
        self._committed, self._launched = self._launched, None
        self.tokens, self._launched_tokens = self._launched_tokens, None

    def rollback(self) -> None:
        """The prepared step was undone: forget it (and the last committed one: its tokens on the device
        may have been overwritten by the failed step's; the retry is packed afresh)."""
        self._launched = self._committed = None
        self._launched_tokens = None

    # -- the steady state: the last step's sequences again --------------------------------------------
    @staticmethod
    def _continues(scheduled: Sequence, last: _DecodeStep) -> bool:
        """The same sequences, each one token further: true whenever the last step committed (each of
        them then has exactly its drawn token left to compute); checked on both ends for the price of two."""
        return (
            scheduled[0].start == last.positions[0] + 1
            and scheduled[-1].start == last.positions[-1] + 1
            and scheduled[0].num_new_tokens == scheduled[-1].num_new_tokens == 1
        )

    def _next_decode(self, last: _DecodeStep) -> StepBatch:
        """The step after ``last`` over the same rows (module docstring's example in the comments)."""
        rows, B = last.rows, self.block_size  # E.g. [0, 2]
        positions = last.positions + 1  # (C,) E.g. [5, 9] -> [6, 10]
        self._refresh(last.seqs, rows, positions // B + 1)  # E.g. need [2, 3] blocks
        W = int(self._length[rows].max())
        # E.g. ids [-1, -2]: token 0 and token 1 of the last step's draw
        placeholders = np.arange(-1, -1 - len(rows), -1, dtype=np.int64)
        return pack_decodes(placeholders, positions, self.table[rows, :W], B)

    def _refresh(self, seqs: list, rows: np.ndarray, need: np.ndarray) -> None:
        """Bring the step's rows up to date: rewrite the edited ones (looked for only when the allocator
        handed out a version since they were last checked), then append to those that need more blocks."""
        latest = self._latest_version() if self._latest_version is not None else None
        if latest is None or latest != self._checked_version:  # a table was made or edited: find which of ours
            seq_ids = [seq.seq_id for seq in seqs]
            versions = np.fromiter(self._versions(seq_ids), dtype=np.int64, count=len(seq_ids))  # (C,)
            edited = np.flatnonzero(self._version[rows] != versions).tolist()
            for k, table in zip(edited, self._block_tables([seq_ids[k] for k in edited])):
                self._write(rows[k], table, 0)
            self._version[rows] = versions
            self._checked_version = latest
        short = np.flatnonzero(self._length[rows] < need)  # E.g. C at position 12 needs a 4th block: [1]
        if not short.size:
            return
        tables = self._block_tables([seqs[k].seq_id for k in short.tolist()])
        r, copied = rows[short], self._length[rows[short]]  # E.g. row [2], 3 blocks copied
        lens = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))  # E.g. [4]
        if (lens == copied + 1).all() and lens.max() <= self.table.shape[1]:  # one new block each (the usual)
            self.table[r, copied] = [t[-1] for t in tables]  # E.g. table[2, 3] = C's new block: its new_block_ids
            self._length[r] = lens
            self.num_rows_written += len(tables)
            return
        for k, table in zip(short.tolist(), tables):
            self._write(rows[k], table, int(self._length[rows[k]]))

    # -- any other step: packed from the chunks ---------------------------------------------------------
    def _pack(self, scheduled: Sequence, seqs: list) -> tuple[StepBatch, np.ndarray | None]:
        """:func:`pack_chunks` of the chunks; a pure-decode step's tables from the kept rows. Returns the
        batch and, for a pure-decode step with kept rows, its rows."""
        token_ids: list[int] = []
        for item in scheduled:  # each chunk's new tokens (placeholders -1 - j where async scheduling holds them)
            seq, s, n = item.seq, item.start, item.num_new_tokens
            p = len(seq.prompt_token_ids)
            if n == 1:
                token_ids.append(seq.output_token_ids[s - p] if s >= p else seq.prompt_token_ids[s])
            else:
                token_ids += token_slice(seq, s, s + n)
        seq_ids = [seq.seq_id for seq in seqs]
        counts = [item.num_new_tokens for item in scheduled]
        starts = [item.start for item in scheduled]
        tables = self._block_tables(seq_ids)
        if self._versions is None or max(counts) > 1:  # nothing kept, or a step with prompt chunks
            return pack_chunks(token_ids, starts, counts, tables, self.block_size), None
        rows = self._rows(seq_ids)
        matrix = lambda tables, lens: self._matrix(seq_ids, rows, tables, lens)  # noqa: E731
        return pack_chunks(token_ids, starts, counts, tables, self.block_size, matrix), rows

    def _matrix(self, seq_ids: list, rows: np.ndarray, tables: Sequence[Sequence[int]], lens: np.ndarray) -> np.ndarray:
        """The zero-padded ``(C, max(lens))`` int32 tables of ``seq_ids`` from their kept rows (a new
        array: the rows may change next step): every row checked against its version, rewritten if
        edited (or new), grown if its table grew. ``tables`` are the manager's lists, ``lens`` their lengths."""
        # (read before the versions: an edit after this read moves the number again, and is caught next step)
        self._checked_version = self._latest_version() if self._latest_version is not None else None
        C = len(seq_ids)
        versions = np.fromiter(self._versions(seq_ids), dtype=np.int64, count=C)  # (C,)
        copied = self._length[rows]  # (C,)
        edited = (self._version[rows] != versions) | (copied > lens)  # (C,) rewrite these whole
        grown = ~edited & (copied < lens)  # (C,) append to these
        for k in np.flatnonzero(edited).tolist():
            self._write(rows[k], tables[k], 0)
        for k in np.flatnonzero(grown).tolist():
            self._write(rows[k], tables[k], int(copied[k]))
        self._version[rows] = versions
        return self.table[rows, : int(lens.max())]  # (C, W)

    # -- rows -------------------------------------------------------------------------------------------
    def _write(self, row: int, table: Sequence[int], start: int) -> None:
        """``table[start:]`` into ``row`` (the first ``start`` blocks are already there); zeros past it."""
        n, old = len(table), int(self._length[row])
        if n > self.table.shape[1]:
            self._grow(self.table.shape[0], max(n, 2 * self.table.shape[1]))
        self.table[row, start:n] = table[start:]
        self.table[row, n:old] = 0
        self._length[row] = n
        self.num_rows_written += 1

    def _rows(self, seq_ids: list) -> np.ndarray:
        """Each sequence's row, ``(C,)``; a sequence new to the decode steps gets one (version -1: written
        on first use)."""
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

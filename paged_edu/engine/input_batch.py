"""The persistent input batch: each sequence's decode state kept in rows across steps, written where it changes.

What you will learn
-------------------
:func:`~paged_edu.engine.batch.pack_chunks` builds any step's :class:`~paged_edu.engine.batch.StepBatch`
from the scheduler's chunks -- reading every sequence's new token, position and block table through
Python. Yet from one decode step to the next almost nothing changes: most sequences decode again, each
one position further on, with the token the last step drew for it, and a table gains a block every
``B`` tokens. So the runner keeps the sequences' state across steps, as vLLM's worker does: its
``InputBatch`` (``vllm/v1/worker/gpu_input_batch.py``) holds a row per request -- tokens, computed count,
sampling parameters, block table -- in preallocated arrays, and each step writes only what the
scheduler says changed (``CachedRequestData.new_block_ids``, ``vllm/v1/core/sched/output.py``, appended
by ``BlockTable.append_row``).

:class:`InputBatch` keeps one **row** per sequence (``row_of[seq_id]``), and in it

* ``table[r, :length[r]]`` -- its block table (zeros after), copied at the allocator's version number
  ``version[r]`` (:meth:`~paged_edu.core.seq_lookup.SequenceLookup.block_table_versions`: it changes when
  a table is edited other than by growing -- a copy-on-write, a block swapped for the prefix cache's copy);
* ``drawn[r]`` -- which token of the last committed step's draw is the sequence's (``-1``: it drew none),
  and ``next_position[r]`` -- the position that token takes.

A decode step is then built row-wise (:meth:`InputBatch._decode`). In the worked examples ``B = 4``;
the last step drew ``[t0, t1, t2]`` for ``A``, ``C`` and ``D`` (rows ``[0, 2, 3]``, their tokens
taking positions ``[6, 10, 4]``); ``D`` finished, and a new sequence ``E`` decodes its prompt's last
token (at 7, row 1):

* ``rows = row_of[seq_ids]``: ``[0, 2, 1]`` (``A``, ``C``, ``E``); ``j = drawn[rows]``: ``[0, 1, -1]``;
* a row that drew (``j >= 0``) continues: ``position = next_position[r]``, its token ``t_j`` -- read
  on the host once the step's tokens are back (the synchronous engine), else the placeholder
  ``-1 - j``, gathered on the device by the runner (async scheduling's placeholders, the same
  mechanism: :mod:`~paged_edu.engine.overlap`): positions ``[6, 10, .]``, ids ``[t0, t1, .]``;
* a row that did not (``E``) is read from its chunk and sequence: the only per-sequence Python,
  one sequence per change: positions ``[6, 10, 7]``;
* a table gains only the blocks its sequence lacks (``position // B + 1 > length``: ``C`` at 10 needs
  a third block; about one sequence in ``B`` a step), rows are rewritten only where a version changed,
  looked at only when the allocator's ``latest_table_version`` moved;
* the table matrix is ``table[rows, :W]`` and the slots ``table[i, pos // B] * B + pos % B``: numpy
  over ``C`` numbers.

A step with prompt chunks is packed from its chunks (the readable base, :func:`pack_chunks`); its
draws are recorded all the same, so the decode step after it continues from it. A step's draws count
as "the last committed step" only once the step commits (:meth:`InputBatch.commit`: not undone);
:meth:`InputBatch.rollback` forgets them, so a retried step reads its sequences afresh.

What it buys, measured (``bench_host`` at 256 running on this repository's 2-core CPU, medians of 5
runs interleaved with the commit before, ``benchmarks/records/cpu/host_ab_input_batch.json``): the
prepare phase 0.191 -> 0.114 ms a step, the step 0.673 -> 0.568 ms (CUDA-graph path); on the
512-request schedule at ~256 running 0.860 -> 0.731 ms a decode step, 0.961 -> 0.923 with async
scheduling (whose placeholders still cost a device gather a step).

Invariants (what ``tests/engine/test_input_batch.py`` checks against the per-token definition of the
batch after random steps of a real scheduler): a row holds its sequence's table up to its length and
zeros after it; every batch equals the one defined from the sequences, its placeholders read as the
last committed step's tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np

from paged_edu.engine.batch import StepBatch, pack_chunks, pack_decodes, pack_one_chunk, token_slice

__all__ = ["InputBatch"]

_NO_ROWS = np.zeros(0, dtype=np.int64)  # (0,) read-only: no rows
_NO_ROWS.flags.writeable = False


def _token(seq, s: int) -> int:
    """The token a one-token chunk computes: the sequence's token at its start ``s`` (a placeholder
    ``-1 - j`` where async scheduling holds the step in flight's)."""
    p = len(seq.prompt_token_ids)
    return seq.output_token_ids[s - p] if s >= p else seq.prompt_token_ids[s]


class InputBatch:
    """The runner's sequences' state, kept across steps (module docstring). Each step: :meth:`prepare`;
    :meth:`launched` with the tokens drawn (and :meth:`read` once they are on the host); then
    :meth:`commit` -- or :meth:`rollback` if the step failed.

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
        self.block_tables = block_tables  # the manager's reader: seq_ids -> their tables (its own lists)
        self._versions = versions
        self._latest_version = latest_version
        self._row_of: dict[Hashable, int] = {}  # seq_id -> its row
        self._free_rows: list[int] = []
        self.table = np.zeros((0, 0), dtype=np.int32)  # (rows, width): each row a zero-padded block table
        self._length = np.zeros(0, dtype=np.int64)  # (rows,) blocks copied into each row
        self._version = np.zeros(0, dtype=np.int64)  # (rows,) the version each row was copied at (-1: none)
        self._checked = np.zeros(0, dtype=np.int64)  # (rows,) the allocator's latest version when it was checked
        self._drawn = np.zeros(0, dtype=np.int64)  # (rows,) its token's index in the last committed draw, or -1
        self._next_position = np.zeros(0, dtype=np.int64)  # (rows,) the position that token takes
        self._drawn_rows = _NO_ROWS  # the rows whose drawn[r] is set (the last commit's)
        self._last: tuple[list, np.ndarray] | None = None  # the last decode step's (sequences, rows)
        self._launched: tuple[np.ndarray, np.ndarray] | None = None  # the prepared step's (rows, positions) drawn
        self._launched_tokens = self._launched_host = None
        self.tokens = None  # (N,) the last committed step's draw, on the device: what placeholders -1 - j read
        self.host_tokens: np.ndarray | None = None  # the same on the host, once read (None until then)
        self.num_rows_written = 0  # rows rewritten or grown, over all steps (what keeping saves is the rest)
        self.num_decode_steps = 0  # steps built row-wise (the others packed from their chunks)
        self.num_rows_read = 0  # rows of those read from their chunk: the sequences that did not continue

    # -- one step ---------------------------------------------------------------------------------
    def prepare(self, sched, drawn: Sequence[int] | None) -> StepBatch:
        """The step's :class:`StepBatch` from the scheduler's output ``sched``, read as its columns
        (``chunk_seqs()``, ``chunk_starts()``, ...: a decode step makes no ``ScheduledSeq``). ``drawn``:
        the chunk of each token the step will draw (the sampling plan's ``chunks``), or None when its
        tokens do not map one to a chunk (a parallel-sampling fork): the next step then continues from none."""
        seqs, starts = sched.chunk_seqs(), sched.chunk_starts()  # the one pass over the step's sequences
        # A step with a chunk of several tokens (a prompt's) is packed: not tried row-wise first, which
        # found that out only after looking its rows up (~20 us of a lone prompt's step, bench_host --workload lone)
        row_wise = self._versions is not None and all(item.num_new_tokens == 1 for item in sched.chunks)
        batch, rows = self._decode(sched, seqs, starts) if row_wise else (None, None)
        if batch is None:
            batch, rows = self._pack(sched, seqs, starts)
        self._launched = None
        if rows is not None and drawn is not None and len(drawn):
            # (C,) where each chunk's next token goes (a decode step's logits_rows are 0 .. C-1: no gather)
            ends = batch.positions + 1 if batch.is_pure_decode else batch.positions[batch.logits_rows] + 1
            if len(drawn) == len(seqs):  # one token a chunk, in order (without forks: the usual step)
                self._launched = (rows, ends)
            else:  # E.g. a prompt chunk in the middle of its prompt draws none: drawn [0, 2]
                chunks = np.asarray(drawn, dtype=np.int64)  # (N,)
                self._launched = (rows[chunks], ends[chunks])
        self._launched_tokens = self._launched_host = None
        return batch

    def launched(self, tokens) -> None:
        """The prepared step's tokens were drawn (``(N,)`` on the device, or None if it drew none)."""
        self._launched_tokens = tokens

    def read(self, tokens, host: np.ndarray) -> None:
        """A step's ``tokens`` reached the host as ``host``: the prepared step's, or the last committed
        one's (async scheduling reads a step after it launched the next), are then resolved on the host."""
        if tokens is None:
            return
        if tokens is self._launched_tokens:
            self._launched_host = host.copy()
        elif tokens is self.tokens:
            self.host_tokens = host.copy()

    def commit(self) -> None:
        """The prepared step was not undone: its draws are the ones the next step continues from."""
        # E.g. rows [0, 2, 3] drew tokens 0, 1, 2 for positions [6, 10, 4]
        rows, positions = self._launched if self._launched is not None else (_NO_ROWS, None)
        if rows is not self._drawn_rows:  # (the same rows, in the same order, hold that j already: the usual step)
            self._drawn[self._drawn_rows] = -1
            self._drawn[rows] = np.arange(len(rows))
            self._drawn_rows = rows
        if positions is not None:
            self._next_position[rows] = positions
        self._launched = None
        self.tokens, self.host_tokens = self._launched_tokens, self._launched_host
        self._launched_tokens = self._launched_host = None

    def rollback(self) -> None:
        """The prepared step was undone: forget its draws and the last committed step's (their tokens on
        the device may have been overwritten by the failed step's): the retry reads every sequence."""
        self._drawn[self._drawn_rows] = -1
        self._drawn_rows = _NO_ROWS
        self._launched = self._last = None
        self.host_tokens = self._launched_tokens = self._launched_host = None
        # (self.tokens stays: async scheduling's step in flight holds placeholders that read it)

    def release(self) -> None:
        """Forget every device tensor (``Engine.close``): the draws' tokens may be views of a captured
        graph's output, which would keep the graph's memory pool alive."""
        self.rollback()
        self.tokens = None

    # -- a decode step, row-wise ------------------------------------------------------------------------
    def _decode(self, sched, seqs: list, starts: list[int]) -> tuple[StepBatch | None, np.ndarray | None]:
        """The step built from the rows (module docstring's example in the comments), or ``(None, None)``
        when it has a prompt chunk (it is packed)."""
        B = self.block_size
        if self._last is not None and seqs == self._last[0]:  # the same sequences in the same order
            rows = self._last[1]
        else:
            rows = self._rows([seq.seq_id for seq in seqs])  # E.g. [0, 2, 1]
        positions = self._next_position[rows]  # (C,) E.g. [6, 10, x]: right where j >= 0
        host = self.host_tokens
        if rows is self._drawn_rows:  # the last step's sequences, in its order, each drew: j = [0, 1, .., C-1]
            # Speed: the usual decode step reads no j -- its ids are the last draw itself, and no row is
            # new: 6 numpy calls fewer; with commit's skip, prepare 0.118 -> 0.100 ms a step (bench_host --graph-path,
            # 256 running, this 2-core CPU, medians of 6 interleaved runs), the step 0.460 -> 0.419 ms
            new = []
            if positions[0] != starts[0] or positions[-1] != starts[-1]:
                return None, None  # (never, when the last step committed: as below)
            ids = host if host is not None else -1 - np.arange(len(rows))  # (C,) [t0, t1, ..] or [-1, -2, ..]
        else:
            j = self._drawn[rows]  # (C,) E.g. [0, 1, -1]
            new = np.flatnonzero(j < 0).tolist()  # E.g. [2]: E, read from its chunk
            if new:
                counts = sched.chunk_counts()
                if any(counts[k] != 1 for k in new):
                    return None, None  # a prompt chunk: packed
                positions[new] = [starts[k] for k in new]  # E.g. [6, 10, 7]
            ends = (0, -1) if len(new) < len(rows) else ()  # the first and last rows, if they continue
            if any(j[k] >= 0 and positions[k] != starts[k] for k in ends):
                return None, None  # (never, when the last step committed: a check for two attribute reads)
            ids = host[j] if host is not None else -1 - j  # (C,) E.g. [t0, t1, .]; or placeholders [-1, -2, .]
            if new:
                ids[new] = [_token(seqs[k], starts[k]) for k in new]
        self._refresh(seqs, rows, positions // B + 1)  # E.g. need [2, 3, 2] blocks
        W = int(self._length[rows].max())
        self._last = (seqs, rows)
        self.num_decode_steps += 1
        self.num_rows_read += len(new)
        return pack_decodes(ids, positions, self.table[rows, :W], B), rows

    def _refresh(self, seqs: list, rows: np.ndarray, need: np.ndarray) -> None:
        """Bring the step's rows up to date: rewrite the edited and the new ones -- looked for only among
        the rows checked before the allocator handed out its latest version number (none, while it
        stands still) -- then give the rows that lack blocks their new block ids."""
        if self._latest_version is None:  # a manager that numbers its tables but not its edits: every row
            latest, stale = -1, np.arange(len(rows))
        else:
            latest = self._latest_version()
            stale = np.flatnonzero(self._checked[rows] != latest)  # (S,) rows a table edit may have missed
        if stale.size:
            r = rows[stale]
            seq_ids = [seqs[k].seq_id for k in stale.tolist()]
            versions = np.fromiter(self._versions(seq_ids), dtype=np.int64, count=len(seq_ids))  # (S,)
            edited = np.flatnonzero(self._version[r] != versions).tolist()
            for k, table in zip(edited, self.block_tables([seq_ids[k] for k in edited])):
                self._write(r[k], table, 0)
            self._version[r] = versions
            self._checked[r] = latest
        short = np.flatnonzero(self._length[rows] < need)  # E.g. C at 10 needs a third block: [1]
        if not short.size:
            return
        tables = self.block_tables([seqs[k].seq_id for k in short.tolist()])
        r, copied = rows[short], self._length[rows[short]]  # E.g. row [2], 2 blocks copied
        lens = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))  # E.g. [3]
        if (lens == copied + 1).all() and lens.max() <= self.table.shape[1]:  # one new block each (the usual)
            self.table[r, copied] = [t[-1] for t in tables]  # E.g. table[2, 2] = C's new block: its new_block_ids
            self._length[r] = lens
            self.num_rows_written += len(tables)
            return
        for k, table in zip(short.tolist(), tables):
            self._write(rows[k], table, int(self._length[rows[k]]))

    # -- any other step: packed from the chunks ---------------------------------------------------------
    def _pack(self, sched, seqs: list, starts: list[int]) -> tuple[StepBatch, np.ndarray | None]:
        """:func:`pack_chunks` of the chunks, from the sequences and the manager's lists. Returns the batch
        and its sequences' rows (None without version numbers: nothing is kept)."""
        counts = sched.chunk_counts()
        token_ids: list[int] = []
        for seq, s, n in zip(seqs, starts, counts):  # each chunk's new tokens (placeholders -1 - j: async scheduling's)
            if n == 1:
                token_ids.append(_token(seq, s))
            else:
                token_ids += token_slice(seq, s, s + n)
        seq_ids = [seq.seq_id for seq in seqs]
        tables = self.block_tables(seq_ids)
        if len(counts) == 1 and counts[0] > 1:  # a lone prompt chunk (an idle engine's request): the short path
            batch = pack_one_chunk(token_ids, starts[0], counts[0], tables[0], self.block_size)
        else:
            batch = pack_chunks(token_ids, starts, counts, tables, self.block_size)
        return batch, (None if self._versions is None else self._rows(seq_ids))

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
        """Each sequence's row, ``(C,)``; a sequence new here gets one (version -1: written on first use,
        drawn -1: read from its chunk)."""
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
            self._version[row] = self._drawn[row] = self._checked[row] = -1
        return np.fromiter(map(row_of.__getitem__, seq_ids), dtype=np.int64, count=len(seq_ids))

    def _release(self, seq_id: Hashable) -> None:
        row = self._row_of.pop(seq_id)
        self.table[row, : self._length[row]] = 0  # rows are zero past their length
        self._length[row] = 0
        self._drawn[row] = -1
        self._free_rows.append(row)
        self._last = None  # its rows may be another sequence's from now on

    def _grow(self, rows: int, width: int) -> None:
        old_rows, old_width = self.table.shape
        table = np.zeros((rows, width), dtype=np.int32)
        table[:old_rows, :old_width] = self.table
        self.table = table
        more = rows - old_rows
        self._length = np.concatenate([self._length, np.zeros(more, dtype=np.int64)])
        self._version = np.concatenate([self._version, np.full(more, -1, dtype=np.int64)])
        self._checked = np.concatenate([self._checked, np.full(more, -1, dtype=np.int64)])
        self._drawn = np.concatenate([self._drawn, np.full(more, -1, dtype=np.int64)])
        self._next_position = np.concatenate([self._next_position, np.zeros(more, dtype=np.int64)])
        self._free_rows.extend(range(rows - 1, old_rows - 1, -1))  # popped lowest first

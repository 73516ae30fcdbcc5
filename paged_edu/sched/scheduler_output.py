"""What one scheduling step hands its executor: the chunks to compute and the block copies to make.

The engine (a real model) and the simulator (a cost model) both execute a
:class:`SchedulerOutput`: apply ``block_ops`` in order, compute K/V for every :class:`ScheduledSeq`,
sample a token for each that ``emits_token``. Plain Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged_edu.sched.sequence import Sequence

__all__ = ["ScheduledSeq", "SchedulerOutput"]


@dataclass(slots=True)
class ScheduledSeq:
    """Compute K/V for ``seq.token_ids[start : start + num_new_tokens]`` this step.

    ``emits_token``: the chunk reaches the last known token, so the executor samples the next one
    (fixed when the chunk is scheduled; the sequence grows by that token in update).
    """

    seq: Sequence
    num_new_tokens: int
    start: int
    emits_token: bool

    @property
    def end(self) -> int:
        return self.start + self.num_new_tokens

    @property
    def is_decode(self) -> bool:
        """One new token: a decode row, which the decode kernel serves with the step's others (so is
        a prompt whose other tokens all hit the cache). vLLM v1 splits a batch into decodes and
        prefills by query length the same way (``split_decodes_and_prefills``)."""
        return self.num_new_tokens == 1


@dataclass(slots=True)
class SchedulerOutput:
    """One step's chunks, in order (:attr:`scheduled`), and the block copies to make before it runs.

    The step's leading decodes -- running sequences computing the one token each sampled last, every
    chunk of most steps -- travel as two lists, ``decode_seqs`` and ``decode_starts`` (the chunk of
    ``decode_seqs[i]`` is ``ScheduledSeq(decode_seqs[i], 1, decode_starts[i], True)``), the other
    chunks after them as ``chunks``. :attr:`scheduled` is all of them as :class:`ScheduledSeq` s, made
    once, when first read. vLLM v1 carries the requests it scheduled before the same way, one list a
    field (``CachedRequestData``: ``req_ids``, ``num_computed_tokens``, ...; ``vllm/v1/core/sched/output.py``).

    Speed: a ScheduledSeq costs 0.13 us to make, whatever the constructor (a dataclass, ``__slots__``
    and ``__init__``, a tuple); the simulator's beam benchmark schedules 13.5 M decodes and reads the
    two lists instead (``Scheduler.update`` takes the whole output): 11.78 -> 8.98 s CPU with the
    scheduler's kept sequence count (medians of 6, interleaved; this project's 2-core CPU). The
    engine reads the chunks as columns (:meth:`chunk_seqs`, :meth:`chunk_starts`, ...), so a step of
    decodes makes none: ``bench_host --graph-path`` at 256 running 0.403 -> 0.356 ms a step, its
    prepare phase 0.126 -> 0.093 (medians of 5 interleaved runs, this CPU;
    ``benchmarks/records/cpu/host_ab_chunk_columns.txt``).
    """

    decode_seqs: list[Sequence] = field(default_factory=list)  # the leading decodes' sequences
    decode_starts: list[int] = field(default_factory=list)  # and their starts (num_tokens - 1 when scheduled)
    chunks: list[ScheduledSeq] = field(default_factory=list)  # the rest: running, then swapped in, then admitted
    preempted: list[Sequence] = field(default_factory=list)
    started: list[Sequence] = field(default_factory=list)  # admitted or swapped back in: running from this step
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (gpu_block, cpu_block)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu_block, gpu_block)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst)
    # Every copy above, in the order it must be applied before the step runs:
    # ("swap_out", gpu, cpu), ("copy", src, dst), ("swap_in", cpu, gpu).
    block_ops: list[tuple[str, int, int]] = field(default_factory=list)
    num_batched_tokens: int = 0
    _scheduled: list[ScheduledSeq] = field(default_factory=list, init=False, repr=False)

    @property
    def scheduled(self) -> list[ScheduledSeq]:
        """Every chunk of the step in order: the decodes, then ``chunks`` (the same list each read)."""
        made = self._scheduled
        if len(made) != len(self.decode_seqs) + len(self.chunks):  # not made yet (or the step grew since)
            made[:] = [ScheduledSeq(seq, 1, start, True) for seq, start in zip(self.decode_seqs, self.decode_starts)]
            made += self.chunks
        return made

    @property
    def is_empty(self) -> bool:
        return not self.decode_seqs and not self.chunks

    @property
    def num_chunks(self) -> int:
        return len(self.decode_seqs) + len(self.chunks)

    # -- the chunks as columns, in order (new lists each call) ------------------------------------------
    # What the engine reads each step: a decode's entry comes from the two lists, so a step of decodes
    # makes no ScheduledSeq at all (what it buys: the class docstring's speed note).
    def chunk_seqs(self) -> list[Sequence]:
        """Each chunk's sequence: ``[item.seq for item in self.scheduled]``."""
        return self.decode_seqs + [item.seq for item in self.chunks]

    def chunk_starts(self) -> list[int]:
        """Each chunk's first position: ``[item.start for item in self.scheduled]``."""
        return self.decode_starts + [item.start for item in self.chunks]

    def chunk_counts(self) -> list[int]:
        """Each chunk's new tokens: ``[item.num_new_tokens for item in self.scheduled]`` (a decode's 1)."""
        return [1] * len(self.decode_seqs) + [item.num_new_tokens for item in self.chunks]

    def chunk_emits(self) -> list[bool]:
        """Whether each chunk samples: ``[item.emits_token for item in self.scheduled]`` (a decode does)."""
        return [True] * len(self.decode_seqs) + [item.emits_token for item in self.chunks]

    def decodes_and_prefill_tokens(self) -> tuple[int, int]:
        """``(decodes, prefill_tokens)``: the one-token chunks (:attr:`ScheduledSeq.is_decode`) and the
        new tokens of all the others (prompt chunks, recomputes) -- how a step's metrics and the
        engine's timeline count it."""
        counts = [s.num_new_tokens for s in self.chunks]
        decodes = counts.count(1)
        return len(self.decode_seqs) + decodes, sum(counts) - decodes

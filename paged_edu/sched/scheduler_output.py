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
    scheduled: list[ScheduledSeq] = field(default_factory=list)  # running, then swapped in, then admitted
    preempted: list[Sequence] = field(default_factory=list)
    started: list[Sequence] = field(default_factory=list)  # admitted or swapped back in: running from this step
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (gpu_block, cpu_block)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu_block, gpu_block)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst)
    # Every copy above, in the order it must be applied before the step runs:
    # ("swap_out", gpu, cpu), ("copy", src, dst), ("swap_in", cpu, gpu).
    block_ops: list[tuple[str, int, int]] = field(default_factory=list)
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def decodes_and_prefill_tokens(self) -> tuple[int, int]:
        """``(decodes, prefill_tokens)``: the one-token chunks (:attr:`ScheduledSeq.is_decode`) and the
        new tokens of all the others (prompt chunks, recomputes) -- how a step's metrics and the
        engine's timeline count it."""
        counts = [s.num_new_tokens for s in self.scheduled]
        decodes = counts.count(1)
        return decodes, sum(counts) - decodes

"""Iteration-level scheduling (continuous batching) over a paged block allocator.

Every step the scheduler decides which tokens are computed, in this order:

1. **running sequences**, oldest first -- each needs a slot for the token it sampled last step:
   ``allocator.append_slots`` (a count: the token's id reaches the allocator with ``mark_computed``
   after the step, in :meth:`Scheduler.update`, so the slot could as well be reserved before the
   token is sampled). While the pool is full the youngest running sequence is *preempted*
   (``while not reserve_slot(seq): preempt(running.pop())``, as nano-vllm): ``recompute`` frees its
   blocks and puts it back at the front of the waiting queue (its K/V is recomputed later, partly
   from the prefix cache); ``swap`` copies its blocks to CPU memory and parks it until blocks are
   free again; ``auto`` chooses as vLLM (v0) does -- recompute for a request with a single
   sequence, swap for one whose parallel samples share blocks, since recomputing those would lose
   what they share. Then its next chunk: one token (a decode), or the next chunk of a prompt that
   did not fit in one step (chunked prefill).
2. **swapped sequences** come back (only in a step that preempted nothing).
3. **waiting sequences** are admitted in ``policy`` order -- ``fcfs``, or ``lpm``: longest cached
   prefix first, starvation bounded (:mod:`~paged_edu.sched.policy`) -- while ``max_num_seqs``,
   the token budget ``max_num_batched_tokens`` and the pool allow: ``allocator.allocate`` gives the
   block table and the prefix-cache hit, whose tokens are not computed again.

The executor (the engine's model, or the simulator's cost model) runs the
:class:`~paged_edu.sched.scheduler_output.SchedulerOutput` and hands the sampled tokens to
:meth:`Scheduler.update`. The memory manager is any :class:`~paged_edu.sched.memory_manager.MemoryManager`;
CPU swap is a :class:`~paged_edu.sched.swap.SwapSpace`; a request that could never run is refused
when it is added (:mod:`~paged_edu.sched.admission`). Plain Python, no torch.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from operator import attrgetter, sub
from paged_edu.core.block_pool import OutOfBlocksError
from paged_edu.core.validation import FieldValueError, as_int, choice, flag, integer
from paged_edu.sched.admission import check_fits
from paged_edu.sched.memory_manager import MemoryManager, PrefixLookup, cache_keys, publishes_before_computed
from paged_edu.sched.policy import POLICIES, LongestPrefixFirst
from paged_edu.sched.scheduler_output import ScheduledSeq, SchedulerOutput
from paged_edu.sched.sequence import Sequence, SequenceStatus
from paged_edu.sched.swap import SwapSpace

__all__ = ["Scheduler"]

PREEMPTION_MODES = ("recompute", "swap", "auto")


class Scheduler:
    """Waiting, running and swapped queues over one memory manager and one swap space."""

    def __init__(
        self,
        allocator: MemoryManager,
        *,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        enable_chunked_prefill: bool = True,
        preemption_mode: str = "recompute",
        num_cpu_blocks: int = 0,
        max_model_len: int | None = None,
        policy: str = "fcfs",
    ) -> None:
        preemption_mode = choice("preemption_mode", preemption_mode, PREEMPTION_MODES)
        policy = choice("policy", policy, POLICIES)
        max_num_seqs = integer("max_num_seqs", max_num_seqs, low=1)
        max_num_batched_tokens = integer("max_num_batched_tokens", max_num_batched_tokens, low=1)
        if max_model_len is not None:
            max_model_len = integer("max_model_len", max_model_len, low=1)
        enable_chunked_prefill = flag("enable_chunked_prefill", enable_chunked_prefill)
        if policy == "lpm" and not isinstance(allocator, PrefixLookup):
            raise FieldValueError(
                "policy",
                f"policy='lpm' needs a manager that can look up a prompt's cached prefix "
                f"(num_cached_tokens_for); {type(allocator).__name__} has none: use policy='fcfs'",
            )
        swap_space = SwapSpace(num_cpu_blocks)
        if preemption_mode == "swap" and swap_space.num_blocks == 0:  # "auto" recomputes without swap space
            raise FieldValueError("num_cpu_blocks", "preemption_mode='swap' needs num_cpu_blocks > 0 to swap into")
        if publishes_before_computed(allocator):
            raise FieldValueError(
                "allocator",
                "the memory manager shares blocks before their K/V is computed, but this scheduler computes "
                "prompts over several steps: build it with BlockAllocator(..., cache_when_computed=True)",
            )
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.preemption_mode = preemption_mode
        self.max_model_len = max_model_len
        self.swap_space = swap_space
        self.policy, self._lpm = policy, (LongestPrefixFirst() if policy == "lpm" else None)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.num_preemptions = 0
        self.budget = 0  # tokens the step being scheduled may still compute
        # What max_num_seqs bounds, kept as sequences start, stop and fork (_num_seqs): each running
        # sequence that stands for more than itself -> how many more, their sum, and those of them whose
        # request still draws samples at its prompt's end (an abort may strike one off: re-read each step).
        self._forking: dict[Sequence, int] = {}
        self._num_more = 0
        self._drawing: set[Sequence] = set()
        self._live: dict[int, Sequence] = {}  # seq_id -> every unfinished sequence, wherever it is
        self._ids = itertools.count()

    @property
    def num_cpu_blocks(self) -> int:
        return self.swap_space.num_blocks

    @property
    def free_cpu_blocks(self) -> list[int]:  # read-only view of the swap space
        return self.swap_space.free_block_ids

    # -- requests ------------------------------------------------------------------------------
    def new_seq_id(self) -> int:
        return next(self._ids)

    def make_sequence(self, prompt_token_ids: Iterable[int], max_new_tokens: int, **kwargs) -> Sequence:
        """A :class:`Sequence` with a fresh id, added to the waiting queue."""
        seq = Sequence(self.new_seq_id(), list(prompt_token_ids), max_new_tokens, **kwargs)
        self.add(seq)
        return seq

    def check_fits(self, num_prompt_tokens: int, max_new_tokens: int, num_samples: int = 1) -> None:
        """Refuse a request that could never run here, naming the limit (see :func:`check_fits`)."""
        check_fits(
            num_prompt_tokens,
            max_new_tokens,
            num_samples,
            max_model_len=self.max_model_len,
            block_size=self.allocator.block_size,
            num_blocks=self.allocator.num_blocks,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_chunked_prefill=self.enable_chunked_prefill,
        )

    def add(self, seq: Sequence, *, validate: bool = True) -> None:
        """Queue a new sequence, after :meth:`check_fits` (``validate=False``: the caller has
        checked that it fits, as ``simulate`` does for every request before it starts)."""
        if seq.seq_id in self._live or seq.status is not SequenceStatus.WAITING or seq.num_computed_tokens:
            raise ValueError(f"sequence {seq.seq_id} was already added")
        if validate:
            try:
                self.check_fits(seq.num_prompt_tokens, seq.max_new_tokens, seq.max_num_running_seqs)
            except FieldValueError as exc:
                raise FieldValueError(exc.field, f"sequence {seq.seq_id}: {exc}") from None
        self._live[seq.seq_id] = seq
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self._live)

    def abort(self, seq: Sequence) -> None:
        """Drop an unfinished sequence wherever it is, releasing its GPU and CPU blocks.

        An unknown or already finished sequence raises ``ValueError`` and nothing changes (a
        finished sequence keeps its ``finish_reason``).
        """
        if self._live.get(seq.seq_id) is not seq:
            state = f"already finished ({seq.finish_reason})" if seq.is_finished else "not in this scheduler"
            raise ValueError(f"cannot abort sequence {seq.seq_id}: it is {state}")
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.allocator.free(seq.seq_id)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            self.swapped.remove(seq)
            self.swap_space.release(seq.seq_id)
        self._finish(seq, "abort", seq.finish_time)

    def _finish(self, seq: Sequence, reason: str, now: float | None) -> None:
        del self._live[seq.seq_id]
        seq.samples.finish(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = now
        self._recount(seq)

    # -- preemption ----------------------------------------------------------------------------
    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.num_preemptions += 1
        seq.num_preemptions += 1
        out.preempted.append(seq)
        table = self.allocator.block_table(seq.seq_id)
        swap = self.preemption_mode == "swap" or (self.preemption_mode == "auto" and seq.samples.shares_blocks(seq))
        if swap and self.swap_space.can_swap_out(len(table)):
            self._record_copies(out)  # a pending copy into this sequence's blocks must land first
            for gpu, cpu in self.swap_space.swap_out(seq.seq_id, table):
                out.blocks_to_swap_out.append((gpu, cpu))
                out.block_ops.append(("swap_out", gpu, cpu))
            self.allocator.free(seq.seq_id)
            seq.status = SequenceStatus.SWAPPED
            self.swapped.append(seq)
        else:  # recompute (also the fallback when CPU swap space is full)
            self.allocator.free(seq.seq_id)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)
        self._recount(seq)

    def _record_copies(self, out: SchedulerOutput) -> None:
        for src, dst in self.allocator.take_copies():
            out.blocks_to_copy.append((src, dst))
            out.block_ops.append(("copy", src, dst))

    # -- one step ------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """One step: a loop over each queue in turn -- running, swapped, waiting (module docstring).

        ``out.scheduled`` lists the chunks in that order (the leading decodes as two lists, ``out.chunks``
        the rest: :class:`SchedulerOutput`); the executor groups one-token chunks
        (:attr:`ScheduledSeq.is_decode`) for the decode kernel itself.
        """
        out = SchedulerOutput()
        self.budget = self.max_num_batched_tokens
        self._schedule_running(out)
        num_seqs = self._num_seqs()
        if not out.preempted:  # a step that had to preempt brings nothing back
            num_seqs = self._schedule_swapped(out, num_seqs)
        if not out.preempted and not self.swapped:  # swapped sequences go before new ones
            self._schedule_waiting(out, num_seqs)
        self._record_copies(out)
        out.num_batched_tokens = self.max_num_batched_tokens - self.budget
        return out

    def _schedule_running(self, out: SchedulerOutput) -> None:
        """Running sequences, oldest first: a slot for the token each sampled last step -- while the
        pool is full, the youngest running sequence is preempted -- then its next chunk."""
        num_decodes = self._schedule_decodes(out)  # the leading decodes whose slots the pool has: in bulk
        running, self.running = deque(self.running[num_decodes:]), self.running[:num_decodes]
        while running:
            seq = running.popleft()
            if self.budget == 0:  # the batch is full: it and the rest stay running, unscheduled
                self.running.append(seq)
                self.running.extend(running)
                break
            while not self._reserve_slot(seq):
                if not running:
                    self._preempt(seq, out)
                    break
                self._preempt(running.pop(), out)
            else:
                self.running.append(seq)
                self._schedule_chunk(seq, out)

    def _schedule_decodes(self, out: SchedulerOutput) -> int:
        """The loop of :meth:`_schedule_running` for its leading decodes whose slots the pool has --
        every running sequence, in most steps -- in bulk; returns how many it scheduled (the loop
        takes the rest, and preempts for them).

        A decode (one token to compute: the one sampled last) is a one-token chunk that emits, after
        its slot. The loop preempts only when a slot cannot be had; before the first such sequence it
        reserves a slot and schedules a chunk for each, as here: the slots of the first ``k`` decodes
        (``k`` at most the budget, one token each) in one call, which stops at the first the pool
        cannot serve, then their chunks. Only a manager with that call (``append_slots_upto``: the
        paged allocators) goes this way; any other leaves every sequence to the loop.

        Their chunks go out as two lists (``out.decode_seqs``, ``out.decode_starts``), no
        :class:`ScheduledSeq` made (see :class:`SchedulerOutput`).

        Speed: lists over the batch instead of five calls per sequence, 0.6 -> 0.3 us per decode
        scheduled; the simulator's beam benchmark (``benchmarks/bench_simulator.py --only beam``:
        13.5 M decodes) spends 6 instead of 8 s of CPU scheduling (this project's 2-core CPU).
        """
        append_slots_upto = getattr(self.allocator, "append_slots_upto", None)
        if append_slots_upto is None:
            return 0
        seqs = self.running[: self.budget]
        ends = [seq.num_tokens for seq in seqs]
        starts = [seq.num_computed_tokens for seq in seqs]
        todo = list(map(sub, ends, starts))
        if todo.count(1) < len(todo):  # a prompt chunk: the decodes before it only
            num = next(i for i, n in enumerate(todo) if n != 1)
            seqs, ends, starts = seqs[:num], ends[:num], starts[:num]
        num = append_slots_upto([seq.seq_id for seq in seqs], ends)
        if num < len(seqs):
            seqs, starts = seqs[:num], starts[:num]
        out.decode_seqs, out.decode_starts = seqs, starts
        self.budget -= num
        return num

    def _schedule_swapped(self, out: SchedulerOutput, num_seqs: int) -> int:
        """Swapped sequences come back, oldest first, while the batch and the pool have room;
        returns ``num_seqs`` with them."""
        while self.swapped and self._has_room(self.swapped[0], num_seqs) and self._swap_in(self.swapped[0], out):
            seq = self.swapped.popleft()
            num_seqs += self._start(seq, out)
        return num_seqs

    def _schedule_waiting(self, out: SchedulerOutput, num_seqs: int) -> None:
        """Waiting sequences, in policy order, while the batch, the budget and the pool have room."""
        if self._lpm is not None and self.waiting:
            self._lpm.order(self.waiting, self.allocator)
        while self.waiting and self._has_room(self.waiting[0], num_seqs) and self._admit(self.waiting[0]):
            seq = self.waiting.popleft()
            num_seqs += self._start(seq, out)

    def _num_seqs(self) -> int:
        """Sequences running once every branch due to fork later exists: what ``max_num_seqs`` bounds
        (as vLLM counts a request of ``n`` samples as ``n`` sequences from admission) --
        ``len(running)`` plus ``max_num_running_seqs - 1`` of each running sequence.

        The second term is kept as sequences start, stop and fork (:meth:`_recount`), except for a
        request still to draw its samples: an abort strikes samples off its record
        (:meth:`ParallelSamples.abort <paged_edu.sched.parallel_sampling.ParallelSamples.abort>`)
        without the scheduler, so those few are read again here.

        Speed: a sum over every running sequence that will fork, each step, took 0.67 s of the beam
        benchmark (54,235 steps, ~64 such sequences a step); kept, 0.04 s (phase timers, this 2-core CPU).
        """
        for seq in list(self._drawing):
            self._recount(seq)
        return len(self.running) + self._num_more

    def _recount(self, seq: Sequence) -> None:
        """Bring ``seq``'s share of :meth:`_num_seqs` up to date after it started, stopped running,
        forked, or took its samples."""
        more = seq.max_num_running_seqs - 1 if seq.status is SequenceStatus.RUNNING else 0
        self._num_more += more - self._forking.pop(seq, 0)
        if more > 0:
            self._forking[seq] = more
        if more > 0 and seq.samples.num_tokens_to_sample > 1:
            self._drawing.add(seq)
        else:
            self._drawing.discard(seq)

    def _has_room(self, seq: Sequence, num_seqs: int) -> bool:
        return num_seqs + seq.max_num_running_seqs <= self.max_num_seqs and self.budget > 0

    def _reserve_slot(self, seq: Sequence) -> bool:
        """A slot for the token ``seq`` sampled last step, if it has none yet (by count: its id
        reaches the allocator after its step, with ``mark_computed``); False when the pool is full."""
        if self.allocator.num_tokens(seq.seq_id) == seq.num_tokens:
            return True
        try:
            self.allocator.append_slots(seq.seq_id)
        except OutOfBlocksError:
            return False
        return True

    def _admit(self, seq: Sequence) -> bool:
        """Give a waiting sequence its block table; the prefix-cache hit counts as computed. False
        (nothing changed) when the pool is full, or its prompt must go whole and the budget is short."""
        if not self.enable_chunked_prefill and seq.num_tokens > self.budget:
            return False
        readmitted = seq.num_preemptions > 0  # recomputed: its hits are its own blocks, no reuse
        try:
            self.allocator.allocate(seq.seq_id, seq.token_ids, record_stats=not readmitted, **cache_keys(seq))
        except OutOfBlocksError:
            return False
        cached = self.allocator.num_cached_tokens(seq.seq_id)
        if readmitted:
            self.allocator.stats.record(seq.num_tokens, cached, preempted=True)
        seq.num_cached_tokens = seq.num_computed_tokens = cached
        return True

    def _start(self, seq: Sequence, out: SchedulerOutput) -> int:
        """``seq`` (admitted or swapped in) runs from this step; returns the sequences it stands for."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        out.started.append(seq)
        if seq.max_num_running_seqs > 1:
            self._recount(seq)
        self._schedule_chunk(seq, out)
        return seq.max_num_running_seqs

    def _schedule_chunk(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Compute ``seq``'s next tokens this step: all that are left, or as many as the budget allows
        with chunked prefill (without it: all or none)."""
        remaining = seq.num_tokens - seq.num_computed_tokens
        num_new = remaining if remaining < self.budget else self.budget  # min(): 0.02 instead of 0.1-0.17 us
        if num_new == 0 or (num_new < remaining and not self.enable_chunked_prefill):
            return
        out.chunks.append(ScheduledSeq(seq, num_new, seq.num_computed_tokens, num_new == remaining))
        self.budget -= num_new

    def _swap_in(self, seq: Sequence, out: SchedulerOutput) -> bool:
        """Give a swapped sequence GPU blocks again and ask for its K/V to be copied back; False
        (nothing changed) when the pool is too full."""
        allocator = self.allocator
        tokens = seq.token_ids
        # The slots it held when swapped out: every token, or all but the one sampled last (its slot
        # not reserved yet); only where the two take different block counts does it matter.
        pending = -(-len(tokens) // allocator.block_size) > self.swap_space.num_blocks_held(seq.seq_id)
        try:
            allocator.allocate(seq.seq_id, tokens[:-1] if pending else tokens, record_stats=False, **cache_keys(seq))
        except OutOfBlocksError:
            return False
        if pending:  # the token sampled last gets its slot, by count: its id reaches the allocator after its step
            try:
                allocator.append_slots(seq.seq_id)
            except OutOfBlocksError:
                allocator.free(seq.seq_id)
                return False
        # Leading blocks hit in the prefix cache are shared and already hold their K/V: never
        # recompute (write) into them, even when this sequence had computed less before its swap.
        num_cached = allocator.num_cached_tokens(seq.seq_id)
        seq.num_computed_tokens = max(seq.num_computed_tokens, num_cached)
        own = allocator.block_table(seq.seq_id)
        allocator.mark_computed(seq.seq_id, seq.num_computed_tokens)  # its K/V is copied back first
        # Publish, then read the table: publishing may swap a block for the cache's copy (radix),
        # whose K/V is there (or copied in earlier this step): no copy goes into it.
        table = allocator.block_table(seq.seq_id)
        self._record_copies(out)
        first = num_cached // allocator.block_size
        for i, (cpu, gpu) in enumerate(self.swap_space.swap_in(seq.seq_id, table, first), start=first):
            if gpu != own[i]:
                continue
            out.blocks_to_swap_in.append((cpu, gpu))
            out.block_ops.append(("swap_in", cpu, gpu))
        return True

    # -- after the step ------------------------------------------------------------------------
    def update(
        self,
        out: SchedulerOutput,
        sampled: dict,
        now: float = 0.0,
        decode_tokens: list[int] | None = None,
        num_held: int = 0,
    ) -> list[Sequence]:
        """Advance the computed tokens and append the sampled ones; return finished sequences.

        ``out``: the step's :class:`SchedulerOutput` (its leading decodes read as its two lists).
        ``sampled`` maps the id of every sequence whose chunk ``emits_token`` to its new token -- or,
        for a parallel-sampling sequence finishing its prompt, to a list of its
        ``samples.num_tokens_to_sample`` tokens: the first is its own, the others start the children
        forked from it (:meth:`~paged_edu.sched.parallel_sampling.ParallelSamples.take_forks`).
        ``decode_tokens``, if given, are the tokens of ``out.decode_seqs`` in their order (an executor
        that draws one token a chunk in the step's order has them so: the engine); ``sampled`` then
        needs only the other chunks'.

        ``num_held``: the first ``num_held`` leading decodes already hold this step's token as a
        placeholder -- their last output token, their counts advanced as if the step were done (an
        executor that schedules the next step before this one's tokens are read: the engine's async
        scheduling, ``engine/overlap.py``). The sampled token replaces the placeholder in place.
        """
        finished: list[Sequence] = []
        seqs, starts, rest = out.decode_seqs, out.decode_starts, out.chunks
        if decode_tokens is not None and len(decode_tokens) != len(seqs):
            raise ValueError(
                f"decode_tokens holds {len(decode_tokens)} tokens for the step's {len(seqs)} leading decodes"
            )
        if not (type(num_held) is int and 0 <= num_held <= len(seqs)):
            integer("num_held", num_held, low=0, high=len(seqs))  # raises, naming the field
        if decode_tokens is None:  # each decode's token from the map
            tokens = map(sampled.get, map(attrgetter("seq_id"), seqs))
        else:
            tokens = decode_tokens
        num = self._update_decodes(seqs, starts, tokens, now, finished, num_held)  # the leading decodes: in bulk
        if num < len(seqs):  # one is not a plain decode (no int token, or not running): the loop takes it and the rest
            for seq, start in zip(seqs[num:num_held], starts[num:num_held]):  # held, but the loop appends:
                seq.take_back_token(start)  # the placeholder taken back, the counts as before the step
            rest = [ScheduledSeq(seq, 1, start, True) for seq, start in zip(seqs[num:], starts[num:])] + rest
            if decode_tokens is not None:  # the loop reads tokens by sequence
                sampled = {**dict(zip([seq.seq_id for seq in seqs[num:]], decode_tokens[num:])), **sampled}
        block_size, running = self.allocator.block_size, SequenceStatus.RUNNING
        for item in rest:
            seq = item.seq
            if seq.status is not running:
                continue
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            end = item.start + item.num_new_tokens
            seq.num_computed_tokens = end
            if end // block_size > item.start // block_size:  # a block was completed: publish it
                self._publish_computed(seq, item.start, end)
            if not item.emits_token:
                continue  # a prefill chunk in the middle of the prompt
            token = sampled.get(seq.seq_id)
            if type(token) is int:  # the common case; the others are checked (and forked) apart
                seq.append_token(token)
                self._after_token(seq, now, finished)
            else:
                self._append_sampled(seq, token, now, finished)
        return finished

    def _update_decodes(
        self,
        seqs: list[Sequence],
        starts: list[int],
        tokens: Iterable,
        now: float,
        finished: list[Sequence],
        num_held: int = 0,
    ) -> int:
        """The loop of :meth:`update` for its leading decodes -- every chunk, in most steps -- in bulk:
        ``seqs[i]`` computed its token ``starts[i]`` and sampled ``tokens[i]``; the first ``num_held``
        hold a placeholder for it (:meth:`update`), which the token replaces. Returns how many it took
        (the loop takes the rest).

        A decode (one token computed, one plain ``int`` token sampled, the sequence running) changes
        its own sequence only: its computed count, its new token and the token's time. A few do
        more: complete a block (one in ``B`` a step: publish it), emit their first token, or finish.
        The loop does all of it per chunk; here one tight pass does each sequence's own part and
        notes the few that do more, then those are finished in order -- the memory manager sees the
        same calls in the same order (a sequence's own fields are read by nobody else).

        Speed: one pass, no call per plain decode instead of three: :meth:`update` over 256 decodes
        (16 of them completing a block, the memory manager stubbed) 88-94 -> 76-81 us, best of 300
        (this project's 2-core CPU); the rest of the phase is the blocks' publishing (``mark_computed``).
        """
        B, running = self.allocator.block_size, SequenceStatus.RUNNING
        more: list[Sequence] = []  # the decodes that do more than their own bookkeeping, in order
        num = len(seqs)
        held = num_held  # decodes left that hold a placeholder (the first ones)
        for seq, start, token in zip(seqs, starts, tokens):  # (no enumerate: 15 ns a decode)
            if type(token) is not int or seq.status is not running:
                num = seqs.index(seq)  # not a plain decode: the loop takes it and the rest
                break
            end = seq.num_computed_tokens = start + 1
            output = seq.output_token_ids
            if held:  # the placeholder is its last token, counted already: replaced in place
                held -= 1
                output[-1] = token
            else:
                output.append(token)  # Sequence.append_token, inlined: no call per decode
                seq.num_tokens += 1
            seq.token_times.append(now)
            if not end % B or token in seq.stop_token_ids or len(output) >= seq.max_new_tokens:
                more.append(seq)  # it completed a block, or it finishes
            elif seq.first_token_time is None:
                more.append(seq)
        for seq in more:
            if seq.first_scheduled_time is None:  # its first step (a prompt all cached but its last token)
                seq.first_scheduled_time = now
            end = seq.num_computed_tokens
            if not end % B:
                self._publish_computed(seq, end - 1, end)
            self._after_token(seq, now, finished, timed=True)
        return num

    def _publish_computed(self, seq: Sequence, start: int, end: int) -> None:
        """``seq``'s tokens ``start .. end - 1`` were computed and completed a block: tell the memory
        manager, with the ids of the sampled tokens among them (the earlier ones are known)."""
        num_prompt = len(seq.prompt_token_ids)
        if end > num_prompt:  # sampled tokens' ids, from this chunk's first block on
            lo = max(num_prompt, start // self.allocator.block_size * self.allocator.block_size)
            self.allocator.mark_computed(seq.seq_id, end, seq.output_token_ids[lo - num_prompt : end - num_prompt])
        else:
            self.allocator.mark_computed(seq.seq_id, end)

    def _append_sampled(self, seq: Sequence, token, now: float, finished: list[Sequence]) -> None:
        """:meth:`update` for a token that is not a plain int: ``n`` tokens at the end of a
        parallel-sampling prompt (the others start forked children), a numpy/torch integer, or none."""
        if token is None:
            raise KeyError(f"no sampled token for sequence {seq.seq_id}, whose chunk emits one")
        children = ()  # forked now, at the end of a parallel-sampling prompt
        if isinstance(token, (list, tuple)):
            token, forks = seq.samples.take_forks(seq, token)
            self._recount(seq)
            children = [self._fork_child(seq, i, t) for i, t in forks]
        seq.append_token(as_int(token, f"the sampled token of sequence {seq.seq_id} must be an integer"))
        self._after_token(seq, now, finished)
        for child in children:
            self._after_token(child, now, finished)

    def _fork_child(self, parent: Sequence, sample_index: int, token: int) -> Sequence:
        child = Sequence(
            self.new_seq_id(),
            list(parent.prompt_token_ids),
            parent.max_new_tokens,
            arrival_time=parent.arrival_time,
            stop_token_ids=parent.stop_token_ids,
            request_id=parent.request_id,
            sample_index=sample_index,
            cache_salt=parent.cache_salt,
        )
        self.fork(parent, child)
        child.append_token(as_int(token, f"the sampled token of sample {sample_index} must be an integer"))
        return child

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Start ``child`` as a copy of ``parent`` that shares every block (parallel sampling)."""
        if parent.status is not SequenceStatus.RUNNING:
            raise ValueError(f"can only fork a running sequence; {parent.seq_id} is {parent.status.value}")
        if child.seq_id in self._live:
            raise ValueError(f"sequence {child.seq_id} already exists")
        if parent.num_pending_forks:  # a branch it reserved room for at admission
            parent.num_pending_forks -= 1
            self._recount(parent)
        self.allocator.fork(parent.seq_id, child.seq_id)
        parent.samples.add(child)
        child.output_token_ids = list(parent.output_token_ids)
        child.num_tokens = parent.num_tokens
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        child.first_scheduled_time = parent.first_scheduled_time
        child.status = SequenceStatus.RUNNING
        self._live[child.seq_id] = child
        self.running.append(child)
        if child.max_num_running_seqs > 1:
            self._recount(child)

    def _after_token(self, seq: Sequence, now: float, finished: list[Sequence], timed: bool = False) -> None:
        """``seq`` has a new token, emitted at ``now`` (already in ``token_times`` if ``timed``): finish
        it if the token stops it or it has all it may have."""
        if seq.first_token_time is None:
            seq.first_token_time = now
        if not timed:
            seq.token_times.append(now)
        token = seq.output_token_ids[-1]
        if token in seq.stop_token_ids:
            seq.finish_reason = "stop"
        elif len(seq.output_token_ids) >= seq.max_new_tokens:
            seq.finish_reason = "length"
        else:
            return
        self.running.remove(seq)
        self.allocator.free(seq.seq_id)
        self._finish(seq, seq.finish_reason, now)
        finished.append(seq)

    # -- metrics -------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Queue lengths, KV usage and prefix hit rate now (for per-step metrics)."""
        return {
            "running": len(self.running),
            "waiting": len(self.waiting),
            "swapped": len(self.swapped),
            "kv_usage": self.allocator.usage,
            "prefix_hit_rate": self.allocator.stats.hit_rate,
            "preemptions": self.num_preemptions,
        }

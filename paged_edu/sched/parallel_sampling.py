"""Parallel sampling (``n > 1``): one request, ``n`` samples of the same prompt, in one record.

What you will learn
-------------------
A request with ``SamplingParams(n=3)`` starts as **one** sequence. Its prompt is computed once;
when the prompt's last chunk is computed the executor draws ``n`` tokens for it instead of one, and
the scheduler *forks* the sequence into ``n``: every child shares every block of the prompt --
the partly filled last block included -- with ``ref_count == n``, and the first token each sample
writes into that shared last block makes a copy-on-write copy (``n - 1`` copies; the last writer
keeps the original). That is the paper's parallel sampling (Kwon et al., SOSP 2023, §4.4 and
Fig. 8), and lesson 3's picture.

vLLM v1 does it differently: ``LLMEngine.add_request`` (``vllm/v1/engine/llm_engine.py``) fans the
request out *in front of* the scheduler into ``n`` independent child requests (ids
``f"{index}_{request_id}"``, each with ``n=1`` and ``seed + index``); a ``ParentRequest``
(``vllm/v1/engine/parallel_sampling.py``: ``get_child_info``, ``get_outputs``) only collects their
outputs back into one. The scheduler never sees ``n``. The children share the prompt through the
prefix cache, which holds **full** blocks only (``BlockPool.cache_full_blocks``,
``vllm/v1/core/block_pool.py``): the partial last block is computed once per child, and nothing is
ever copied on write. Simpler machinery; here we keep the fork because it is the
mechanism the paper (and lesson 3) teaches.

The record
----------
:class:`ParallelSamples` is the one place that knows about a request's samples; every sequence of
the request points at the same record (``Sequence.samples``). It says which sample indices exist,
which are still to be forked, which were aborted before their fork (they end empty) and which
finished. The scheduler, the engine and the simulator only call it:

* :attr:`~ParallelSamples.num_tokens_to_sample` -- tokens to draw when a chunk of it emits: ``n`` (less
  samples aborted before the fork) at the prompt's end, then 1;
* :meth:`~ParallelSamples.sample_indices` -- the random stream (sample index) of each of those tokens;
* :meth:`~ParallelSamples.take_forks` -- at the prompt's end, ``(sample index, token)`` per child to fork;
* :meth:`~ParallelSamples.add` / :meth:`~ParallelSamples.finish` -- a child forked, a sequence finished;
* :meth:`~ParallelSamples.abort` -- end sample ``i`` (or all): before the fork no sequence stops,
  the sample is struck off (or, if it is the forking sequence's own index, that sequence takes the
  next one); after it, that sample's sequence stops;
* :meth:`~ParallelSamples.check_live` -- the sample index an abort names, refused if out of range or ended;
* :attr:`~ParallelSamples.done`, :meth:`~ParallelSamples.in_order`, :meth:`~ParallelSamples.completed` -- the
  request's outcome by sample index, and which requests a step's finished sequences completed.

Beam-style branches (the simulator's ``fork="beam"``) fork later, through ``Scheduler.fork``; they are
samples of the record too (counted in ``n``), never in the to-fork list. Plain Python, no torch.

Invariant: the sample indices to fork, live, finished and aborted are disjoint, and while any is
still to fork, exactly one sequence (the one that forks them) is live.
"""

from __future__ import annotations

from typing import Protocol

from paged_edu.core.validation import as_int

__all__ = ["ParallelSamples"]


class Sequence(Protocol):
    """What the record reads of a sample's :class:`paged_edu.sched.sequence.Sequence` (which imports
    this module, so it is named here by its shape)."""

    seq_id: int
    request_id: int | None
    sample_index: int
    finish_reason: str | None
    output_token_ids: list[int]
    samples: ParallelSamples

    @property
    def holds_blocks(self) -> bool: ...


class ParallelSamples:
    """A request's ``n`` samples: still to fork, live, finished, aborted before their fork."""

    __slots__ = ("request_id", "n", "_to_fork", "_live_samples", "_finished_samples", "_aborted_samples")

    def __init__(self, seq: Sequence, num_samples: int, num_forked_later: int = 0) -> None:
        """The record of a request that starts as ``seq``: ``num_samples`` samples forked when its
        prompt ends, ``num_forked_later`` more forked later (beam branches, through ``Scheduler.fork``)."""
        self.request_id = seq.request_id
        self.n = num_samples + num_forked_later
        first = seq.sample_index  # 0, or a branch's own index (a forked child's record is replaced by add)
        self._to_fork: list[int] = list(range(first + 1, first + num_samples))
        self._live_samples: dict[int, Sequence] = {seq.sample_index: seq}  # sample index -> its unfinished sequence
        self._finished_samples: dict[int, Sequence] = {}  # sample index -> its finished (or aborted) sequence
        self._aborted_samples: set[int] = set()  # samples aborted before their fork: they end empty

    # -- sampling ------------------------------------------------------------------------------
    @property
    def num_tokens_to_sample(self) -> int:
        """Tokens drawn when a chunk of the request emits: one per sample still to fork, plus the
        emitting sequence's own (only the forking sequence is live while any is still to fork)."""
        return 1 + len(self._to_fork)

    def sample_indices(self, seq: Sequence) -> tuple[int, ...]:
        """The sample index (random stream) of each token ``seq`` draws, in order: its own first."""
        return (seq.sample_index, *self._to_fork)

    def take_forks(self, seq: Sequence, tokens) -> tuple[int, list[tuple[int, int]]]:
        """Split the ``num_tokens_to_sample`` tokens drawn at the prompt's end: ``seq``'s own token,
        and ``(sample index, token)`` for each child the scheduler forks now. Raises ``ValueError``
        (nothing changed) on a wrong count."""
        tokens = list(tokens)
        if len(tokens) != self.num_tokens_to_sample:
            raise ValueError(
                f"sequence {seq.seq_id} takes {self.num_tokens_to_sample} token(s) this step, got {len(tokens)}"
            )
        forks, self._to_fork = list(zip(self._to_fork, tokens[1:])), []
        return tokens[0], forks

    # -- the request's sequences ---------------------------------------------------------------
    def add(self, child: Sequence) -> None:
        """``child`` was forked from a sequence of this request: it is one of its samples now."""
        child.samples = self
        self._live_samples[child.sample_index] = child

    def finish(self, seq: Sequence) -> None:
        """``seq`` finished (or was aborted): its sample is done."""
        del self._live_samples[seq.sample_index]
        self._finished_samples[seq.sample_index] = seq

    def shares_blocks(self, seq: Sequence) -> bool:
        """Does another sample hold blocks now (running or swapped), or will one at the fork?"""
        return bool(self._to_fork) or any(
            other is not seq and other.holds_blocks for other in self._live_samples.values()
        )

    # -- aborts --------------------------------------------------------------------------------
    def check_index(self, sample_index) -> int | None:
        """``sample_index`` as an int in ``[0, n)`` (None: every sample); ``ValueError`` otherwise."""
        if sample_index is None:
            return None
        i = as_int(sample_index, "sample_index must be an int")
        if not 0 <= i < self.n:
            raise ValueError(f"sample_index must be in [0, {self.n}) for request {self.request_id}, got {i}")
        return i

    def has_ended(self, sample_index: int | None) -> bool:
        """Has sample ``sample_index`` finished or been aborted (None: never -- the request is live)?"""
        return sample_index in self._finished_samples or sample_index in self._aborted_samples

    def check_live(self, sample_index) -> int | None:
        """:meth:`check_index`, and the sample must not have ended (``ValueError`` naming why it did)."""
        i = self.check_index(sample_index)
        if self.has_ended(i):
            reason = self._finished_samples[i].finish_reason if i in self._finished_samples else "abort"
            raise ValueError(f"sample {i} of request {self.request_id} already finished (finish_reason={reason!r})")
        return i

    def abort(self, sample_index: int | None) -> list[Sequence]:
        """End sample ``sample_index`` (None: every sample); returns the sequences the caller must stop
        (``Scheduler.abort``, which books them here through :meth:`finish`). A sample not forked yet
        ends empty and stops nothing; if it is the forking sequence's own, that sequence goes on as
        the next sample still to fork."""
        if sample_index is None:  # every live sequence stops; samples not forked yet end with them, empty
            self._aborted_samples.update(self._to_fork)
            self._to_fork = []
            return list(self._live_samples.values())
        if sample_index in self._to_fork:  # never forked: it never will be
            self._to_fork.remove(sample_index)
            self._aborted_samples.add(sample_index)
            return []
        seq = self._live_samples[sample_index]
        if not self._to_fork:
            return [seq]
        self._aborted_samples.add(sample_index)  # the forking sequence's own sample ends empty; it takes the next one
        del self._live_samples[sample_index]
        seq.sample_index = self._to_fork.pop(0)
        self._live_samples[seq.sample_index] = seq
        return []

    # -- the outcome ---------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """Has every sample finished or been aborted?"""
        return len(self._finished_samples) + len(self._aborted_samples) >= self.n

    def num_output_tokens(self) -> int:
        """Tokens generated so far by every sample's sequence, live or finished."""
        return sum(len(s.output_token_ids) for s in (*self._live_samples.values(), *self._finished_samples.values()))

    def in_order(self) -> list[Sequence | None]:
        """Every sample's sequence by sample index (None: aborted before its fork)."""
        return [self._finished_samples.get(i) for i in range(self.n)]

    @staticmethod
    def completed(finished: list[Sequence]) -> list[ParallelSamples]:
        """The requests that sequences ``finished`` in one step completed, once each, in order (several
        samples of one request may finish in the same step)."""
        return list({seq.request_id: seq.samples for seq in finished if seq.samples.done}.values())

"""A sequence's state as the scheduler sees it: its tokens, how many are computed, its metrics.

Plain Python, shared by the engine (a real model) and the simulator (a cost model).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from paged_edu.core.validation import FieldTypeError, FieldValueError, integer
from paged_edu.sched.parallel_sampling import ParallelSamples

__all__ = ["Sequence", "SequenceStatus"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # not admitted, or preempted by recompute
    RUNNING = "running"  # holds blocks in the GPU pool
    SWAPPED = "swapped"  # preempted by swap: its blocks wait in CPU memory
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """One stream of tokens: a prompt and what has been generated after it.

    ``num_computed_tokens`` leading tokens have their K/V in the cache; how many slots the memory
    manager holds for it is the manager's to count (``num_tokens(seq_id)``). Its CPU blocks while
    swapped out belong to the scheduler's :class:`~paged_edu.sched.swap.SwapSpace`. A sequence with
    ``num_samples = n > 1`` forks into ``n`` sequences when its prompt is done (parallel sampling):
    the children share ``request_id`` and ``samples``, the request's
    :class:`~paged_edu.sched.parallel_sampling.ParallelSamples` record, which knows the rest.
    """

    seq_id: int
    prompt_token_ids: list[int]
    max_new_tokens: int
    arrival_time: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    request_id: int | None = None
    num_samples: int = 1
    num_pending_forks: int = 0  # branches it will fork later (beam search), counted from admission
    sample_index: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at the last admission
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # "length" | "stop" | "abort"
    cache_salt: str | None = None  # its prefix-cache namespace: hits only its own salt's blocks
    num_tokens: int = field(init=False, default=0)  # prompt + output tokens, kept by append_token (as nano-vllm)
    samples: ParallelSamples = field(init=False, repr=False)  # its request's samples, shared by every one of them

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise FieldValueError(
                "prompt_token_ids", f"sequence {self.seq_id}: the prompt is empty; it needs at least one token"
            )
        try:  # counts are integers, never True (a bool is an int to isinstance)
            self.max_new_tokens = integer("max_new_tokens", self.max_new_tokens, low=1)
            self.num_samples = integer("num_samples", self.num_samples, low=1)
            self.num_pending_forks = integer("num_pending_forks", self.num_pending_forks, low=0)
            integer("sample_index", self.sample_index, low=0)  # checked only: the samples' record numbers them
        except (FieldTypeError, FieldValueError) as exc:
            raise type(exc)(exc.field, f"sequence {self.seq_id}: {exc}") from None
        if self.request_id is None:
            self.request_id = self.seq_id
        self.samples = ParallelSamples(self, self.num_samples, self.num_pending_forks)
        self.num_tokens = len(self.prompt_token_ids) + len(self.output_token_ids)

    def append_token(self, token_id: int) -> None:
        """The one way a sequence grows: ``num_tokens`` stays a field, not a sum per call
        (``Scheduler.update`` does the same inline, for speed)."""
        self.output_token_ids.append(token_id)
        self.num_tokens += 1

    def take_back_token(self, num_computed_tokens: int) -> None:
        """:meth:`append_token` undone, and the computed count set back to ``num_computed_tokens``: async
        scheduling's placeholder for a token not read yet, taken back (``engine/overlap.py``,
        :meth:`Scheduler.update`'s held decodes)."""
        self.output_token_ids.pop()
        self.num_tokens -= 1
        self.num_computed_tokens = num_computed_tokens

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def max_num_running_seqs(self) -> int:
        """Sequences this one stands for against ``max_num_seqs``: its samples not forked yet and its
        pending beam branches count from admission (as vLLM counts a request of ``n`` samples as
        ``n``), so a later fork never pushes the batch over the limit."""
        return self.samples.num_tokens_to_sample + self.num_pending_forks

    @property
    def holds_blocks(self) -> bool:
        """Running or swapped: it holds blocks (GPU or CPU) another sample may share."""
        return self.status is SequenceStatus.RUNNING or self.status is SequenceStatus.SWAPPED

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def ttft(self) -> float | None:
        """Time to first token, from arrival."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def inter_token_latencies(self) -> list[float]:
        times = self.token_times
        return [b - a for a, b in zip(times, times[1:])]

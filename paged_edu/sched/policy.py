"""Which waiting request goes first: first come, first served, or longest cached prefix first.

``fcfs`` admits in arrival order (preempted sequences go back to the front). ``lpm`` is SGLang's
*longest prefix match* policy: before admitting, the waiting queue is sorted by how many leading
prompt tokens the prefix cache holds now, longest first, so requests that share a cached prefix
run while it is still cached -- the tree (or hash) cache is hit more and evicts less.

SGLang sorts the whole queue by ``-len(prefix_indices)`` and, above 128 waiting requests, falls
back to FCFS because the prefix matching gets expensive (sgl-project/sglang,
``python/sglang/srt/managers/schedule_policy.py``: ``CacheAwarePolicy.LPM``,
``_determine_active_policy``). Here the first ``window`` (128) waiting requests are sorted and the
rest keep their order.

**Starvation bound.** Sorting by prefix alone can pass over a request with no cached prefix
forever. So every request counts the scheduling rounds it has waited; one that has waited more
than ``max_wait_rounds`` is *aged* and goes before every request that is not, aged ones in queue
(arrival) order. A request therefore waits at most ``max_wait_rounds`` rounds longer than FCFS
would make it wait behind the requests aged before it. The prefix lengths come from the memory
manager's side-effect-free ``num_cached_tokens_for``. Plain Python, no torch.
"""

from __future__ import annotations

from collections import deque

from paged_edu.core.validation import integer
from paged_edu.sched.memory_manager import cache_keys

__all__ = ["POLICIES", "LongestPrefixFirst"]

POLICIES = ("fcfs", "lpm")


class LongestPrefixFirst:
    """Reorders a waiting queue in place: aged requests first, then longest cached prefix first."""

    def __init__(self, max_wait_rounds: int = 64, window: int = 128) -> None:
        self.max_wait_rounds = integer("max_wait_rounds", max_wait_rounds, low=1)
        self.window = integer("window", window, low=1)
        self.rounds: dict[int, int] = {}  # seq_id -> scheduling rounds waited

    def order(self, waiting: deque, manager) -> None:
        rounds = {seq.seq_id: self.rounds.get(seq.seq_id, 0) + 1 for seq in waiting}
        self.rounds = rounds  # admitted sequences drop out; a preempted one starts counting again
        head = [waiting.popleft() for _ in range(min(self.window, len(waiting)))]
        aged = [seq for seq in head if rounds[seq.seq_id] > self.max_wait_rounds]
        rest = [seq for seq in head if rounds[seq.seq_id] <= self.max_wait_rounds]
        rest.sort(
            key=lambda seq: -manager.num_cached_tokens_for(seq.token_ids, **cache_keys(seq))
        )  # stable: ties keep order
        waiting.extendleft(reversed(aged + rest))

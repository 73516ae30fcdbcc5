"""
The last program to arrive: parts of one result combined inside the kernel that computed them
=============================================================================================

What you will learn
-------------------
* how several programs of *one* launch that each compute a part of a result (a slice of ``K`` of a
  GEMM tile, a split of a sequence's attention) can combine the parts without a second kernel: each
  writes its part, then adds 1 to a counter with an atomic; the program that reads back ``n - 1``
  arrived last, so every part is written -- it combines them and sets the counter back to 0;
* why that is safe in a CUDA graph: the counters live in one zeroed buffer per device that every
  launch leaves zeroed again (no memset node, no host work), so a replay finds them as the capture did;
* why the result is deterministic: the last program sums the parts in a fixed order (part 0, 1, ...),
  whichever program came last.

The memory order, per program::

    store my part (every thread)
    barrier of the program's threads                 # all my stores are issued
    old = atomic_add(counter, 1)   (acq_rel, GPU)    # release: my part, to the whole GPU
    if old == n - 1:                                 # acquire: every other part is visible
        read the parts (through L2: .cg), combine, store
        counter = 0                                  # ready for the next launch (stream order)

Used by the skinny GEMM's split-K (:mod:`~paged_edu.kernels.triton_gemm`) and, with
``merge_in_kernel=True``, by the decode kernel's split merge (:mod:`~paged_edu.kernels.decode.fast`). Two
launches that use the counters must not run *concurrently* (two streams); in one stream, and in a chain of
programmatic launches (each waits for its predecessor before its first atomic), they take turns.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["arrival_counters", "last_to_arrive", "reset_arrival"]


@triton.jit
def last_to_arrive(counter_ptr, num_parts):
    """Announce this program's part (written before the call) on ``counter_ptr``; True in the program
    that arrives last of ``num_parts``, which then sees every part and must call :func:`reset_arrival`."""
    # Every thread's part is written before one thread announces it (the barrier), and the
    # announcement releases them to the whole GPU; the last program acquires them all.
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    return arrived == num_parts - 1


@triton.jit
def reset_arrival(counter_ptr):
    """Zero the counter, by the last program, after it combined the parts: ready for the next launch."""
    tl.atomic_xchg(counter_ptr, 0)


_counters: dict[torch.device, torch.Tensor] = {}  # per device: int32, zero between launches


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """``n`` (or more) zeroed int32 counters on ``device``: one buffer per device, grown (never shrunk) as
    needed -- at least 1,024, so that a launch inside a CUDA-graph capture finds it allocated (the GEMM's
    tiles: at most 768, the LM head's; the decode kernel's (sequence, KV head) pairs when it splits: at
    most twice the SMs, :func:`~paged_edu.kernels.decode.tuning.choose_num_splits`)."""
    buf = _counters.get(device)
    if buf is None or buf.numel() < n:
        buf = _counters[device] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return buf

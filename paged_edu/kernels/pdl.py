"""
Programmatic dependent launch: the next kernel starts before this one ends
==========================================================================

What you will learn
-------------------
* why a decode step of a small model is a chain of ~250 kernels whose *latency*, not their
  bytes, sets the time: each waits for the previous one to finish, then pays its own launch,
  its first loads' round trip to HBM and its tail (at batch 1 on an H200, 244 kernels of ~3 us
  each while their weights stream in well under 1 us: ``paged_edu/data/layer_bench.json``);
* how Hopper's *programmatic dependent launch* (PDL) lets kernel ``n + 1`` be launched while
  kernel ``n`` still runs: its programs are placed on the SMs and set up their indices and
  pointers, then wait at ``griddepcontrol.wait`` until ``n`` has finished and its stores are visible;
* where the wait must sit: before the first load of anything an earlier kernel writes, and before
  the first store (a store could race the previous kernel's reads).

The protocol, per kernel launched with ``launch_pdl=True``::

    program ids, offsets, pointers, masks           # overlaps the previous kernel
    gdc_wait()                                      # every earlier kernel's stores are visible
    gdc_launch_dependents()                         # now the next kernel may be launched
    ... the kernel's loads, math and stores ...

``gdc_launch_dependents`` comes *after* the wait, so at most one kernel runs ahead: with it first,
every kernel of a step could be launched at once and sit on the SMs waiting. ``gdc_wait`` waits for
the *whole* previous grid, which itself waited for its own predecessor, so the order of the chain is
kept transitively; a kernel launched without PDL (cuBLAS, a PyTorch op) simply waits as before. Under
the interpreter, or before Hopper, the kernels take ``USE_PDL=False`` and these calls compile away.
In a CUDA graph, stream capture turns the launch attribute into programmatic edges between the
graph's kernel nodes.

Measured on the H200 (``python benchmarks/bench_layer.py --batches 1,16,32,64,256 --reps 20``, a
whole SmolLM2-135M decode step in a CUDA graph, L2 flushed; ``benchmarks/records/h200/pdl_probe/``): the step
pays only when *every* kernel of the chain takes part, which at <= 32 rows means the skinny Triton
GEMM in place of cuBLAS (:mod:`~paged_edu.kernels.triton_gemm`): 711 / 815 / 923 us at batch
1 / 16 / 32 against 864 / 935 / 990 for cuBLAS without PDL, and 878 / 965 / 1,032 for the skinny GEMM
without PDL. With cuBLAS's GEMMs left in the chain, PDL on the Triton kernels alone was *slower*:
899 / 965 / 1,025 us at <= 32 rows (its SwiGLU GEMM also prefetching, as below), and 1,186 against 1,178 us at batch 64, 1,784 against 1,734 at 256,
where every projection was cuBLAS's. So the model turns it on only for the steps the skinny GEMM takes
(:meth:`~paged_edu.models.llama.Kernels.for_step`): <= 32 rows then, <= 64 since commit 2cf683e, which moved the
skinny GEMM's limit (1,090 against 1,108 us a step at 48 rows, 1,175 against 1,175 at 64, 244 kernels instead of 274;
``benchmarks/records/h200/layer_bench_rows64.json``). Also measured and dropped: the GEMM asking for
its weight's lines before the wait (``prefetch.global.L2``, one per 128-byte line: they are no
kernel's output), 757 / 870 / 982 us -- slower than the wait alone. Loading the weight's slice into
*registers* before the wait does pay, at <= 16 rows (:mod:`~paged_edu.kernels.triton_gemm`, "The weight
before the wait": 672 against 708 us a step at batch 1, 775 against 801 at 16).

Steps with prompt chunks of <= 64 rows take part too (commit 64d364a): the rotary + K/V store kernel and the
prefill kernel wait like the others, so a lone short prompt -- a request's first token on an idle server --
runs the same early-launched chain as a decode batch. On an H100 (``python benchmarks/bench_ttft.py --modes
async --lengths 16,40,96``, the server's engine idle, its mixed-step graphs, against the same tree with PDL
in pure-decode steps only, one lease; ``benchmarks/records/h100/ttft_ab_e6f5fcf_log.txt``): the prompt step
on the device 1,029 -> 804 us at 16 tokens and 1,127 -> 1,010 at 40, the time to the first token 1,329 ->
1,161 and 1,413 -> 1,338 us; at 96 tokens, past the skinny GEMM's rows, 1,171 against 1,174 (nothing
changes there). A GPU test holds such a step's hidden states and stored K/V bit for bit to the chain
launched one kernel after the other (``tests/kernels/test_pdl.py``).

Peers launch their own small kernels this way on Hopper, e.g. alibaba/rtp-llm's
``LAUNCH_KERNEL_WITH_PDL`` (``rtp_llm/cpp/cuda/launch_utils.h``: ``cudaLaunchKernelEx`` with
``cudaLaunchAttributeProgrammaticStreamSerialization`` where the compute capability is >= 9).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

__all__ = ["launch_options", "pdl_supported", "wait_for_previous_kernel"]


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def pdl_supported(device: torch.device) -> bool:
    """True on a CUDA device of compute capability >= 9.0 (Hopper). Never for CPU tensors, which is
    where the interpreter runs the kernels (``paged_edu.kernels.support``)."""
    if device.type != "cuda":
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device())[0] >= 9


def launch_options(pdl: bool, device: torch.device) -> dict:
    """A launch's keyword arguments: ``USE_PDL`` for the kernel, and ``launch_pdl`` when it is on."""
    on = bool(pdl) and pdl_supported(device)
    return {"USE_PDL": on, "launch_pdl": True} if on else {"USE_PDL": False}


@triton.jit
def wait_for_previous_kernel(USE_PDL: tl.constexpr):
    """With ``USE_PDL``: wait until every earlier kernel's stores are visible, then let the next
    kernel be launched. Call it before the first load of an earlier kernel's output and before the
    first store."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()

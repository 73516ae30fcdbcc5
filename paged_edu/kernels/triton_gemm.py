"""
Skinny GEMM: a Linear layer for a decode batch of a few rows
============================================================

What you will learn
-------------------
* why ``y = x @ W^T`` with ``M <= 64`` rows is not a matrix multiplication in the usual sense: the
  FLOPs are negligible, the weight ``W`` is read once from HBM, and the time is that read plus the
  kernel's *latency*. On an H200 a SmolLM2-135M decode step at batch 1 ran 121 cuBLAS GEMMs of
  3.9 us each, while their weights (0.7-3.5 MB each) take 0.2-0.8 us at 4.8 TB/s;
* how to read the weight at full speed with a *small* kernel: split its ``N`` output rows over
  enough programs to put one on every SM (132 on an H200), and keep several loads in flight in
  each (``num_stages``: Triton's software pipeline);
* the "swap AB" trick of small-batch GEMMs: the tensor cores want a tall left operand (64 rows
  on Hopper), so each program computes ``y^T``'s tile ``W_tile @ x^T`` -- the weight's rows are
  the tall side, the few tokens (padded to 16) the narrow one;
* split-K without a second kernel: when ``N`` alone gives too few programs (``N = 576``: 36
  tiles of 16 rows), several programs share a tile, each summing a slice of ``K``. They write
  fp32 partial sums; the *last to arrive* (an atomic counter per tile) adds them up in a fixed
  order and writes ``y``, then resets the counter for the next launch -- no memset, no second pass,
  the same bits whichever program comes last;
* how a GEMM takes the next elementwise op into its *epilogue*: the SwiGLU MLP's ``silu(gate) * up``
  applied to the tiles before they are stored (``swiglu=True``), one kernel where there were two --
  and why its tiling differs from the plain GEMM's.

The math
--------
For ``x`` ``(M, K)`` and ``W`` ``(N, K)`` (row-major, as ``nn.Linear`` stores it)::

    y[m, n] = sum_k x[m, k] * W[n, k]                    # y = x @ W^T, (M, N)

Program ``(j, s)`` owns output columns ``n in [j*BLOCK_N, (j+1)*BLOCK_N)`` and the ``s``-th of
``SPLIT_K`` slices of ``K``; it accumulates ``acc = W[n_tile, k_slice] @ x[:, k_slice]^T``, a
``(BLOCK_N, BLOCK_M)`` tile of ``y^T`` in fp32, ``BLOCK_K`` columns of ``K`` at a time. With
``SPLIT_K = 1`` it writes ``y[:, n_tile] = acc^T`` in ``x``'s dtype; otherwise
``y[:, n_tile] = sum_s partial_s^T``, summed by the last program of the tile.

``tl.dot`` needs every dimension >= 16 for 16-bit inputs on a GPU: ``BLOCK_M`` is ``M`` rounded
up to a power of two from 16 to 64 (the padding rows are masked loads of 0, never stored), ``BLOCK_N, BLOCK_K >= 16``.
fp32 inputs multiply in full fp32 (``input_precision="ieee"``, as ``F.linear`` does; TF32 would
lose 13 bits). In the interpreter (``TRITON_INTERPRET=1``) bf16 tensors are raw bits: the tiles
are upcast to fp32 right after their loads (and the interpreter truncates the final bf16 store
where the GPU rounds to nearest: one ulp).

The SwiGLU epilogue (on by default at <= 64 rows)
-------------------------------------------------
A Llama MLP is ``down(silu(x @ W_g^T) * (x @ W_u^T))``; ``gate_up_proj`` stores ``W_g`` and ``W_u``
stacked, a ``(2I, K)`` weight, gate rows first. Unfused, at <= 64 rows, its first half is two
kernels: the GEMM writes ``(M, 2I)``, and
:func:`~paged_edu.kernels.triton_fused.silu_and_mul_triton` reads it back to write ``(M, I)`` -- one
launch of ~4 us (latency, not bytes) per layer, 30 per SmolLM2 decode step. With ``swiglu=True``
program ``(j, s)`` owns the outputs ``n in [j*BLOCK_N, (j+1)*BLOCK_N)`` of ``I`` and sums *two* tiles
over the same ``x`` tile: the gate's (weight rows ``n``) and the up's (rows ``n + I``); then::

    g = round(acc_gate),  u = round(acc_up)              # where F.linear rounds gate_up
    a[m, n] = round(round(silu(g)) * u)                  # silu_and_mul_triton's rounding, (M, I)

``round`` is the cast to ``x``'s dtype (:func:`~paged_edu.kernels.triton_fused.round_to`), and the
second line is the same ``@triton.jit`` helper
(:func:`~paged_edu.kernels.triton_fused.silu_and_mul`) that the separate kernel calls: the result is
bit for bit ``silu_and_mul_triton(F.linear(x, W))`` wherever the two GEMMs' fp32 sums agree (their
order differs, so a sum next to a rounding boundary can land one ulp apart). Under split-K the
partial buffer is indexed by *weight row* (``(SPLIT_K, 2I, BLOCK_M)``); the last program of a tile
adds both halves' partials in slice order, then applies the epilogue. In the interpreter this
epilogue rounds by hand to nearest (:func:`~paged_edu.kernels.triton_fused.round_to`), so the
truncated store above does not apply to it. Its tiling is its own (:func:`skinny_config` with
``swiglu=True``): no split of ``K``, five stages. With the plain rule's tiling (``SPLIT_K = 3``, 288
programs) it had removed the 30 launches but not the time (5.6 us against cuBLAS's gate_up GEMM plus
the SiLU kernel). A sweep on the H200 (``benchmarks/records/h200/mlp_sweep.json``: 30 MLPs in one CUDA graph, L2
flushed) put the unsplit tiling at 4.9-5.1 us a layer at 1-32 rows, against 4.5 + 1.8-2.0 us for the
two kernels it replaces. A whole decode step (``python benchmarks/bench_layer.py --batches 1,16,32,64,256
--reps 20``, with and without ``--no-swiglu-gemm`` in one call; ``benchmarks/records/h200/layer_bench_swiglu_default.json``
and ``layer_bench_swiglu_off.json``): 863 against 890 us at batch 1, 936 / 971 at 16, 989 / 1,034 at 32,
244 kernels instead of 274; batches of more than 32 rows were unchanged (cuBLAS and the SiLU kernel; since 2cf683e the
skinny GEMM takes up to 64 rows, below). Its
logits are as far from an fp32 step as the two-kernel path's (3.2-3.5e-2 for both over 30 random
layers). So ``Kernels.swiglu_gemm`` is on by default; ``False`` gives the two kernels back.

A mirror image was measured and not kept: SiLU-and-mul in the *prologue* of the down projection
(each program applying it to the ``x`` tiles it loads). Bit for bit the two-kernel path, but at best
5.9 us (split 12 ways) against 7.1 us for the SiLU kernel plus cuBLAS's down GEMM at one row, 8.2
against 7.3 at 32 rows, and 9.5 us with the plain rule's tiling; each program recomputes the
activation of its slice of ``K``, once for every tile of outputs that reads it.

The *previous* op in the prologue was measured too, and not kept: the residual add + RMSNorm that
feeds qkv and gate_up (two of a layer's eight kernels at <= 64 rows), as ``add_rms_norm_matmul``. A norm
needs its row's ``sum(r'^2)`` before any normalised value exists. Two ways, both tested in the
interpreter against an fp64 oracle and the two-kernel path, both slower on the H200 (commits d7136fc and
8ba8c78, reverted; records ``benchmarks/records/h200/norm_sweep_{prepass,fold}.json``, 30 layers in one CUDA graph, L2
flushed, us a layer at 1 / 16 / 32 rows):

* a first pass over the row in every program, then the GEMM on normalised tiles (the norm kernel's
  roundings): qkv 6.9 / 7.2 / 8.7 against 6.0 / 5.9 / 5.9 for the norm kernel plus cuBLAS; gate_up with
  SwiGLU 7.4 / 7.8 / 9.1 against 6.7 / 6.8 / 6.9 for the norm kernel plus the SwiGLU GEMM. The best of 12
  tilings at one row: 6.2 and 7.2;
* no first pass: ``sum(r'^2)`` accumulated in the GEMM's own loop and ``1 / rms`` applied to the sums
  (one rounding fewer; no split of ``K``): qkv 7.2 / 7.2 / 8.2, gate_up with SwiGLU 10.7 / 10.7 / 9.4.

A whole decode step (``bench_layer.py --batches 1,16,32,64,256 --reps 20``, with and without the option in
one call): 911 against 854 us at batch 1, 1,027 / 930 at 16, 1,165 / 987 at 32 for the first way; 1,013 /
857, 1,093 / 931, 1,139 / 988 for the second -- with 184 kernels instead of 244
(``benchmarks/records/h200/layer_bench_norm_{prepass,fold}_{on,off}.json``). What each program adds -- the row's
reductions, the h, r and norm-weight loads beside every weight tile -- cost more than the ~2 us launch it
saved; which of them costs most was not measured.

A third time, the first way built again under programmatic launches and the weight preload (branch kern4,
8e9c4f7, not merged): each program's pass over its rows after the PDL wait, its weight slice still loaded
before it, program ``(0, 0)`` storing ``r'``. On the H100 a whole decode step (``bench_layer.py --ab norm_gemm
--batches 1,16,64 --reps 20 --rounds 3``: one process, three interleaved rounds; log
``benchmarks/records/h100/layer_ab_norm_gemm_8e9c4f7_log.txt``) took 768 against 662 us at batch 1 (+16.0 %),
964 / 805 at 16 (+19.7 %), 1,457 / 1,148 at 64 (+26.9 %), with 184 kernels instead of 244: 60 launches fewer a
step still lost, at every batch. And in the same call one GPU test failed: with the prologue on, the chain of
programmatic launches at 33 sequences was not bit for bit the same kernels launched one after the other
(``test_pdl.py::test_gpu_decode_graph_with_pdl_is_bit_for_bit_the_plain_chain[33-True]``; its traceback did
not come back, so which read ran early is not known).

Launch shapes depend only on ``(M's bucket, N, K)`` and the config, never on values, so a call
captures in a CUDA graph; the split-K counters live in one zeroed buffer per device that every
launch leaves zeroed again (so two split-K launches must not run *concurrently* on two streams).

Measured: a tie with cuBLAS alone, a win in a chain of programmatic launches
----------------------------------------------------------------------------
``python benchmarks/bench_gemm.py`` on the H200 (record ``benchmarks/records/h200/gemm_bench.json``; a graph of
30 GEMMs on distinct weights, L2 flushed, per call at M = 1): qkv 4.54 us against cuBLAS's 4.15,
o_proj 4.22 / 3.76, gate_up 4.63 / 4.42, down 5.19 / 5.23, the LM head 18.1 / 16.6 with the
default config; the best of the sweep per shape (4.19, 4.01, 4.34, 4.89, 15.9 us) sums to within
1 % of cuBLAS per layer. A whole SmolLM2 decode step: 902 against 876 us at batch 1, 986 against
954 at batch 16. Both kernels sit at the same floor, ~4 us a GEMM for 0.7-3.5 MB that the memory
streams in under 1 us: the time is latency (a launch inside the graph, the first loads' round
trips, the tail), which a different tiling does not remove -- fewer kernels do (the decode
kernel's own K/V store, :mod:`~paged_edu.kernels.decode.fast`; the SwiGLU epilogue above) -- or
kernels that start before the previous one ends. That is what this kernel can do and cuBLAS's cannot
here: launched as a programmatic dependent (``pdl=True``, :mod:`~paged_edu.kernels.pdl`) it waits for
``x`` only after its programs are placed and their pointers computed. With every kernel of a decode
step launched that way a whole step took 711 against 864 us at batch 1 (cuBLAS, no PDL) on the H200,
815 / 935 at 16 and 923 / 990 at 32. So ``gemm="auto"`` means ``"triton"`` where PDL is on (Hopper
and later, a pure-decode chain of Triton kernels) and ``"torch"`` elsewhere.

Up to 32 rows first, then 64 (``MAX_ROWS``, commit 2cf683e): with ``BLOCK_M = 64`` a decode step of 33-64 sequences
runs 244 kernels instead of 274 (cuBLAS's GEMMs and the SiLU kernel gone) and the whole chain launches early -- on the
H200 1,090 against 1,108 us a step at 48 rows, 1,175 against 1,175 at 64 (``python benchmarks/bench_layer.py --batches
1,16,32,33,48,64,256 --reps 20``, ``benchmarks/records/h200/layer_bench_rows64.json``; ``docs/benchmarks.md``). Past 64 rows cuBLAS
runs the projections (the skinny GEMM was not measured there).

The weight before the wait (``PRELOAD``)
---------------------------------------
Inside a chain of programmatic launches the kernel's first loads still wait: ``x`` is the previous
kernel's output, and the loop asks for ``w`` and ``x`` together. But ``w`` is no kernel's output. With
``PRELOAD`` a program loads its *whole* weight slice -- ``BLOCK_N`` rows by the slice's ``K`` columns,
padded to a power of two for ``tl.arange`` and masked there -- before ``gdc_wait``, so that round trip
to HBM overlaps the previous kernel; after the wait only ``x`` (just written, in L2) is loaded, and one
``tl.dot`` over the slice replaces the loop. On the H200 its logits equal the loop's bit for bit (the
tensor-core steps run in the same order). An earlier try that only asked for the weight's lines to come
into L2 (``prefetch.global.L2``, :mod:`~paged_edu.kernels.pdl`) was slower; registers are the
difference. Measured (script ``benchmarks/records/h200/preload_ab_script.txt``, log ``benchmarks/records/h200/preload_ab_sweep_log.txt``:
a whole SmolLM2 decode step in a CUDA graph, context 512, L2 flushed, three interleaved rounds, us):

========  =====  ========================  ==========================
rows      loop   PRELOAD (qkv, o, down)    PRELOAD + the SwiGLU GEMM
========  =====  ========================  ==========================
1         708    **672**                   702
16        801    **775**                   810
32        914    932                       975
48        1,077  1,100                     1,208
64        1,163  1,164                     1,244
========  =====  ========================  ==========================

It pays up to 16 rows (one ``x`` tile of 16) and loses from 32, where the whole ``x`` slice of 32-64 rows
arrives in one unpipelined load after the wait; the SwiGLU GEMM's unsplit slice (two 16 x 1,024 tiles)
loses at every size. So :func:`skinny_config` sets it for at most 16 rows and slices of at most 8,192
elements, never with ``swiglu``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from paged_edu.kernels.pdl import launch_options, wait_for_previous_kernel
from paged_edu.kernels.support import SKINNY_MAX_ROWS, num_sms
from paged_edu.kernels.triton_fused import INTERPRETING, by_hand, round_to, silu_and_mul

__all__ = ["MAX_ROWS", "skinny_config", "skinny_matmul"]

MAX_ROWS = SKINNY_MAX_ROWS  # the largest M: one tile of x^T, at most 64 rows, rides along with every weight tile

# PRELOAD where it was measured to pay (the module docstring, "The weight before the wait"): x's tile of
# at most 16 rows, a weight slice of at most 16 KB in bf16 (SmolLM2's qkv, o and down; not the LM head's
# 64 x 1,024 tiles, which would not fit in registers).
PRELOAD_MAX_ROWS = 16
PRELOAD_MAX_ELEMENTS = 8192


# ----------------------------------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------------------------------


@triton.jit
def _mma(w, x, acc, IEEE: tl.constexpr):
    """``acc + w @ x^T``: a ``(BLOCK_N, BLOCK_K)`` weight tile times ``x``'s ``(BLOCK_M, BLOCK_K)`` tile."""
    if IEEE:
        return tl.dot(w, tl.trans(x), acc, input_precision="ieee")  # (BLOCK_N, BLOCK_M)
    return tl.dot(w, tl.trans(x), acc)  # (BLOCK_N, BLOCK_M)


@triton.jit
def _epilogue(acc, acc_up, dtype: tl.constexpr, SWIGLU: tl.constexpr, BY_HAND: tl.constexpr):
    """The tile of ``y^T`` to store, in ``dtype``: ``acc`` itself, or with ``SWIGLU``
    ``round(round(silu(g)) * u)`` of the gate and up sums rounded to ``dtype`` first -- exactly where
    ``F.linear`` would round them before :func:`~paged_edu.kernels.triton_fused.silu_and_mul_triton`."""
    y = acc
    if SWIGLU:
        y = silu_and_mul(round_to(acc, dtype, BY_HAND), round_to(acc_up, dtype, BY_HAND), dtype, BY_HAND)
    return y.to(dtype)


@triton.jit(do_not_specialize=["M"])  # M unspecialised: M = 1 shares the kernel of M = 2..16
def _skinny_matmul_kernel(
    x_ptr,  # (M, K): the activations, any strides
    w_ptr,  # (N, K): the weight, as nn.Linear stores it; (2N, K) with SWIGLU: gate rows, then up rows
    y_ptr,  # (M, N) out, in x's dtype
    partial_ptr,  # fp32 (SPLIT_K, N or 2N weight rows, BLOCK_M): each K slice's sums (unused when SPLIT_K == 1)
    counter_ptr,  # int32 (>= number of N tiles,): programs of a tile done so far; 0 between launches
    M,  # rows of x (<= BLOCK_M); runtime, so batches 1..16 share one compiled kernel
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_ym,
    stride_yn,  # element strides
    N: tl.constexpr,  # output features (I with SWIGLU)
    K: tl.constexpr,  # input features
    BLOCK_M: tl.constexpr,  # M rounded up to 16, 32 or 64: the narrow side of every tl.dot
    BLOCK_N: tl.constexpr,  # output features per program (the tall side of tl.dot); twice the weight rows with SWIGLU
    BLOCK_K: tl.constexpr,  # columns of K per loop step: one (BLOCK_N, BLOCK_K) weight load
    K_STEPS: tl.constexpr,  # loop steps per program: cdiv(cdiv(K, BLOCK_K), SPLIT_K)
    SPLIT_K: tl.constexpr,  # programs sharing one N tile, each summing a slice of K
    SWIGLU: tl.constexpr,  # y = silu(x @ W_gate^T) * (x @ W_up^T): a second tile, weight rows n + N
    UPCAST: tl.constexpr,  # convert tiles to fp32 after loading (the interpreter: bf16 is raw bits)
    IEEE: tl.constexpr,  # fp32 inputs: full-precision products, not TF32
    BY_HAND: tl.constexpr,  # the SWIGLU epilogue's round_to rounds by hand (the interpreter, bf16)
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent (paged_edu.kernels.pdl)
    PRELOAD: tl.constexpr,  # the whole K slice's weight tile loaded before the wait, one tl.dot after it
    K_SLICE_PAD: tl.constexpr,  # PRELOAD: K_STEPS * BLOCK_K rounded up to a power of two (tl.arange)
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) rows of W, columns of y
    rm = tl.arange(0, BLOCK_M)  # (BLOCK_M,) rows of x and y
    k_start = pid_k * (K_STEPS * BLOCK_K)  # this program's first column of K
    mask_n = rn < N
    mask_m = rm < M
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # a tile of y^T (SWIGLU: of the gate's)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # SWIGLU: the up tile's (else unused)
    if PRELOAD:
        # The weight is no kernel's output: its whole slice is requested before the wait, so its
        # round trip to HBM overlaps the previous kernel; after the wait only x (in L2) is loaded.
        ks = k_start + tl.arange(0, K_SLICE_PAD)  # (K_SLICE_PAD,) this slice's columns
        mask_ks = (ks < k_start + K_STEPS * BLOCK_K) & (ks < K)  # not the next slice's, not past K
        w_mask = mask_n[:, None] & mask_ks[None, :]
        w_all = w_ptr + rn[:, None] * stride_wn + ks[None, :] * stride_wk  # (BLOCK_N, K_SLICE_PAD)
        w = tl.load(w_all, mask=w_mask, other=0.0)  # (BLOCK_N, K_SLICE_PAD)
        if SWIGLU:
            w_up = tl.load(w_all + N * stride_wn, mask=w_mask, other=0.0)  # the up rows, n + N
        wait_for_previous_kernel(USE_PDL)  # x is the previous kernel's output
        x_all = x_ptr + rm[:, None] * stride_xm + ks[None, :] * stride_xk  # (BLOCK_M, K_SLICE_PAD)
        x = tl.load(x_all, mask=mask_m[:, None] & mask_ks[None, :], other=0.0)
        if UPCAST:
            w = w.to(tl.float32)
            x = x.to(tl.float32)
        acc = _mma(w, x, acc, IEEE)  # (BLOCK_N, BLOCK_M)
        if SWIGLU:
            if UPCAST:
                w_up = w_up.to(tl.float32)
            acc_up = _mma(w_up, x, acc_up, IEEE)
    else:
        rk = k_start + tl.arange(0, BLOCK_K)  # (BLOCK_K,) the step's columns
        w_ptrs = w_ptr + rn[:, None] * stride_wn + rk[None, :] * stride_wk  # (BLOCK_N, BLOCK_K)
        up_ptrs = w_ptrs + N * stride_wn  # (BLOCK_N, BLOCK_K): SWIGLU's up rows, n + N
        x_ptrs = x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk  # (BLOCK_M, BLOCK_K)
        wait_for_previous_kernel(USE_PDL)  # x is the previous kernel's output
        for _ in range(K_STEPS):  # a constant trip count: the pipeliner keeps num_stages - 1 loads ahead
            mask_k = rk < K  # the tail of K, and whole steps past it when SPLIT_K does not divide
            w_mask = mask_n[:, None] & mask_k[None, :]
            w = tl.load(w_ptrs, mask=w_mask, other=0.0)  # (BLOCK_N, BLOCK_K)
            x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)  # (BLOCK_M, BLOCK_K)
            if UPCAST:
                w = w.to(tl.float32)
                x = x.to(tl.float32)
            acc = _mma(w, x, acc, IEEE)  # (BLOCK_N, BLOCK_M)
            if SWIGLU:  # the same x tile, the up rows' weights
                w_up = tl.load(up_ptrs, mask=w_mask, other=0.0)  # (BLOCK_N, BLOCK_K)
                if UPCAST:
                    w_up = w_up.to(tl.float32)
                acc_up = _mma(w_up, x, acc_up, IEEE)  # (BLOCK_N, BLOCK_M)
                up_ptrs += BLOCK_K * stride_wk
            rk += BLOCK_K
            w_ptrs += BLOCK_K * stride_wk
            x_ptrs += BLOCK_K * stride_xk
    y_ptrs = y_ptr + rm[None, :] * stride_ym + rn[:, None] * stride_yn  # (BLOCK_N, BLOCK_M): y^T's tile
    y_mask = mask_n[:, None] & mask_m[None, :]
    dtype = y_ptr.dtype.element_ty
    if SPLIT_K == 1:
        tl.store(y_ptrs, _epilogue(acc, acc_up, dtype, SWIGLU, BY_HAND), mask=y_mask)
    else:
        W_ROWS = 2 * N if SWIGLU else N  # partial is indexed by weight row
        tile = rn[:, None] * BLOCK_M + rm[None, :]  # (BLOCK_N, BLOCK_M) offsets in one slice of partial
        tl.store(partial_ptr + pid_k * (W_ROWS * BLOCK_M) + tile, acc, mask=mask_n[:, None])
        if SWIGLU:
            tl.store(partial_ptr + pid_k * (W_ROWS * BLOCK_M) + N * BLOCK_M + tile, acc_up, mask=mask_n[:, None])
        # Every thread's partial is written before one thread announces it (the barrier), and the
        # announcement releases them to the whole GPU; the last program acquires them all.
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            total_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):  # a fixed order: the same sum whoever arrives last
                # .cg: read L2, where the other SMs' stores are, not a stale L1 line
                slice_ptr = partial_ptr + s * (W_ROWS * BLOCK_M)
                total += tl.load(slice_ptr + tile, mask=mask_n[:, None], cache_modifier=".cg")
                if SWIGLU:
                    total_up += tl.load(slice_ptr + N * BLOCK_M + tile, mask=mask_n[:, None], cache_modifier=".cg")
            tl.store(y_ptrs, _epilogue(total, total_up, dtype, SWIGLU, BY_HAND), mask=y_mask)
            tl.atomic_xchg(counter_ptr + pid_n, 0)  # ready for the next launch (stream order)


# ----------------------------------------------------------------------------------------------
# The configuration: one fixed choice per shape, overridable for sweeps
# ----------------------------------------------------------------------------------------------


def _k_slice(K: int, block_k: int, split_k: int) -> tuple[int, int]:
    """One program's share of ``K``: its loop steps of ``block_k`` columns (``K_STEPS``), and those
    ``K_STEPS * block_k`` columns rounded up to a power of two (``K_SLICE_PAD``, the width of
    ``PRELOAD``'s tile)."""
    steps = triton.cdiv(triton.cdiv(K, block_k), split_k)
    return steps, triton.next_power_of_2(steps * block_k)


def skinny_config(M: int, N: int, K: int, num_sms: int = 132, *, swiglu: bool = False) -> dict:
    """Block sizes, split-K, warps and pipeline depth for ``(M, N, K)`` (no autotuning: a decode
    GEMM is captured in a CUDA graph and must launch the same way every time).

    * ``BLOCK_N``: the largest of 64, 32, 16 that still gives one N tile per SM (the LM head's
      49,152 rows: 64, 768 tiles; gate_up's 3,072: 16, 192 tiles); at least 16 for ``tl.dot``.
    * ``BLOCK_K``: 128 columns (256 bytes of each weight row) when they divide ``K``, else 64
      (``K = 576``): whole steps, no masked tail.
    * ``SPLIT_K``: where the N tiles fill fewer than 3/4 of the SMs (``N = 576``: 36 tiles,
      ``N = 960``: 60), the smallest divisor of the K steps that reaches 3/4, up to 8.
    * ``num_stages = 4``: three weight tiles in flight while one is multiplied -- a split-K program's
      whole slice (3 steps) is requested at once, the latency paid about once; ``num_warps = 4``.

    * ``PRELOAD``: at most 16 rows and a weight slice of at most 8,192 elements (``BLOCK_N`` times the
      slice's ``K`` columns rounded up to a power of two): the slice is loaded whole before the PDL wait
      and multiplied in one ``tl.dot`` (the module docstring, "The weight before the wait").

    ``M`` changes only ``PRELOAD``: the weight read is the same for 1 or 64 rows.

    The SwiGLU GEMM (``swiglu=True``: ``N`` counts its output features, ``I``, and each program reads
    ``2 * BLOCK_N`` weight rows, gate and up) never splits ``K`` and keeps five stages in flight: at
    SmolLM2's MLP (``I = 1536``, ``K = 576``) 96 programs of 2 x 16 rows by 576 columns. Measured on the
    H200 (a sweep of 108 tilings at one row, the best four at 16 and 32; ``benchmarks/records/h200/mlp_sweep.json``):
    4.9-5.1 us a call at 1-32 rows, against ~6.2 us for the plain rule's ``SPLIT_K = 3`` (288 programs;
    5.6 us in an earlier session) and 6.2-6.6 us for cuBLAS's ``gate_up`` plus the SiLU kernel. What a
    split adds here: fp32 partials of *two* tiles per program and the last program's pass over them;
    unsplit, each program walks its nine 64-column steps of ``K`` with four loads ahead.
    """
    block_n = 64
    while block_n > 16 and triton.cdiv(N, block_n) < num_sms:
        block_n //= 2
    block_k = 128 if K % 128 == 0 else 64
    if swiglu:
        return dict(BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=1, num_warps=4, num_stages=5, PRELOAD=False)
    tiles, k_blocks = triton.cdiv(N, block_n), triton.cdiv(K, block_k)
    split_k = 1
    if tiles < 0.75 * num_sms:
        divisors = [s for s in range(1, min(8, k_blocks) + 1) if k_blocks % s == 0]
        split_k = next((s for s in divisors if tiles * s >= 0.75 * num_sms), divisors[-1])
    _, slice_pad = _k_slice(K, block_k, split_k)
    preload = M <= PRELOAD_MAX_ROWS and block_n * slice_pad <= PRELOAD_MAX_ELEMENTS
    return dict(BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, num_warps=4, num_stages=4, PRELOAD=preload)


_counters: dict[torch.device, torch.Tensor] = {}  # per device: int32, zero between launches


def _tile_counters(device: torch.device, n_tiles: int) -> torch.Tensor:
    """The split-K arrival counters: one zeroed buffer per device, grown (never shrunk) as needed."""
    buf = _counters.get(device)
    if buf is None or buf.numel() < n_tiles:
        buf = _counters[device] = torch.zeros(max(n_tiles, 1024), dtype=torch.int32, device=device)
    return buf


# ----------------------------------------------------------------------------------------------
# The Python wrapper
# ----------------------------------------------------------------------------------------------


def skinny_matmul(
    x: torch.Tensor,  # (M, K), M <= MAX_ROWS; any strides
    weight: torch.Tensor,  # (N, K), nn.Linear's weight; with swiglu gate_up's (2I, K): gate rows, then up rows
    out: torch.Tensor | None = None,  # (M, N) -- (M, I) with swiglu -- in x's dtype: written in place when given
    config: dict | None = None,  # overrides of skinny_config (benchmark sweeps)
    *,
    swiglu: bool = False,  # silu(gate) * up in the epilogue: silu_and_mul_triton(F.linear(x, weight)) in one kernel
    pdl: bool = False,  # launch as a programmatic dependent where the GPU can (paged_edu.kernels.pdl)
) -> torch.Tensor:  # (M, N) or (M, I), x's dtype
    """``x @ weight.T`` for a few rows (``F.linear(x, weight)`` without a bias), fp32 accumulation.

    With ``swiglu=True``, the SwiGLU MLP's first half: ``silu(g) * u`` for ``g, u = (x @ weight.T).chunk(2, -1)``,
    rounded as :func:`~paged_edu.kernels.triton_fused.silu_and_mul_triton` rounds ``F.linear``'s output."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"x must be (M, K) and weight (N, K), got {tuple(x.shape)} and {tuple(weight.shape)}")
    M, K = x.shape
    N = weight.shape[0]  # weight rows
    if weight.shape[1] != K:
        raise ValueError(f"x has K={K} columns but weight is {tuple(weight.shape)}: need (N, {K})")
    if M > MAX_ROWS:
        raise ValueError(f"skinny_matmul takes at most {MAX_ROWS} rows (a small decode batch), got M={M}: use F.linear")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(
            f"x and weight must share dtype and device, got {x.dtype} on {x.device} and {weight.dtype} on {weight.device}"
        )
    if swiglu and N % 2:
        raise ValueError(
            f"swiglu=True needs gate_up's weight, (2I, K): gate rows then up rows, an even number; got {N} rows"
        )
    if not INTERPRETING and not x.is_cuda:
        raise RuntimeError(
            "skinny_matmul needs a CUDA GPU, or the Triton interpreter for CPU tensors: set "
            "TRITON_INTERPRET=1 before importing paged_edu (slow, for learning and tests), or use F.linear"
        )
    n_out = N // 2 if swiglu else N  # output features: I with swiglu
    if out is None:
        out = torch.empty((M, n_out), dtype=x.dtype, device=x.device)
    elif out.shape != (M, n_out) or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"out must be ({M}, {n_out}) {x.dtype} on {x.device}, got {tuple(out.shape)} {out.dtype} on {out.device}"
        )
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()  # swiglu too: silu(0) * 0
    sms = num_sms(x.device.index if x.device.index is not None else torch.cuda.current_device()) if x.is_cuda else 132
    cfg = skinny_config(M, n_out, K, sms, swiglu=swiglu)  # swiglu: tiles of I outputs, 2 * BLOCK_N weight rows each
    cfg.update(config or {})
    block_m = max(16, triton.next_power_of_2(M))  # 16, 32 or 64
    n_tiles = triton.cdiv(n_out, cfg["BLOCK_N"])
    split_k = cfg["SPLIT_K"]
    if split_k > 1:  # each slice's fp32 sums per weight row; no zeroing needed, every program writes its whole slice
        partial = torch.empty((split_k, N, block_m), dtype=torch.float32, device=x.device)
        counters = _tile_counters(x.device, n_tiles)
    else:
        partial = counters = out  # unused
    k_steps, slice_pad = _k_slice(K, cfg["BLOCK_K"], split_k)
    _skinny_matmul_kernel[(n_tiles, split_k)](
        x,
        weight,
        out,
        partial,
        counters,
        M,
        x.stride(0),
        x.stride(1),
        weight.stride(0),
        weight.stride(1),
        out.stride(0),
        out.stride(1),
        N=n_out,
        K=K,
        BLOCK_M=block_m,
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=cfg["BLOCK_K"],
        K_STEPS=k_steps,
        SPLIT_K=split_k,
        SWIGLU=swiglu,
        UPCAST=INTERPRETING and x.dtype != torch.float32,
        IEEE=x.dtype == torch.float32,
        BY_HAND=swiglu and by_hand(x.dtype),
        PRELOAD=cfg["PRELOAD"],
        K_SLICE_PAD=slice_pad,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        **launch_options(pdl, x.device),
    )
    return out

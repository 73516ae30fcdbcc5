"""
Fusing a Llama layer's per-token ops: residual add + RMSNorm, and SiLU-and-mul
==============================================================================

What you will learn
-------------------
* why a decode step of a small model is bound by the *number* of kernels, not by their bytes:
  written in PyTorch, a residual add and ``RMSNorm`` are nine kernels (add, cast, square, mean,
  + eps, rsqrt, multiply, cast, times the weight), each reading and writing the whole ``(T, hidden)`` activation; at
  ``T = 256`` rows of 576 values one such kernel moves 0.3 MB -- 0.07 us of HBM time -- but costs
  1-3 us to run. On an H200, 800 such kernels were 2 of the 3.5 ms of a SmolLM2 decode step;
* how one program per row does the whole thing with the row in registers: one read, one write;
* how to keep the *rounding points* of the PyTorch path, so that a fused model gives the same
  bf16 numbers as the plain one (up to the order of a sum).

The two kernels
---------------
**Residual add + RMSNorm** (vLLM's ``fused_add_rms_norm``, ``csrc/layernorm_kernels.cu``, which
updates ``residual`` in place and overwrites the input with the normalised row). A Llama layer
adds each sub-layer's output ``h`` to the residual stream ``r`` and normalises the sum for the
next sub-layer; per row of ``N`` values, in the model's dtype with every product in fp32::

    r'  = round(h + r)                                   # the new residual stream, returned
    y   = round(w * round(r' / sqrt(mean(r'^2) + eps)))  # the next sub-layer's input

``round`` is the cast to the activation dtype (bf16): exactly where :class:`PagedLlama`'s
``RMSNorm`` casts (``x.float()`` ... ``.to(dtype)``, then ``weight * x`` in bf16). Without a
residual (the first layer) ``r' = h``. Ours writes two new tensors instead of updating in place:
the same bytes, and no tensor a caller holds changes under it.

**SiLU-and-mul** (vLLM's ``silu_and_mul``, ``csrc/activation_kernels.cu``). The SwiGLU MLP's
``gate_up`` projection gives ``(T, 2I)``: gate ``g`` then up ``u``; the down projection wants::

    a = round(round(g / (1 + exp(-g))) * u)     # (T, I)

(``silu`` rounds to bf16 before the product, as ``F.silu(gate) * up`` does.) The per-element math is
one ``@triton.jit`` helper, :func:`silu_and_mul`, which the skinny GEMM's SwiGLU epilogue
(:mod:`~paged_edu.kernels.triton_gemm`, ``swiglu=True``) calls too: at <= 64 rows the two kernels become one.

In the interpreter (``TRITON_INTERPRET=1``) bf16 tensors are raw bits; both kernels convert to
fp32 right after each load and keep every value in fp32. Each ``round`` is :func:`round_to`: a
cast to the activation dtype and back -- except that the interpreter *truncates* fp32 to bf16
(the GPU and PyTorch round to nearest, ties to even), so there it rounds by hand on the bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from paged_edu.kernels.pdl import launch_options, wait_for_previous_kernel

__all__ = ["INTERPRETING", "add_rms_norm_triton", "by_hand", "round_to", "silu_and_mul", "silu_and_mul_triton"]


@triton.jit
def round_to(x, dtype: tl.constexpr, BY_HAND: tl.constexpr):
    """``x`` (fp32) rounded to ``dtype`` as PyTorch rounds (nearest, ties to even), kept in fp32.

    ``BY_HAND`` (the interpreter with bf16): add half an ulp of bf16 -- ``0x7FFF`` plus the lowest
    kept bit, for ties to even -- to the fp32 bits and clear the 16 bits bf16 drops (finite ``x``).
    """
    if BY_HAND:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    return x.to(dtype).to(tl.float32)


# The kernels were decorated under the interpreter (TRITON_INTERPRET=1 before this import)? Asked
# here, in the Triton module every other one imports (triton_decode re-exports it under the same name).
INTERPRETING = type(round_to).__name__ == "InterpretedFunction"


def by_hand(dtype: torch.dtype) -> bool:
    """Whether :func:`round_to` must round by hand: the interpreter, rounding to bf16."""
    return INTERPRETING and dtype == torch.bfloat16


# ----------------------------------------------------------------------------------------------
# Residual add + RMSNorm: one program per row
# ----------------------------------------------------------------------------------------------


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,  # (T, N): the sub-layer's output h
    residual_ptr,  # (T, N): the residual stream r (unused when HAS_RESIDUAL is False)
    weight_ptr,  # (N,): the norm's weight w
    y_ptr,  # (T, N) out: the normalised row y
    residual_out_ptr,  # (T, N) out: r' = h + r (unused when HAS_RESIDUAL is False)
    stride_x,
    stride_r,
    stride_y,
    stride_ro,  # row strides (the column stride is 1)
    eps,  # the norm's epsilon
    N: tl.constexpr,  # hidden size
    BLOCK_N: tl.constexpr,  # N rounded up to a power of two: the whole row in one program
    HAS_RESIDUAL: tl.constexpr,  # False for the first layer: r' = h, nothing is written
    BY_HAND: tl.constexpr,  # round_to rounds by hand (the interpreter, bf16)
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent (paged_edu.kernels.pdl)
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    mask = cols < N
    wait_for_previous_kernel(USE_PDL)  # h and r are the previous kernels' outputs
    dtype = y_ptr.dtype.element_ty  # the activation dtype: every "round" is a cast to it
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        x = round_to(x + r, dtype, BY_HAND)  # r' = round(h + r): the stream the next layer adds to
        tl.store(residual_out_ptr + row * stride_ro + cols, x.to(dtype), mask=mask)
    mean_sq = tl.sum(x * x, axis=0) / N  # mean(r'^2) in fp32 (padding lanes are 0)
    normed = round_to(x * tl.rsqrt(mean_sq + eps), dtype, BY_HAND)  # round(r' / rms)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = round_to(w * normed, dtype, BY_HAND)
    tl.store(y_ptr + row * stride_y + cols, y.to(dtype), mask=mask)


def add_rms_norm_triton(
    x: torch.Tensor,  # (T, N)
    weight: torch.Tensor,  # (N,)
    eps: float,
    residual: torch.Tensor | None = None,  # (T, N)
    *,
    pdl: bool = False,  # launch as a programmatic dependent where the GPU can (paged_edu.kernels.pdl)
) -> tuple[torch.Tensor, torch.Tensor]:  # y (T, N), r' (T, N)
    """``(rmsnorm(x + residual) * weight, x + residual)`` in one kernel (``x`` alone without a residual)."""
    T, N = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    y = torch.empty((T, N), dtype=x.dtype, device=x.device)
    if residual is None:
        residual_out = x  # r' = h: the stream starts at the embedding
        r = x  # unused
    else:
        r = residual if residual.stride(1) == 1 else residual.contiguous()
        residual_out = torch.empty_like(y)
    if T == 0:
        return y, residual_out
    block_n = triton.next_power_of_2(N)
    _add_rms_norm_kernel[(T,)](
        x,
        r,
        weight,
        y,
        residual_out,
        x.stride(0),
        r.stride(0),
        y.stride(0),
        residual_out.stride(0),
        float(eps),
        N=N,
        BLOCK_N=block_n,
        HAS_RESIDUAL=residual is not None,
        BY_HAND=by_hand(x.dtype),
        num_warps=4 if block_n >= 1024 else 2,  # 8-16 values per thread
        **launch_options(pdl, x.device),
    )
    return y, residual_out


# ----------------------------------------------------------------------------------------------
# SiLU-and-mul: a grid of (row, column block)
# ----------------------------------------------------------------------------------------------


@triton.jit
def silu_and_mul(g, u, dtype: tl.constexpr, BY_HAND: tl.constexpr):
    """``round(round(silu(g)) * u)`` per element, kept in fp32: ``g`` and ``u`` are fp32 tiles of values
    already rounded to ``dtype``. The one place for this math: the kernel below and the skinny GEMM's
    SwiGLU epilogue (:mod:`~paged_edu.kernels.triton_gemm`) both call it, so the two paths round alike."""
    silu = round_to(g / (1.0 + tl.exp(-g)), dtype, BY_HAND)  # round(silu(g))
    return round_to(silu * u, dtype, BY_HAND)


@triton.jit
def _silu_and_mul_kernel(
    gate_up_ptr,  # (T, 2I): gate in columns [0, I), up in [I, 2I)
    out_ptr,  # (T, I)
    stride_in,
    stride_out,  # row strides (the column stride is 1)
    I: tl.constexpr,  # intermediate size
    BLOCK: tl.constexpr,  # columns per program
    BY_HAND: tl.constexpr,  # round_to rounds by hand (the interpreter, bf16)
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
    mask = cols < I
    dtype = out_ptr.dtype.element_ty
    g = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_up_ptr + row * stride_in + I + cols, mask=mask, other=0.0).to(tl.float32)
    a = silu_and_mul(g, u, dtype, BY_HAND)  # (BLOCK,)
    tl.store(out_ptr + row * stride_out + cols, a.to(dtype), mask=mask)


def silu_and_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:  # (T, 2I) -> (T, I)
    """``silu(gate) * up`` for ``gate, up = gate_up.chunk(2, dim=-1)``, in one kernel."""
    T, two_i = gate_up.shape
    if two_i % 2:
        raise ValueError(f"gate_up must have an even number of columns (gate then up), got {two_i}")
    if gate_up.stride(1) != 1:
        gate_up = gate_up.contiguous()
    I = two_i // 2
    out = torch.empty((T, I), dtype=gate_up.dtype, device=gate_up.device)
    if T == 0:
        return out
    block = min(1024, triton.next_power_of_2(I))
    _silu_and_mul_kernel[(T, triton.cdiv(I, block))](
        gate_up,
        out,
        gate_up.stride(0),
        out.stride(0),
        I=I,
        BLOCK=block,
        BY_HAND=by_hand(gate_up.dtype),
        num_warps=4,
    )
    return out

"""Paged attention: one block table, three implementations of the same function (lesson 4).

* :mod:`~paged_edu.kernels.attention` -- the entry points ``paged_attention_decode`` and
  ``paged_attention_prefill`` (shapes, ``impl=``, ``validate=``: read its docstring first);
* :mod:`~paged_edu.kernels.support` -- which kernels run on a device (the one Triton probe);
* :mod:`~paged_edu.kernels.checks` -- the entry points' input checks;
* :mod:`~paged_edu.kernels.reference` -- the seed's loop, corrected, and the vectorised PyTorch oracle;
* :mod:`~paged_edu.kernels.online_softmax` -- the seed's online softmax and the merge of partial states;
* the Triton kernels: :mod:`~paged_edu.kernels.decode` (split-KV flash-decoding: the kernel lesson 4
  reads and, built from the same pieces, the engine's pure-decode kernel that also rotates and stores
  the new token; its entry points also at :mod:`~paged_edu.kernels.triton_decode`),
  :mod:`~paged_edu.kernels.triton_prefill` (varlen causal prefill), :mod:`~paged_edu.kernels.triton_store`
  (the K/V store by slot mapping), :mod:`~paged_edu.kernels.triton_fused` (a Llama layer's
  per-token ops), :mod:`~paged_edu.kernels.triton_gemm` (the skinny GEMM: a decode batch's
  projections, ``gemm_impl="triton"``) and :mod:`~paged_edu.kernels.pdl` (programmatic dependent
  launch: a kernel starts before the previous one ends).

The seed's kernel as written, the timing helpers and the whole-row decode experiment are lesson
material, in :mod:`paged_edu.labs`. This package's ``__init__`` only re-exports.
"""

from paged_edu.kernels.attention import IMPLS, paged_attention_decode, paged_attention_prefill, resolve_impl
from paged_edu.kernels.checks import check_decode_inputs, check_prefill_inputs
from paged_edu.kernels.reference import paged_attention_loop, paged_attention_torch, paged_prefill_reference
from paged_edu.kernels.support import KernelSupport, kernel_support, triton_available, triton_interpreting

__all__ = [
    "IMPLS",
    "KernelSupport",
    "kernel_support",
    "paged_attention_decode",
    "paged_attention_prefill",
    "resolve_impl",
    "triton_available",
    "triton_interpreting",
    "check_decode_inputs",
    "check_prefill_inputs",
    "paged_attention_loop",
    "paged_attention_torch",
    "paged_prefill_reference",
]

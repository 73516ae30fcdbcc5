"""Paged decode attention in Triton: the kernel lesson 4 reads, and the engine's, built from the same pieces.

* :mod:`~paged_edu.kernels.decode.pieces` -- the named ``@triton.jit`` pieces: a split's tile range, the
  tile load through the block table, the online-softmax update, the result, the split merge;
* :mod:`~paged_edu.kernels.decode.tutorial` -- :func:`paged_decode_kernel`, the readable kernel made of
  them (lesson 4), its split merge, and :func:`paged_attention_triton`, which launches both;
* :mod:`~paged_edu.kernels.decode.fast` -- :func:`rotary_store_decode_kernel`, the engine's pure-decode kernel:
  the same pieces plus the new token's rotary embedding and K/V store and the first tile read before
  the PDL wait (:func:`rotary_store_decode_triton`);
* :mod:`~paged_edu.kernels.decode.tuning` -- tile length, warps, stages and split count, apart from the
  kernel bodies.

:mod:`paged_edu.kernels.triton_decode` keeps the public entry points at their old import path.
"""

from paged_edu.kernels.decode.fast import rotary_store_decode_kernel, rotary_store_decode_triton
from paged_edu.kernels.decode.tuning import choose_num_splits, decode_config, split_plan
from paged_edu.kernels.decode.tutorial import (
    launch_inputs,
    merge_splits_kernel,
    paged_attention_triton,
    paged_decode_kernel,
)

__all__ = [
    "choose_num_splits",
    "decode_config",
    "rotary_store_decode_kernel",
    "launch_inputs",
    "merge_splits_kernel",
    "paged_attention_triton",
    "paged_decode_kernel",
    "rotary_store_decode_triton",
    "split_plan",
]

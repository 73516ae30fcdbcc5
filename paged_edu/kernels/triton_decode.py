"""The Triton decode kernels' public entry points, at the import path the model, lessons and benchmarks use.

The kernels, their pieces and their tuning live in :mod:`paged_edu.kernels.decode` (read its docstring
first): :func:`paged_attention_triton` launches the kernel lesson 4 reads, :func:`rotary_store_decode_triton`
the engine's pure-decode kernel. ``INTERPRETING`` says whether the kernels were decorated under the
Triton interpreter (``TRITON_INTERPRET=1`` before the first import).
"""

from paged_edu.kernels.decode.fast import rotary_store_decode_triton
from paged_edu.kernels.decode.tuning import choose_num_splits, decode_config, split_plan
from paged_edu.kernels.decode.tutorial import launch_inputs, paged_attention_triton
from paged_edu.kernels.triton_fused import INTERPRETING

__all__ = [
    "INTERPRETING",
    "choose_num_splits",
    "decode_config",
    "launch_inputs",
    "paged_attention_triton",
    "rotary_store_decode_triton",
    "split_plan",
]

"""Paged attention: one block table, three implementations of the same function.

Decode -- one new query token per sequence
------------------------------------------
``paged_attention_decode(q, k_cache, v_cache, block_tables, seq_lens, *, scale=None, impl="auto")``

=============== ========================================================= =========================
argument        shape                                                     meaning
=============== ========================================================= =========================
``q``           ``(num_seqs, num_q_heads, head_dim)``                     the new token's queries
``k_cache``     ``(num_blocks, block_size, num_kv_heads, head_dim)``      every layer's K pool
``v_cache``     ``(num_blocks, block_size, num_kv_heads, head_dim)``      every layer's V pool
``block_tables`` int32 ``(num_seqs, max_blocks)``                         ``B(i)`` per sequence;
                                                                          entries past the last
                                                                          block may hold anything
``seq_lens``    int32 ``(num_seqs,)``                                     ``s``, each >= 1, new
                                                                          token included (its K/V
                                                                          already stored)
=============== ========================================================= =========================

Returns ``(num_seqs, num_q_heads, head_dim)`` in ``q``'s dtype:
``o = softmax(q K^T * scale) V`` over the ``s`` cached tokens, with ``scale = 1/sqrt(head_dim)``
by default. Query head ``h`` reads KV head ``h // (num_q_heads // num_kv_heads)`` (GQA; MHA and
MQA are the ratios 1 and ``num_q_heads``). fp32, fp16 and bf16; softmax and accumulation in fp32.

``impl`` picks the implementation:

* ``"loop"`` -- the seed's algorithm kept readable: per request, per block, online softmax
  (:func:`paged_edu.kernels.reference.paged_attention_loop`). The teaching baseline; slow. The
  seed's code as written is :mod:`paged_edu.labs.seed_kernel` (not an ``impl``): it raises
  ``RuntimeError`` on bf16/fp16 inputs, because it multiplies its fp32 softmax weights by bf16 V.
* ``"torch"`` -- vectorised gather + masked softmax, the oracle every other one is tested against
  (:func:`paged_edu.kernels.reference.paged_attention_torch`).
* ``"triton"`` -- the kernel in :mod:`paged_edu.kernels.decode.tutorial` (split-KV flash-decoding).
* ``"auto"`` -- Triton on CUDA tensors, or on CPU tensors when the Triton interpreter is on
  (``TRITON_INTERPRET=1`` before the first import); ``"torch"`` everywhere else.

With ``validate=True`` (the default) the inputs are checked (:mod:`~paged_edu.kernels.checks`):
shapes, dtypes and devices, and the *values* of ``seq_lens`` (>= 1, covered by the table) and of
the table entries a sequence reads (blocks of the cache); bad input raises ``ValueError``/``TypeError``
naming the problem. The value checks need a device-to-host copy, so they are skipped while a CUDA
graph is being captured. ``validate=False`` runs no Python check at all: for a caller that built the
inputs itself (the engine's model), whose inputs are then its own responsibility.

Prefill / extend -- a chunk of new query tokens per sequence (varlen)
---------------------------------------------------------------------
``paged_attention_prefill(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, *, scale=None,
impl="auto")``

=================== ============================ ====================================================
argument            shape                        meaning
=================== ============================ ====================================================
``q``               ``(num_q_tokens,             the new tokens of every sequence, packed: sequence
                    num_q_heads, head_dim)``     ``i`` owns rows ``cu_seqlens_q[i]:cu_seqlens_q[i+1]``
``k_cache/v_cache`` as above                     the new tokens' K/V must already be stored
                                                 (:meth:`paged_edu.cache.kv_cache.PagedKVCache.store`)
``block_tables``    int32 ``(num_seqs,           as above
                    max_blocks)``
``seq_lens``        int32 ``(num_seqs,)``        total KV length: cached prefix + new tokens
``cu_seqlens_q``    int32 ``(num_seqs + 1,)``    ``0 = c_0 <= c_1 <= ...``; ``q_len_i = c_{i+1} - c_i``
                                                 with ``1 <= q_len_i <= seq_lens[i]``
=================== ============================ ====================================================

New token ``j`` of sequence ``i`` sits at position ``p = seq_lens[i] - q_len_i + j`` and attends
causally to positions ``0 .. p`` (the cached prefix -- e.g. prefix-cache hits or earlier chunks of
a chunked prefill -- plus the new tokens up to itself). Returns ``(num_q_tokens, num_q_heads,
head_dim)`` in ``q``'s dtype. Decode is the case ``q_len_i = 1``. ``impl``: ``"torch"`` (the
oracle, :func:`paged_edu.kernels.reference.paged_prefill_reference`), ``"triton"``
(:mod:`paged_edu.kernels.triton_prefill`) or ``"auto"`` (Triton on CUDA tensors, ``"torch"``
otherwise: the interpreted prefill kernel is too slow for whole prompts, so CPU runs use PyTorch
even under ``TRITON_INTERPRET=1``; tests call ``impl="triton"`` explicitly).

The package imports without Triton (macOS, Windows): ``"auto"`` then means ``"torch"`` and
``impl="triton"`` raises a ``RuntimeError`` that says what to install.

Which kernels can run here
--------------------------
:func:`kernel_support(device) <kernel_support>` is the one answer to "is Triton usable": which of
the decode, prefill and store kernels run on that device, and whether interpreted. Every
``"auto"`` -- the dispatch here, :meth:`PagedKVCache.store <paged_edu.cache.kv_cache.PagedKVCache.store>`,
the engine's choice of kernels -- asks it.
"""

from __future__ import annotations

import importlib
import math

import torch

from paged_edu.kernels.checks import check_decode_inputs, check_impl, check_prefill_inputs, check_scale
from paged_edu.kernels.reference import paged_attention_loop, paged_attention_torch, paged_prefill_reference
from paged_edu.kernels.support import kernel_support

__all__ = ["IMPLS", "paged_attention_decode", "paged_attention_prefill", "resolve_impl"]

IMPLS = ("loop", "torch", "triton", "auto")
PREFILL_IMPLS = ("torch", "triton", "auto")


def resolve_impl(impl: str, device: torch.device | str, kernel: str = "decode") -> str:
    """``impl`` with ``"auto"`` made ``"triton"`` or ``"torch"`` for ``kernel`` (``"decode"`` or
    ``"prefill"``) on ``device``, as the entry points here resolve it; any other ``impl`` as given."""
    if impl != "auto":
        return impl
    return "triton" if kernel_support(device).use_triton(kernel) else "torch"


def _resolve(impl: str, q: torch.Tensor, prefill: bool = False) -> str:
    """``impl`` with ``"auto"`` resolved (kept for a non-tensor ``q``: the input checks reject it)."""
    if not isinstance(q, torch.Tensor):
        return impl
    return resolve_impl(impl, q.device, "prefill" if prefill else "decode")


def paged_attention_decode(
    q: torch.Tensor,  # (num_seqs, num_q_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # int32 (num_seqs, max_blocks)
    seq_lens: torch.Tensor,  # int32 (num_seqs,)
    *,
    scale: float | None = None,
    impl: str = "auto",
    validate: bool = True,
) -> torch.Tensor:  # (num_seqs, num_q_heads, head_dim), q.dtype
    """Attention of one new token per sequence over its paged KV. See the module docstring."""
    if validate:
        check_impl(impl, IMPLS)
        check_decode_inputs(q, k_cache, v_cache, block_tables, seq_lens)
        scale = check_scale(scale, q.shape[2])
    elif scale is None:
        scale = 1.0 / math.sqrt(q.shape[2])
    impl = _resolve(impl, q)
    if impl == "loop":
        return paged_attention_loop(q, k_cache, v_cache, block_tables, seq_lens, scale=scale)
    if impl == "torch":
        return paged_attention_torch(q, k_cache, v_cache, block_tables, seq_lens, scale=scale)
    return _triton_module("decode").paged_attention_triton(q, k_cache, v_cache, block_tables, seq_lens, scale=scale)


def paged_attention_prefill(
    q: torch.Tensor,  # (num_q_tokens, num_q_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # int32 (num_seqs, max_blocks)
    seq_lens: torch.Tensor,  # int32 (num_seqs,): cached prefix + new tokens
    cu_seqlens_q: torch.Tensor,  # int32 (num_seqs + 1,)
    *,
    scale: float | None = None,
    impl: str = "auto",
    validate: bool = True,
    out: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:  # (num_q_tokens, num_q_heads, head_dim), q.dtype
    """Causal attention of a chunk of new tokens per sequence over its paged KV (varlen).

    ``out``: write into this tensor (``q``'s shape and dtype) and return it; then the chunks may
    own only rows ``cu_seqlens_q[0] .. cu_seqlens_q[-1]`` of ``q`` and the other rows of ``out`` are
    left as they are -- how the engine puts a step's decode rows and prompt chunks in one buffer.
    ``pdl``: the Triton kernel launched as a programmatic dependent (:mod:`~paged_edu.kernels.pdl`;
    where the GPU has it)."""
    if validate:
        check_impl(impl, PREFILL_IMPLS)
        check_prefill_inputs(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, out=out)
        scale = check_scale(scale, q.shape[2])
    elif scale is None:
        scale = 1.0 / math.sqrt(q.shape[2])
    impl = _resolve(impl, q, prefill=True)
    if impl == "torch":
        return paged_prefill_reference(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale=scale, out=out)
    return _triton_module("triton_prefill").paged_prefill_triton(
        q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale=scale, out=out, pdl=pdl
    )


def _triton_module(name: str):
    """Import a Triton kernel module, or say clearly why it cannot run here."""
    try:
        return importlib.import_module(f"paged_edu.kernels.{name}")
    except ImportError as exc:
        raise RuntimeError(
            f"impl='triton' needs the triton package (Linux only; pip install triton): {exc}. Use impl='torch' instead."
        ) from exc

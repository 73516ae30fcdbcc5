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
  seed's code as written is :mod:`paged_edu.kernels.seed_kernel` (not an ``impl``): it raises
  ``RuntimeError`` on bf16/fp16 inputs, because it multiplies its fp32 softmax weights by bf16 V.
* ``"torch"`` -- vectorised gather + masked softmax, the oracle every other one is tested against
  (:func:`paged_edu.kernels.reference.paged_attention_torch`).
* ``"triton"`` -- the kernel in :mod:`paged_edu.kernels.triton_decode` (split-KV flash-decoding).
* ``"auto"`` -- Triton on CUDA tensors, or on CPU tensors when the Triton interpreter is on
  (``TRITON_INTERPRET=1`` before the first import); ``"torch"`` everywhere else.

Keyword ``validate=True`` also checks the *values* of ``seq_lens`` (>= 1, covered by the table)
and of the table entries a sequence reads (blocks of the cache).
That needs a device-to-host copy, so it is skipped while a CUDA graph is being captured, and an
engine that built the inputs itself may pass ``validate=False``. Shapes, dtypes and devices are
always checked: bad input raises ``ValueError``/``TypeError`` naming the problem.

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

import functools
import importlib
import math
import numbers
from dataclasses import dataclass

import torch

from paged_edu.kernels.reference import (
    paged_attention_loop,
    paged_attention_torch,
    paged_prefill_reference,
)

__all__ = [
    "IMPLS",
    "KernelSupport",
    "kernel_support",
    "paged_attention_decode",
    "paged_attention_prefill",
    "triton_available",
    "triton_interpreting",
    "check_decode_inputs",
    "check_prefill_inputs",
    "paged_attention_loop",
    "paged_attention_torch",
    "paged_prefill_reference",
]

IMPLS = ("loop", "torch", "triton", "auto")
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------------------------
# Which kernels can run here: the one probe
# ----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _importable(name: str) -> bool:
    """True when the kernel module ``paged_edu.kernels.<name>`` imports (it needs ``triton``)."""
    try:
        importlib.import_module(f"paged_edu.kernels.{name}")
    except ImportError:
        return False
    return True


def triton_available() -> bool:
    """True when the Triton kernels imported (Linux with the ``triton`` package)."""
    return _importable("triton_decode")


def triton_interpreting() -> bool:
    """True when the Triton kernels were decorated under the interpreter (``TRITON_INTERPRET=1``)."""
    if not triton_available():
        return False
    from paged_edu.kernels.triton_decode import INTERPRETING

    return INTERPRETING


@dataclass(frozen=True, slots=True)
class KernelSupport:
    """Which Triton kernels can run on tensors of one device type (see :func:`kernel_support`)."""

    device_type: str
    decode: bool  # paged_edu.kernels.triton_decode
    prefill: bool  # paged_edu.kernels.triton_prefill
    store: bool  # paged_edu.kernels.triton_store
    fused: bool  # paged_edu.kernels.triton_fused + the rotary store: a Llama layer's per-token ops
    interpreted: bool  # they would run in Triton's interpreter: exact, but far too slow to serve a model

    def use_triton(self, kernel: str) -> bool:
        """What ``impl="auto"`` means for ``kernel`` (``"decode"``, ``"prefill"``, ``"store"``, ``"fused"``).

        Compiled kernels always. Interpreted ones only for decode, where tests and lessons want
        the kernel's own arithmetic on a CPU; prefill, store and the fused per-token ops run
        PyTorch there (the interpreted prefill takes seconds per prompt, a store is a plain
        scatter, and the fused ops exist only to save kernel launches on a GPU).
        """
        runs = getattr(self, kernel)
        return runs and (not self.interpreted or kernel == "decode")


def kernel_support(device: torch.device | str) -> KernelSupport:
    """The one answer to "is Triton usable": which kernels can run on ``device``.

    Triton compiles for CUDA tensors; under ``TRITON_INTERPRET=1`` (set before the first import)
    it interprets on CPU tensors instead -- never both. Every caller (the dispatch below, the KV
    cache's store, the engine's choice of kernels) asks here.
    """
    return _support(torch.device(device).type)


@functools.lru_cache(maxsize=None)
def _support(device_type: str) -> KernelSupport:
    interpreting = triton_interpreting()
    runs_here = (device_type == "cuda" and not interpreting) or (device_type == "cpu" and interpreting)
    return KernelSupport(
        device_type=device_type,
        decode=runs_here and _importable("triton_decode"),
        prefill=runs_here and _importable("triton_prefill"),
        store=runs_here and _importable("triton_store"),
        fused=runs_here and _importable("triton_fused") and _importable("triton_store"),
        interpreted=runs_here and interpreting,
    )


def _pick(impl: str, q: torch.Tensor, allowed: tuple[str, ...], prefill: bool = False) -> str:
    """Check ``impl`` and resolve ``"auto"`` (kept for a non-tensor ``q``: the input checks reject it)."""
    if not isinstance(impl, str) or impl not in allowed:
        raise ValueError(f"impl must be one of {allowed}, got {impl!r}")
    if impl != "auto" or not isinstance(q, torch.Tensor):
        return impl
    return "triton" if kernel_support(q.device).use_triton("prefill" if prefill else "decode") else "torch"


# ----------------------------------------------------------------------------------------------
# Validation: shapes, dtypes and devices always; values (lengths) when asked.
# ----------------------------------------------------------------------------------------------


def _check_cache_and_tables(q, k_cache, v_cache, block_tables, seq_lens, num_seqs) -> None:
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables, "seq_lens": seq_lens}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t, rank in (("q", q, 3), ("k_cache", k_cache, 4), ("v_cache", v_cache, 4),
                          ("block_tables", block_tables, 2), ("seq_lens", seq_lens, 1)):
        if t.dim() != rank:
            raise ValueError(f"{name} must have rank {rank}, got shape {tuple(t.shape)}")
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) != 1:
        raise ValueError(f"all tensors must be on one device, got {', '.join(f'{n}={d}' for n, d in devices.items())}")
    if q.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"q must be float32, float16 or bfloat16, got {q.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} dtype {t.dtype} differs from q dtype {q.dtype}")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {t.dtype}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
    _, _, num_kv_heads, head_dim = k_cache.shape
    if min(k_cache.shape) < 1:
        raise ValueError(f"k_cache must be non-empty in every dimension (head_dim >= 1 too), got shape {tuple(k_cache.shape)}")
    if q.shape[2] != head_dim:
        raise ValueError(f"q head_dim {q.shape[2]} differs from the cache's head_dim {head_dim}")
    if q.shape[1] % num_kv_heads != 0:
        raise ValueError(
            f"num_q_heads ({q.shape[1]}) must be a multiple of num_kv_heads ({num_kv_heads}) for GQA"
        )
    if block_tables.shape[0] != num_seqs or seq_lens.shape[0] != num_seqs:
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} and seq_lens {tuple(seq_lens.shape)} must have "
            f"one row per sequence ({num_seqs})"
        )
    if num_seqs < 1 or block_tables.shape[1] < 1:
        raise ValueError(f"need at least one sequence and one block-table column, got {tuple(block_tables.shape)}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must be contiguous in head_dim (stride 1)")


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _check_lengths(seq_lens: torch.Tensor, block_tables: torch.Tensor, block_size: int, num_blocks: int) -> None:
    lens = seq_lens.tolist()
    cover = block_tables.shape[1] * block_size
    for i, s in enumerate(lens):
        if s < 1:
            raise ValueError(f"seq_lens[{i}] = {s}: every sequence needs at least one token")
        if s > cover:
            raise ValueError(
                f"seq_lens[{i}] = {s} exceeds what the block table covers "
                f"({block_tables.shape[1]} blocks x {block_size} = {cover} tokens)"
            )
    # The blocks a sequence reads, B(0) .. B(ceil(s/B) - 1), must exist in the pool (entries past
    # them may hold anything): a kernel would otherwise read memory outside the cache.
    used = (seq_lens.to(torch.int64) + block_size - 1) // block_size  # (num_seqs,)
    cols = torch.arange(block_tables.shape[1], device=block_tables.device)  # (max_blocks,)
    bad = (cols[None, :] < used[:, None]) & ((block_tables < 0) | (block_tables >= num_blocks))
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(
            f"block_tables[{i}, {j}] = {int(block_tables[i, j])} is not a block of the cache "
            f"[0, {num_blocks}) although sequence {i} reads it (seq_lens[{i}] = {lens[i]})"
        )


def check_decode_inputs(q, k_cache, v_cache, block_tables, seq_lens, *, validate: bool = True) -> None:
    """Raise ``TypeError``/``ValueError`` for anything :func:`paged_attention_decode` cannot take."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must have rank 3 (num_seqs, num_q_heads, head_dim), got shape {tuple(q.shape)}")
    _check_cache_and_tables(q, k_cache, v_cache, block_tables, seq_lens, q.shape[0])
    if validate and not _capturing(q):
        _check_lengths(seq_lens, block_tables, k_cache.shape[1], k_cache.shape[0])


def check_prefill_inputs(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, *, validate: bool = True,
                         max_q_len: int | None = None) -> None:
    """Raise ``TypeError``/``ValueError`` for anything :func:`paged_attention_prefill` cannot take."""
    if not isinstance(cu_seqlens_q, torch.Tensor):
        raise TypeError(f"cu_seqlens_q must be a torch.Tensor, got {type(cu_seqlens_q).__name__}")
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.dtype != torch.int32:
        raise TypeError(f"cu_seqlens_q must be a 1-D int32 tensor, got {cu_seqlens_q.dtype} {tuple(cu_seqlens_q.shape)}")
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must have rank 3 (num_q_tokens, num_q_heads, head_dim), got shape {tuple(q.shape)}")
    num_seqs = cu_seqlens_q.shape[0] - 1
    _check_cache_and_tables(q, k_cache, v_cache, block_tables, seq_lens, num_seqs)
    if cu_seqlens_q.device != q.device:
        raise ValueError(f"cu_seqlens_q is on {cu_seqlens_q.device}, q on {q.device}")
    if validate and not _capturing(q):
        _check_lengths(seq_lens, block_tables, k_cache.shape[1], k_cache.shape[0])
        cu = cu_seqlens_q.tolist()
        if cu[0] != 0 or cu[-1] != q.shape[0]:
            raise ValueError(f"cu_seqlens_q must start at 0 and end at num_q_tokens ({q.shape[0]}), got {cu[0]}..{cu[-1]}")
        for i, s in enumerate(seq_lens.tolist()):
            q_len = cu[i + 1] - cu[i]
            if not 1 <= q_len <= s:
                raise ValueError(f"sequence {i}: q_len {q_len} must be in [1, seq_lens[{i}] = {s}]")
        longest = max((b - a for a, b in zip(cu, cu[1:])), default=0)
        if max_q_len is not None and (isinstance(max_q_len, bool) or not isinstance(max_q_len, int) or max_q_len < longest):
            raise ValueError(f"max_q_len={max_q_len!r}, but the longest chunk in cu_seqlens_q has {longest} tokens")


# The largest softmax scale accepted. Models use 1/sqrt(head_dim) (at most 1) or a scale of that
# order; the fp32 scores ``scale * q.k`` of ordinary activations overflow to inf long before 1e38 and
# turn the softmax into NaN, so a scale far past 1 is a units mistake, refused rather than computed.
MAX_SCALE = 1e4


def _check_scale(scale, head_dim: int) -> float:
    """The softmax scale: ``1/sqrt(head_dim)`` by default, else a real number in ``(0, MAX_SCALE]``
    (numpy floats included). A NaN, infinite or huge scale would silently turn outputs into NaN."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float (any real number) or None, got {type(scale).__name__} {scale!r}")
    value = float(scale)
    if not 0 < value <= MAX_SCALE:  # NaN fails this too
        raise ValueError(f"scale must be a finite number > 0 and <= MAX_SCALE = {MAX_SCALE:g} (1/sqrt(head_dim) = "
                         f"{head_dim ** -0.5:.4g} by default), got {scale!r}")
    return value


# ----------------------------------------------------------------------------------------------
# The entry points
# ----------------------------------------------------------------------------------------------


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
    impl = _pick(impl, q, IMPLS)
    check_decode_inputs(q, k_cache, v_cache, block_tables, seq_lens, validate=validate)
    scale = _check_scale(scale, q.shape[2])
    if impl == "loop":
        return paged_attention_loop(q, k_cache, v_cache, block_tables, seq_lens, scale=scale)
    if impl == "torch":
        return paged_attention_torch(q, k_cache, v_cache, block_tables, seq_lens, scale=scale)
    return _triton_module("triton_decode").paged_attention_triton(
        q, k_cache, v_cache, block_tables, seq_lens, scale=scale
    )


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
    max_q_len: int | None = None,
) -> torch.Tensor:  # (num_q_tokens, num_q_heads, head_dim), q.dtype
    """Causal attention of a chunk of new tokens per sequence over its paged KV (varlen).

    ``max_q_len``, the longest chunk, is what the Triton kernel's grid needs; a caller that knows it on
    the host (the engine's runner) passes it, else the kernel reads it off ``cu_seqlens_q`` (a sync)."""
    allowed = ("torch", "triton", "auto")
    impl = _pick(impl, q, allowed, prefill=True)
    check_prefill_inputs(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, validate=validate,
                         max_q_len=max_q_len)
    scale = _check_scale(scale, q.shape[2])
    if impl == "torch":
        return paged_prefill_reference(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale=scale)
    return _triton_module("triton_prefill").paged_prefill_triton(
        q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale=scale, max_q_len=max_q_len
    )


def _triton_module(name: str):
    """Import a Triton kernel module, or say clearly why it cannot run here."""
    try:
        return importlib.import_module(f"paged_edu.kernels.{name}")
    except ImportError as exc:
        raise RuntimeError(
            f"impl='triton' needs the triton package (Linux only; pip install triton): {exc}. "
            "Use impl='torch' instead."
        ) from exc

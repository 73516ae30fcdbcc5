"""The input checks of the paged-attention entry points: shapes, dtypes and devices, and -- with a
device-to-host copy, so never while a CUDA graph is being captured -- the values of the lengths and
of the block-table entries a sequence reads.

:func:`check_decode_inputs` and :func:`check_prefill_inputs` raise ``TypeError``/``ValueError``
naming the problem. The entry points in :mod:`~paged_edu.kernels.attention` run them when called
with ``validate=True`` (the default) and not at all with ``validate=False`` (an engine that built
the inputs itself).
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["check_decode_inputs", "check_impl", "check_prefill_inputs", "check_rotary_store_inputs", "check_scale"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_cache_and_tables(q, k_cache, v_cache, block_tables, seq_lens, num_seqs) -> None:
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables, "seq_lens": seq_lens}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t, rank in (
        ("q", q, 3),
        ("k_cache", k_cache, 4),
        ("v_cache", v_cache, 4),
        ("block_tables", block_tables, 2),
        ("seq_lens", seq_lens, 1),
    ):
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
        raise ValueError(
            f"k_cache must be non-empty in every dimension (head_dim >= 1 too), got shape {tuple(k_cache.shape)}"
        )
    if q.shape[2] != head_dim:
        raise ValueError(f"q head_dim {q.shape[2]} differs from the cache's head_dim {head_dim}")
    if q.shape[1] % num_kv_heads != 0:
        raise ValueError(f"num_q_heads ({q.shape[1]}) must be a multiple of num_kv_heads ({num_kv_heads}) for GQA")
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


def check_impl(impl, allowed: tuple[str, ...]) -> str:
    """``impl`` if it is one of ``allowed``: a kernel's name, or ``"auto"``."""
    if not isinstance(impl, str) or impl not in allowed:
        raise ValueError(f"impl must be one of {allowed}, got {impl!r}")
    return impl


def check_decode_inputs(q, k_cache, v_cache, block_tables, seq_lens, *, validate: bool = True) -> None:
    """Raise ``TypeError``/``ValueError`` for anything :func:`paged_attention_decode` cannot take."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must have rank 3 (num_seqs, num_q_heads, head_dim), got shape {tuple(q.shape)}")
    _check_cache_and_tables(q, k_cache, v_cache, block_tables, seq_lens, q.shape[0])
    if validate and not _capturing(q):
        _check_lengths(seq_lens, block_tables, k_cache.shape[1], k_cache.shape[0])


def check_prefill_inputs(
    q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, *, validate: bool = True, out=None
) -> None:
    """Raise ``TypeError``/``ValueError`` for anything :func:`paged_attention_prefill` cannot take."""
    if not isinstance(cu_seqlens_q, torch.Tensor):
        raise TypeError(f"cu_seqlens_q must be a torch.Tensor, got {type(cu_seqlens_q).__name__}")
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.dtype != torch.int32:
        raise TypeError(
            f"cu_seqlens_q must be a 1-D int32 tensor, got {cu_seqlens_q.dtype} {tuple(cu_seqlens_q.shape)}"
        )
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must have rank 3 (num_q_tokens, num_q_heads, head_dim), got shape {tuple(q.shape)}")
    num_seqs = cu_seqlens_q.shape[0] - 1
    _check_cache_and_tables(q, k_cache, v_cache, block_tables, seq_lens, num_seqs)
    if cu_seqlens_q.device != q.device:
        raise ValueError(f"cu_seqlens_q is on {cu_seqlens_q.device}, q on {q.device}")
    if out is not None and (
        not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != q.device
    ):
        raise ValueError(
            f"out must be a tensor of q's shape {tuple(q.shape)}, dtype {q.dtype} and device {q.device}, got "
            + (
                f"{out.dtype} {tuple(out.shape)} on {out.device}"
                if isinstance(out, torch.Tensor)
                else type(out).__name__
            )
        )
    if validate and not _capturing(q):
        _check_lengths(seq_lens, block_tables, k_cache.shape[1], k_cache.shape[0])
        cu = cu_seqlens_q.tolist()
        if out is None and (cu[0] != 0 or cu[-1] != q.shape[0]):
            raise ValueError(
                f"cu_seqlens_q must start at 0 and end at num_q_tokens ({q.shape[0]}), got {cu[0]}..{cu[-1]} "
                "(with out=..., the chunks may own a middle range of rows)"
            )
        if cu[0] < 0 or cu[-1] > q.shape[0]:
            raise ValueError(f"cu_seqlens_q must lie within q's {q.shape[0]} rows, got {cu[0]}..{cu[-1]}")
        for i, s in enumerate(seq_lens.tolist()):
            q_len = cu[i + 1] - cu[i]
            if not 1 <= q_len <= s:
                raise ValueError(f"sequence {i}: q_len {q_len} must be in [1, seq_lens[{i}] = {s}]")


def check_rotary_store_inputs(q, key, value, k_cache) -> None:
    """Raise ``ValueError`` unless ``q`` ``(T, H, D)``, ``key`` and ``value`` ``(T, H_kv, D)`` fit a pool
    ``k_cache`` ``(num_blocks, B, H_kv, D)`` with an even ``D``: the shapes the rotary store kernels
    take (:func:`~paged_edu.kernels.triton_store.rotary_store_kv_triton`, and the decode kernel that
    stores as it attends). Shapes only: no device sync, so it runs under CUDA-graph capture too."""
    if q.shape[0] != key.shape[0] or q.shape[2] != key.shape[2] or key.shape[2] % 2:
        raise ValueError(f"q {tuple(q.shape)} and key {tuple(key.shape)} need the same tokens and an even head_dim")
    if value.shape != key.shape or key.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"key {tuple(key.shape)} and value {tuple(value.shape)} must have one shape, with the pool's "
            f"heads and head_dim {tuple(k_cache.shape[2:])}"
        )


# The largest softmax scale accepted. Models use 1/sqrt(head_dim) (at most 1) or a scale of that
# order; the fp32 scores ``scale * q.k`` of ordinary activations overflow to inf long before 1e38 and
# turn the softmax into NaN, so a scale far past 1 is a units mistake, refused rather than computed.
MAX_SCALE = 1e4


def check_scale(scale, head_dim: int) -> float:
    """The softmax scale: ``1/sqrt(head_dim)`` by default, else a real number in ``(0, MAX_SCALE]``
    (numpy floats included). A NaN, infinite or huge scale would silently turn outputs into NaN."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float (any real number) or None, got {type(scale).__name__} {scale!r}")
    value = float(scale)
    if not 0 < value <= MAX_SCALE:  # NaN fails this too
        raise ValueError(
            f"scale must be a finite number > 0 and <= MAX_SCALE = {MAX_SCALE:g} (1/sqrt(head_dim) = "
            f"{head_dim**-0.5:.4g} by default), got {scale!r}"
        )
    return value

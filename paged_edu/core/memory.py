"""The KV-cache memory model: how many bytes a token costs, and how much of a reservation is used.

A model's cache costs ``M_KV(s) = M_KV(1) * s`` bytes for ``s`` tokens, ``M_KV(1)`` being
:attr:`~paged_edu.core.hardware.ModelGeometry.kv_bytes_per_token` of the model's geometry
(``2 * N_layers * N_kv * d_head * sizeof(dtype)``; per GPU under tensor / pipeline parallelism:
:meth:`~paged_edu.core.hardware.ModelGeometry.per_gpu`).

Utilisation of the slots reserved for a request of ``s`` tokens:

* contiguous, reserving ``L_max`` slots:  ``eta_naive = s / L_max``
* paged, ``ceil(s/B)`` blocks of ``B``:   ``eta_paged = s / (ceil(s/B) * B) >= 1 - B/(s+B)``

Plain Python, no torch.
"""

from __future__ import annotations

import math

from paged_edu.core.hardware import MODELS, ModelGeometry
from paged_edu.core.validation import integer

__all__ = [
    "eta_naive",
    "eta_paged",
    "eta_paged_bound",
    "format_bytes",
    "kv_bytes",
    "max_requests_contiguous",
    "max_requests_paged",
    "vllm_kv_budget",
    "seed_70b_example",
]


def kv_bytes(model: ModelGeometry, num_tokens: int) -> int:
    """``M_KV(s)`` in bytes."""
    return model.kv_bytes_per_token * integer("num_tokens", num_tokens, low=0)


def format_bytes(num_bytes: float) -> str:
    """Both units, because mixing them is the classic slip: ``2.50 GiB (2.68 GB)``."""
    for binary, decimal, power in (("GiB", "GB", 3), ("MiB", "MB", 2), ("KiB", "KB", 1)):
        if num_bytes >= 1024**power:
            return f"{num_bytes / 1024**power:.2f} {binary} ({num_bytes / 1000**power:.2f} {decimal})"
    return f"{int(num_bytes)} B"


def seed_70b_example(num_tokens: int = 8192) -> dict[str, float]:
    """The seed's example, exactly, and where its "2.62 GB" comes from.

    327,680 bytes per token is exactly 320 KiB. 8,192 tokens take 2,684,354,560 bytes: 2.50 GiB or
    2.68 GB. The seed's 2.62 multiplies 320 KiB by 8,192 (2,621,440 KiB) and then divides by 10^6
    as if KiB were kB -- binary kilobytes, decimal gigabytes.
    """
    model = MODELS["llama-2-70b"]  # "Seed 70B example"
    per_token = model.kv_bytes_per_token
    total = kv_bytes(model, num_tokens)
    return {
        "bytes_per_token": per_token,
        "kib_per_token": per_token / 1024,
        "total_bytes": total,
        "total_gib": total / 1024**3,
        "total_gb": total / 1e9,
        "seed_mixed_units_gb": (per_token / 1024) * num_tokens / 1e6,
    }


def _check_len(name: str, value: int) -> None:
    integer(name, value, low=1)


def eta_naive(s: int, max_seq_len: int) -> float:
    """``eta_naive = s / L_max``: share of a contiguous ``L_max`` reservation that holds tokens."""
    _check_len("s", s)
    _check_len("max_seq_len", max_seq_len)
    if s > max_seq_len:
        raise ValueError(f"s = {s} exceeds L_max = {max_seq_len}")
    return s / max_seq_len


def eta_paged(s: int, block_size: int) -> float:
    """``eta_paged = s / (ceil(s/B) * B)``: only the last block is partly empty."""
    _check_len("s", s)
    _check_len("block_size", block_size)
    return s / (math.ceil(s / block_size) * block_size)


def eta_paged_bound(s: int, block_size: int) -> float:
    """The lower bound ``1 - B/(s+B) = s/(s+B)``: at most ``B - 1`` wasted slots."""
    _check_len("s", s)
    _check_len("block_size", block_size)
    return 1 - block_size / (s + block_size)


def max_requests_contiguous(budget_bytes: int, model: ModelGeometry, max_seq_len: int) -> int:
    """Requests that fit when each reserves ``L_max`` slots up front."""
    _check_len("max_seq_len", max_seq_len)
    budget_bytes = integer("budget_bytes", budget_bytes, low=0)
    return budget_bytes // kv_bytes(model, max_seq_len)


def max_requests_paged(budget_bytes: int, model: ModelGeometry, s: int, block_size: int = 16) -> int:
    """Requests of ``s`` tokens that fit when each takes ``ceil(s/B)`` blocks."""
    _check_len("s", s)
    _check_len("block_size", block_size)
    budget_bytes = integer("budget_bytes", budget_bytes, low=0)
    num_blocks = budget_bytes // model.block_bytes(block_size)
    return num_blocks // math.ceil(s / block_size)


def vllm_kv_budget(total_bytes: float, gpu_memory_utilization: float, non_kv_bytes: float) -> float:
    """The one rule for the KV pool of one GPU, vLLM's: ``utilization * total - everything that is not KV cache``.

    vLLM v1 (``vllm/v1/worker/gpu_worker.py``): ``init_device`` sets ``requested_memory = total_memory *
    gpu_memory_utilization`` from a snapshot taken once the CUDA context exists, and
    ``determine_available_memory`` returns ``requested_memory - non_kv_cache_memory``: the weights, the
    peak activations of a profiling forward and the non-torch allocations made since that snapshot. The
    CUDA context is not subtracted: it lives, with everything unmeasured, in the ``(1 - utilization) *
    total`` left over. Every sizing here uses this rule: the engine's pool
    (:func:`paged_edu.cache.sizing.available_kv_cache_memory`), the simulator's
    (:meth:`~paged_edu.sim.costmodel.CostModel.kv_budget_bytes`), :func:`paged_edu.core.parallel_kv.plan_kv_per_gpu`
    and the calculator; the callers pass what they model (the weights, optionally a reserve for activations).
    May be <= 0: the callers say what that means for them.
    """
    return gpu_memory_utilization * total_bytes - non_kv_bytes

"""Sizing the paged KV cache: what a block costs and how many fit in a memory budget.

Plain arithmetic over the geometry (``num_layers``, ``block_size``, ``num_kv_heads``,
``head_dim``, the dtype's size): :class:`~paged_edu.cache.kv_cache.PagedKVCache`'s
``from_byte_budget`` and ``from_gpu_memory_utilization`` are built on these.
"""

from __future__ import annotations

import gc
import os

import torch

from paged_edu.core.hardware import ModelGeometry
from paged_edu.core.memory import vllm_kv_budget
from paged_edu.core.validation import FieldValueError, fraction

__all__ = ["available_kv_cache_memory", "bytes_per_block", "check_blocks_fit", "dtype_name", "num_blocks_for_budget"]


def format_gib(n: float) -> str:
    """``n`` bytes as GiB with two decimals (for error messages)."""
    return f"{n / 2**30:.2f} GiB"


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one block costs over all layers, K and V: ``2 * N_layers * B * N_kv * d_head * sizeof`` --
    the memory model's :meth:`~paged_edu.core.hardware.ModelGeometry.block_bytes` for this torch dtype."""
    return ModelGeometry("cache", num_layers, num_kv_heads, head_dim, dtype_name(dtype)).block_bytes(block_size)


def dtype_name(dtype: torch.dtype) -> str:
    """The model table's name of a torch dtype (:data:`~paged_edu.core.hardware.DTYPE_BYTES`): ``"bf16"`` ..."""
    name = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype)
    if name is None:
        raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    return name


def num_blocks_for_budget(budget_bytes: int, block_bytes: int, *, min_blocks: int = 1, what: str = "") -> int:
    """``floor(budget / block_bytes)``, or a ``ValueError`` that names the numbers when < min_blocks."""
    num_blocks = int(budget_bytes // block_bytes) if budget_bytes > 0 else 0
    if num_blocks < min_blocks:
        raise ValueError(
            f"the KV cache does not fit: {what}a budget of {budget_bytes:,} bytes ({format_gib(budget_bytes)}) holds "
            f"{num_blocks} blocks of {block_bytes:,} bytes, fewer than the {min_blocks} needed "
            f"({min_blocks * block_bytes:,} bytes)"
        )
    return num_blocks


def available_kv_cache_memory(total_bytes: int, gpu_memory_utilization: float, non_kv_bytes: int) -> int:
    """The KV budget by the library's one rule, vLLM's: ``gpu_memory_utilization * total - non_kv``
    (:func:`~paged_edu.core.memory.vllm_kv_budget`).

    ``non_kv_bytes`` is everything that is not KV cache and lives inside the fraction: the weights, the
    activations of the forward pass (a reserve), other allocations of this process. The rest,
    ``(1 - gpu_memory_utilization) * total``, is headroom for everything nobody measured -- the CUDA
    context, a warm-up forward the reserve left out; the seed's troubleshooting case 1 is a utilisation
    of 0.98 that leaves too little of it. Refuses a fraction outside (0, 1] and a budget <= 0, naming
    the numbers.
    """
    gpu_memory_utilization = fraction("gpu_memory_utilization", gpu_memory_utilization)
    if non_kv_bytes < 0:
        raise ValueError(f"non_kv_bytes must be >= 0, got {non_kv_bytes}")
    budget = int(vllm_kv_budget(total_bytes, gpu_memory_utilization, non_kv_bytes))
    if budget <= 0:
        raise ValueError(
            f"the KV cache does not fit: gpu_memory_utilization={gpu_memory_utilization} of {format_gib(total_bytes)} "
            f"total is {format_gib(total_bytes * gpu_memory_utilization)}, less than the {format_gib(non_kv_bytes)} "
            f"that is not KV cache (weights, reserved activations): use a smaller model, reserve less or raise "
            f"gpu_memory_utilization"
        )
    return budget


def available_bytes(device: torch.device) -> tuple[int, str] | None:
    """What a new pool can take on ``device`` now, and which figure that is; None if unknown.

    On a GPU: the driver's free memory (``torch.cuda.mem_get_info``) *plus* what torch's caching
    allocator holds reserved but unused (``memory_reserved - memory_allocated``: the tensors of a
    dropped or closed engine, say), which it hands out again before it asks the driver for more --
    and frees back to the driver, then retries, when a request does not fit its cached segments. On
    the host: the available RAM."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return free + cached, (
            f"{format_gib(free)} free on the device + {format_gib(cached)} reserved by torch's caching "
            "allocator for reuse"
        )
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "available RAM"
    except (ValueError, OSError, AttributeError):  # not on this OS
        return None


def check_blocks_fit(field: str, num_blocks: int, block_bytes: int, device: torch.device) -> None:
    """Refuse a pool of ``num_blocks`` blocks that the memory of ``device`` cannot hold now -- a clear
    error naming ``field`` and the figure it used (:func:`available_bytes`) instead of a bare
    ``MemoryError`` (or the OS killing the process)."""
    available = available_bytes(device)
    need = num_blocks * block_bytes
    if available is not None and need > available[0]:
        # An engine dropped inside a reference cycle -- one a view's callback closes, say -- holds its
        # pool until the collector runs: run it before refusing.
        gc.collect()
        available = available_bytes(device)
    if available is not None and need > available[0]:
        free, figure = available
        raise FieldValueError(
            field,
            f"{field}={num_blocks} blocks of {block_bytes} bytes need {format_gib(need)}, but {device} has "
            f"{format_gib(free)} ({figure}); at most {free // block_bytes} fit now",
        )

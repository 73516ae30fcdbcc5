"""Which kernels can run here: the one probe of "is Triton usable"; a device's default dtype and SM count.

:func:`kernel_support(device) <kernel_support>` says which of the decode, prefill, store, fused and
skinny-GEMM Triton kernels run on that device, and whether interpreted. Every ``"auto"`` -- the dispatch in
:mod:`~paged_edu.kernels.attention`, :meth:`PagedKVCache.store <paged_edu.cache.kv_cache.PagedKVCache.store>`,
the engine's choice of kernels -- asks it. Triton compiles for CUDA tensors; under
``TRITON_INTERPRET=1`` (set before the first import) it interprets on CPU tensors instead.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

import torch

__all__ = [
    "SKINNY_MAX_ROWS",
    "KernelSupport",
    "default_dtype",
    "kernel_support",
    "num_sms",
    "triton_available",
    "triton_interpreting",
]

# The skinny GEMM's largest batch (paged_edu.kernels.triton_gemm.MAX_ROWS): named here, without Triton,
# so that the model can choose between it and cuBLAS on any machine.
SKINNY_MAX_ROWS = 64


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
    return _importable("decode")


def triton_interpreting() -> bool:
    """True when the Triton kernels were decorated under the interpreter (``TRITON_INTERPRET=1``)."""
    if not triton_available():
        return False
    from paged_edu.kernels.triton_fused import INTERPRETING

    return INTERPRETING


@dataclass(frozen=True, slots=True)
class KernelSupport:
    """Which Triton kernels can run on tensors of one device type (see :func:`kernel_support`)."""

    device_type: str
    decode: bool  # paged_edu.kernels.decode
    prefill: bool  # paged_edu.kernels.triton_prefill
    store: bool  # paged_edu.kernels.triton_store
    fused: bool  # paged_edu.kernels.triton_fused + the rotary store: a Llama layer's per-token ops
    gemm: bool  # paged_edu.kernels.triton_gemm: the projections of a batch of <= 64 rows
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
        decode=runs_here and _importable("decode"),
        prefill=runs_here and _importable("triton_prefill"),
        store=runs_here and _importable("triton_store"),
        fused=runs_here and _importable("triton_fused") and _importable("triton_store"),
        gemm=runs_here and _importable("triton_gemm"),
        interpreted=runs_here and interpreting,
    )


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    """The number of streaming multiprocessors of CUDA device ``device_index`` (the split counts and
    the skinny GEMM's tiling are planned from it)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_dtype(device) -> torch.dtype:
    """fp32 on the CPU; bf16 on a GPU that has it (compute capability >= 8.0), else fp16 (Colab's T4)."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else torch.float16

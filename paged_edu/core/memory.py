"""The KV-cache memory model: how many bytes a token costs, and how much of a reservation is used.

For a decoder with ``N_layers`` layers, ``N_kv`` key/value heads of size ``d_head``, every token
stores one key and one value vector per layer and KV head:

    M_KV(s) = 2 * N_layers * N_kv * d_head * s * sizeof(dtype)   bytes.

Utilisation of the slots reserved for a request of ``s`` tokens:

* contiguous, reserving ``L_max`` slots:  ``eta_naive = s / L_max``
* paged, ``ceil(s/B)`` blocks of ``B``:   ``eta_paged = s / (ceil(s/B) * B) >= 1 - B/(s+B)``

Plain Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from paged_edu.core.hardware import MODEL_TABLE

__all__ = [
    "DTYPE_BYTES",
    "KVSpec",
    "PRESETS",
    "eta_naive",
    "eta_paged",
    "eta_paged_bound",
    "format_bytes",
    "kv_bytes",
    "max_requests_contiguous",
    "max_requests_paged",
    "seed_70b_example",
]

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True, slots=True)
class KVSpec:
    """The shape of one token's cache.

    A standard (MHA/GQA) model stores K and V: ``2 * num_layers * num_kv_heads * head_dim`` values.
    An MLA model (DeepSeek-V2/V3) stores one compressed latent of ``latent_dim`` plus a decoupled
    RoPE key of ``rope_dim`` per layer, shared by all heads: ``num_layers * (latent_dim + rope_dim)``.
    """

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "fp16"
    latent_dim: int = 0  # MLA only
    rope_dim: int = 0  # MLA only
    note: str = ""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {sorted(DTYPE_BYTES)}")
        for field_name in ("num_layers", "num_kv_heads", "head_dim"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field_name} must be a positive int, got {value!r}")
        if self.latent_dim < 0 or self.rope_dim < 0:
            raise ValueError("latent_dim and rope_dim must be >= 0")

    @property
    def is_mla(self) -> bool:
        return self.latent_dim > 0

    @property
    def values_per_token(self) -> int:
        if self.is_mla:
            return self.num_layers * (self.latent_dim + self.rope_dim)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def bytes_per_token(self) -> int:
        """``M_KV(1)``: bytes one token occupies in the cache, all layers."""
        return self.values_per_token * DTYPE_BYTES[self.dtype]

    def block_bytes(self, block_size: int) -> int:
        """Bytes of one block of ``B`` tokens across all layers (K and V)."""
        return self.bytes_per_token * block_size


PRESETS: dict[str, KVSpec] = {name: m.kv_spec for name, m in MODEL_TABLE.items()}


def kv_bytes(spec: KVSpec, num_tokens: int) -> int:
    """``M_KV(s)`` in bytes."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return spec.bytes_per_token * num_tokens


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
    spec = PRESETS["Seed 70B example"]
    per_token = spec.bytes_per_token
    total = kv_bytes(spec, num_tokens)
    return {
        "bytes_per_token": per_token,
        "kib_per_token": per_token / 1024,
        "total_bytes": total,
        "total_gib": total / 1024**3,
        "total_gb": total / 1e9,
        "seed_mixed_units_gb": (per_token / 1024) * num_tokens / 1e6,
    }


def _check_len(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


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


def max_requests_contiguous(budget_bytes: int, spec: KVSpec, max_seq_len: int) -> int:
    """Requests that fit when each reserves ``L_max`` slots up front."""
    _check_len("max_seq_len", max_seq_len)
    if budget_bytes < 0:
        raise ValueError("budget_bytes must be >= 0")
    return budget_bytes // kv_bytes(spec, max_seq_len)


def max_requests_paged(budget_bytes: int, spec: KVSpec, s: int, block_size: int = 16) -> int:
    """Requests of ``s`` tokens that fit when each takes ``ceil(s/B)`` blocks."""
    _check_len("s", s)
    _check_len("block_size", block_size)
    if budget_bytes < 0:
        raise ValueError("budget_bytes must be >= 0")
    num_blocks = budget_bytes // spec.block_bytes(block_size)
    return num_blocks // math.ceil(s / block_size)

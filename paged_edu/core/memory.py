"""The KV-cache memory model: how many bytes a token costs, and how much of a reservation is used.

For a decoder with ``N_layers`` layers, ``N_kv`` key/value heads of size ``d_head``, every token
stores one key and one value vector per layer and KV head:

    M_KV(s) = 2 * N_layers * N_kv * d_head * s * sizeof(dtype)   bytes.

On one GPU of a deployment split ``tp`` ways by tensor parallelism and ``pp`` ways by pipeline
parallelism (:meth:`KVSpec.per_gpu`), a GPU holds the KV heads of its tensor-parallel rank --
``max(1, N_kv // tp)``, a head *replicated* on ``tp / N_kv`` ranks when ``tp > N_kv`` -- for the
layers of its pipeline stage, at most ``ceil(N_layers / pp)``; an MLA latent is one "head" every
rank keeps whole. The KV-cache dtype (``--kv-cache-dtype fp8``: 1 byte) scales it all.

Utilisation of the slots reserved for a request of ``s`` tokens:

* contiguous, reserving ``L_max`` slots:  ``eta_naive = s / L_max``
* paged, ``ceil(s/B)`` blocks of ``B``:   ``eta_paged = s / (ceil(s/B) * B) >= 1 - B/(s+B)``

Plain Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from paged_edu.core.hardware import DTYPE_BYTES, MODEL_TABLE, ModelGeometry
from paged_edu.core.validation import FieldValueError, choice, integer

__all__ = [
    "DTYPE_BYTES",
    "KVSpec",
    "PRESETS",
    "eta_naive",
    "eta_paged",
    "eta_paged_bound",
    "format_bytes",
    "kv_bytes",
    "kv_heads_per_rank",
    "max_requests_contiguous",
    "max_requests_paged",
    "vllm_kv_budget",
    "seed_70b_example",
]


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
        choice("dtype", self.dtype, tuple(sorted(DTYPE_BYTES)))
        for field_name in ("num_layers", "num_kv_heads", "head_dim"):
            integer(field_name, getattr(self, field_name), low=1)
        integer("latent_dim", self.latent_dim, low=0)
        integer("rope_dim", self.rope_dim, low=0)

    @classmethod
    def from_geometry(cls, g: ModelGeometry) -> "KVSpec":
        """The cache shape of a model of :mod:`paged_edu.core.hardware`'s table."""
        return cls(
            g.name,
            g.num_layers,
            g.num_kv_heads,
            g.head_dim,
            g.dtype,
            latent_dim=g.latent_dim,
            rope_dim=g.rope_dim,
            note=g.note,
        )

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

    def per_gpu(
        self, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1, kv_cache_dtype: str | None = None
    ) -> KVSpec:
        """The cache one GPU holds per token when the model runs on ``tp x pp`` GPUs.

        * tensor parallelism splits the KV heads: ``kv_heads_per_rank(N_kv, tp)`` each (vLLM's
          ``ModelConfig.get_num_kv_heads``: ``max(1, N_kv // tp)``, replicated when ``tp > N_kv``);
          an MLA latent is not split -- every rank caches it whole (vLLM returns 1 KV head for MLA);
        * pipeline parallelism splits the layers: the busiest stage holds ``ceil(N_layers / pp)``,
          and it is the one whose memory runs out first;
        * ``kv_cache_dtype`` (``"fp8"``, ``"bf16"``, ...; None keeps the model's) sets the bytes per value.

        ``bytes_per_token`` of the result is then per GPU. The block tables are the same on every GPU
        (one scheduler drives all ranks), so a GPU's pool of blocks is the deployment's.
        """
        tp = integer("tensor_parallel_size", tensor_parallel_size, low=1)
        pp = integer("pipeline_parallel_size", pipeline_parallel_size, low=1)
        if pp > self.num_layers:
            raise FieldValueError(
                "pipeline_parallel_size", f"pipeline_parallel_size={pp} exceeds the model's {self.num_layers} layers"
            )
        dtype = choice(
            "kv_cache_dtype", self.dtype if kv_cache_dtype is None else kv_cache_dtype, tuple(sorted(DTYPE_BYTES))
        )
        heads = self.num_kv_heads if self.is_mla else kv_heads_per_rank(self.num_kv_heads, tp)[0]
        note = f"{self.name} per GPU at tp={tp}, pp={pp}, {dtype}"
        return replace(self, name=note, num_layers=-(-self.num_layers // pp), num_kv_heads=heads, dtype=dtype)


PRESETS: dict[str, KVSpec] = {name: KVSpec.from_geometry(m) for name, m in MODEL_TABLE.items()}


def kv_heads_per_rank(num_kv_heads: int, tensor_parallel_size: int) -> tuple[int, int]:
    """``(KV heads on each rank, ranks holding each head)`` under ``tp``-way tensor parallelism.

    ``tp <= N_kv``: the heads are split, ``N_kv / tp`` per rank, each held once; ``tp > N_kv``: one
    head per rank, each replicated on ``tp / N_kv`` ranks. Either way one must divide the other,
    as vLLM's ``QKVParallelLinear`` requires (``divide(tp, N_kv)`` / ``divide(N_kv, tp)``).
    """
    tp = integer("tensor_parallel_size", tensor_parallel_size, low=1)
    n = integer("num_kv_heads", num_kv_heads, low=1)
    if tp <= n:
        if n % tp:
            raise FieldValueError(
                "tensor_parallel_size", f"num_kv_heads={n} is not divisible by tensor_parallel_size={tp}"
            )
        return n // tp, 1
    if tp % n:
        raise FieldValueError(
            "tensor_parallel_size",
            f"tensor_parallel_size={tp} is not a multiple of num_kv_heads={n}: the heads cannot be replicated evenly",
        )
    return 1, tp // n


def kv_bytes(spec: KVSpec, num_tokens: int) -> int:
    """``M_KV(s)`` in bytes."""
    if num_tokens < 0:
        raise FieldValueError("num_tokens", f"num_tokens must be >= 0, got {num_tokens}")
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


def vllm_kv_budget(total_bytes: float, gpu_memory_utilization: float, non_kv_bytes: float) -> float:
    """vLLM's rule for the KV pool of one GPU: ``utilization * total - everything that is not KV cache``.

    vLLM subtracts the profiled peak of the weights, a dummy forward's activations and non-torch
    allocations (``vllm/v1/worker/gpu_worker.py``, ``determine_available_memory``); the callers here pass
    what they model (the weights, optionally a reserve). The one place for the rule: the simulator's
    :meth:`~paged_edu.sim.costmodel.CostModel.kv_budget_bytes` and :func:`paged_edu.core.parallel_kv.plan_kv_per_gpu`
    use it. (The engine's own sizing, :mod:`paged_edu.cache.sizing`, applies the fraction to *free* memory.)
    May be <= 0: the callers say what that means for them.
    """
    return gpu_memory_utilization * total_bytes - non_kv_bytes

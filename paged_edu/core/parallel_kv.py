"""KV memory past one GPU, on paper: what a GPU's budget holds under tensor / pipeline parallelism.

A model served on ``tp x pp`` GPUs keeps on each GPU its share of the weights and a KV pool for the
tokens of *every* running sequence, restricted to the GPU's KV heads and layers
(:meth:`~paged_edu.core.hardware.ModelGeometry.per_gpu`). Per GPU, in bytes:

    weights_gpu = P * sizeof(weight dtype) / (tp * pp)               (an even split, stated)
    budget_gpu  = gpu_memory_utilization * memory - weights_gpu - reserve
    M_gpu(1)    = 2 * ceil(N_layers / pp) * max(1, N_kv // tp) * d_head * sizeof(kv dtype)
    blocks      = floor(budget_gpu / (B * M_gpu(1))),   tokens = blocks * B

``reserve`` is what vLLM's profiling forward pass measures beside the weights (activations, CUDA
graphs); we take it as an input. The block tables are the same on every GPU -- one scheduler
drives all ranks (vLLM's ``EngineCore._initialize_kv_caches`` builds one scheduler KV config from all
workers', and ``generate_scheduler_kv_cache_config`` asserts they have the same ``num_blocks``) -- so
the deployment holds as many tokens as one GPU's pool. Plain Python, no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from paged_edu.core.hardware import DTYPE_BYTES, GPUS, find_model, kv_heads_per_rank
from paged_edu.core.memory import vllm_kv_budget
from paged_edu.core.validation import choice, fraction, integer

__all__ = ["ParallelKVPlan", "parallel_kv_rows", "plan_kv_per_gpu"]


@dataclass(frozen=True, slots=True)
class ParallelKVPlan:
    """One deployment's KV pool, per GPU. ``fits`` is False when the weights leave no KV budget."""

    model: str
    gpu: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    kv_cache_dtype: str
    kv_heads_per_gpu: int  # KV heads (an MLA latent counts as 1) each GPU caches
    kv_head_replicas: int  # GPUs holding each KV head (tp / N_kv when tp > N_kv; tp for MLA)
    layers_per_gpu: int  # layers of the busiest pipeline stage
    bytes_per_token_per_gpu: int
    bytes_per_token_all_gpus: int  # what one token costs across the tp x pp GPUs, replicas included
    weights_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int
    block_size: int
    num_blocks: int  # blocks of the pool (the same on every GPU)

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def num_tokens(self) -> int:
        """Token slots the deployment's pool holds."""
        return self.num_blocks * self.block_size

    @property
    def fits(self) -> bool:
        return self.num_blocks > 0

    def max_sequences(self, tokens_per_sequence: int) -> int:
        """Sequences of ``s`` tokens that fit at once: ``blocks // ceil(s / B)``."""
        tokens_per_sequence = integer("tokens_per_sequence", tokens_per_sequence, low=1)
        return self.num_blocks // -(-tokens_per_sequence // self.block_size)


def plan_kv_per_gpu(
    model: str,
    gpu: str = "h200",
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    kv_cache_dtype: str | None = None,
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    reserve_bytes: int = 0,
    weight_dtype: str | None = None,
) -> ParallelKVPlan:
    """The KV pool one GPU of ``gpu`` keeps for ``model`` on ``tp x pp`` GPUs (see the module docstring).

    ``kv_cache_dtype`` None keeps the model's dtype (vLLM's ``--kv-cache-dtype auto``); ``weight_dtype``
    None likewise. Bad arguments raise ``ValueError`` naming them.
    """
    g = find_model(model)
    choice("gpu", gpu, tuple(sorted(GPUS)))
    gpu_memory_utilization = fraction("gpu_memory_utilization", gpu_memory_utilization)
    block_size = integer("block_size", block_size, low=1)
    reserve_bytes = integer("reserve_bytes", reserve_bytes, low=0)
    wdtype = choice("weight_dtype", g.dtype if weight_dtype is None else weight_dtype, tuple(sorted(DTYPE_BYTES)))
    spec = g.per_gpu(tensor_parallel_size, pipeline_parallel_size, kv_cache_dtype)
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    replicas = tp if g.is_mla else kv_heads_per_rank(g.num_kv_heads, tp)[1]
    full = g.per_gpu(1, 1, spec.kv_dtype).kv_bytes_per_token  # one copy of every head and layer
    weights = int(g.num_params * DTYPE_BYTES[wdtype]) // (tp * pp)
    budget = max(int(vllm_kv_budget(GPUS[gpu].memory_bytes, gpu_memory_utilization, weights + reserve_bytes)), 0)
    return ParallelKVPlan(
        model=g.name,
        gpu=gpu,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        kv_cache_dtype=spec.kv_dtype,
        kv_heads_per_gpu=spec.num_kv_heads if not spec.is_mla else 1,
        kv_head_replicas=replicas,
        layers_per_gpu=spec.num_layers,
        bytes_per_token_per_gpu=spec.kv_bytes_per_token,
        bytes_per_token_all_gpus=full * replicas,
        weights_bytes_per_gpu=weights,
        kv_budget_bytes_per_gpu=budget,
        block_size=block_size,
        num_blocks=budget // spec.block_bytes(block_size),
    )


def parallel_kv_rows(
    models=("Llama-3-8B", "Llama-3-70B"),
    gpu: str = "h200",
    tensor_parallel_sizes=(1, 2, 4, 8),
    kv_cache_dtypes=(None, "fp8"),
    pipeline_parallel_size: int = 1,
    **kwargs,
) -> list[dict]:
    """One row (a dict: the plan's fields plus ``num_tokens`` and ``fits``) per model x tp x KV dtype."""
    rows = []
    for model in models:
        for dtype in kv_cache_dtypes:
            for tp in tensor_parallel_sizes:
                plan = plan_kv_per_gpu(
                    model,
                    gpu,
                    tensor_parallel_size=tp,
                    pipeline_parallel_size=pipeline_parallel_size,
                    kv_cache_dtype=dtype,
                    **kwargs,
                )
                rows.append(
                    {**asdict(plan), "num_gpus": plan.num_gpus, "num_tokens": plan.num_tokens, "fits": plan.fits}
                )
    return rows

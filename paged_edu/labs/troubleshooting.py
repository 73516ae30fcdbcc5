"""Lesson 6's troubleshooting case 1: "CUDA out of memory on engine warm-up".

The pool is sized by the library's one rule, vLLM's (:func:`~paged_edu.cache.sizing.available_kv_cache_memory`):
``kv = gpu_memory_utilization * total - (weights + reserve)``. Whatever the forward pass allocates beyond
the reserve (activations of the warm-up batch, the logits) must fit, with the CUDA context, in the
``(1 - utilization) * total`` left over.

* :func:`plan_memory` -- the arithmetic on the CPU, for a GPU of :data:`~paged_edu.core.hardware.GPUS`
  and a model of :data:`~paged_edu.core.hardware.MODELS` (by key or name): context, weights, KV pool, activations, and
  whether their sum fits the device;
* :func:`warmup_activation_bytes` -- the estimate of one warm-up forward of ``num_tokens`` tokens;
* :func:`cuda_oom_child` -- the same on a real GPU, in a child process (an OOM must not take the lesson's
  kernel with it): weights, a pool sized at ``gpu_memory_utilization``, then one forward of
  ``num_tokens`` tokens, with ``torch.cuda.mem_get_info`` / ``memory_allocated`` at every stage. CUDA only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from paged_edu import data
from paged_edu.cache.sizing import available_kv_cache_memory, num_blocks_for_budget
from paged_edu.core.hardware import GPUS, find_model

__all__ = ["MemoryPlan", "cuda_oom_child", "h200_measured_warmup", "plan_memory", "warmup_activation_bytes"]


def warmup_activation_bytes(model_key: str, num_tokens: int) -> int:
    """One forward of ``num_tokens`` tokens without pruning the logits, as a profiling warm-up runs it:
    the fp32 logits (``T x vocab x 4``) plus the widest live activations (``T x 3 x intermediate``-ish,
    taken here as ``T x 4 x d_model x 4`` for the MLP's gate, up and product) -- an estimate, stated."""
    g = find_model(model_key)
    return num_tokens * (g.vocab_size * 4 + 4 * 4 * g.d_model * 4)


@dataclass(frozen=True)
class MemoryPlan:
    """Where a GPU's memory goes at warm-up, in bytes."""

    gpu: str
    total: int
    context: int  # CUDA context and the allocator's own reserve
    weights: int
    free_after_load: int
    gpu_memory_utilization: float
    kv: int  # the pool: num_blocks * block_bytes
    num_blocks: int
    block_bytes: int
    activations: int

    @property
    def peak(self) -> int:
        return self.context + self.weights + self.kv + self.activations

    @property
    def fits(self) -> bool:
        return self.peak <= self.total

    @property
    def headroom(self) -> int:
        """What the activations may use once the pool is allocated: ``(1 - utilization) * total`` minus
        the context, plus the pool's rounding."""
        return self.total - self.context - self.weights - self.kv

    def rows(self) -> list[tuple[str, float]]:
        """(part, GiB) for a table or a bar."""
        gib = 2**30
        return [
            ("CUDA context", self.context / gib),
            ("weights", self.weights / gib),
            ("KV pool", self.kv / gib),
            ("activations (warm-up)", self.activations / gib),
        ]


def plan_memory(
    gpu_key: str,
    model_key: str,
    gpu_memory_utilization: float,
    *,
    context_bytes: int,
    activation_bytes: int,
    block_size: int = 16,
    reserve_bytes: int = 0,
    total_bytes: int | None = None,
) -> MemoryPlan:
    """The warm-up's memory on ``gpu_key`` for ``model_key`` at ``gpu_memory_utilization``.

    The pool is sized as the engine sizes it, by vLLM's rule (``utilization * total - weights -
    reserve_bytes``, whole blocks: the context is not subtracted, it lives in the headroom);
    an impossible budget raises the sizing's own ``ValueError``. ``total_bytes`` overrides the table's
    memory (a measured figure).
    """
    gpu, g = GPUS[gpu_key], find_model(model_key)
    total = gpu.memory_bytes if total_bytes is None else int(total_bytes)
    weights = int(g.weight_bytes)
    free = total - context_bytes - weights
    if free <= 0:
        raise ValueError(
            f"{g.name} needs {weights / 2**30:.1f} GiB of weights plus {context_bytes / 2**30:.1f} GiB of "
            f"context; {gpu.name} has {total / 2**30:.1f} GiB"
        )
    block_bytes = g.block_bytes(block_size)
    budget = available_kv_cache_memory(total, gpu_memory_utilization, weights + reserve_bytes)
    num_blocks = num_blocks_for_budget(budget, block_bytes, what=f"{gpu.name}, {g.name}: ")
    return MemoryPlan(
        gpu.name,
        total,
        context_bytes,
        weights,
        free,
        gpu_memory_utilization,
        num_blocks * block_bytes,
        num_blocks,
        block_bytes,
        activation_bytes,
    )


def h200_measured_warmup() -> dict:
    """What :func:`cuda_oom_child` measured on the H200 (``paged_edu/data/oom_child.json``), in bytes:
    ``total`` (the device's own ``mem_get_info`` total), ``context``, ``activations`` (the warm-up's peak
    over the pool, from the run that fitted) and each run's record, for :func:`plan_memory` on a CPU."""
    rec = data.load_json("oom_child.json")
    fitted = next(r for r in rec["runs"] if r["ok"])
    gib = 2**30
    return {
        "total": int(fitted["total_gib"] * gib),
        "context": int(fitted["context_gib"] * gib),
        "activations": int(fitted["activations_gib"] * gib),
        "runs": rec["runs"],
        "source": rec["source"],
    }


_CHILD = r"""
import json, sys, torch
from paged_edu.cache.kv_cache import PagedKVCache
from paged_edu.models.config import smollm2_config
from paged_edu.models.loaders import random_hf_llama
util, num_tokens, block_size = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
gib = 2**30
rec = {"gpu_memory_utilization": util, "num_tokens": num_tokens}
torch.cuda.init(); torch.zeros(1, device="cuda")
free0, total = torch.cuda.mem_get_info(); rec["total_gib"] = total / gib
rec["context_gib"] = (total - free0) / gib  # the CUDA context (and anything else on the device)
cfg = smollm2_config()
hf = random_hf_llama(cfg, seed=0).to("cuda", torch.bfloat16).eval()
rec["weights_gib"] = torch.cuda.memory_allocated() / gib
try:
    cache = PagedKVCache.from_gpu_memory_utilization(cfg.num_layers, block_size, cfg.num_kv_heads, cfg.head_dim,
        gpu_memory_utilization=util, dtype=torch.bfloat16, device="cuda")
    rec["num_blocks"] = cache.num_blocks
    rec["kv_gib"] = cache.nbytes / gib
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        ids = torch.randint(0, cfg.vocab_size, (1, num_tokens), device="cuda")
        hf(input_ids=ids).logits.float().sum().item()  # the warm-up forward, logits unpruned
    rec["activations_gib"] = (torch.cuda.max_memory_allocated() - before) / gib
    rec["ok"] = True
except torch.cuda.OutOfMemoryError as exc:
    rec["ok"], rec["error"] = False, str(exc).splitlines()[0]
except ValueError as exc:
    rec["ok"], rec["error"] = False, f"ValueError: {exc}"
rec["free_at_end_gib"] = torch.cuda.mem_get_info()[0] / gib
print(json.dumps(rec))
"""


def cuda_oom_child(
    gpu_memory_utilization: float, num_tokens: int = 32768, block_size: int = 16, timeout: float = 300
) -> dict:
    """Run the warm-up on the GPU in a child process; returns its record (``ok``, the error message,
    and context / weights / KV / activations in GiB). Needs CUDA (not run on a CPU)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("cuda_oom_child needs a CUDA GPU; on a CPU use plan_memory")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(gpu_memory_utilization), str(num_tokens), str(block_size)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"the child process failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1])

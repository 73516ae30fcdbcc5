"""A step-time cost model: how long one serving iteration takes on a GPU, from FLOPs and bytes.

The simulator runs the real scheduler and the real allocator, but no model. Each step's time is
predicted from what the step does, against a roofline::

    t_step = max(FLOPs / (peak_flops * compute_efficiency),
                 bytes / (hbm_bandwidth * memory_efficiency))
             + step_overhead + per_seq_overhead * num_seqs
             + swapped_bytes / pcie_bandwidth

For a step that computes ``n_i`` new tokens of sequence ``i`` on top of ``c_i`` tokens already in the
cache (decode: ``n_i = 1``; a prefill chunk: ``n_i`` prompt tokens)::

    FLOPs = 2 * P * sum(n_i)                                      # the weight matmuls
          + 2 * d_model * vocab * (sequences that emit a token)  # the LM head, last position only
          + 4 * layers * q_heads * head_dim * sum(n_i * c_i + n_i (n_i + 1) / 2)   # QK^T and PV
    bytes = sizeof(dtype) * P                                    # every weight read once per step
          + M_KV * sum(c_i + n_i)                                # K/V read (and the new ones written)

with ``P`` the parameters outside the embedding and ``M_KV = 2 * layers * kv_heads * head_dim *
sizeof(dtype)`` the KV bytes per token. Activations, the softmax and norms are left out: they are a
few per cent of both sums at these sizes.

:meth:`CostModel.roofline` is the yardstick the benchmarks compare the engine with
(:data:`ROOFLINE_NAME`): the same sums at full efficiency (peak FLOP/s, the copy-ceiling bandwidth),
no overhead term, plus the tied LM head's weight read (``ModelGeometry.lm_head_bytes``: a tied head is
not in ``P``) in every step that samples, each step given as its exact chunks
(:meth:`StepShape.of_chunks`). The default model leaves the head's read out, as it was calibrated.

Assumptions are numbers on dataclasses, printed by :meth:`CostModel.describe` and adjustable:
``CostModel.calibrate`` fits the efficiencies and overhead to measured step times (for example the
engine's per-step metrics on the H200, through ``StepShape.from_step_metrics``).

GPU and model figures come from the one table in :mod:`paged_edu.core.hardware` (sources there).
The default GPU is our H200: 989 TFLOP/s dense bf16, a device-to-device copy ceiling of 4.24 TB/s
measured here (counting read + write; 4.8 TB/s on the datasheet), 143,771 MiB of HBM3e ("141 GB"). The best paged decode kernels
there reach 82-87% of the copy ceiling, so ``memory_efficiency = 0.85``; large prefill GEMMs reach
about 60% of peak, so ``compute_efficiency = 0.6``; a CUDA-graph engine spends about 1 ms per step
outside the GPU kernels (``step_overhead_s``). All three are assumptions until calibrated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from operator import mul

import numpy as np

from paged_edu.core.hardware import GPU, GPUS, MODELS, ModelGeometry
from paged_edu.core.memory import vllm_kv_budget
from paged_edu.core.validation import FieldValueError, fraction, integer

__all__ = ["ROOFLINE_NAME", "CostModel", "StepShape"]

# What every table calls the time of CostModel.roofline() on a step's exact chunks.
ROOFLINE_NAME = "roofline (full efficiency, per-chunk shapes, LM head included)"


def _attention_pairs(start: int, num_new_tokens: int) -> int:
    """Query-key pairs of a causal chunk: ``n * c + n (n + 1) / 2`` for ``n`` new tokens after ``c``."""
    return num_new_tokens * start + num_new_tokens * (num_new_tokens + 1) // 2


@dataclass(slots=True)
class StepShape:
    """What one step computes, summed over its scheduled sequences (the cost model's input)."""

    num_seqs: int = 0
    num_new_tokens: int = 0  # sum n_i
    num_context_tokens: int = 0  # sum c_i: tokens already cached that the step reads
    attention_pairs: int = 0  # sum n_i * c_i + n_i (n_i + 1) / 2: query-key pairs
    num_emitting: int = 0  # sequences that sample a token this step
    swapped_blocks: int = 0  # blocks copied between host and device before the step
    copied_blocks: int = 0  # copy-on-write copies on the device
    num_blocks_read: int = 0  # KV blocks the attention kernel walks (only counted when per_block_s > 0)

    @classmethod
    def from_step_metrics(cls, m) -> "StepShape":
        """An approximate shape from the engine's per-step metrics (:class:`paged_edu.engine.StepMetrics`).

        The engine reports totals, not each sequence's chunk, so the prefill tokens are taken as one
        chunk starting from an empty cache, and the context as the tokens in the cache after the
        step minus the ones it computed. Good enough to calibrate the overhead and the efficiencies
        from decode-heavy runs: ``cost.calibrate([(StepShape.from_step_metrics(m), m.duration) ...])``.
        """
        shape = cls()
        prefill = m.num_prefill_tokens
        decodes = m.num_decode_seqs
        shape.num_seqs = decodes + (1 if prefill else 0)
        shape.num_new_tokens = m.num_batched_tokens
        shape.num_context_tokens = max(m.num_tokens_in_cache - m.num_batched_tokens, 0)
        shape.attention_pairs = shape.num_context_tokens + decodes + prefill * (prefill + 1) // 2
        shape.num_emitting = shape.num_seqs
        return shape

    @classmethod
    def of_chunks(cls, starts: list[int], counts: list[int], num_emitting: int, **copies: int) -> "StepShape":
        """A step of chunks: chunk ``i`` computes ``counts[i]`` new tokens on top of ``starts[i]`` cached ones.

        Sums over whole lists (the simulator builds one shape per step, millions of chunks per run);
        ``copies``: ``swapped_blocks`` / ``copied_blocks``.
        """
        num_new_tokens = sum(counts)
        context = sum(starts)
        if counts.count(1) == len(counts):  # every chunk a decode (n_i = 1), most steps: sum c_i + n,
            pairs = context + num_new_tokens  # 2 instead of 15 us a step of 156 decodes
        else:  # sum n_i c_i + n_i (n_i + 1) / 2 = sum n_i c_i + (sum n_i^2 + sum n_i) / 2, each sum at C speed
            pairs = sum(map(mul, counts, starts)) + (sum(map(mul, counts, counts)) + num_new_tokens) // 2
        return cls(len(counts), num_new_tokens, context, pairs, num_emitting, **copies)

    def add(self, start: int, num_new_tokens: int, emits: bool) -> None:
        """One more chunk: ``num_new_tokens`` new tokens on top of ``start`` cached ones."""
        start = integer("start", start, low=0)
        num_new_tokens = integer("num_new_tokens", num_new_tokens, low=0)
        self.num_seqs += 1
        self.num_new_tokens += num_new_tokens
        self.num_context_tokens += start
        self.attention_pairs += _attention_pairs(start, num_new_tokens)
        self.num_emitting += emits


@dataclass(slots=True)
class CostModel:
    """Predict step times; every assumption is a field, printed by :meth:`describe`."""

    model: ModelGeometry = field(default_factory=lambda: MODELS["opt-13b"])
    gpu: GPU = field(default_factory=lambda: GPUS["h200"])
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.85
    step_overhead_s: float = 1e-3
    per_seq_overhead_s: float = 0.0
    block_size: int = 16  # for the bytes of swapped / copied blocks
    # The paged kernel's cost per KV block it walks, per layer and KV head (block-table lookup,
    # a short tile, the running-softmax rescale). 0 (off) by default; see fit_per_block_cost.
    per_block_s: float = 0.0
    # Count the tied LM head's weight read (ModelGeometry.lm_head_bytes) in every step that samples. Off
    # by default, which keeps the calibrated model's numbers as they were (lesson 7); on in roofline().
    lm_head_read: bool = False

    def __post_init__(self) -> None:
        m = self.model
        if not (m.matmul_params > 0 and m.num_q_heads > 0 and m.d_model > 0 and m.vocab_size > 0):
            raise ValueError(
                f"{m.name}: the cost model needs the model's size (matmul_params, num_q_heads, d_model, vocab_size)"
            )
        for name in ("compute_efficiency", "memory_efficiency"):
            fraction(name, getattr(self, name))
        self.block_size = integer("block_size", self.block_size, low=1)
        for name in ("step_overhead_s", "per_seq_overhead_s", "per_block_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    # -- the roofline ----------------------------------------------------------------------------
    def flops(self, s: StepShape) -> float:
        m = self.model
        return (
            m.matmul_flops_per_token * s.num_new_tokens
            + m.lm_head_flops_per_token * s.num_emitting
            + m.attention_flops_per_pair * s.attention_pairs
        )

    def bytes_moved(self, s: StepShape) -> float:
        m = self.model
        head = m.lm_head_bytes if self.lm_head_read and s.num_emitting else 0.0
        return m.matmul_weight_bytes + head + m.kv_bytes_per_token * (s.num_context_tokens + s.num_new_tokens)

    def roofline(self) -> "CostModel":
        """This model at full efficiency: the time a step's FLOPs and bytes need at the GPU's peak
        FLOP/s and its roofline bandwidth (``GPU.hbm_bandwidth``, the copy ceiling), with no overhead
        of any kind, the tied LM head's weight read counted. Give it each step's exact chunks
        (:meth:`StepShape.of_chunks`); tables call it :data:`ROOFLINE_NAME`."""
        return replace(
            self,
            compute_efficiency=1.0,
            memory_efficiency=1.0,
            step_overhead_s=0.0,
            per_seq_overhead_s=0.0,
            per_block_s=0.0,
            lm_head_read=True,
        )

    def step_time(self, s: StepShape) -> float:
        """Seconds one step takes (0 for an empty step)."""
        if s.num_seqs == 0:
            return 0.0
        t_compute = self.flops(s) / (self.gpu.peak_flops * self.compute_efficiency)
        t_memory = self.bytes_moved(s) / (self.gpu.hbm_bandwidth * self.memory_efficiency)
        t = max(t_compute, t_memory) + self.step_overhead_s + self.per_seq_overhead_s * s.num_seqs
        if self.per_block_s:
            t += self.per_block_s * self.model.num_layers * self.model.num_kv_heads * s.num_blocks_read
        if s.swapped_blocks or s.copied_blocks:
            block_bytes = self.model.kv_bytes_per_token * self.block_size
            t += s.swapped_blocks * block_bytes / self.gpu.pcie_bandwidth
            t += 2 * s.copied_blocks * block_bytes / (self.gpu.hbm_bandwidth * self.memory_efficiency)
        return t

    def decode_step_time(self, batch: int, context: int) -> float:
        """A pure decode step: ``batch`` sequences, each with ``context`` cached tokens."""
        s = StepShape()
        for _ in range(integer("batch", batch, low=0)):
            s.add(context, 1, True)
        return self.step_time(s)

    # -- memory --------------------------------------------------------------------------------
    def kv_budget_bytes(self, gpu_memory_utilization: float = 0.9, weight_bytes: float | None = None) -> float:
        """Bytes left for the KV cache, as vLLM sizes its pool: ``utilization * total - weights``.

        ``weight_bytes``: what the weights take in memory (default: ``ModelGeometry.matmul_weight_bytes``,
        the model's ``P`` times its dtype's size; the input embedding is left out of ``P``). vLLM subtracts the profiled peak of
        everything that is not KV cache -- weights, the activations of a dummy forward, non-torch
        allocations; this counts the weights only.
        """
        gpu_memory_utilization = fraction("gpu_memory_utilization", gpu_memory_utilization)
        weights = self.model.matmul_weight_bytes if weight_bytes is None else weight_bytes
        free = vllm_kv_budget(self.gpu.memory_bytes, gpu_memory_utilization, weights)
        if free <= 0:
            raise FieldValueError(
                "gpu_memory_utilization",
                f"{self.model.name} weights ({weights / 1e9:.1f} GB) do not fit in "
                f"{gpu_memory_utilization:.0%} of {self.gpu.name}'s {self.gpu.memory_bytes / 1e9:.0f} GB",
            )
        return free

    def kv_capacity_tokens(self, gpu_memory_utilization: float = 0.9) -> int:
        """Token slots left for the KV cache after the weights, as vLLM sizes its pool."""
        return int(self.kv_budget_bytes(gpu_memory_utilization) // self.model.kv_bytes_per_token)

    # -- calibration ---------------------------------------------------------------------------
    def calibrate(self, samples: list[tuple[StepShape, float]]) -> "CostModel":
        """Fit the efficiencies and the step overhead to measured ``(shape, seconds)`` pairs.

        Least squares on ``t = overhead + a * t_compute + b * t_memory`` restricted to the side of
        the roofline each sample is on; returns a new model (this one is unchanged).
        """
        if len(samples) < 2:
            raise ValueError("calibrate needs at least 2 measured steps")
        ideal = replace(
            self, compute_efficiency=1.0, memory_efficiency=1.0, step_overhead_s=0.0, per_seq_overhead_s=0.0
        )
        rows = []
        for shape, seconds in samples:
            if not seconds > 0:
                raise ValueError(f"measured step times must be > 0, got {seconds}")
            tc = ideal.flops(shape) / ideal.gpu.peak_flops
            tm = ideal.bytes_moved(shape) / ideal.gpu.hbm_bandwidth
            # Which side of the roofline: judged with the current efficiencies.
            compute_bound = tc / self.compute_efficiency > tm / self.memory_efficiency
            rows.append((1.0, tc if compute_bound else 0.0, 0.0 if compute_bound else tm, seconds))
        coef = _least_squares([r[:3] for r in rows], [r[3] for r in rows])
        overhead, inv_c, inv_m = coef
        new = replace(self, step_overhead_s=max(overhead, 0.0))
        if inv_c > 0:
            new = replace(new, compute_efficiency=min(1.0, 1.0 / inv_c))
        if inv_m > 0:
            new = replace(new, memory_efficiency=min(1.0, 1.0 / inv_m))
        return new

    # -- printing ------------------------------------------------------------------------------
    def assumptions(self) -> dict:
        """Every number the model uses, as a flat dict (also written to the simulator's JSON)."""
        m, g = self.model, self.gpu
        return {
            "model": m.name,
            "model_params": m.matmul_params,
            "kv_bytes_per_token": m.kv_bytes_per_token,
            "layers/q_heads/kv_heads/head_dim": f"{m.num_layers}/{m.num_q_heads}/{m.num_kv_heads}/{m.head_dim}",
            "gpu": g.name,
            "peak_flops": g.peak_flops,
            "hbm_bandwidth": g.hbm_bandwidth,
            "pcie_bandwidth": g.pcie_bandwidth,
            "compute_efficiency": self.compute_efficiency,
            "memory_efficiency": self.memory_efficiency,
            "step_overhead_s": self.step_overhead_s,
            "per_seq_overhead_s": self.per_seq_overhead_s,
            "per_block_s": self.per_block_s,
            **({"lm_head_bytes": m.lm_head_bytes} if self.lm_head_read else {}),
        }

    def describe(self) -> str:
        m, g = self.model, self.gpu
        return "\n".join(
            [
                f"cost model: t_step = max(FLOPs / ({g.peak_flops / 1e12:.0f} TFLOP/s x {self.compute_efficiency:.2f}), "
                f"bytes / ({g.hbm_bandwidth / 1e12:.2f} TB/s x {self.memory_efficiency:.2f})) "
                f"+ {self.step_overhead_s * 1e3:.2f} ms/step + {self.per_seq_overhead_s * 1e6:.1f} us/seq"
                + (f" + {self.per_block_s * 1e9:.2f} ns per block x layer x KV head" if self.per_block_s else ""),
                f"  GPU: {g.name} ({g.source})" if g.source else f"  GPU: {g.name}",
                f"  model: {m.name}, {m.matmul_params / 1e9:.2f}B params ({m.matmul_weight_bytes / 1e9:.1f} GB), "
                f"{m.num_layers} layers, {m.num_q_heads}/{m.num_kv_heads} q/kv heads x {m.head_dim}, "
                f"M_KV = {m.kv_bytes_per_token:,} bytes/token",
                f"  e.g. decode step, batch 64 x 512 tokens: {self.decode_step_time(64, 512) * 1e3:.2f} ms",
            ]
        )


def _least_squares(rows: list[tuple[float, ...]], y: list[float]) -> list[float]:
    """``argmin ||A x - y||`` (numpy's ``lstsq``); an all-zero column of ``A`` gets coefficient 0."""
    a = np.asarray(rows, dtype=float)
    used = np.flatnonzero(np.any(a != 0, axis=0))
    x, _, rank, _ = np.linalg.lstsq(a[:, used], np.asarray(y, dtype=float), rcond=None)
    if rank < len(used):
        raise ValueError("calibration samples do not determine the fit (too few distinct shapes)")
    out = np.zeros(a.shape[1])
    out[used] = x
    return out.tolist()

"""What one simulation is configured with and what it measured: :class:`SimConfig`, :class:`SimResult`.

:meth:`SimResult.record` is the JSON record ``paged-edu simulate --json`` writes (its fields are a
contract). Plain Python and numpy, no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from paged_edu.core.validation import choice, fraction, integer
from paged_edu.sim.managers import MANAGERS
from paged_edu.sim.arrivals import L_MAX

__all__ = ["RequestRecord", "SimConfig", "SimResult"]


@dataclass(slots=True)
class SimConfig:
    """One simulated server: a memory manager, a pool size, and the scheduler's knobs."""

    manager: str = "paged"
    block_size: int = 16
    num_kv_slots: int | None = None  # None: what the cost model's GPU holds after the weights
    gpu_memory_utilization: float = 0.9
    max_seq_len: int = L_MAX
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"
    num_cpu_blocks: int = 0
    policy: str = "fcfs"  # admission order: "fcfs" or "lpm" (paged_edu.sched.policy)
    sample_every: int = 4  # steps between memory snapshots

    def __post_init__(self) -> None:
        # The settings of the simulation and of its memory manager; the pool (num_kv_slots) and the
        # scheduler's settings are checked once when simulate builds the server (sim.simulator.prepare).
        choice("manager", self.manager, MANAGERS)
        self.block_size = integer("block_size", self.block_size, low=1)
        self.sample_every = integer("sample_every", self.sample_every, low=1)
        self.max_seq_len = integer("max_seq_len", self.max_seq_len, low=1)
        if self.num_kv_slots is None:
            fraction("gpu_memory_utilization", self.gpu_memory_utilization)

    @property
    def label(self) -> str:
        label = self.manager if self.manager.startswith("contiguous") else f"{self.manager} B={self.block_size}"
        return label if self.policy == "fcfs" else f"{label} {self.policy}"


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request (its samples together)."""

    arrival_time: float
    prompt_len: int
    output_len: int
    num_samples: int
    first_token_time: float
    finish_time: float
    num_preemptions: int
    stored_tokens: list[int]  # per sample, K/V slots written by the end
    held_slots: list[int]  # per sample, slots it held at the end

    @property
    def ttft(self) -> float:
        return self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float:
        return self.finish_time - self.arrival_time

    @property
    def normalized_latency(self) -> float:
        """End-to-end latency per output token (the paper's s/token)."""
        return self.latency / self.output_len


@dataclass(slots=True)
class SimResult:
    """Everything one simulation measured; :meth:`record` is the JSON line."""

    config: SimConfig
    num_kv_slots: int
    requests: list[RequestRecord]
    makespan_s: float
    num_steps: int
    num_output_tokens: int
    max_concurrent: int
    mean_batched: float
    preemptions: int
    prefix_hit_rate: float
    fragmentation_refusals: int  # sequences refused at least once although enough slots were free
    breakdown: dict[str, float]  # slot-steps per category (idle included)
    kv_utilization: float
    sharing_saving: float
    sim_wall_s: float
    assumptions: dict = field(default_factory=dict)
    live_lengths_mean: float = 0.0  # mean stored tokens of a live sequence over snapshots
    prefix_hit_rate_per_salt: dict[str, float] = field(default_factory=dict)  # salted runs: each tenant's hits
    preempted_hit_rate: float = 0.0  # re-admissions of recomputed sequences: their own blocks hit again, apart
    hit_rate_counting_readmissions: float = 0.0  # both together: what a counter blind to preemption reports

    @property
    def kv_utilization_final(self) -> float:
        stored = sum(sum(r.stored_tokens) for r in self.requests)
        held = sum(sum(r.held_slots) for r in self.requests)
        return stored / held if held else 0.0

    def breakdown_fractions(self) -> dict[str, float]:
        """The paper's Fig. 2: shares of the memory that was allocated or wanted (idle left out)."""
        keys = ("token_states", "reserved", "internal_frag", "external_frag", "other")
        total = sum(self.breakdown[k] for k in keys)
        return {k: (self.breakdown[k] / total if total else 0.0) for k in keys}

    def record(self) -> dict:
        ttft = [r.ttft for r in self.requests]
        norm = [r.normalized_latency for r in self.requests]
        paged = not self.config.manager.startswith("contiguous")
        return {
            "manager": self.config.manager,
            "block_size": self.config.block_size if paged else None,
            "policy": self.config.policy,
            "num_kv_slots": self.num_kv_slots,
            "num_requests": len(self.requests),
            "kv_utilization": self.kv_utilization,
            "kv_utilization_final": self.kv_utilization_final,
            "max_concurrent": self.max_concurrent,
            "mean_batched": self.mean_batched,
            "throughput_tokens_per_s": self.num_output_tokens / self.makespan_s if self.makespan_s else 0.0,
            "throughput_requests_per_s": len(self.requests) / self.makespan_s if self.makespan_s else 0.0,
            "ttft_p50_s": _percentile(ttft, 50),
            "ttft_p99_s": _percentile(ttft, 99),
            "norm_latency_p50_s": _percentile(norm, 50),
            "norm_latency_p99_s": _percentile(norm, 99),
            "norm_latency_mean_s": sum(norm) / len(norm) if norm else 0.0,
            "preemptions": self.preemptions,
            "prefix_hit_rate": self.prefix_hit_rate,
            "preempted_hit_rate": self.preempted_hit_rate,
            "fragmentation_refusals": self.fragmentation_refusals,
            "sharing_saving": self.sharing_saving,
            "memory_breakdown": self.breakdown_fractions(),
            "makespan_s": self.makespan_s,
            "num_steps": self.num_steps,
            "num_output_tokens": self.num_output_tokens,
            "sim_wall_s": self.sim_wall_s,
            "config": asdict(self.config),
            "cost_model": self.assumptions,
            **(
                {"prefix_hit_rate_per_salt": dict(self.prefix_hit_rate_per_salt)}
                if self.prefix_hit_rate_per_salt
                else {}
            ),
        }


def _percentile(values: list[float], q: float) -> float:
    """numpy's linear-interpolation percentile; NaN for no values."""
    return float(np.percentile(values, q)) if values else float("nan")

"""The paged kernel's cost per KV block, fitted from the stored GPU kernel benchmark.

The roofline in :mod:`paged_edu.sim.costmodel` charges attention only for the bytes it reads, so a
block size of 8 costs the same as 128. The paper's Fig. 18 shows small blocks are slower: the
kernel does a block-table lookup, a short tile and a softmax rescale per block. ``CostModel`` has a
``per_block_s`` term for that (off by default); this module fits it from the decode kernel's
measured times in ``paged_edu/data/kernel_bench.json`` / ``kernel_sweep.json`` (our Triton kernel on the
H200, bf16, B = 16, 32 q / 8 KV heads x 128, CUDA-graph replay, L2 flushed)::

    t_kernel - t_read = a + per_block_s * (num_seqs * ceil(seq_len / B) * num_kv_heads)

where ``t_read = ceiling_us / 2`` is the time to *read* the K/V bytes at the measured copy ceiling
(the copy reads and writes them). The benchmark has one block size only, so any shortfall of the
kernel from the ceiling that grows with the bytes is counted as per-block cost too: the fitted
value is an upper bound on the true per-block cost, measured on the H200, not on the paper's A100.
Plain Python and numpy, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["BlockCostFit", "fit_per_block_cost"]


@dataclass(frozen=True, slots=True)
class BlockCostFit:
    """``per_block_s`` (seconds per block x layer x KV head), the fixed part, and the points fitted."""

    per_block_s: float
    fixed_s: float
    points: list[tuple[str, int, float]]  # (case, head-blocks walked, excess seconds)
    source: str

    def describe(self) -> str:
        return (
            f"per-block kernel cost {self.per_block_s * 1e9:.3f} ns per block x KV head "
            f"(+ {self.fixed_s * 1e6:.1f} us per launch), least squares over {len(self.points)} "
            f"cases of {self.source}"
        )


def fit_per_block_cost(*benches: dict, impl: str = "triton") -> BlockCostFit:
    """Fit ``per_block_s`` from kernel benchmark records (``bench_kernels.py``'s JSON), pooled."""
    points = []
    for bench in benches:
        points += _excess_points(bench, impl)
    if len(points) < 2:
        raise ValueError(f"fit_per_block_cost needs at least 2 cases with impl {impl!r}, got {len(points)}")
    a = np.array([[1.0, b] for _, b, _ in points])
    (fixed, per_block), *_ = np.linalg.lstsq(a, np.array([e for *_, e in points]), rcond=None)
    source = "; ".join(
        f"{b.get('command', '?')} on {b.get('device', '?')} (B = {b['geometry']['block_size']})" for b in benches
    )
    return BlockCostFit(max(float(per_block), 0.0), float(fixed), points, source)


def _excess_points(bench: dict, impl: str) -> list[tuple[str, int, float]]:
    geometry = bench["geometry"]
    block_size, kv_heads = geometry["block_size"], geometry["num_kv_heads"]
    points = []
    for case in bench["cases"]:
        if impl not in case["impls"]:
            continue
        blocks = case["num_seqs"] * math.ceil(case["seq_len"] / block_size) * kv_heads
        excess = (case["impls"][impl]["us"] - case["ceiling_us"] / 2) * 1e-6
        points.append((case["case"], blocks, excess))
    return points

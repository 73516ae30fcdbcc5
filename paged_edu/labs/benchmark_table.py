"""Lesson 7: the seed's empty "Empirical Benchmark Evaluation" table, filled by the simulator.

The paper's set-up (Kwon et al., SOSP 2023, §6.1): OPT-13B on one A100-40GB, ShareGPT- and
Alpaca-like request lengths, Poisson arrivals. Every number the lesson prints comes from here:
:func:`paper_cost_model` (the roofline, with the per-block kernel cost fitted from the stored H200
kernel benchmark), :func:`benchmark_table` (one row per memory manager and block size),
:func:`p99_ttft_crossing` (the rate where p99 TTFT passes a bound) and :func:`batch_ratio_formula`
(the seed's paged/contiguous batch-size ratio). Plain Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from paged_edu.sim import workloads
from paged_edu import data
from paged_edu.sim.block_cost import fit_per_block_cost
from paged_edu.sim.compare import compare, default_configs
from paged_edu.core.hardware import GPUS, MODELS
from paged_edu.sim.costmodel import CostModel
from paged_edu.sim.results import SimConfig, SimResult
from paged_edu.sim.simulator import simulate
from paged_edu.sim.arrivals import L_MAX

__all__ = [
    "TABLE_ROWS",
    "batch_ratio_formula",
    "benchmark_table",
    "contiguous_max_utilization",
    "final_lengths",
    "kernel_block_fit",
    "markdown_table",
    "p99_ttft_crossing",
    "paper_cost_model",
    "simulated_batch_ratio",
    "table_rows",
    "workload",
    "block_size_sweep",
    "paper_comparison",
    "PAPER",
]

KERNEL_BENCHES = ("kernel_bench.json", "kernel_sweep.json")

# The table's columns: (header, SimResult.record() key, format).
TABLE_ROWS = (
    ("throughput (tok/s)", "throughput_tokens_per_s", "{:,.0f}"),
    ("memory efficiency", "kv_utilization", "{:.1%}"),
    ("TTFT p50 (s)", "ttft_p50_s", "{:.3f}"),
    ("TTFT p99 (s)", "ttft_p99_s", "{:.3f}"),
    ("time per output token p50 (s)", "norm_latency_p50_s", "{:.4f}"),
    ("preemptions", "preemptions", "{}"),
)


@lru_cache(maxsize=1)
def kernel_block_fit():
    """The per-block cost fitted from the stored H200 kernel benchmarks (see :mod:`paged_edu.sim.block_cost`)."""
    benches = [data.load_json(name) for name in KERNEL_BENCHES]
    return fit_per_block_cost(*benches)


def paper_cost_model(gpu: str = "a100-40gb", model: str = "opt-13b", per_block: bool = True) -> CostModel:
    """The roofline for the paper's set-up; ``per_block`` adds the fitted per-block kernel cost."""
    if gpu not in GPUS:
        raise ValueError(f"gpu must be one of {sorted(GPUS)}, got {gpu!r}")
    if model not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {model!r}")
    cost = CostModel(model=MODELS[model], gpu=GPUS[gpu])
    return replace(cost, per_block_s=kernel_block_fit().per_block_s) if per_block else cost


def workload(dataset: str, num_requests: int, rate: float, seed: int = 0):
    """ShareGPT- or Alpaca-like requests (stated length distributions, :mod:`paged_edu.sim.workloads`)."""
    if dataset not in ("sharegpt", "alpaca"):
        raise ValueError(f"dataset must be 'sharegpt' or 'alpaca', got {dataset!r}")
    return workloads.make_workload(dataset, num_requests, rate, seed)


def benchmark_table(
    dataset: str = "sharegpt",
    num_requests: int = 300,
    rate: float = 3.0,
    seed: int = 0,
    cost: CostModel | None = None,
    block_sizes=(8, 16, 32, 64, 128),
) -> list[SimResult]:
    """Every manager (contiguous max / pow2 / oracle; paged and paged + prefix caching per block size)."""
    cost = cost or paper_cost_model()
    return compare(workload(dataset, num_requests, rate, seed), default_configs(block_sizes), cost)


def table_rows(results: list[SimResult]) -> list[dict]:
    """The filled table as plain rows: ``{"configuration": label, header: formatted cell, ...}``."""
    rows = []
    for res in results:
        rec = res.record()
        row = {"configuration": res.config.label}
        row.update({header: fmt.format(rec[key]) for header, key, fmt in TABLE_ROWS})
        rows.append(row)
    return rows


def markdown_table(results: list[SimResult]) -> str:
    rows = table_rows(results)
    headers = list(rows[0])
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row[h] for h in headers) + " |" for row in rows]
    return "\n".join(lines)


def contiguous_max_utilization(lengths, max_seq_len: int = L_MAX) -> float:
    """KV slots holding tokens when every request reserves ``L_max``: ``sum s / (n L_max)`` (mean eta_naive)."""
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths must not be empty")
    return sum(lengths) / (len(lengths) * max_seq_len)


def final_lengths(requests) -> list[int]:
    """Tokens each request stores at its end: prompt + output."""
    return [r.prompt_len + r.output_len for r in requests]


def batch_ratio_formula(lengths, block_size: int = 16, max_seq_len: int = L_MAX) -> float:
    """The seed's ratio: requests that fit paged / contiguous = ``L_max / mean(ceil(s/B) B)``."""
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths must not be empty")
    mean_paged = sum(math.ceil(s / block_size) * block_size for s in lengths) / len(lengths)
    return max_seq_len / mean_paged


def simulated_batch_ratio(requests, cost: CostModel, block_size: int = 16) -> float:
    """``mean_batched`` paged / contiguous-max, all requests at t = 0 (the simulation's answer)."""
    paged = simulate(requests, SimConfig(manager="paged", block_size=block_size), cost)
    contiguous = simulate(requests, SimConfig(manager="contiguous-max"), cost)
    return paged.mean_batched / contiguous.mean_batched


def p99_ttft_crossing(
    dataset: str,
    rates,
    num_requests: int = 200,
    seed: int = 0,
    bound_s: float = 1.0,
    managers=("paged", "contiguous-max"),
    cost: CostModel | None = None,
) -> dict:
    """The lowest rate in ``rates`` at which p99 TTFT exceeds ``bound_s``, per manager (None: never)."""
    cost = cost or paper_cost_model()
    out = {}
    for manager in managers:
        out[manager] = None
        for rate in sorted(rates):
            rec = simulate(workload(dataset, num_requests, rate, seed), SimConfig(manager=manager), cost).record()
            if rec["ttft_p99_s"] > bound_s:
                out[manager] = rate
                break
    return out


def block_size_sweep(
    dataset: str = "alpaca",
    num_requests: int = 300,
    rate: float = math.inf,
    seed: int = 0,
    gpu: str = "a100-40gb",
    block_sizes=(8, 16, 32, 64, 128),
    per_block_s: float | None = None,
) -> list[dict]:
    """Fig. 18: per block size, the mean normalised latency with the per-block kernel cost off and on.

    ``per_block_s``: the cost to use when on (default: the fit from the stored H200 kernel benchmark).
    """
    off = paper_cost_model(gpu, per_block=False)
    on = replace(off, per_block_s=kernel_block_fit().per_block_s if per_block_s is None else per_block_s)
    requests = workload(dataset, num_requests, rate, seed)
    rows = []
    for b in block_sizes:
        config = SimConfig(manager="paged", block_size=b)
        r_off, r_on = simulate(requests, config, off).record(), simulate(requests, config, on).record()
        rows.append(
            {
                "block_size": b,
                "latency_off_s": r_off["norm_latency_mean_s"],
                "latency_on_s": r_on["norm_latency_mean_s"],
                "tok_s_off": r_off["throughput_tokens_per_s"],
                "tok_s_on": r_on["throughput_tokens_per_s"],
                "kv_utilization": r_on["kv_utilization"],
                "per_block_s": on.per_block_s,
            }
        )
    return rows


# The paper's numbers (Kwon et al., SOSP 2023, OPT-13B on an A100-40GB), as docs/benchmarks.md lists them.
# Fig. 13a is measured at 2 req/s ("Average number of batched requests when serving OPT-13B for the
# ShareGPT (2 reqs/s) and Alpaca (30 reqs/s) traces", the figure's caption).
FIG13A_RATE = 2.0
PAPER = {
    "Fig. 2 token states": {
        "contiguous-max": 0.204,
        "contiguous-pow2": 0.268,
        "contiguous-oracle": 0.382,
        "paged": 0.963,
    },
    "Fig. 13a mean batched (ShareGPT)": {
        "contiguous-max": 7.00,
        "contiguous-pow2": 9.81,
        "contiguous-oracle": 13.62,
        "paged": 30.42,
    },
}


def paper_values(saturated: list[SimResult], at_fig13a_rate: list[SimResult]) -> list[dict]:
    """Ours against the paper's Fig. 2 (from a saturated ShareGPT-like run) and Fig. 13a (from a run at
    :data:`FIG13A_RATE`, the paper's rate), B = 16 for paged: rows ``{quantity, manager, simulated, paper}``."""

    def by_manager(results):
        return {
            r.config.manager: r
            for r in results
            if r.config.manager in PAPER["Fig. 2 token states"]
            and (r.config.manager != "paged" or r.config.block_size == 16)
        }

    sat, at_rate = by_manager(saturated), by_manager(at_fig13a_rate)
    rows = [
        {
            "quantity": "Fig. 2 token states",
            "manager": m,
            "paper": p,
            "simulated": sat[m].breakdown_fractions()["token_states"],
        }
        for m, p in PAPER["Fig. 2 token states"].items()
        if m in sat
    ]
    rows += [
        {"quantity": "Fig. 13a mean batched", "manager": m, "paper": p, "simulated": at_rate[m].mean_batched}
        for m, p in PAPER["Fig. 13a mean batched (ShareGPT)"].items()
        if m in at_rate
    ]
    return rows


def paper_comparison(saturated: list[SimResult], at_fig13a_rate: list[SimResult]) -> str:
    """:func:`paper_values` as a markdown table."""
    lines = ["| quantity | manager | simulated | paper |", "|---|---|--:|--:|"]
    for r in paper_values(saturated, at_fig13a_rate):
        f = "{:.1%}" if r["quantity"].startswith("Fig. 2") else "{:.2f}"
        lines.append(f"| {r['quantity']} | {r['manager']} | {f.format(r['simulated'])} | {f.format(r['paper'])} |")
    return "\n".join(lines)

"""The simulations behind the serving simulator's paper figures (lesson 7, ``paged-edu figures-sim``):
the saturated ShareGPT-like load per memory manager (Figs. 2 and 13a), block sizes, latency against
request rate, and the memory saved by sharing (Fig. 15). :mod:`paged_edu.viz.sim_figures` draws them.
"""

from __future__ import annotations

import math

from paged_edu.sim import workloads
from paged_edu.sim.compare import compare, latency_vs_rate
from paged_edu.sim.costmodel import CostModel
from paged_edu.sim.results import SimConfig
from paged_edu.sim.simulator import simulate

__all__ = ["MAIN", "paper_figure_runs", "sharing_rows"]

MAIN = ("contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged")  # the paper's four managers


def sharing_rows(cost: CostModel, num_requests: int, seed: int, config: SimConfig) -> list[dict]:
    """Memory saved by sharing, parallel sampling and beam-style forking, n = 2, 4, 6 (Fig. 15).

    At a moderate load (40% of what paging sustains for single samples, divided by n): under memory
    pressure the scheduler preempts samples one by one, and a recomputed sample no longer shares its
    prompt's blocks. ``max_concurrent`` is the most sequences that ran at once (at most
    ``config.max_num_seqs``, beam branches included).
    """
    rows = []
    num = max(num_requests // 4, 50)
    for dataset in ("alpaca", "sharegpt"):
        single = simulate(workloads.make_workload(dataset, num, math.inf, seed), config, cost)
        capacity = single.record()["throughput_requests_per_s"]
        for fork in ("parallel", "beam"):
            for n in (2, 4, 6):
                rate = 0.4 * capacity / n
                res = simulate(workloads.parallel(num, rate, seed, n=n, fork=fork, dataset=dataset), config, cost)
                rows.append(
                    {
                        "dataset": dataset,
                        "fork": fork,
                        "n": n,
                        "rate": rate,
                        "saving": res.sharing_saving,
                        "mean_batched": res.mean_batched,
                        "max_concurrent": res.max_concurrent,
                        "preemptions": res.preemptions,
                    }
                )
    return rows


def paper_figure_runs(
    cost: CostModel | None = None,
    num_requests: int = 1000,
    seed: int = 0,
    server: dict | None = None,
    progress: bool = True,
) -> dict:
    """Every run the simulator's figures show: ``saturated`` and ``block_sizes`` (lists of results),
    ``latency_vs_rate`` (points), ``sharing`` (rows), and ``data``, the plain records of them all."""
    cost = cost or CostModel()
    server = {k: v for k, v in (server or {}).items() if v is not None}
    data: dict = {"cost_model": cost.assumptions(), "num_requests": num_requests, "seed": seed}

    def cfg(manager: str, block_size: int = 16) -> SimConfig:
        return SimConfig(manager=manager, block_size=block_size, **server)

    # 1. Saturated ShareGPT-like load (everything arrives at t=0): breakdown and batch sizes.
    offline = workloads.sharegpt(num_requests, math.inf, seed)
    main = compare(offline, [cfg(m) for m in MAIN], cost, progress=progress)
    data["saturated"] = [r.record() for r in main]

    # 2. Block sizes.
    sizes = compare(offline, [cfg("paged", b) for b in (8, 16, 32, 64, 128)], cost, progress=progress)
    data["block_sizes"] = [r.record() for r in sizes]

    # 3. Normalised latency vs rate, rates spread up to 1.2x what paging sustains.
    capacity = next(r for r in main if r.config.manager == "paged").record()["throughput_requests_per_s"]
    rates = [round(capacity * f, 3) for f in (0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0, 1.2)]
    points = latency_vs_rate(
        lambda rate: workloads.sharegpt(num_requests, rate, seed),
        rates,
        [cfg(m) for m in MAIN],
        cost,
        progress=progress,
    )
    data["latency_vs_rate"] = points

    # 4. Sharing: parallel sampling and beam-style forking.
    rows = sharing_rows(cost, num_requests, seed, cfg("paged"))
    data["sharing"] = rows
    return {"saturated": main, "block_sizes": sizes, "latency_vs_rate": points, "sharing": rows, "data": data}

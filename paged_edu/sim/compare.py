"""Many simulations side by side: every manager and block size, the results table, rate sweeps.

Plain Python, no torch.
"""

from __future__ import annotations

import contextlib

from paged_edu.core.validation import FieldTypeError, FieldValueError
from paged_edu.sim.costmodel import CostModel
from paged_edu.sim.managers import BLOCK_SIZES, DEFAULT_MANAGERS
from paged_edu.sim.results import SimConfig, SimResult
from paged_edu.sim.simulator import Server, prepare, simulate
from paged_edu.sim.request import Request

__all__ = ["compare", "default_configs", "format_table", "latency_vs_rate", "prepare_all"]


def default_configs(block_sizes=BLOCK_SIZES, managers=DEFAULT_MANAGERS, **kwargs) -> list[SimConfig]:
    """One config per (manager, block size): contiguous managers once, paged ones per ``B``."""
    configs = []
    for name in managers:
        if name.startswith("contiguous"):
            configs.append(SimConfig(manager=name, **kwargs))
        else:
            configs.extend(SimConfig(manager=name, block_size=b, **kwargs) for b in block_sizes)
    return configs


@contextlib.contextmanager
def _progress_bar(show: bool, total: int, unit: str, desc: str):
    """A tqdm bar while the ``with`` body runs, closed however it ends; ``None`` when not ``show``."""
    if not show:
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit=unit, desc=desc, leave=False)
    try:
        yield bar
    finally:
        bar.close()


def prepare_all(requests: list[Request], configs: list[SimConfig], cost_model: CostModel | None = None) -> list[Server]:
    """Every config's server, built and checked before any runs (:func:`~paged_edu.sim.simulator.prepare`).

    A server that cannot serve the requests raises the ``FieldValueError`` / ``FieldTypeError`` of
    ``prepare``, its ``.field`` kept and its message prefixed with the config's label."""
    cost_model = cost_model or CostModel()
    servers = []
    for config in configs:
        try:
            servers.append(prepare(requests, config, cost_model))
        except (FieldTypeError, FieldValueError) as exc:
            raise type(exc)(exc.field, f"{config.label}: {exc}") from None
    return servers


def compare(
    requests: list[Request],
    configs: list[SimConfig] | None = None,
    cost_model: CostModel | None = None,
    progress: bool = False,
    *,
    servers: list[Server] | None = None,
) -> list[SimResult]:
    """Simulate the same requests under every config (default: every manager and block size).

    Every server is built and checked first (:func:`prepare_all`; or pass ``servers`` it built),
    so a config that cannot serve the requests is refused before any simulation runs."""
    if servers is None:
        servers = prepare_all(requests, configs if configs is not None else default_configs(), cost_model)
    results = []
    with _progress_bar(progress, len(servers) * len(requests), "req", "simulating") as bar:
        for server in servers:
            if bar is not None:
                bar.set_postfix_str(server.config.label)
            progress_of = bar.update if bar is not None else None
            results.append(simulate(requests, progress=progress_of, server=server))
    return results


TABLE_COLUMNS = (
    # (header, record key, format)
    ("manager", "label", "{}"),
    ("KV util", "kv_utilization", "{:.1%}"),
    ("util@end", "kv_utilization_final", "{:.1%}"),
    ("peak seqs", "max_concurrent", "{}"),
    ("mean batch", "mean_batched", "{:.1f}"),
    ("tok/s", "throughput_tokens_per_s", "{:,.0f}"),
    ("req/s", "throughput_requests_per_s", "{:.2f}"),
    ("TTFT p50", "ttft_p50_s", "{:.3f}"),
    ("TTFT p99", "ttft_p99_s", "{:.3f}"),
    ("s/tok p50", "norm_latency_p50_s", "{:.4f}"),
    ("s/tok p99", "norm_latency_p99_s", "{:.4f}"),
    ("preempt", "preemptions", "{}"),
    ("prefix hit", "prefix_hit_rate", "{:.1%}"),
    ("saved", "sharing_saving", "{:.1%}"),
)
BREAKDOWN_COLUMNS = (
    ("tokens", "token_states"),
    ("reserved", "reserved"),
    ("int.frag", "internal_frag"),
    ("ext.frag", "external_frag"),
    ("other", "other"),
)


def format_table(results: list[SimResult], markdown: bool = True) -> str:
    """The seed's missing table, one row per (manager, block size), plus the Fig. 2 breakdown."""
    headers = [c[0] for c in TABLE_COLUMNS] + [c[0] for c in BREAKDOWN_COLUMNS]
    rows = []
    for res in results:
        rec = res.record()
        rec["label"] = res.config.label
        row = [fmt.format(rec[key]) for _, key, fmt in TABLE_COLUMNS]
        row += [f"{rec['memory_breakdown'][key]:.1%}" for _, key in BREAKDOWN_COLUMNS]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells):
        body = " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return f"| {body} |" if markdown else body

    out = [line(headers)]
    if markdown:
        out.append("|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|")
    out += [line(r) for r in rows]
    return "\n".join(out)


def latency_vs_rate(
    build, rates, configs: list[SimConfig], cost_model: CostModel | None = None, progress: bool = False
) -> list[dict]:
    """Mean normalised latency (s/token) against request rate, one curve per config.

    ``build(rate)`` returns the requests for that rate (same seed, so only the arrivals change).
    Returns one dict per (config, rate) with the record's main numbers.
    """
    points = []
    with _progress_bar(progress, len(rates) * len(configs), "run", "rate sweep") as bar:
        for rate in rates:
            requests = build(rate)
            for config in configs:
                rec = simulate(requests, config, cost_model).record()
                points.append(
                    {
                        "label": config.label,
                        "manager": config.manager,
                        "block_size": rec["block_size"],
                        "rate": rate,
                        "norm_latency_mean_s": rec["norm_latency_mean_s"],
                        "norm_latency_p50_s": rec["norm_latency_p50_s"],
                        "ttft_p50_s": rec["ttft_p50_s"],
                        "throughput_requests_per_s": rec["throughput_requests_per_s"],
                        "mean_batched": rec["mean_batched"],
                        "kv_utilization": rec["kv_utilization"],
                    }
                )
                if bar is not None:
                    bar.update(1)
    return points

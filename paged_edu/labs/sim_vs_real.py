"""Lesson 7: the simulator against a real engine run on the same trace.

:func:`sim_vs_real` runs the real :class:`~paged_edu.engine.Engine` (on the CPU: the tiny 2-layer
Llama of :mod:`paged_edu.labs.engine_lab`; on a GPU the same code on the device) on two traces
drawn with different seeds: it fits the cost model to the engine's measured steps on the first
(:func:`fit_engine_steps`), then tests the fit on the second -- the engine serves it, and the
simulator serves the same requests with the same pool, block size and scheduler limits -- and puts
the two side by side: output tokens per second, TTFT and the number of preemptions. (A fit judged
on the trace it was fitted on would flatter itself.) :func:`h200_engine_calibration` does the fit on the stored H200 engine
benchmark (``paged_edu/data/engine_bench.json``), whose per-step records were summarised, not kept.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from paged_edu import data
from paged_edu.engine import Engine, RequestMetrics, SamplingParams, StepMetrics
from paged_edu.cache.sizing import dtype_name
from paged_edu.labs.card import roofline_card
from paged_edu.labs.batching import make_requests
from paged_edu.sim.costmodel import CostModel, StepShape
from paged_edu.sim.request import Request
from paged_edu.sim.results import SimConfig
from paged_edu.sim.simulator import simulate

__all__ = ["describe_fit", "error_table", "fit_engine_steps", "h200_engine_summary", "sim_vs_real"]


def _p(values, q):
    return float(np.percentile(values, q)) if values else float("nan")


def sim_vs_real(
    model,
    *,
    num_requests: int = 24,
    num_blocks: int = 24,
    block_size: int = 16,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 256,
    seed: int = 0,
    fit_seed: int | None = None,
    gpu: str | None = None,
) -> dict:
    """Fit the cost model on one trace, then compare engine and simulator on another (all at t = 0).

    The fit trace is drawn with ``fit_seed`` (default ``seed + 1``), the test trace with ``seed``;
    both have ``num_requests`` requests. Returns ``{"measured": {...}, "simulated": {...}, "cost":
    CostModel, ...}`` for the test trace; each side has ``tokens_per_s``, ``ttft_p50_s``,
    ``ttft_p99_s``, ``preemptions``, ``num_steps``, ``seconds``; ``step_rel_error_p50`` is the fit's
    median per-step error on the test trace's steps. ``gpu`` only names the roofline whose FLOP term
    is fitted (None: the card the model runs on, :func:`~paged_edu.labs.card.this_card`; the H200's on a CPU) (:func:`describe_fit` states the fit without it).
    """
    fit_seed = seed + 1 if fit_seed is None else fit_seed
    if fit_seed == seed:
        raise ValueError(f"fit_seed={fit_seed} equals seed: the fit must be tested on another trace")

    def trace(s):
        return make_requests(
            num_requests, seed=s, vocab_size=model.config.vocab_size, prompt_len=(8, 96), output_len=(8, 64)
        )

    def new_engine():
        return Engine(
            model,
            num_blocks=num_blocks,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )

    def serve(requests):
        prompts, params = [p for p, _ in requests], [SamplingParams(max_tokens=n) for _, n in requests]
        with new_engine() as engine:
            steps: list[StepMetrics] = []
            finished: list[RequestMetrics] = []
            engine.subscribe(lambda e: (steps if isinstance(e, StepMetrics) else finished).append(e))
            engine.run(prompts, params)
            return steps, finished

    fit_requests, requests = trace(fit_seed), trace(seed)
    if model.device.type != "cpu":
        # On a GPU the first steps of a process compile the Triton kernels for each new shape: seconds
        # that would swamp the fit, or the measured run. One untimed run of each trace compiles them
        # (a shape only the test trace has would otherwise compile inside its timed steps).
        serve(fit_requests)
        serve(requests)
    fit_steps, _ = serve(fit_requests)
    base = CostModel(model=model.config.geometry(dtype_name(model.dtype)), gpu=roofline_card(gpu, model.device).gpu)
    cost = fit_engine_steps(base, fit_steps)

    steps, finished = serve(requests)
    seconds = sum(s.duration for s in steps)
    out_tokens = sum(r.num_output_tokens for r in finished)
    t0 = min(r.arrival_time for r in finished)
    measured = {
        "tokens_per_s": out_tokens / seconds,
        "ttft_p50_s": _p([r.first_token_time - t0 for r in finished], 50),
        "ttft_p99_s": _p([r.first_token_time - t0 for r in finished], 99),
        "preemptions": steps[-1].num_preemptions,
        "num_steps": len(steps),
        "seconds": seconds,
    }
    sim_trace = [Request(0.0, len(p), n, prompt=list(p)) for p, n in requests]
    config = SimConfig(
        manager="paged",
        block_size=block_size,
        num_kv_slots=num_blocks * block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    rec = simulate(sim_trace, config, cost).record()
    simulated = {
        "tokens_per_s": rec["throughput_tokens_per_s"],
        "ttft_p50_s": rec["ttft_p50_s"],
        "ttft_p99_s": rec["ttft_p99_s"],
        "preemptions": rec["preemptions"],
        "num_steps": rec["num_steps"],
        "seconds": rec["makespan_s"],
    }
    durations = [s.duration for s in steps]
    predicted = [cost.step_time(StepShape.from_step_metrics(s)) for s in steps]
    return {
        "measured": measured,
        "simulated": simulated,
        "cost": cost,
        "num_requests": num_requests,
        "seed": seed,
        "fit_seed": fit_seed,
        "fit_steps": len(fit_steps),
        "step_rel_error_p50": _p([abs(p - d) / d for p, d in zip(predicted, durations)], 50),
        "step_durations": durations,
        "step_predicted": predicted,
        "step_batched_tokens": [s.num_batched_tokens for s in steps],
    }


def describe_fit(cost: CostModel) -> str:
    """The fitted step time in the terms that were fitted, on the machine that was measured: no GPU's
    peak and no efficiency against it (a CPU fit against an H200 roofline reads "x 0.00")."""
    flop_rate = cost.gpu.peak_flops * cost.compute_efficiency
    return (
        f"fitted step time: {cost.step_overhead_s * 1e3:.3f} ms + {cost.per_seq_overhead_s * 1e6:.1f} us per sequence "
        f"+ FLOPs / {flop_rate / 1e9:,.1f} GFLOP/s (the measured machine's effective rate)"
    )


def fit_engine_steps(base: CostModel, steps: list[StepMetrics]) -> CostModel:
    """Fit ``t = step_overhead + per_seq_overhead * seqs + FLOPs / (peak * compute_efficiency)`` to measured steps.

    A small model's step is launch- and Python-bound: the roofline's byte term is mostly the weights,
    the same every step, so it cannot be told apart from the fixed overhead (what
    :meth:`CostModel.calibrate` would try). Here the bytes are left at full bandwidth (negligible)
    and the per-sequence overhead is fitted instead. Least squares; negative terms clamped to 0.
    """
    if len(steps) < 3:
        raise ValueError(f"fit_engine_steps needs at least 3 measured steps, got {len(steps)}")
    shapes = [StepShape.from_step_metrics(s) for s in steps]
    a = np.array([[1.0, sh.num_seqs, base.flops(sh) / base.gpu.peak_flops] for sh in shapes])
    y = np.array([s.duration for s in steps])
    (overhead, per_seq, inv_c), *_ = np.linalg.lstsq(a, y, rcond=None)
    return replace(
        base,
        step_overhead_s=max(float(overhead), 0.0),
        per_seq_overhead_s=max(float(per_seq), 0.0),
        compute_efficiency=min(1.0, 1.0 / inv_c) if inv_c > 0 else 1.0,
        memory_efficiency=1.0,
    )


def error_table(result: dict) -> str:
    """Measured against simulated, with the relative error, as a markdown table."""
    lines = ["| | real engine | simulator | error |", "|---|--:|--:|--:|"]
    for key, fmt in (
        ("tokens_per_s", "{:,.0f}"),
        ("ttft_p50_s", "{:.4f}"),
        ("ttft_p99_s", "{:.4f}"),
        ("num_steps", "{}"),
        ("preemptions", "{}"),
        ("seconds", "{:.3f}"),
    ):
        m, s = result["measured"][key], result["simulated"][key]
        err = f"{(s - m) / m:+.1%}" if m else ("0" if s == m else f"{s - m:+}")
        lines.append(f"| {key} | {fmt.format(m)} | {fmt.format(s)} | {err} |")
    return "\n".join(lines)


def h200_engine_summary(name: str = "engine_bench.json") -> dict:
    """What a stored H200 engine benchmark (:mod:`paged_edu.data` ``name``) measured (SmolLM2-135M geometry,
    512 ShareGPT-like requests), with where it ran: the card, the commit, the date and the command."""
    bench = data.load_json(name)
    e = bench["engine"]
    out = {
        "device": bench["device_name"],
        "commit": bench.get("commit"),  # (None: a record written before benchmarks named their commit)
        "date_utc": bench.get("date_utc"),
        "command": bench.get("command"),
        "async_scheduling": bool(e.get("async_scheduling")),
        "mixed_graphs": bool(e.get("mixed_graphs")),
        "tokens_per_s": e["tokens_per_s"],
        "num_steps": e["num_steps"],
        "mean_decode_step_ms": e["mean_decode_step_ms"],
        "ttft_p50_s": e["ttft_p50"],
        "preemptions": e["num_preemptions"],
        "mean_concurrency": e["mean_concurrency"],
        "kv_tokens": bench["kv_budget"]["tokens"],
        "block_size": bench["kv_budget"]["block_size"],
        "num_requests": bench["workload"]["num_requests"],
    }
    # Later runs also split the decode step (host work / waiting for the GPU), give its
    # roofline, and ran transformers' continuous batching beside the engine.
    for key in (
        "roofline_decode_step_ms",
        "host_ms_per_decode_step",
        "device_wait_ms_per_decode_step",
        "mean_decode_phase_ms",
        "mean_mixed_step_ms",
        "num_mixed_steps",
        "share_of_steps_with_graph",
    ):
        if key in e:
            out[key] = e[key]
    for peer in ("transformers_cb_graphs", "transformers_cb_default"):
        if isinstance(bench.get(peer), dict) and "tokens_per_s" in bench[peer]:
            out[f"{peer}_tokens_per_s"] = bench[peer]["tokens_per_s"]
    return out

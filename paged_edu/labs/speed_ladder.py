"""The speed ladder: the engine's own speed story, one :class:`~paged_edu.engine.Engine` option per rung.

What you will learn
-------------------
Each rung adds one mechanism to the one before and serves the same requests (lesson 9):

1. ``eager`` -- every kernel launched from Python, per-token ops in PyTorch;
2. ``+ CUDA graphs`` -- a decode step is one graph replay: the launches are recorded once per
   batch size and replayed with one call (``cuda_graphs=True``);
3. ``+ fused kernels`` -- the per-token ops (norm + residual, rotary + store, SiLU x up) as Triton
   kernels: fewer kernels, fewer trips through HBM (``fused_impl="triton"``);
4. ``+ overlap`` -- the host schedules step N+1 while the device runs step N
   (``async_scheduling=True``): a step costs ``max(host, device)`` instead of their sum;
5. ``+ graphs for mixed steps`` -- steps with prompt chunks in graphs too, one full graph per token
   bucket, attention included (``mixed_graphs=True``, :mod:`paged_edu.engine.cuda_graphs`).

:func:`run_ladder` serves one workload on every rung that can run here (a warm-up run first, outside
the timed window, so that no Triton compile and no graph capture lands in it: the timed run of
:mod:`paged_edu.labs.timed_run`, which ``bench_engine`` makes too), with the engine's timeline recording
(:mod:`paged_edu.engine.timeline`), and returns one JSON-able record per rung: useful tokens/s, mean decode
and mixed step, the host / device split per step, the GPU's idle gap between decode steps, and each step
against the roofline of its exact chunks (:data:`~paged_edu.sim.costmodel.ROOFLINE_NAME`:
``CostModel.roofline()``, as ``bench_engine`` prices it).
On a CPU only ``eager`` runs (CUDA graphs and the Triton kernels need a GPU): the lesson shows the
stored H200 ladder (:func:`load_stored_ladder`) and runs that rung live to show the mechanism.
"""

from __future__ import annotations

import numpy as np
import torch

from paged_edu import data
from paged_edu.cache.sizing import dtype_name
from paged_edu.engine.config import setting_names
from paged_edu.engine.timeline import StepRecord, summarize_timeline
from paged_edu.labs.card import roofline_card
from paged_edu.labs.timed_run import roofline_model, roofline_s, step_speed, timed_run
from paged_edu.sim.costmodel import ROOFLINE_NAME

__all__ = [
    "RUNGS",
    "STORED_LADDER",
    "ladder_setup",
    "load_stored_ladder",
    "overlap_schedule",
    "run_ladder",
    "run_rung",
    "rung_blocker",
    "rung_table",
    "stored_decode_kernels",
    "stored_decode_split",
]

_EAGER = dict(cuda_graphs=False, fused_impl="torch")
_GRAPHS = dict(cuda_graphs=True, fused_impl="torch")
_FUSED = dict(cuda_graphs=True, fused_impl="triton")
_OVERLAP = dict(_FUSED, async_scheduling=True)
RUNGS: tuple[tuple[str, dict], ...] = (
    ("eager", _EAGER),
    ("+ CUDA graphs", _GRAPHS),
    ("+ fused kernels", _FUSED),
    ("+ overlap", _OVERLAP),
    ("+ graphs for mixed steps", dict(_OVERLAP, mixed_graphs=True)),
)
STORED_LADDER = "speed_ladder_h200.json"  # benchmarks/bench_ladder.py on the H200, in paged_edu.data


def ladder_setup(device: torch.device | str, num_requests: int, seed: int = 0) -> dict:
    """The ladder's model, requests and shared engine options on ``device``: on CUDA SmolLM2-135M's
    geometry with random bf16 weights, ShareGPT-like requests (:func:`~paged_edu.labs.batching.sharegpt_requests`),
    a pool of 8,192 blocks of 16, 256 running and 4,096 batched tokens at most (``bench_engine``'s pool and
    budget); on a CPU the 2-layer tiny model and requests a tenth as long. Returns ``model``, ``prompts``,
    ``outputs``, ``engine_kwargs`` and ``label``."""
    from paged_edu.labs.batching import sharegpt_requests
    from paged_edu.labs.engine_lab import tiny_model
    from paged_edu.models.config import smollm2_config
    from paged_edu.models.llama import PagedLlama
    from paged_edu.models.loaders import random_hf_llama

    device = torch.device(device)
    if device.type == "cuda":
        hf = random_hf_llama(smollm2_config(), seed=seed, dtype=torch.bfloat16, device=device, eos_token_id=None)
        model, scale, label = PagedLlama.from_hf(hf), 1.0, "SmolLM2-135M geometry, random bf16 weights"
        engine_kwargs = dict(num_blocks=8192, block_size=16, max_num_seqs=256, max_num_batched_tokens=4096)
    else:
        model, scale = tiny_model(seed=seed), 0.1
        label = "the tiny model (2 layers, hidden 64, random fp32 weights), requests a tenth as long"
        engine_kwargs = dict(num_blocks=1024, block_size=16, max_num_seqs=64, max_num_batched_tokens=512)
    prompts, outputs = sharegpt_requests(num_requests, seed, model.config.vocab_size, scale)
    return dict(model=model, prompts=prompts, outputs=outputs, engine_kwargs=engine_kwargs, label=label, scale=scale)


def rung_blocker(engine_kwargs: dict, device: torch.device | str) -> str | None:
    """Why a rung's ``Engine`` options cannot run here (None when they can)."""
    unknown = sorted(set(engine_kwargs) - set(setting_names()))
    if unknown:
        return f"this Engine has no option {', '.join(unknown)} yet"
    if torch.device(device).type != "cuda":
        if engine_kwargs.get("cuda_graphs"):
            return "CUDA graphs need a CUDA device"
        if engine_kwargs.get("fused_impl") == "triton":
            return "the fused Triton kernels need a CUDA device"
    return None


_SPLIT_KEYS = (  # what a rung's record takes from summarize_timeline
    "host_ms_per_decode_step",
    "device_ms_per_decode_step",
    "host_ms_per_mixed_step",
    "device_ms_per_mixed_step",
    "gpu_idle_between_decode_steps_ms_median",
    "forward_modes",
)


def run_rung(
    model,
    prompts: list[list[int]],
    max_tokens: list[int],
    rung_kwargs: dict,
    engine_kwargs: dict,
    *,
    gpu: str | None = None,
    window: int = 40,
    max_points: int = 400,
) -> dict:
    """Serve the requests twice on ``Engine(model, **engine_kwargs, **rung_kwargs)``: a warm-up run, then
    the timed run with the timeline recording (:func:`~paged_edu.labs.timed_run.timed_run`). Returns the
    rung's record (times in ms unless named _s): useful tokens/s, the mean decode and mixed step, host /
    device ms per step, the idle gaps, the roofline of the same steps on ``gpu`` (None: the card the model runs on,
    :func:`~paged_edu.labs.card.this_card`; the H200's on a CPU); ``steps``: per step (at
    most ``max_points``, evenly spaced) its kind, duration and roofline; ``window``: ``window`` consecutive
    steps' host and device intervals from the middle of the run (the timeline figure)."""
    run = timed_run(model, prompts, max_tokens, dict(engine_kwargs, **rung_kwargs), record_timeline=True)
    records: list[StepRecord] = run.engine.timeline
    run.release()  # the next rung builds its own engine: one pool at a time
    cost = roofline_model(model.config.geometry(dtype_name(model.dtype)), gpu, model.device)
    roof, dur, decode = roofline_s(run.steps, cost), run.durations, run.decode
    speed, split = step_speed(run, cost), summarize_timeline(records)
    picks = np.unique(np.linspace(0, len(run.steps) - 1, min(max_points, len(run.steps))).astype(int))
    mid = max(0, len(records) // 2 - window // 2)
    return dict(
        engine_kwargs=rung_kwargs,
        useful_tokens=run.useful_tokens,
        wall_s=run.seconds,
        tokens_per_s=run.tokens_per_s,
        num_steps=len(run.steps),
        **{k: speed[k] for k in ("num_decode_steps", "num_mixed_steps", "mean_decode_step_ms", "mean_mixed_step_ms")},
        **{k: split[k] for k in _SPLIT_KEYS},
        roofline=ROOFLINE_NAME,
        roofline_gpu=cost.gpu.name,
        roofline_spec=roofline_card(gpu, model.device).spec,  # "table": the card's own row; "assumed" on a CPU
        roofline_run_s=float(roof.sum()),  # (not rounded: a CPU rung's roofline is a few ms)
        roofline_tokens_per_s=run.useful_tokens / float(roof.sum()),
        roofline_decode_step_ms=speed["roofline_decode_step_ms"],
        roofline_mixed_step_ms=speed["roofline_mixed_step_ms"],
        steps=dict(
            step=picks.tolist(),
            decode=decode[picks].tolist(),
            duration_ms=[round(1e3 * x, 4) for x in dur[picks]],
            roofline_ms=[round(1e3 * x, 5) for x in roof[picks]],
        ),
        window=[
            dict(
                step=r.step,
                decode=r.is_decode,
                host_ms=[round(1e3 * r.host_start_s, 4), round(1e3 * r.host_end_s, 4)],
                device_ms=[round(1e3 * r.device_start_s, 4), round(1e3 * r.device_end_s, 4)],
            )
            for r in records[mid : mid + window]
        ],
    )


def run_ladder(
    model,
    prompts: list[list[int]],
    max_tokens: list[int],
    engine_kwargs: dict,
    *,
    rungs=RUNGS,
    log=None,
    **rung_options,
) -> list[dict]:
    """Every rung in order on the same requests: :func:`run_rung`'s record, or for a rung that cannot run
    here ``{"rung", "engine_kwargs", "skipped": reason}``. ``engine_kwargs``: the options every rung
    shares (``num_blocks``, ``block_size``, ``max_num_seqs`` ...); ``rung_options``: :func:`run_rung`'s."""
    out = []
    for name, kwargs in rungs:
        blocker = rung_blocker(kwargs, model.device)
        if blocker is not None:
            out.append(dict(rung=name, engine_kwargs=kwargs, skipped=blocker))
        else:
            out.append(dict(rung=name, **run_rung(model, prompts, max_tokens, kwargs, engine_kwargs, **rung_options)))
        if log is not None:
            r = out[-1]
            log(
                f"  {name}: skipped ({r['skipped']})"
                if "skipped" in r
                else f"  {name}: {r['tokens_per_s']:,.0f} tok/s, decode step {r['mean_decode_step_ms']} ms "
                f"(host {r['host_ms_per_decode_step']:.3f}, device {r['device_ms_per_decode_step']:.3f}), "
                f"{r['wall_s']:.2f} s"
            )
    return out


def rung_table(rungs: list[dict]) -> str:
    """A markdown table of the ladder: one row per rung."""
    fmt = lambda v, f="{:.3f}": "-" if v is None else f.format(v)  # noqa: E731
    lines = [
        "| rung | useful tok/s | decode step (ms) | host / device per decode step (ms) | device idle between "
        "decode steps, median (ms) | mixed step (ms) | roofline decode step (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rungs:
        if "skipped" in r:
            lines.append(f"| {r['rung']} | skipped: {r['skipped']} | | | | | |")
            continue
        lines.append(
            f"| {r['rung']} | {r['tokens_per_s']:,.0f} | {fmt(r['mean_decode_step_ms'])} | "
            f"{fmt(r['host_ms_per_decode_step'])} / {fmt(r['device_ms_per_decode_step'])} | "
            f"{fmt(r['gpu_idle_between_decode_steps_ms_median'])} | {fmt(r['mean_mixed_step_ms'])} | "
            f"{fmt(r['roofline_decode_step_ms'], '{:.4f}')} |"
        )
    return "\n".join(lines)


def load_stored_ladder(name: str = STORED_LADDER) -> dict | None:
    """The stored ladder record (``benchmarks/bench_ladder.py`` on the H200) from :mod:`paged_edu.data`,
    or None when it has not been stored yet."""
    try:
        return data.load_json(name)
    except FileNotFoundError:
        return None


def stored_decode_split() -> dict:
    """The host / device split of a synchronous decode step measured on the H200, for lesson 9's
    "predict, then measure": the stored ladder's ``+ fused kernels`` rung (and its ``+ overlap`` rung's
    measured step), or -- until the ladder is stored with that rung -- ``engine_bench.json``'s engine run (CUDA graphs
    and fused kernels, synchronous; its device share is the host's wait for the tokens). Times in ms."""
    ladder = load_stored_ladder()
    by_name = {r["rung"]: r for r in ladder["rungs"] if "skipped" not in r} if ladder is not None else {}
    if "+ fused kernels" in by_name:  # (a ladder whose fused rung was skipped falls back too)
        fused, overlap = by_name["+ fused kernels"], by_name.get("+ overlap")
        return dict(
            source=f"{STORED_LADDER}, rung '+ fused kernels'",
            command=ladder["command"],
            commit=ladder["commit"],
            host_ms=fused["host_ms_per_decode_step"],
            device_ms=fused["device_ms_per_decode_step"],
            step_ms=fused["mean_decode_step_ms"],
            overlap_step_ms=overlap["mean_decode_step_ms"] if overlap else None,
        )
    bench = data.load_json("engine_bench.json")
    e = bench["engine"]
    return dict(
        source="engine_bench.json, the synchronous engine (CUDA graphs, fused kernels)",
        command=bench["command"],
        commit=bench.get("commit"),
        host_ms=e["host_ms_per_decode_step"],
        device_ms=e["device_wait_ms_per_decode_step"],
        step_ms=e["mean_decode_step_ms"],
        overlap_step_ms=None,
    )


def stored_decode_kernels(batch: int = 1) -> dict:
    """One decode step of SmolLM2-135M's geometry (context 512) on the H200, from ``layer_bench.json``
    (``benchmarks/bench_layer.py``, profiled graph replays): kernels per step and GPU-busy microseconds,
    per-token ops unfused (PyTorch) and fused (Triton), and the step's roofline; the skinny GEMM's row
    limit when it was measured (``skinny_max_rows``) and the profile's batches within it."""
    bench = data.load_json("layer_bench.json")
    row = next((r for r in bench["rows"] if r["batch"] == batch), None)
    if row is None:
        raise ValueError(f"layer_bench.json has batches {[r['batch'] for r in bench['rows']]}, not {batch}")
    return dict(
        batch=batch,
        context=row["context"],
        device=bench["device"],
        command=bench["command"],
        unfused_kernels=int(row["unfused_profile"]["kernels_per_step"]),
        unfused_busy_us=row["unfused_profile"]["gpu_busy_us"],
        fused_kernels=int(row["fused_profile"]["kernels_per_step"]),
        fused_busy_us=row["fused_profile"]["gpu_busy_us"],
        fused_us=row["fused_us"],
        roofline_us=row["roofline_us"],
        skinny_max_rows=bench["skinny_max_rows"],
        skinny_batches=[r["batch"] for r in bench["rows"] if r["batch"] <= bench["skinny_max_rows"]],
    )


def overlap_schedule(host_ms: float, device_ms: float, num_steps: int, overlap: bool) -> list[dict]:
    """When each of ``num_steps`` identical steps runs on the host and on the device (ms from 0).

    Synchronous: the host schedules, prepares and launches step k once step k-1's tokens are back,
    then the device runs it. Overlapped (the engine's ``async_scheduling``): the host launches step
    k+1 before it reads step k's tokens, so the host may run one step ahead, never two --
    ``host_start(k) = max(host_end(k-1), device_end(k-2))`` and ``device_start(k) = max(host_end(k),
    device_end(k-1))``. In steady state a step then costs ``max(host, device)`` instead of their sum.
    """
    if host_ms < 0 or device_ms < 0 or num_steps < 1:
        raise ValueError(f"need host_ms, device_ms >= 0 and num_steps >= 1, got {host_ms}, {device_ms}, {num_steps}")
    out: list[dict] = []
    for k in range(num_steps):
        prev_host_end = out[k - 1]["host"][1] if k else 0.0
        prev_dev_end = out[k - 1]["device"][1] if k else 0.0
        if overlap:
            h0 = max(prev_host_end, out[k - 2]["device"][1] if k >= 2 else 0.0)
        else:
            h0 = prev_dev_end
        d0 = max(h0 + host_ms, prev_dev_end)
        out.append(dict(step=k, host=(h0, h0 + host_ms), device=(d0, d0 + device_ms)))
    return out

"""A timed engine run: the one mechanism behind every engine speed this package reports.

What you will learn
-------------------
How to time an engine so that the number means the engine's steady state, and how to read it
against the roofline. ``benchmarks/bench_engine.py`` and the speed ladder of lesson 9
(:mod:`paged_edu.labs.speed_ladder`, ``benchmarks/bench_ladder.py``) both build on it:

1. **warm-up** -- :func:`timed_run` serves the requests once, untimed, on an engine built with the
   same options. The schedule does not depend on timing, so this run meets every shape the timed
   one meets: every Triton variant is compiled and every CUDA graph captured before the window;
2. **the timed window** -- a fresh engine serves the same requests between two device syncs, the
   heap frozen (:func:`~paged_edu.labs.timing.frozen_heap`, as vLLM does after warm-up). A
   subscriber keeps each step's :class:`~paged_edu.engine.StepMetrics` (one list append a step;
   with ``count_compiles_per_step`` also the count of Triton variants compiled so far), and
   :mod:`paged_edu.labs.timing`'s counters say what was still compiled or captured inside the window
   (``triton_variants_compiled_in_window``, ``graph_captures_in_window``: both 0 in a clean run);
3. **decode and mixed steps** -- a *decode* step computes no prompt token; a *mixed* step computes
   prompt chunks beside decodes (:attr:`TimedRun.decode`, :attr:`TimedRun.mixed`; a step of prompt
   chunks only is neither);
4. **the roofline of the same steps** -- :func:`roofline_s`: ``CostModel.roofline()`` on each step's
   exact chunks (:attr:`StepMetrics.shape <paged_edu.engine.StepMetrics.shape>`), what a perfect
   engine would need for them (:data:`~paged_edu.sim.costmodel.ROOFLINE_NAME`); :func:`step_speed`
   sets the measured steps beside it, with the host's share of each step;
5. **the timeline** (:mod:`paged_edu.engine.timeline`) -- host and device per step. Either the timed
   run records it (``timed_run(..., record_timeline=True)``, the ladder: its record is the timeline of
   the run it times) or :func:`timeline_run` serves the requests once more with it, outside the
   window (``bench_engine``: its timed run stays free of the recording's events).

One engine at a time: each run closes its engine before the next is built (``Engine.close()``), and
:func:`check_pool_fits` refuses, before anything starts, a pool the device cannot hold --
nano-vllm's workload needs a 30 GiB pool, and two of them do not fit an 80 GB card.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from paged_edu.cache.sizing import bytes_per_block, check_blocks_fit, format_gib
from paged_edu.core.hardware import GPU, GPUS
from paged_edu.engine import Engine, RequestOutput, SamplingParams, StepMetrics
from paged_edu.engine.timeline import summarize_timeline
from paged_edu.labs.card import roofline_card
from paged_edu.labs.timing import compiled_variant_counter, frozen_heap, graph_capture_counter
from paged_edu.sim.costmodel import ROOFLINE_NAME, CostModel

__all__ = [
    "CONCURRENCY_BUCKETS",
    "TimedRun",
    "by_concurrency",
    "check_pool_fits",
    "mean_ms",
    "near_running",
    "roofline_model",
    "roofline_s",
    "step_speed",
    "timed_run",
    "timeline_run",
]


@dataclass(slots=True)
class TimedRun:
    """The timed run of :func:`timed_run`: its engine, outputs, steps and wall time."""

    engine: Engine  # the timed run's engine (its timeline, when it recorded one)
    outputs: list[RequestOutput]
    steps: list[StepMetrics]  # every step that scheduled tokens, in order
    seconds: float  # the timed run's wall time, between two device syncs
    warmup_seconds: float  # the untimed warm-up run's
    triton_variants_compiled_in_window: int
    graph_captures_in_window: int  # (paged_edu captures its graphs when the engine is built: before the window)
    # (steps,) bool: the step compiled a Triton variant not seen before; None unless count_compiles_per_step
    compiled: np.ndarray | None

    @property
    def useful_tokens(self) -> int:
        """Output tokens generated (every sample of every request)."""
        return sum(len(o.outputs[0]) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.useful_tokens / self.seconds

    @property
    def durations(self) -> np.ndarray:
        """(steps,) each step's wall time, seconds."""
        return np.array([m.duration for m in self.steps])

    @property
    def decode(self) -> np.ndarray:
        """(steps,) bool: a decode step (no prompt token)."""
        return np.array([m.num_prefill_tokens == 0 for m in self.steps], dtype=bool)

    @property
    def mixed(self) -> np.ndarray:
        """(steps,) bool: a mixed step (prompt chunks beside decodes)."""
        return np.array([m.num_prefill_tokens > 0 and m.num_decode_seqs > 0 for m in self.steps], dtype=bool)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_pool_fits(model, num_blocks: int, block_size: int) -> int:
    """Refuse, before a run starts, a KV pool the device cannot hold now: a ``ValueError`` naming the
    pool it needs (blocks, bytes a block, GiB) and what the device has free. Returns the pool's bytes.

    One pool at a time: :func:`timed_run` and :func:`timeline_run` close each engine before the next,
    so a run fits when one pool does, beside the weights already loaded."""
    c = model.config
    block_bytes = bytes_per_block(c.num_layers, block_size, c.num_kv_heads, c.head_dim, model.dtype)
    try:
        check_blocks_fit("num_blocks", num_blocks, block_bytes, model.device)
    except ValueError as exc:
        raise ValueError(
            f"this run cannot fit: its KV pool needs {num_blocks:,} blocks of {block_size} tokens x "
            f"{block_bytes:,} bytes = {num_blocks * block_bytes:,} bytes ({format_gib(num_blocks * block_bytes)}) "
            f"for one engine at a time ({exc})"
        ) from None
    return num_blocks * block_bytes


def _params(max_tokens: list[int], temperature: float) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=m, temperature=temperature) for m in max_tokens]


def timed_run(
    model,
    prompts: list[list[int]],
    max_tokens: list[int],
    engine_kwargs: dict,
    *,
    temperature: float = 0.0,
    record_timeline: bool = False,
    count_compiles_per_step: bool = False,
) -> TimedRun:
    """Serve the requests on ``Engine(model, **engine_kwargs)`` twice -- once untimed (the warm-up), then
    timed on a fresh engine -- and return the timed run.

    ``max_tokens``: each request's output length; ``temperature``: every request's (0: greedy);
    ``record_timeline``: the timed engine records its timeline (``Engine(record_timeline=True)``; its
    steps are checked against the step metrics); ``count_compiles_per_step``: the subscriber also counts
    the Triton variants compiled after each step (:attr:`TimedRun.compiled`), a sum over the kernels'
    caches each step -- leave it off where the window must hold nothing but the append.
    """
    device = model.device
    _sync(device)
    t = time.perf_counter()
    with Engine(model, **engine_kwargs) as warm:  # closed before the timed engine's pool is made
        warm.run(prompts, _params(max_tokens, temperature), use_tqdm=False)
    _sync(device)
    warmup_seconds = time.perf_counter() - t

    engine = Engine(model, **engine_kwargs, record_timeline=record_timeline)
    steps: list[StepMetrics] = []
    compiled_after: list[int] = []  # Triton variants compiled so far, after each step
    count_variants, count_graphs = compiled_variant_counter(), graph_capture_counter()
    # (async scheduling's last call schedules nothing: it only reads the last step's tokens)
    if count_compiles_per_step:

        def on_event(e):
            if isinstance(e, StepMetrics) and e.num_batched_tokens:
                steps.append(e)
                compiled_after.append(count_variants())
    else:

        def on_event(e):
            if isinstance(e, StepMetrics) and e.num_batched_tokens:
                steps.append(e)

    engine.subscribe(on_event)
    compiled_before, graphs_before = count_variants(), count_graphs()
    params = _params(max_tokens, temperature)
    with frozen_heap():
        _sync(device)
        t0 = time.perf_counter()
        outputs = engine.run(prompts, params, use_tqdm=False)
        _sync(device)
        seconds = time.perf_counter() - t0
    variants, graphs = count_variants() - compiled_before, count_graphs() - graphs_before

    if record_timeline and [r.step for r in engine.timeline] != [m.step for m in steps]:
        raise RuntimeError("the timeline and the step metrics disagree: a step is missing from one of them")
    compiled = np.diff(np.array([compiled_before] + compiled_after)) > 0 if count_compiles_per_step else None
    return TimedRun(engine, outputs, steps, seconds, warmup_seconds, variants, graphs, compiled)


def timeline_run(
    model,
    prompts: list[list[int]],
    max_tokens: list[int],
    engine_kwargs: dict,
    timed_tokens_per_s: float,
    *,
    temperature: float = 0.0,
) -> dict:
    """Serve the requests once more on ``Engine(model, **engine_kwargs, record_timeline=True)``, after a
    :func:`timed_run` and outside its window: :func:`~paged_edu.engine.timeline.summarize_timeline`'s
    per-step split (host busy ms and device ms per decode step, the median GPU idle gap between
    consecutive decode steps), and this run's tok/s beside the timed run's
    (``tokens_per_s_vs_timed_run``: what recording costs)."""
    params = _params(max_tokens, temperature)
    with Engine(model, **engine_kwargs, record_timeline=True) as engine, frozen_heap():
        _sync(model.device)
        t0 = time.perf_counter()
        outs = engine.run(prompts, params, use_tqdm=False)
        _sync(model.device)
        dt = time.perf_counter() - t0
    out = summarize_timeline(engine.timeline)
    out["tokens_per_s"] = sum(len(o.outputs[0]) for o in outs) / dt
    out["tokens_per_s_vs_timed_run"] = out["tokens_per_s"] / timed_tokens_per_s
    return out


def roofline_model(spec, gpu: str | GPU | None = None, device=None) -> CostModel:
    """:data:`~paged_edu.sim.costmodel.ROOFLINE_NAME`: ``CostModel.roofline()`` for the model geometry
    ``spec`` -- full efficiency, no overhead, the tied LM head's weight read counted -- on ``gpu``: None,
    the card ``device`` is (:func:`~paged_edu.labs.card.this_card`: its row of the GPU table, its measured
    ceilings if the table lacks it, the H200's without a GPU), or a key of
    :data:`~paged_edu.core.hardware.GPUS`."""
    return CostModel(model=spec, gpu=roofline_card(gpu, device).gpu).roofline()


def roofline_s(steps: list[StepMetrics], cost: CostModel) -> np.ndarray:
    """(steps,) the time ``cost`` needs for each step's exact chunks, seconds."""
    return np.array([cost.step_time(m.shape) for m in steps])


def mean_ms(seconds: np.ndarray, mask: np.ndarray) -> float | None:
    """The mean of ``seconds[mask]`` in ms, rounded to 0.1 us; None when the mask selects nothing."""
    return round(float(seconds[mask].mean() * 1e3), 4) if mask.any() else None


CONCURRENCY_BUCKETS = ((1, 64), (64, 128), (128, 256), (256, 384), (384, 513))  # [lo, hi) sequences a step


def by_concurrency(num_seqs: np.ndarray, mask: np.ndarray, **seconds: np.ndarray) -> list[dict]:
    """The steps of ``mask`` grouped by how many sequences each computed (``num_seqs``, grouped by
    :data:`CONCURRENCY_BUCKETS`): per group the step count and the mean of each named column, given in
    seconds, as ``<name>_ms``."""
    rows = []
    for lo, hi in CONCURRENCY_BUCKETS:
        m = mask & (num_seqs >= lo) & (num_seqs < hi)
        if m.any():
            means = {f"{k}_ms": mean_ms(v, m) for k, v in seconds.items()}
            rows.append(dict(num_seqs=f"{lo}-{hi - 1}", steps=int(m.sum()), **means))
    return rows


def near_running(running: np.ndarray, target: int = 256, width: int = 32) -> np.ndarray:
    """Steps with ``target +- width`` sequences running: what "at ~256 running" means in every host figure."""
    return np.abs(running - target) <= width


def step_speed(run: TimedRun, cost: CostModel, roofline_gpus=()) -> dict:
    """A timed run's steps against the roofline of the same steps, and the host's share of each step.

    ``cost``: the roofline (:func:`roofline_model`). Host time: ``duration - device_wait``, the wall
    time less the time the host waited for the GPU (the copy of the sampled tokens: the one sync).
    ``roofline_gpus``: keys of :data:`~paged_edu.core.hardware.GPUS` (or rows, e.g. a measured card's) to
    price the same steps on too (``roofline_run_s_by_gpu``, by key, not rounded). The step counts of a kind that compiled a Triton
    variant need ``timed_run(..., count_compiles_per_step=True)`` (None without).
    """
    steps, decode, mixed = run.steps, run.decode, run.mixed
    roof = roofline_s(steps, cost)  # (steps,) seconds
    dur = run.durations
    host = dur - np.array([m.device_wait for m in steps])
    running = np.array([m.num_running for m in steps])
    near_256 = decode & near_running(running)
    compiled = run.compiled
    out = dict(
        roofline=ROOFLINE_NAME,
        roofline_gpu=cost.gpu.name,
        roofline_gpu_key=cost.gpu.key,
        roofline_bandwidth=cost.gpu.hbm_bandwidth,
        roofline_run_s=round(float(roof.sum()), 4),
        mean_decode_step_ms=mean_ms(dur, decode),
        roofline_decode_step_ms=mean_ms(roof, decode),
        mean_mixed_step_ms=mean_ms(dur, mixed),
        roofline_mixed_step_ms=mean_ms(roof, mixed),
        num_decode_steps=int(decode.sum()),
        num_mixed_steps=int(mixed.sum()),
        device_wait_ms_per_decode_step=mean_ms(dur - host, decode),  # ~ the GPU's share of a decode step
        host_ms_per_step=mean_ms(host, np.ones(len(steps), bool)),
        host_ms_per_decode_step=mean_ms(host, decode),
        host_ms_at_256_running=mean_ms(host, near_256),
        num_steps_near_256_running=int(near_256.sum()),
        host_ms_decode_p50_p90_max=[round(float(np.percentile(host[decode], q)) * 1e3, 4) for q in (50, 90, 100)]
        if decode.any()
        else None,
        steps_that_compiled=None if compiled is None else int(compiled.sum()),
        mixed_steps_that_compiled=None if compiled is None else int((compiled & mixed).sum()),
        mean_mixed_step_ms_without_compiles=None if compiled is None else mean_ms(dur, mixed & ~compiled),
        # "host below the GPU's time at every concurrency": a decode step's wall time, its host work, the
        # host's wait for the device and its roofline, by the sequences it decoded
        decode_by_concurrency=by_concurrency(
            np.array([m.num_decode_seqs for m in steps]),
            decode,
            step=dur,
            host=host,
            device_wait=dur - host,
            roofline=roof,
        ),
    )
    for kind in ("decode", "mixed"):
        step, roofline = out[f"mean_{kind}_step_ms"], out[f"roofline_{kind}_step_ms"]
        out[f"{kind}_step_vs_roofline"] = round(step / roofline, 3) if step and roofline else None
    if roofline_gpus:
        shapes = [m.shape for m in steps]
        rows = [GPUS[g] if isinstance(g, str) else g for g in roofline_gpus]
        out["roofline_run_s_by_gpu"] = {g.key: float(sum(map(replace(cost, gpu=g).step_time, shapes))) for g in rows}
    return out

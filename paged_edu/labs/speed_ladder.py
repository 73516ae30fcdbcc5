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
Each rung's record also holds what the step-timeline model (:mod:`paged_edu.labs.step_timeline`) needs
to predict it: ``decode_batches`` (how many decode steps ran at each batch size: the workload's
schedule), per-step host phases (``steps``, ``window``), and -- with ``probe_batches`` -- a ``profile``
of decode steps measured apart at a few batch sizes (:func:`probe_decode_steps`: ``torch.profiler``'s
kernels by kind and their device time, the host's launch calls, the host phases and the device span).

On a CPU only ``eager`` runs (CUDA graphs and the Triton kernels need a GPU): the lesson shows the
stored ladder of a GPU (:func:`load_stored_ladder`: one per card, :data:`STORED_LADDERS`) and runs that
rung live to show the mechanism.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import torch

from paged_edu import data
from paged_edu.cache.sizing import dtype_name
from paged_edu.core.hardware import gpu_of_device
from paged_edu.engine import SamplingParams, StepMetrics
from paged_edu.engine.config import setting_names
from paged_edu.engine.timeline import StepRecord, summarize_timeline
from paged_edu.labs.card import roofline_card
from paged_edu.labs.timed_run import roofline_model, roofline_s, step_speed, timed_run
from paged_edu.labs.timing import frozen_heap, kernel_table
from paged_edu.sim.costmodel import ROOFLINE_NAME

__all__ = [
    "PHASES",
    "PROBE_BATCHES",
    "RUNGS",
    "STORED_LADDER",
    "STORED_LADDERS",
    "card_of",
    "ladder_setup",
    "load_stored_ladder",
    "overlap_gap",
    "probe_decode_steps",
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
# benchmarks/bench_ladder.py's record of each card, in paged_edu.data: card key -> file
STORED_LADDERS = {"h200": "speed_ladder_h200.json", "h100": "speed_ladder_h100.json"}
STORED_LADDER = STORED_LADDERS["h200"]
PHASES = ("schedule", "prepare", "forward", "sample", "update")  # StepMetrics.phase_times, in step order
PROBE_BATCHES = (1, 8, 32, 128, 256)  # bench_ladder's probes: decode steps of this many sequences


def card_of(device_name: str) -> str | None:
    """The key of :data:`STORED_LADDERS` (and :data:`~paged_edu.core.hardware.GPUS`) for a CUDA device
    name (``torch.cuda.get_device_name``): ``"h200"``, ``"h100"``, or None for any other card -- the
    GPU table's exact name (:func:`~paged_edu.core.hardware.gpu_of_device`, as the roofline's card:
    an H100 PCIe is not the H100 SXM whose ladder is stored)."""
    gpu = gpu_of_device(device_name)
    return gpu.key if gpu is not None and gpu.key in STORED_LADDERS else None


def ladder_setup(device: torch.device | str, num_requests: int, seed: int = 0, scale: float | None = None) -> dict:
    """The ladder's model, requests and shared engine options on ``device``: on CUDA SmolLM2-135M's
    geometry with random bf16 weights, ShareGPT-like requests (:func:`~paged_edu.labs.batching.sharegpt_requests`,
    lengths times ``scale``, default 1), a pool of 8,192 blocks of 16, 256 running and 4,096 batched tokens at
    most (``bench_engine``'s pool and budget); on a CPU the 2-layer tiny model and requests a tenth as long
    (``scale`` default 0.1). Returns ``model``, ``prompts``, ``outputs``, ``engine_kwargs``, ``label``, ``scale``."""
    from paged_edu.labs.batching import sharegpt_requests
    from paged_edu.labs.engine_lab import tiny_model
    from paged_edu.models.config import smollm2_config
    from paged_edu.models.llama import PagedLlama
    from paged_edu.models.loaders import random_hf_llama

    device = torch.device(device)
    if device.type == "cuda":
        hf = random_hf_llama(smollm2_config(), seed=seed, dtype=torch.bfloat16, device=device, eos_token_id=None)
        model, label = PagedLlama.from_hf(hf), "SmolLM2-135M geometry, random bf16 weights"
        scale = 1.0 if scale is None else scale
        engine_kwargs = dict(num_blocks=8192, block_size=16, max_num_seqs=256, max_num_batched_tokens=4096)
    else:
        model = tiny_model(seed=seed)
        scale = 0.1 if scale is None else scale
        label = "the tiny model (2 layers, hidden 64, random fp32 weights)"
        engine_kwargs = dict(num_blocks=1024, block_size=16, max_num_seqs=64, max_num_batched_tokens=512)
    if scale != 1.0:
        label += f", requests {scale:g} times as long"
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


def _ms(x: float, digits: int = 4) -> float:
    return round(1e3 * x, digits)


def _phases_ms(m: StepMetrics) -> dict[str, float]:
    return {p: _ms(m.phase_times.get(p, 0.0)) for p in PHASES}


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
    probe_batches: tuple[int, ...] = (),
    probe_context: int = 320,
) -> dict:
    """Serve the requests twice on ``Engine(model, **engine_kwargs, **rung_kwargs)``: a warm-up run, then
    the timed run with the timeline recording (:func:`~paged_edu.labs.timed_run.timed_run`). Returns the
    rung's record (times in ms unless named _s): useful tokens/s, the mean decode and mixed step, host /
    device ms per step, the idle gaps, the roofline of the same steps on ``gpu`` (a key of
    :data:`~paged_edu.core.hardware.GPUS`; default: the card the model runs on,
    :func:`~paged_edu.labs.card.this_card`, the H200's on a CPU);
    ``decode_batches``: decode steps per batch size; ``steps``: per step (at most ``max_points``, evenly
    spaced) its kind, batch, duration, roofline, host phases, host busy time and device span; ``window``:
    ``window`` consecutive steps' host and device intervals (and phases) from the middle of the run;
    ``profile``: :func:`probe_decode_steps` on the timed engine at ``probe_batches`` (after its run)."""
    run = timed_run(model, prompts, max_tokens, dict(engine_kwargs, **rung_kwargs), record_timeline=True)
    records: list[StepRecord] = run.engine.timeline
    cost = roofline_model(model.config.geometry(dtype_name(model.dtype)), gpu, model.device)
    roof, dur, decode = roofline_s(run.steps, cost), run.durations, run.decode
    speed, split = step_speed(run, cost), summarize_timeline(records)
    picks = np.unique(np.linspace(0, len(run.steps) - 1, min(max_points, len(run.steps))).astype(int))
    mid = max(0, len(records) // 2 - window // 2)
    batches: dict[int, int] = {}
    for m in run.steps:
        if m.num_prefill_tokens == 0:
            batches[m.num_decode_seqs] = batches.get(m.num_decode_seqs, 0) + 1
    metrics = {m.step: m for m in run.steps}
    steps = [run.steps[i] for i in picks]
    out = dict(
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
        roofline_bandwidth=cost.gpu.hbm_bandwidth,
        roofline_run_s=float(roof.sum()),  # (not rounded: a CPU rung's roofline is a few ms)
        roofline_tokens_per_s=run.useful_tokens / float(roof.sum()),
        roofline_decode_step_ms=speed["roofline_decode_step_ms"],
        roofline_mixed_step_ms=speed["roofline_mixed_step_ms"],
        decode_batches={str(b): n for b, n in sorted(batches.items())},
        steps=dict(
            step=picks.tolist(),
            decode=decode[picks].tolist(),
            num_decodes=[m.num_decode_seqs for m in steps],
            num_prefill_tokens=[m.num_prefill_tokens for m in steps],
            duration_ms=[round(1e3 * x, 4) for x in dur[picks]],
            roofline_ms=[round(1e3 * x, 5) for x in roof[picks]],
            host_busy_ms=[_ms(m.duration - m.device_wait) for m in steps],
            **{f"{p}_ms": [_ms(m.phase_times.get(p, 0.0)) for m in steps] for p in PHASES},
        ),
        window=[
            dict(
                step=r.step,
                decode=r.is_decode,
                num_decodes=r.num_decodes,
                host_ms=[_ms(r.host_start_s), _ms(r.host_end_s)],
                device_ms=[_ms(r.device_start_s), _ms(r.device_end_s)],
                host_busy_ms=_ms(r.host_busy_s),
                phases_ms=_phases_ms(metrics[r.step]) if r.step in metrics else None,
            )
            for r in records[mid : mid + window]
        ],
    )
    if probe_batches:  # on the timed engine, before it is closed
        # With the heap frozen, as the timed run's was. Unfrozen, the H100's eager probes (d06468f) took 33-42 ms
        # a step to launch against the timed run's median 20.6 ms -- collections rescanning the whole heap while
        # an eager step allocates -- and the timeline model, priced from them, missed the eager rung by +53 %
        # (benchmarks/records/h100/speed_ladder_h100_d06468f.json). Frozen (96e4ae5, the same card): the batch-1
        # probe 34.1 -> 20.1 ms a step, the model's eager miss +19.6 % (paged_edu/data/speed_ladder_h100.json).
        with frozen_heap():
            out["profile"] = probe_decode_steps(run.engine, probe_batches, probe_context)
    run.engine.close()  # its pool back before the next rung's engines are built (its records stay)
    return out


def _profile_steps(step, n: int) -> dict:
    """``torch.profiler`` over ``n`` calls of ``step``: per call the kernels on the device (by kind, and
    the longest names), their device us, and the host's launch calls (kernel launches, graph launches)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    events = prof.events()
    kernels = [
        e
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
    ]
    host = [e for e in events if e.device_type != torch.autograd.DeviceType.CUDA]
    return dict(
        kernel_table(kernels, n, top=8),
        launches_per_step=sum("LaunchKernel" in e.name for e in host) / n,
        graph_launches_per_step=sum("GraphLaunch" in e.name for e in host) / n,
    )


def _timeline_or_none(engine) -> list[StepRecord] | None:
    try:
        return engine.timeline
    except RuntimeError:  # an engine built without record_timeline
        return None


def probe_decode_steps(
    engine, batches, context: int = 320, *, steps: int = 6, profile_steps: int = 3, seed: int = 0
) -> dict:
    """Decode steps of ``engine`` at fixed batch sizes, measured apart from any timed run: for each batch
    ``b``, ``b`` requests of ``context`` random prompt tokens run until all of them decode, then ``steps``
    steps are timed (the engine's :class:`StepMetrics` phases, and -- when it records its timeline -- the
    device span) and, on CUDA, ``profile_steps`` more are profiled (:func:`_profile_steps`).

    Returns ``{"context", "batches": {b: {...}}}``; per batch: ``step_ms``, ``host_ms`` (per phase of
    :data:`PHASES`), ``host_busy_ms``, ``device_span_ms``, and on CUDA ``kernels_per_step``,
    ``gpu_busy_us``, ``launches_per_step``, ``graph_launches_per_step``, ``by_kind``, ``top``.
    The requests are aborted once measured, before the next batch (the pool is the engine's own)."""
    rng = np.random.default_rng(seed)
    vocab = engine.model.config.vocab_size
    seen: list[StepMetrics] = []
    unsubscribe = engine.subscribe(lambda e: seen.append(e) if isinstance(e, StepMetrics) else None)
    out: dict = {"context": context, "steps": steps, "profile_steps": profile_steps, "batches": {}}
    try:
        for b in batches:
            # Enough tokens that no request ends while the others' prompts are still being computed; the
            # requests are aborted once measured.
            params = SamplingParams(max_tokens=steps + profile_steps + 8 + b * context // 64)
            ids = [engine.add_request(rng.integers(3, vocab, size=context).tolist(), params) for _ in range(b)]
            seen.clear()
            for _ in range(10_000):
                if seen and seen[-1].num_prefill_tokens == 0 and seen[-1].num_decode_seqs == b:
                    break
                engine.step()
            else:
                raise RuntimeError(f"probe: {b} sequences of {context} tokens never decoded together (the pool?)")
            engine.step()  # one more: an async engine's step in flight is a decode too
            seen.clear()
            for _ in range(steps):
                engine.step()
            timed = [m for m in seen if m.num_prefill_tokens == 0 and m.num_decode_seqs == b]
            row = dict(
                steps=len(timed),
                step_ms=_ms(float(np.mean([m.duration for m in timed]))),
                host_ms={p: _ms(float(np.mean([m.phase_times.get(p, 0.0) for m in timed]))) for p in PHASES},
                host_busy_ms=_ms(float(np.mean([m.duration - m.device_wait for m in timed]))),
            )
            records = _timeline_or_none(engine)
            if records is not None:
                stepped = {m.step for m in timed}
                spans = [r.device_end_s - r.device_start_s for r in records if r.step in stepped]
                row["device_span_ms"] = _ms(float(np.mean(spans))) if spans else None
            if engine.device.type == "cuda":
                row.update(_profile_steps(engine.step, profile_steps))
            for rid in ids:  # (a request that has just ended is no longer live)
                try:
                    engine.abort_request(rid)
                except ValueError:
                    pass
            while engine.has_unfinished():
                engine.step()
            out["batches"][str(b)] = row
    finally:
        unsubscribe()
    return out


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


def load_stored_ladder(card: str = "h200") -> dict | None:
    """The stored ladder of ``card`` (a key of :data:`STORED_LADDERS`, or a file name in
    :mod:`paged_edu.data`), or None when none is stored for it."""
    name = card if card.endswith(".json") else STORED_LADDERS.get(card)
    if name is None:
        return None
    try:
        return data.load_json(name)
    except FileNotFoundError:
        return None


ENGINE_CODE = ("paged_edu/engine", "paged_edu/kernels", "paged_edu/models")  # what a ladder's figures depend on


def code_changes_since(record: dict) -> dict | None:
    """How the code a ladder measures changed after the ``record`` was taken: the number of commits since the
    record's commit that touched :data:`ENGINE_CODE`, and the last of them (``{"commits": n, "last": hash,
    "date": YYYY-MM-DD}``). None where this copy cannot tell: no git checkout (an installed wheel) or the
    record's commit is not in its history."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    top = git("rev-parse", "--show-toplevel")
    commit = str(record.get("commit") or "").split("+")[0]
    if (
        top is None
        or Path(top).resolve() != root
        or not commit
        or git("cat-file", "-e", f"{commit}^{{commit}}") is None
    ):
        return None
    count = git("rev-list", "--count", "--no-merges", f"{commit}..HEAD", "--", *ENGINE_CODE)
    last = git("log", "-1", "--no-merges", "--format=%h %cs", "--", *ENGINE_CODE)
    if count is None or not last:
        return None
    last_hash, last_date = last.split()
    return {"commits": int(count), "last": last_hash, "date": last_date}


def stored_decode_split(card: str = "h200") -> dict:
    """Exercise 9.1's inputs: the host / device split of a synchronous decode step on ``card``, from its
    stored ladder's ``+ fused kernels`` rung, with the ``+ overlap`` rung's measured step and device span
    beside it (times in ms). Raises ``LookupError`` when no ladder with those rungs is stored for the card."""
    ladder = load_stored_ladder(card)
    by_name = {r["rung"]: r for r in ladder["rungs"] if "skipped" not in r} if ladder is not None else {}
    if "+ fused kernels" not in by_name:
        raise LookupError(f"no stored ladder with a '+ fused kernels' rung for {card!r} ({STORED_LADDERS.get(card)})")
    fused, overlap = by_name["+ fused kernels"], by_name.get("+ overlap")
    return dict(
        source=f"{STORED_LADDERS.get(card, card)}, rung '+ fused kernels'",
        device_name=ladder["device_name"],
        command=ladder["command"],
        commit=ladder["commit"],
        date_utc=ladder["date_utc"],
        host_ms=fused["host_ms_per_decode_step"],
        device_ms=fused["device_ms_per_decode_step"],
        step_ms=fused["mean_decode_step_ms"],
        overlap_step_ms=overlap["mean_decode_step_ms"] if overlap else None,
        overlap_device_ms=overlap["device_ms_per_decode_step"] if overlap else None,
        overlap_host_ms=overlap["host_ms_per_decode_step"] if overlap else None,
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
        commit=bench.get("commit"),
        date_utc=bench.get("date_utc"),
        unfused_kernels=int(row["unfused_profile"]["kernels_per_step"]),
        unfused_busy_us=row["unfused_profile"]["gpu_busy_us"],
        fused_kernels=int(row["fused_profile"]["kernels_per_step"]),
        fused_busy_us=row["fused_profile"]["gpu_busy_us"],
        fused_us=row["fused_us"],
        roofline_us=row["roofline_us"],
        skinny_max_rows=bench["skinny_max_rows"],
        skinny_batches=[r["batch"] for r in bench["rows"] if r["batch"] <= bench["skinny_max_rows"]],
    )


def overlap_gap(record: dict) -> dict:
    """Exercise 9.1, measured: the synchronous ``+ fused kernels`` rung's split, the prediction from it
    (``max(host, device)``), the ``+ overlap`` rung's measured step, and where the difference sits.

    * ``device_sync_ms`` / ``device_async_ms``: the device's span per decode step in the two runs. The
      same graphs run in both; a synchronous step's span starts at its first mark on an idle device, so it
      also holds what the device waits for inside the step (the graph's launch, the copies staged after
      the mark), while with the host a step ahead the step is all queued before the device reaches it;
    * with probes (``profile``) in both rungs, at each probed batch: the two spans (``span_sync_ms``,
      ``span_async_ms``) and the synchronous step's launch phase (``launch_ms``, the replay call);
    * ``model_ms``: the step-timeline model's mean decode step for the overlap rung (every batch size of
      the run priced on its own, not the means' max).
    """
    from paged_edu.labs.step_timeline import predict_ladder

    by = {r["rung"]: r for r in record["rungs"] if "skipped" not in r}
    sync, over = by["+ fused kernels"], by["+ overlap"]
    host, device = sync["host_ms_per_decode_step"], sync["device_ms_per_decode_step"]
    out = dict(
        host_ms=host,
        device_sync_ms=device,
        predicted_ms=max(host, device),
        measured_ms=over["mean_decode_step_ms"],
        device_async_ms=over["device_ms_per_decode_step"],
        host_async_ms=over["host_ms_per_decode_step"],
        model_ms=next(p["predicted_ms"] for p in predict_ladder(record) if p["rung"] == "+ overlap"),
        probes=[],
    )
    ps, pa = sync.get("profile", {}).get("batches", {}), over.get("profile", {}).get("batches", {})
    for b in sorted(set(ps) & set(pa), key=int):
        out["probes"].append(
            dict(
                batch=int(b),
                span_sync_ms=ps[b].get("device_span_ms"),
                span_async_ms=pa[b].get("device_span_ms"),
                launch_ms=ps[b]["host_ms"]["forward"],
            )
        )
    return out

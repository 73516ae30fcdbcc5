"""A step-timeline model: where a decode step's time goes, host and device, kernel by kernel.

What you will learn
-------------------
Lesson 9's speed ladder measures five engines; this model *predicts* them from their parts, so that
each mechanism can be switched on and off and its effect read off a timeline. A decode step is

* **host work before the launch** -- schedule and prepare (``pre``): bookkeeping that grows with the
  number of running sequences: ``host_fixed_us + host_per_seq_us * batch``, a share ``pre_share`` of it
  before the launch, the rest after the tokens are read (``post``: update, collect);
* **the launch** -- eagerly, one host call per kernel (``launch_us`` each: Python, PyTorch's dispatch,
  the driver); with a CUDA graph, one replay for the whole step (``graph_launch_us``);
* **the device's work** -- the step's kernels one after the other, each for its own time (taken from
  a stored ``torch.profiler`` profile of that step, :class:`KernelProfile`), a kernel starting only
  once it has been launched and the one before it has finished; inside a graph ``kernel_gap_us``
  apart;
* **the order** -- synchronous: the host waits for the step's tokens, updates, then starts the next
  step (``pre + launch + device + post``); with the host one step ahead (async scheduling,
  :mod:`paged_edu.engine.overlap`) the host launches step N+1 *before* it reads step N's tokens, so
  a step costs about ``max(host, device)``. :func:`schedule` is that order, for any per-step times.

Everything is in microseconds except :func:`schedule`'s inputs and outputs, which take whatever unit
they are given (the lesson's exercise 9.4 and the engine's recorded timelines use ms).

:func:`costs_for_rung` reads every input from a stored ladder record (``benchmarks/bench_ladder.py``:
each rung's ``profile`` of decode steps at a few batch sizes -- kernels by kind, launches, host
phases, device span -- and the ladder's histogram of decode batch sizes); :func:`predict_ladder`
prices every rung's decode steps with them and sets the prediction beside what the ladder measured.
A record written before the probes existed (no ``profile``) is priced from ``layer_bench.json``'s
kernels and the rungs' own host means instead (:func:`legacy_costs`, said in its ``source``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from paged_edu import data

__all__ = [
    "KINDS",
    "TOLERANCE",
    "KernelProfile",
    "StepCosts",
    "StepTimeline",
    "async_schedule",
    "costs_for_rung",
    "decode_batches",
    "kernel_chain",
    "legacy_costs",
    "predict_ladder",
    "rung_options",
    "schedule",
    "simulate",
    "step_us",
    "sync_schedule",
]

TOLERANCE = 0.25  # the model's stated accuracy: every rung of every stored ladder within 25 % (held by a test)
KINDS = ("gemm", "attention", "fused", "other")  # a kernel's kind (paged_edu.labs.timing.kernel_kind)
SMALL_KINDS = ("fused", "other")  # the per-token ops between the matmuls: what fusing removes


# ----------------------------------------------------------------------------------------------
# The order of a step's phases: synchronous, or the host one step ahead
# ----------------------------------------------------------------------------------------------


def schedule(pre, device, post, *, overlap: bool, launch=None) -> list[tuple[float, float, float]]:
    """When each step's host work starts and when its device work runs: ``[(host_start, device_start,
    device_end)]`` per step, the first step's host starting at 0.

    Per step ``k``: ``pre[k]`` of host work (schedule, prepare, and the launch up to the point where the
    device may start); ``launch[k]`` more host work launching while the device runs (default 0);
    ``device[k]`` of device work; ``post[k]`` of host work once its tokens are read (update).

    * the device runs one step at a time, step k from ``max(host_start + pre, device_end(k-1))``;
    * synchronous: the host reads step k's tokens (it waits for its ``device_end``), updates it, and
      only then starts step k+1: ``host_start(k+1) = max(launch_end(k), device_end(k)) + post[k]``;
    * overlapped (``overlap=True``): the host launches step k, *then* reads step k-1's tokens and
      updates it, then starts step k+1: ``host_start(k+1) = max(launch_end(k), device_end(k-1)) +
      post[k-1]`` (the first step reads nothing). The host is never more than one step ahead.
    """
    n = len(pre)
    launch = [0.0] * n if launch is None else launch
    if not len(device) == len(post) == len(launch) == n:
        raise ValueError(
            f"pre, device, post and launch need one entry per step, got {n}, {len(device)}, {len(post)}, {len(launch)}"
        )
    out: list[tuple[float, float, float]] = []
    host, device_free = 0.0, 0.0
    for k in range(n):
        ready = host + pre[k]
        d0 = max(ready, device_free)
        device_free = d0 + device[k]
        out.append((host, d0, device_free))
        launched = ready + launch[k]
        if not overlap:
            host = max(launched, device_free) + post[k]
        elif k == 0:
            host = launched
        else:
            host = max(launched, out[k - 1][2]) + post[k - 1]
    return out


def sync_schedule(pre, device, post) -> list[tuple[float, float, float]]:
    """:func:`schedule` synchronous: host, device, update, then the next step."""
    return schedule(pre, device, post, overlap=False)


def async_schedule(pre, device, post) -> list[tuple[float, float, float]]:
    """:func:`schedule` with the host one step ahead (exercise 9.4's reference)."""
    return schedule(pre, device, post, overlap=True)


# ----------------------------------------------------------------------------------------------
# The kernels of a step, from a stored profile
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KernelProfile:
    """The kernels of one decode step at a few batch sizes: per batch and kind, how many and their device
    microseconds in all (``torch.profiler`` over graph replays or eager steps). Between the batches
    profiled, times are interpolated linearly in the batch size (flat beyond the ends)."""

    batches: tuple[int, ...]
    counts: dict[str, tuple[float, ...]]  # kind -> kernels per step, per batch
    us: dict[str, tuple[float, ...]]  # kind -> device us per step, per batch
    num_layers: int
    source: str

    @classmethod
    def from_rows(cls, rows: dict[int, dict], num_layers: int, source: str) -> KernelProfile:
        """``rows``: batch -> a profile with ``by_kind`` ``{kind: {"kernels", "us"}}`` (bench_layer's and
        bench_ladder's form)."""
        batches = tuple(sorted(rows))
        get = lambda kind, key: tuple(float(rows[b]["by_kind"].get(kind, {}).get(key, 0.0)) for b in batches)  # noqa: E731
        return cls(batches, {k: get(k, "kernels") for k in KINDS}, {k: get(k, "us") for k in KINDS}, num_layers, source)

    def at(self, batch: float) -> dict[str, tuple[float, float]]:
        """``{kind: (kernels, us)}`` of a step of ``batch`` sequences."""
        b = float(batch)
        return {
            k: (float(np.interp(b, self.batches, self.counts[k])), float(np.interp(b, self.batches, self.us[k])))
            for k in KINDS
        }

    def kernels_per_layer(self, batch: float) -> float:
        return sum(n for n, _ in self.at(batch).values()) / self.num_layers


# ----------------------------------------------------------------------------------------------
# One step's costs, and the timeline they make
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepCosts:
    """What a decode step costs, piece by piece (us): the model's inputs, each a widget of lesson 9."""

    profile: KernelProfile
    host_fixed_us: float  # schedule + prepare + update, whatever the batch
    host_per_seq_us: float  # ... and per running sequence
    pre_share: float = 0.75  # the share of that host work done before the launch (the rest: update)
    launch_us: float = 20.0  # host time to launch one kernel eagerly
    graph_launch_us: float = 30.0  # host time of one graph replay (and its few eager launches)
    kernel_gap_us: float = 0.5  # device idle between two kernels of a graph
    kernels_per_layer: float | None = None  # None: the profile's; else the small kernels are scaled to it
    source: dict = field(default_factory=dict)  # where each number came from

    def kernels(self, batch: float) -> list[tuple[str, float]]:
        """The step's kernels in launch order, ``[(kind, us)]``: per layer its share of every kind,
        interleaved (the order inside a layer does not change a chain's length; its spread does)."""
        at = self.profile.at(batch)
        counts = {k: at[k][0] for k in KINDS}
        mean = {k: (at[k][1] / at[k][0] if at[k][0] else 0.0) for k in KINDS}
        if self.kernels_per_layer is not None:  # more or fewer of the small kernels, each as long as before
            small = sum(counts[k] for k in SMALL_KINDS)
            small_us = sum(at[k][1] for k in SMALL_KINDS) / small if small else 2.0
            extra = (self.kernels_per_layer - self.profile.kernels_per_layer(batch)) * self.profile.num_layers
            new_small = max(0.0, small + extra)
            for k in SMALL_KINDS:
                counts[k] = counts[k] * new_small / small if small else (new_small if k == "other" else 0.0)
                mean[k] = mean[k] if small else small_us
        whole = {k: int(round(counts[k])) for k in KINDS}
        layers = self.profile.num_layers
        out: list[tuple[str, float]] = []
        for layer in range(layers):  # kernel i of a kind goes to layer i * layers // count
            for k in KINDS:
                n = whole[k] * (layer + 1) // layers - whole[k] * layer // layers
                out += [(k, mean[k])] * n
        return out

    def host_us(self, batch: float) -> tuple[float, float]:
        """(pre, post): the host's bookkeeping before the launch and after the tokens are read."""
        total = self.host_fixed_us + self.host_per_seq_us * batch
        return total * self.pre_share, total * (1 - self.pre_share)


def kernel_chain(
    kernels: list[tuple[str, float]], *, graphs: bool, launch_us: float, gap_us: float
) -> list[tuple[float, float]]:
    """Each kernel's (start, end) on the device, us from the moment the device may start the step.

    With a graph every kernel is queued at once and they run ``gap_us`` apart. Eagerly kernel i is
    launched ``i * launch_us`` after the first: it starts at ``max(its launch, the previous end)`` --
    when launching a kernel takes longer than running one, the device waits for the host.
    """
    out, end = [], 0.0
    for i, (_, us) in enumerate(kernels):
        issued = 0.0 if graphs else i * launch_us
        start = max(issued, end + (gap_us if graphs and i else 0.0))
        end = start + us
        out.append((start, end))
    return out


@dataclass(frozen=True, slots=True)
class StepTimeline:
    """A few identical steps as :func:`simulate` lays them out (us from the first step's host start)."""

    batch: float
    graphs: bool
    overlap: bool
    host: list[tuple[int, str, float, float]]  # (step, phase, start, end): "schedule + prepare", "launch", "update"
    device: list[tuple[int, str, float, float]]  # (step, kind, start, end): each kernel
    step_us: float  # steady state: one step every step_us
    host_us: float  # the host's work per step (pre + launch + post)
    device_us: float  # the device's span per step (first kernel's start to last kernel's end)
    busy_us: float  # the device's busy time per step (the kernels alone)
    num_kernels: int
    num_launches: int  # host calls that launch work: one per kernel eagerly, one replay with a graph

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens per second in steady state: one token per sequence per step."""
        return self.batch / self.step_us * 1e6


def simulate(costs: StepCosts, batch: float, *, graphs: bool, overlap: bool, num_steps: int = 4) -> StepTimeline:
    """``num_steps`` identical decode steps of ``batch`` sequences: every host phase and every kernel."""
    kernels = costs.kernels(batch)
    pre_h, post_h = costs.host_us(batch)
    first = costs.graph_launch_us if graphs else costs.launch_us  # until the first kernel can start
    rest = 0.0 if graphs else costs.launch_us * max(0, len(kernels) - 1)  # still launching meanwhile
    chain = kernel_chain(kernels, graphs=graphs, launch_us=costs.launch_us, gap_us=costs.kernel_gap_us)
    span = chain[-1][1] if chain else 0.0
    times = schedule(
        [pre_h + first] * num_steps,
        [span] * num_steps,
        [post_h] * num_steps,
        overlap=overlap,
        launch=[rest] * num_steps,
    )
    host, device = [], []
    for k, (h0, d0, _) in enumerate(times):
        host.append((k, "schedule + prepare", h0, h0 + pre_h))
        host.append((k, "launch", h0 + pre_h, h0 + pre_h + first + rest))
        device += [(k, kind, d0 + s, d0 + e) for (kind, _), (s, e) in zip(kernels, chain)]
    for k in range(num_steps):  # each step's update: after its tokens are read (async: after the next launch)
        launched = host[2 * k + 1][3]
        if overlap and k + 1 < num_steps:
            start = max(host[2 * (k + 1) + 1][3], times[k][2])
        else:
            start = max(launched, times[k][2])
        host.append((k, "update", start, start + post_h))
    period = times[-1][1] - times[-2][1] if num_steps >= 2 else times[0][2]
    return StepTimeline(
        batch=batch,
        graphs=graphs,
        overlap=overlap,
        host=sorted(host, key=lambda h: h[2]),
        device=device,
        step_us=period,
        host_us=pre_h + first + rest + post_h,
        device_us=span,
        busy_us=sum(us for _, us in kernels),
        num_kernels=len(kernels),
        num_launches=1 if graphs else len(kernels),
    )


def step_us(costs: StepCosts, batch: float, *, graphs: bool, overlap: bool) -> float:
    """The steady-state time of one decode step of ``batch`` sequences (us)."""
    return simulate(costs, batch, graphs=graphs, overlap=overlap, num_steps=6).step_us


# ----------------------------------------------------------------------------------------------
# The model's inputs from a stored ladder, and its prediction of every rung
# ----------------------------------------------------------------------------------------------


def decode_batches(rung: dict) -> dict[int, int]:
    """``{batch size: decode steps}`` of a ladder rung: the workload's schedule, the model's other input."""
    if "decode_batches" in rung:
        return {int(b): int(n) for b, n in rung["decode_batches"].items()}
    raise KeyError(f"rung {rung.get('rung')!r} has no decode_batches: it predates them (re-run bench_ladder)")


def _fit_line(xs, ys) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` (b = 0 from one point), ``b`` kept >= 0."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    if len(set(xs.tolist())) < 2:
        return float(ys.mean()), 0.0
    b, a = np.polyfit(xs, ys, 1)
    if b < 0:
        return float(ys.mean()), 0.0
    return float(a), float(b)


def costs_for_rung(record: dict, rung: dict, num_layers: int = 30) -> StepCosts:
    """The model's inputs for one rung of a stored ladder ``record``, from the rung's ``profile`` (decode
    steps measured apart from the ladder's timed run at a few batch sizes): its kernels by kind, the
    host's phases (schedule + prepare before the launch, the launch, update after), the device span.

    * ``host_fixed_us`` / ``host_per_seq_us``: a line through the probes' schedule + prepare + update;
    * ``launch_us``: the eager launch phase per kernel launched (the eager rung's probes);
    * ``graph_launch_us``: the launch phase of a step that replays a graph;
    * ``kernel_gap_us``: (device span - busy) per kernel, in a graph (a synchronous step's span less its
      launch phase: its start mark precedes the replay call).
    A record without probes is priced by :func:`legacy_costs`.
    """
    if "profile" not in rung:
        return legacy_costs(record, rung, num_layers)
    probes = {int(b): p for b, p in rung["profile"]["batches"].items()}
    graphs = bool(rung["engine_kwargs"].get("cuda_graphs"))
    profile = KernelProfile.from_rows(probes, num_layers, f"{rung['rung']}: profile of decode steps")
    bs = sorted(probes)
    pre = [1e3 * (probes[b]["host_ms"]["schedule"] + probes[b]["host_ms"]["prepare"]) for b in bs]
    post = [1e3 * probes[b]["host_ms"]["update"] for b in bs]
    fixed, per_seq = _fit_line(bs, [a + c for a, c in zip(pre, post)])
    launch = [1e3 * probes[b]["host_ms"]["forward"] for b in bs]
    eager = _eager_launch_us(record)
    # A synchronous step's span starts before its graph is launched (the mark precedes the replay call): take
    # the launch out of it; with the host a step ahead the step is queued before the device reaches the mark.
    overlap = bool(rung["engine_kwargs"].get("async_scheduling"))
    gaps = [
        (
            1e3 * probes[b]["device_span_ms"]
            - (0.0 if overlap else 1e3 * probes[b]["host_ms"]["forward"])
            - probes[b]["gpu_busy_us"]
        )
        / max(1.0, probes[b]["kernels_per_step"] - 1)
        for b in bs
    ]
    return StepCosts(
        profile=profile,
        host_fixed_us=fixed,
        host_per_seq_us=per_seq,
        pre_share=float(np.clip(sum(pre) / max(1e-9, sum(pre) + sum(post)), 0.0, 1.0)),
        launch_us=eager,
        graph_launch_us=float(np.mean(launch)) if graphs else 30.0,
        kernel_gap_us=float(max(0.0, np.median(gaps))) if graphs else 0.5,
        source=dict(
            kernels=f"{record.get('device_name')}: rung {rung['rung']!r}'s profile at batches {bs}",
            host=f"a line through the probes' schedule + prepare + update ({len(bs)} batch sizes)",
            launch="the eager rung's launch phase per kernel launched",
            independent=True,  # no input is the rung's own measured step
        ),
    )


def _eager_launch_us(record: dict) -> float:
    """Host us per kernel launched eagerly: the eager rung's probes, launch phase / launches."""
    eager = next((r for r in record["rungs"] if r["rung"] == "eager" and "profile" in r), None)
    if eager is None:
        return 20.0
    per = [
        1e3 * p["host_ms"]["forward"] / p["launches_per_step"]
        for p in eager["profile"]["batches"].values()
        if p.get("launches_per_step")
    ]
    return float(np.median(per)) if per else 20.0


def legacy_costs(record: dict, rung: dict, num_layers: int = 30) -> StepCosts:
    """Inputs for a ladder record written before the probes: the kernels of ``layer_bench.json`` (profiled
    graph replays at batches 1-256, context 512; unfused for the torch rungs, fused for the Triton ones),
    the rung's own mean host time per decode step as ``host_fixed_us`` (no per-sequence term), the eager
    launch cost fitted to the eager rung (its host time over the unfused kernel count), and the graph
    replay's wall time less its busy time as the gaps."""
    bench = data.load_json("layer_bench.json")
    fused = rung["engine_kwargs"].get("fused_impl") == "triton"
    key = "fused" if fused else "unfused"
    rows = {r["batch"]: r[f"{key}_profile"] for r in bench["rows"]}
    gaps = [
        (r[f"{key}_us"] - r[f"{key}_profile"]["gpu_busy_us"]) / r[f"{key}_profile"]["kernels_per_step"]
        for r in bench["rows"]
    ]
    by = {r["rung"]: r for r in record["rungs"] if "skipped" not in r}
    graph_rung = by.get("+ CUDA graphs", rung)
    graph_host = 1e3 * graph_rung["host_ms_per_decode_step"]
    eager = by.get("eager")
    kernels_1 = rows[min(rows)]["kernels_per_step"]
    launch = (
        1e3 * (eager["host_ms_per_decode_step"] - graph_rung["host_ms_per_decode_step"]) / kernels_1 if eager else 20.0
    )
    graphs = bool(rung["engine_kwargs"].get("cuda_graphs"))
    host = 1e3 * rung["host_ms_per_decode_step"] if graphs else graph_host
    return StepCosts(
        profile=KernelProfile.from_rows(rows, num_layers, f"layer_bench.json ({bench.get('commit', '?')[:7]}), {key}"),
        host_fixed_us=host,
        host_per_seq_us=0.0,
        launch_us=launch,
        graph_launch_us=0.0,  # (inside the rung's host time)
        kernel_gap_us=float(max(0.0, np.median(gaps))),
        source=dict(
            kernels=f"layer_bench.json at {str(bench.get('commit', '?'))[:7]}, {key} kernels (not the ladder's commit)",
            host="the rung's own mean host time per decode step (the record has no probes)",
            launch="fitted to the eager rung: its host time over the unfused kernel count",
            independent=False,
        ),
    )


def rung_options(rung: dict) -> tuple[bool, bool]:
    """``(graphs, overlap)`` of a ladder rung: its decode steps replay a graph; its host runs one step ahead."""
    kw = rung["engine_kwargs"]
    return bool(kw.get("cuda_graphs")), bool(kw.get("async_scheduling"))


def predict_ladder(record: dict, measured: list[dict] | None = None) -> list[dict]:
    """Every rung of a stored ladder ``record`` priced by the model beside what it measured: per rung the
    predicted and measured mean decode step (ms) and the relative error (``error``: predicted / measured
    - 1). ``measured``: other rungs to price with ``record``'s inputs -- a live run on the same card, say:
    their own ``decode_batches`` and measured steps, the record's kernels and host costs."""
    by = {r["rung"]: r for r in record["rungs"] if "skipped" not in r}
    out = []
    for rung in measured if measured is not None else record["rungs"]:
        if "skipped" in rung or rung["rung"] not in by:
            continue
        costs = costs_for_rung(record, by[rung["rung"]])
        hist = decode_batches(rung)
        graphs, overlap = rung_options(rung)
        n = sum(hist.values())
        mean_us = sum(c * step_us(costs, b, graphs=graphs, overlap=overlap) for b, c in hist.items()) / n
        out.append(
            dict(
                rung=rung["rung"],
                graphs=graphs,
                overlap=overlap,
                predicted_ms=mean_us / 1e3,
                measured_ms=rung["mean_decode_step_ms"],
                error=mean_us / 1e3 / rung["mean_decode_step_ms"] - 1,
                num_decode_steps=n,
                source=costs.source,
            )
        )
    return out


def with_knobs(costs: StepCosts, **knobs) -> StepCosts:
    """``costs`` with some inputs changed (the widgets' knobs): any field of :class:`StepCosts`."""
    return replace(costs, **knobs)

"""A per-step timeline of host and device: where each step's time went, and the gaps between steps.

What you will learn
-------------------
A step is host work (schedule, prepare, launch) followed by device work (the forward pass and
sampling). ``Engine(..., record_timeline=True)`` keeps one :class:`StepRecord` per step launched:

* ``host_start_s .. host_end_s`` -- the host scheduling, preparing and launching the step
  (``time.perf_counter`` since the engine's start, the clock of ``StepMetrics.time``);
* ``device_start_s .. device_end_s`` -- the device running it, from the forward pass to the last
  sampling kernel. On CUDA two events bracket that work on the stream; their times are put on the
  host's clock through a reference event recorded after a ``synchronize`` (when the timeline is
  made), and read only once the events have completed -- recording never waits for the device.
  On a CPU the device work is synchronous: the interval of the forward and sampling calls;
* ``host_busy_s`` -- the host's work for the call that launched the step: its wall time less the
  time it waited for the device (``StepMetrics.duration - device_wait``, the same split
  ``benchmarks/bench_engine.py`` reports; on a CPU less the device interval too, which the host
  ran itself), and ``forward`` -- how the forward pass ran.

The device *idle gap* before step N+1 is ``device_start(N+1) - device_end(N)``: the GPU waiting for
the host. A synchronous engine leaves a gap of about the host's time per step; with the host one step
ahead (``async_scheduling=True``) step N+1 is launched while step N runs, and the gap shrinks to the
launch latency. Then a step costs ``max(host, device)`` instead of their sum.

The hooks cost nothing when recording is off: the runner checks ``timeline is None`` twice a step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

__all__ = [
    "StepRecord",
    "Timeline",
    "decode_idle_gaps_ms",
    "forward_mode",
    "idle_gaps_ms",
    "per_step_ms",
    "summarize_timeline",
]


@dataclass(slots=True)
class StepRecord:
    """One launched step on the host's clock (seconds since the engine started)."""

    step: int
    host_start_s: float  # the call that launched it began (scheduling)
    host_end_s: float  # its launch ended (the last sampling kernel queued)
    device_start_s: float  # the device began its forward pass
    device_end_s: float  # the device finished its sampling
    host_busy_s: float  # the call's wall time less its wait for the device
    num_decodes: int
    num_prefill_tokens: int
    forward: str  # "graph", "mixed graph" or "eager" (forward_mode)

    @property
    def is_decode(self) -> bool:
        """A pure-decode step (no prompt tokens)."""
        return self.num_prefill_tokens == 0


def forward_mode(batch) -> str:
    """How a :class:`~paged_edu.engine.runner.StagedBatch` runs its forward pass: ``"graph"`` (one
    decode-graph replay), ``"mixed graph"`` (one replay of a mixed-step graph) or ``"eager"``."""
    if batch.graph_size is not None:
        return "graph"
    return "mixed graph" if batch.mixed_key is not None else "eager"


class Timeline:
    """The records of one engine; :class:`~paged_edu.engine.runner.ModelRunner` calls :meth:`begin`
    and :meth:`end` around a step's device work, the engine :meth:`close` when the step is counted."""

    def __init__(self, device: torch.device, t0: float) -> None:
        self.t0 = t0  # the engine's perf_counter origin
        self.on_gpu = device.type == "cuda"
        self._records: list[StepRecord] = []
        self._pending: list[tuple[StepRecord, object, object]] = []  # (record, start event, end event)
        self._open: list = [None, None, None, ""]  # this step's [device start, device end, host end, forward]
        if self.on_gpu:
            torch.cuda.synchronize(device)
            self._ref = torch.cuda.Event(enable_timing=True)
            self._ref.record()
            self._ref.synchronize()
            self._ref_s = time.perf_counter() - t0  # the reference event's time on the host clock

    def _mark(self):
        if self.on_gpu:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter() - self.t0

    def begin(self, batch) -> None:
        """The step's device work starts (``ModelRunner.forward``)."""
        self._open = [self._mark(), None, None, forward_mode(batch)]

    def end(self) -> None:
        """The step's device work is queued to its last kernel (after the tokens are drawn)."""
        self._open[1] = self._mark()
        self._open[2] = time.perf_counter() - self.t0

    def close(self, step: int, sched, host_start_s: float, host_busy_s: float) -> None:
        """Record launched step ``step`` (its ``SchedulerOutput``); a step that drew no token ends now."""
        start, end, host_end, mode = self._open
        if start is None:
            raise RuntimeError(f"step {step} was counted, but the timeline saw no forward pass for it")
        if end is None:
            self.end()
            start, end, host_end, mode = self._open
        self._open = [None, None, None, ""]
        decodes, prefill = sched.decodes_and_prefill_tokens()
        record = StepRecord(step, host_start_s, host_end, 0.0, 0.0, host_busy_s, decodes, prefill, mode)
        if self.on_gpu:
            self._pending.append((record, start, end))
            self._resolve(wait=False)
        else:  # the host ran the device's work itself: not host work that could overlap it
            record.device_start_s, record.device_end_s = start, end
            record.host_busy_s = max(0.0, host_busy_s - (end - start))
            self._records.append(record)

    def discard(self) -> None:
        """The step was undone (:class:`~paged_edu.engine.step.StepFailed`): forget its marks."""
        self._open = [None, None, None, ""]

    def _resolve(self, wait: bool) -> None:
        """Move pending records whose end event completed (every one, waiting, if ``wait``)."""
        while self._pending:
            record, start, end = self._pending[0]
            if not wait and not end.query():
                return
            end.synchronize()
            record.device_start_s = self._ref_s + self._ref.elapsed_time(start) / 1e3
            record.device_end_s = self._ref_s + self._ref.elapsed_time(end) / 1e3
            self._records.append(record)
            self._pending.pop(0)

    @property
    def records(self) -> list[StepRecord]:
        """Every launched step's record (waits for the device's last events: not for the step path)."""
        self._resolve(wait=True)
        return list(self._records)


# ----------------------------------------------------------------------------------------------
# Reading a timeline
# ----------------------------------------------------------------------------------------------


def idle_gaps_ms(records: list[StepRecord]) -> list[float]:
    """Per step after the first: ``device_start(N+1) - device_end(N)`` in ms (the device idle)."""
    return [1e3 * (b.device_start_s - a.device_end_s) for a, b in zip(records, records[1:])]


def per_step_ms(records: list[StepRecord]) -> list[dict]:
    """Per step: its host busy ms, launch ms (scheduling to the last kernel queued), device ms, and the
    device's idle ms before it (None for the first step)."""
    gaps = [None, *idle_gaps_ms(records)]
    return [
        dict(
            step=r.step,
            host_ms=1e3 * r.host_busy_s,
            launch_ms=1e3 * (r.host_end_s - r.host_start_s),
            device_ms=1e3 * (r.device_end_s - r.device_start_s),
            idle_before_ms=gap,
        )
        for r, gap in zip(records, gaps)
    ]


def decode_idle_gaps_ms(records: list[StepRecord]) -> list[float]:
    """The idle gaps between two consecutive decode steps (both pure decode)."""
    return [g for g, a, b in zip(idle_gaps_ms(records), records, records[1:]) if a.is_decode and b.is_decode]


def summarize_timeline(records: list[StepRecord]) -> dict:
    """Means per decode step and per mixed step (host busy ms, device ms, launch ms), the step
    count of each kind and forward mode, and the median idle gap between consecutive decode steps
    (``gpu_idle_between_decode_steps_ms_median``; None without two consecutive decode steps)."""

    def mean_ms(values):
        values = list(values)
        return 1e3 * statistics.fmean(values) if values else None

    out: dict = {"num_steps": len(records)}
    for kind, rows in (
        ("decode", [r for r in records if r.is_decode]),
        ("mixed", [r for r in records if not r.is_decode and r.num_decodes]),
        ("prefill", [r for r in records if not r.num_decodes]),
    ):
        out[f"num_{kind}_steps"] = len(rows)
        out[f"host_ms_per_{kind}_step"] = mean_ms(r.host_busy_s for r in rows)
        out[f"device_ms_per_{kind}_step"] = mean_ms(r.device_end_s - r.device_start_s for r in rows)
        out[f"launch_ms_per_{kind}_step"] = mean_ms(r.host_end_s - r.host_start_s for r in rows)
    out["forward_modes"] = {m: sum(r.forward == m for r in records) for m in sorted({r.forward for r in records})}
    gaps = decode_idle_gaps_ms(records)
    out["gpu_idle_between_decode_steps_ms_median"] = statistics.median(gaps) if gaps else None
    all_gaps = idle_gaps_ms(records)
    out["gpu_idle_ms_median"] = statistics.median(all_gaps) if all_gaps else None
    return out

"""The card a run is on, and the GPU spec that prices its roofline.

What you will learn
-------------------
A speed figure read as "x % of the roofline" is a share of one card's ceilings: priced on the
H200's 4.24 TB/s, an H100 run of nano-vllm's workload read 55 %, "not met", where on the H100's own
3.0 TB/s it was about 69 % (2026-12-06, main at 0c49c28). So every benchmark and lesson prices a run
on the card it ran on, found by :func:`this_card`:

* a card of :data:`~paged_edu.core.hardware.GPUS` (matched by the exact name CUDA reports,
  :func:`~paged_edu.core.hardware.gpu_of_device`): its row -- ``spec = "table"``;
* a GPU the table does not hold: its copy ceiling and a large bf16 matmul, measured here, once per
  process (:func:`~paged_edu.core.hardware.measured_gpu`) -- ``spec = "measured"``, said so;
* no GPU (a CPU run, a lesson on a laptop): the H200's row, the card our records come from --
  ``spec = "assumed"``, said so.

A record stores :meth:`RooflineCard.record` (the device's name, the row that priced the roofline
and how it was chosen); a share printed for another card (the cited peers' A800, priced on the
table's A100 80GB) names that card (:meth:`RooflineCard.names`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from paged_edu.core.hardware import GPU, GPUS, gpu_of_device, measured_gpu

__all__ = ["NO_GPU_KEY", "RooflineCard", "roofline_card", "this_card"]

NO_GPU_KEY = "h200"  # the row a run without a GPU is priced on: the card of the committed records


@dataclass(frozen=True, slots=True)
class RooflineCard:
    """The device a run used and the GPU spec that prices its roofline."""

    device_name: str  # torch.cuda.get_device_name(), or "cpu"
    gpu: GPU  # the spec: GPUS' row, a measured one, or the H200's for a CPU run
    spec: str  # "table" | "measured" | "assumed" (no GPU) | "other card" (asked for by key)

    @property
    def label(self) -> str:
        """How tables name it: ``"H100 80GB"``, or what says it is not the run's own card."""
        if self.spec == "table":
            return self.gpu.label
        if self.spec == "measured":
            return f"{self.device_name} (not in the GPU table: its measured copy ceiling and matmul peak)"
        if self.spec == "assumed":
            return f"{self.gpu.label} (assumed: this run had no GPU)"
        return f"{self.gpu.label} (another card than this run's {self.device_name})"

    def names(self, other: GPU) -> str:
        """A share priced on ``other``: its label, marked when it is not this run's card."""
        return other.label if other is self.gpu else f"{other.label} (not this run's card)"

    def record(self) -> dict:
        """What a benchmark's record stores about the card and the roofline's spec."""
        g = self.gpu
        return dict(
            device_name=self.device_name,
            roofline_gpu=g.name,
            roofline_gpu_key=g.key,
            roofline_spec=self.spec,
            roofline_bandwidth=g.hbm_bandwidth,
            roofline_peak_flops=g.peak_flops,
            roofline_source=g.source,
        )


def this_card(device: torch.device | str | None = None) -> RooflineCard:
    """The card ``device`` is (default: CUDA's current device if there is one, else the CPU) and the
    spec that prices its roofline (module docstring). An unknown GPU is measured once per process."""
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        return RooflineCard("cpu", GPUS[NO_GPU_KEY], "assumed")
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_card(index)


def roofline_card(gpu: str | GPU | None = None, device: torch.device | str | None = None) -> RooflineCard:
    """The card a lab prices a run on: ``gpu`` None -- the run's own (:func:`this_card` of ``device``);
    a key of :data:`GPUS` or a :class:`GPU` -- that one (``spec = "other card"`` unless it is the
    run's own)."""
    own = this_card(device)
    if gpu is None:
        return own
    row = GPUS[gpu] if isinstance(gpu, str) else gpu
    return own if row == own.gpu else RooflineCard(own.device_name, row, "other card")


@cache
def _cuda_card(index: int) -> RooflineCard:
    name = torch.cuda.get_device_name(index)
    row = gpu_of_device(name)
    if row is not None:
        return RooflineCard(name, row, "table")
    return RooflineCard(name, _measure(index, name), "measured")


def _measure(index: int, name: str) -> GPU:
    """Copy ceiling (an eager 512 MiB device copy) and bf16 matmul peak (8192^3), median of 20 runs."""
    from paged_edu.labs.timing import Timer, copy_ceiling_us

    with torch.cuda.device(index):
        timer = Timer(reps=20, warmup=3)
        nbytes = 512 * 2**20
        copy_bw = 2 * nbytes / (copy_ceiling_us(timer, nbytes) * 1e-6)  # read + write
        n = 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        flops = 2 * n**3 / (timer.events(lambda: a @ b) * 1e-6)
        a = b = timer = None  # give the 384 MiB back (the lambda above holds the names)
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(index).total_memory
    return measured_gpu(name, total, copy_bw, flops)

"""The stored measurements the lessons read, shipped inside the package so that a pip install (and
Colab, whose install cell is one) runs every lesson: H200 runs that a CPU shows instead of measuring.

    from paged_edu import data
    data.load_json("kernel_bench.json")

* ``kernel_bench.json`` -- ``benchmarks/bench_kernels.py`` (lessons 4 and 7);
* ``kernel_sweep.json`` -- ``benchmarks/bench_kernels.py --sweep`` (lessons 4 and 7);
* ``engine_bench.json`` -- ``benchmarks/bench_engine.py`` (lessons 5 and 7);
* ``engine_bench_before_fused_kernels.json`` -- the same benchmark before the runner's speed work (the batch
  built by numpy in one pinned buffer, sampling on the device, fused Triton kernels for the per-token ops;
  lesson 5; its log is ``benchmarks/records/h200/engine_bench_before_fused_kernels_log.txt``);
* ``oom_child.json`` -- lesson 6's ``cuda_oom_child`` runs on the H200 (lesson 6).
* ``layer_bench.json`` -- ``benchmarks/bench_layer.py --sweep-decode`` on the H200 (lessons 5 and 9).
* ``speed_ladder_h200.json``, ``speed_ladder_h100.json`` -- ``benchmarks/bench_ladder.py`` on each card
  (lesson 9 shows the one of the card it runs on, the H200's on a CPU; a card without one is said so).
* ``peer_kernels.json`` -- vLLM's and SGLang's decode kernels and torch SDPA's prefill measured beside ours
  on the H200 and an H100, cited from the project's GPU guide (lesson 10).

Files are read through :mod:`importlib.resources`, so they work from a wheel as from a checkout;
the benchmarks write them into a checkout's ``paged_edu/data/``.
"""

from __future__ import annotations

import json
from importlib import resources

__all__ = ["load_json", "names", "path"]


def names() -> list[str]:
    """The stored files, sorted."""
    return sorted(f.name for f in resources.files(__name__).iterdir() if f.name.endswith(".json"))


def path(name: str) -> resources.abc.Traversable:
    """The stored file ``name`` (``"kernel_bench.json"`` ...); ``FileNotFoundError`` naming the files
    there are when it is not one of them."""
    found = resources.files(__name__) / name
    if not found.is_file():
        raise FileNotFoundError(f"paged_edu.data has no {name!r}; it stores {', '.join(names())}")
    return found


def load_json(name: str):
    """The stored JSON file ``name``, parsed."""
    return json.loads(path(name).read_text(encoding="utf-8"))

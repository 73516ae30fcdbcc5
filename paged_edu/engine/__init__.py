"""Continuous batching on a real model (lessons 5-6).

* :mod:`~paged_edu.engine.sequence` -- one request's state as the scheduler sees it;
* :mod:`~paged_edu.engine.scheduler` -- continuous batching, chunked prefill, prefix hits,
  preemption by recompute or swap; plain Python, shared with the simulator;
* :mod:`~paged_edu.engine.sampling` -- seeded, batch-independent sampling;
* :mod:`~paged_edu.engine.engine` -- the ``Engine``: scheduler + model + paged KV cache.

The scheduler and sequence need no torch (the simulator uses them); the engine's torch-side names
load on first use.
"""

_LAZY = {
    "Engine": "paged_edu.engine.engine",
    "RequestMetrics": "paged_edu.engine.engine",
    "RequestOutput": "paged_edu.engine.engine",
    "StepMetrics": "paged_edu.engine.engine",
    "SamplingParams": "paged_edu.engine.sampling",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'paged_edu.engine' has no attribute {name!r}")


__all__ = list(_LAZY)

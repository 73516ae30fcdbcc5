"""Continuous batching on a real model (lessons 5-6).

* :mod:`~paged_edu.engine.sequence` -- one request's state as the scheduler sees it;
* :mod:`~paged_edu.engine.scheduler` -- continuous batching, chunked prefill, prefix hits,
  preemption by recompute or swap; plain Python, shared with the simulator, with its parts:
  :mod:`~paged_edu.engine.memory_manager` (the ``MemoryManager`` protocol it drives),
  :mod:`~paged_edu.engine.admission` (can a request ever fit), :mod:`~paged_edu.engine.swap` (the CPU
  swap space, one owner) and :mod:`~paged_edu.engine.scheduler_output` (what one step schedules);
* :mod:`~paged_edu.engine.sampling` -- seeded, batch-independent sampling;
* :mod:`~paged_edu.engine.runner` -- the model runner: batch preparation and CUDA graphs;
* :mod:`~paged_edu.engine.requests` -- is a request servable (checked before it is queued);
* :mod:`~paged_edu.engine.outputs` -- what the engine hands back: outputs and metrics;
* :mod:`~paged_edu.engine.engine` -- the ``Engine``: scheduler + runner + paged KV cache;
* :mod:`~paged_edu.engine.offline` -- ``run`` / ``generate`` / ``chat`` over a batch of prompts.

The scheduler and sequence need no torch (the simulator uses them); the engine's torch-side names
load on first use.
"""

_LAZY = {
    "Engine": "paged_edu.engine.engine",
    "RequestMetrics": "paged_edu.engine.outputs",
    "RequestOutput": "paged_edu.engine.outputs",
    "StepFailed": "paged_edu.engine.engine",
    "StepMetrics": "paged_edu.engine.outputs",
    "SamplingParams": "paged_edu.engine.sampling",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'paged_edu.engine' has no attribute {name!r}")


__all__ = list(_LAZY)

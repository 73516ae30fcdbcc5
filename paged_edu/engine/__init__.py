"""Continuous batching on a real model (lessons 5-6): the scheduler of :mod:`paged_edu.sched` driving
a :class:`~paged_edu.models.llama.PagedLlama` over the paged KV cache.

* :mod:`~paged_edu.engine.sampling` -- seeded, batch-independent sampling;
* :mod:`~paged_edu.engine.batch` -- one step's model inputs from the scheduler's output;
* :mod:`~paged_edu.engine.runner` -- the model runner: batch preparation and CUDA graphs;
* :mod:`~paged_edu.engine.requests` -- is a request servable (checked before it is queued);
* :mod:`~paged_edu.engine.outputs` -- what the engine hands back: outputs and metrics;
* :mod:`~paged_edu.engine.engine` -- the ``Engine``: scheduler + runner + paged KV cache, with
  ``run`` / ``generate`` / ``chat`` over a batch of prompts;
* :mod:`~paged_edu.engine.overlap` -- async scheduling: the host one step ahead of the device;
* :mod:`~paged_edu.engine.faults` -- faults injected into a step's phases (the fault tests, the soak).

The torch-side names load on first use. Above: the labs, views and lessons that drive an engine.
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

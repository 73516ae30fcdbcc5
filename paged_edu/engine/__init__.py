"""Continuous batching on a real model (lessons 5-6): the scheduler of :mod:`paged_edu.sched` driving
a :class:`~paged_edu.models.llama.PagedLlama` over the paged KV cache.

* :mod:`~paged_edu.engine.engine` -- the ``Engine``: scheduler + runner + paged KV cache, with
  ``add_request`` / ``step`` / ``abort_request`` and ``run`` / ``generate`` / ``chat`` over a batch of prompts;
* :mod:`~paged_edu.engine.config` -- ``EngineConfig`` and its ``KernelConfig``: every setting, checked once;
* :mod:`~paged_edu.engine.step` -- one step's six named phases, run in order by the engine;
* :mod:`~paged_edu.engine.overlap` -- async scheduling: the same phases with the host one step ahead;
* :mod:`~paged_edu.engine.requests` -- is a request servable (checked before it is queued);
* :mod:`~paged_edu.engine.sampling` -- seeded, batch-independent sampling: a step's sampling planned,
  drawn on the device and regrouped by sequence;
* :mod:`~paged_edu.engine.batch` -- one step's flat ``StepBatch`` from the scheduler's output, and
  its staging in one host-to-device copy;
* :mod:`~paged_edu.engine.input_batch` -- the persistent input batch: the decode batch kept across steps,
  written where it changes;
* :mod:`~paged_edu.engine.runner` -- the model runner: block copies, staging, the forward pass, the draw;
* :mod:`~paged_edu.engine.cuda_graphs` -- captured CUDA graphs for decode and mixed steps;
* :mod:`~paged_edu.engine.outputs` -- what the engine hands back: outputs and metrics;
* :mod:`~paged_edu.engine.timeline` -- host and device intervals per step (``record_timeline=True``);
* :mod:`~paged_edu.engine.faults` -- faults injected into a step's phases (the fault tests, the soak).

The torch-side names load on first use. Above: the labs, views and lessons that drive an engine.
"""

_LAZY = {
    "Engine": "paged_edu.engine.engine",
    "EngineConfig": "paged_edu.engine.config",
    "KernelConfig": "paged_edu.engine.config",
    "RequestMetrics": "paged_edu.engine.outputs",
    "RequestOutput": "paged_edu.engine.outputs",
    "StepFailed": "paged_edu.engine.step",
    "StepMetrics": "paged_edu.engine.outputs",
    "SamplingParams": "paged_edu.engine.sampling",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'paged_edu.engine' has no attribute {name!r}")


__all__ = list(_LAZY)

"""paged_edu: PagedAttention you can see, poke and measure.

The package is built in layers, each importing only the ones before it (``tests/project/test_layers.py``
keeps it so); the first four are plain Python, no torch:

* :mod:`paged_edu.data` -- the stored H200 measurements the lessons show on a CPU (package data);
* :mod:`paged_edu.core` -- what a token costs, the model and GPU tables, the contiguous baseline,
  the paged block allocator and the radix cache, the allocator contract (lessons 1-3, 8);
* :mod:`paged_edu.sched` -- the scheduler, shared by the engine and the simulator (lessons 5-6);
* :mod:`paged_edu.sim` -- the serving simulator (lessons 7-8);
* :mod:`paged_edu.kernels` -- paged attention: the PyTorch oracle and the Triton kernels (lesson 4);
* :mod:`paged_edu.cache` -- the paged KV cache on real tensors (lessons 2-3);
* :mod:`paged_edu.models` and :mod:`paged_edu.engine` -- a Llama-family model on the paged cache and
  continuous batching (lessons 5-6);
* :mod:`paged_edu.serve` -- the engine behind OpenAI's API over HTTP, vLLM's metrics and KV events,
  and a client that measures any such server (lesson 11);
* :mod:`paged_edu.labs` -- the experiments and widget models the lessons and views run (lessons 1-9);
* :mod:`paged_edu.viz` -- figures and widgets, views only;
* :mod:`paged_edu.lessons` -- notebook glue: set-up, exercises, lesson 8's tables;
* :mod:`paged_edu.cli` -- ``paged-edu simulate``, ``figures-sim``, ``serve`` and ``bench-serve``.
"""

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.block_events import BlockEvent
from paged_edu.core.block_pool import OutOfBlocksError
from paged_edu.core.seq_lookup import UnknownSequenceError
from paged_edu.core.contiguous import ContiguousAllocator, FragmentationError
from paged_edu.core.hardware import GPUS, MODELS, ModelGeometry
from paged_edu.sched.scheduler import Scheduler
from paged_edu.sched.sequence import Sequence

# Modules that import torch (or plotly) load on first use, so the allocator stays light.
_LAZY = {
    "PagedKVCache": "paged_edu.cache.kv_cache",
    "paged_attention_decode": "paged_edu.kernels",
    "paged_attention_prefill": "paged_edu.kernels",
    "PagedLlama": "paged_edu.models.llama",
    "load_smollm2": "paged_edu.models.loaders",
    "random_llama": "paged_edu.models.loaders",
    "smollm2_config": "paged_edu.models.config",
    "Engine": "paged_edu.engine",
    "SamplingParams": "paged_edu.engine.sampling",
    "simulate": "paged_edu.sim.simulator",
    "compare": "paged_edu.sim.compare",
    "SimConfig": "paged_edu.sim.results",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'paged_edu' has no attribute {name!r}")


__all__ = [
    "BlockAllocator",
    "BlockEvent",
    "ContiguousAllocator",
    "FragmentationError",
    "OutOfBlocksError",
    "GPUS",
    "MODELS",
    "ModelGeometry",
    "Scheduler",
    "Sequence",
    "UnknownSequenceError",
    *_LAZY,
]
__version__ = "0.1.0"

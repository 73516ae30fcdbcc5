"""paged_edu: PagedAttention you can see, poke and measure.

The package reads like the course's table of contents:

* :mod:`paged_edu.core` -- what a token costs, the contiguous baseline, the paged block allocator
  and the seed's allocator (lessons 1-3; plain Python, no torch);
* :mod:`paged_edu.cache` -- the paged KV cache on real tensors (lessons 2-3);
* :mod:`paged_edu.kernels` -- paged attention: the seed's loop, the PyTorch oracle, Triton (lesson 4);
* :mod:`paged_edu.models` and :mod:`paged_edu.engine` -- a Llama-family model on the paged cache and
  continuous batching (lessons 5-6);
* :mod:`paged_edu.sim` -- the serving simulator and ``paged-edu simulate`` (lesson 7; no torch);
* :mod:`paged_edu.viz` -- figures and widgets, views only;
* :mod:`paged_edu.lessons` -- what the notebooks call: set-up, experiments, exercises.
"""

from paged_edu.core.allocator import BlockAllocator, BlockEvent, OutOfBlocksError, UnknownSequenceError
from paged_edu.core.contiguous import ContiguousAllocator, FragmentationError
from paged_edu.core.memory import PRESETS, KVSpec
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
    "SimConfig": "paged_edu.sim.simulator",
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
    "KVSpec",
    "OutOfBlocksError",
    "PRESETS",
    "Scheduler",
    "Sequence",
    "UnknownSequenceError",
    *_LAZY,
]
__version__ = "0.1.0"

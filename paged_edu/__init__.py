"""paged_edu: PagedAttention you can see, poke and measure.

The package reads like the lessons' table of contents:

* :mod:`paged_edu.memory` -- what a token costs in the KV cache, and how much of a reservation is used;
* :mod:`paged_edu.contiguous` -- the contiguous ``L_max`` baseline and its three pathologies;
* :mod:`paged_edu.allocator` -- the paged block allocator: block tables, ref counts, prefix caching,
  copy-on-write (plain Python);
* :mod:`paged_edu.kv_cache` and :mod:`paged_edu.kernels` -- the same block tables driving real tensors
  and a Triton paged-attention kernel;
* :mod:`paged_edu.sequence`, :mod:`paged_edu.scheduler`, :mod:`paged_edu.engine` -- continuous batching
  on a real Llama-family model;
* :mod:`paged_edu.simulator` -- the same scheduler over a cost model, at scales no GPU run affords;
* :mod:`paged_edu.viz` -- widgets and figures, thin views over all of the above.
"""

from paged_edu.allocator import BlockAllocator, BlockEvent, OutOfBlocksError, UnknownSequenceError
from paged_edu.contiguous import ContiguousAllocator, FragmentationError
from paged_edu.memory import PRESETS, KVSpec
from paged_edu.scheduler import Scheduler
from paged_edu.sequence import Sequence

# Modules that import torch (or plotly) load on first use, so the allocator stays light.
_LAZY = {
    "PagedKVCache": "paged_edu.kv_cache",
    "paged_attention_decode": "paged_edu.kernels",
    "paged_attention_prefill": "paged_edu.kernels",
    "PagedLlama": "paged_edu.model",
    "load_smollm2": "paged_edu.model",
    "random_llama": "paged_edu.model",
    "smollm2_config": "paged_edu.model",
    "Engine": "paged_edu.engine",
    "SamplingParams": "paged_edu.sampling",
    "simulate": "paged_edu.simulator",
    "compare": "paged_edu.simulator",
    "SimConfig": "paged_edu.simulator",
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

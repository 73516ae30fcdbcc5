"""The core: what a token costs and where it lives -- plain Python, no torch (lessons 1-3, 8).

* :mod:`~paged_edu.core.hardware` -- the one geometry type (:class:`~paged_edu.core.hardware.ModelGeometry`:
  bytes per token, FLOPs and bytes for the cost model), the one model table and the one GPU table;
* :mod:`~paged_edu.core.memory` -- ``M_KV``, ``eta_naive`` and ``eta_paged`` (lesson 1); :mod:`~paged_edu.core.parallel_kv`
  -- the per-GPU KV under tensor and pipeline parallelism (lesson 8);
* :mod:`~paged_edu.core.contiguous` -- the contiguous ``L_max`` baseline and its three pathologies (lesson 1);
* the paged block allocator (lessons 2-3), in five modules read in this order:
  :mod:`~paged_edu.core.block_hash` (the chained hash that names a full block),
  :mod:`~paged_edu.core.block_pool` (the physical blocks: ref counts, free list),
  :mod:`~paged_edu.core.prefix_index` (the prefix-index interface, and the hash chain behind it),
  :mod:`~paged_edu.core.allocator` (block tables, allocate / append_slots / mark_computed / fork / free,
  copy-on-write) and
  :mod:`~paged_edu.core.block_events` (what it reports to widgets, after each change);
* the radix-tree prefix cache (SGLang's RadixAttention, lesson 8): the same allocator over the same pool
  with a second index, :mod:`~paged_edu.core.radix_tree` (the tree, locks, LRU leaf eviction) and
  :mod:`~paged_edu.core.radix_cache` (``RadixIndex``, ``RadixAllocator``);
  :mod:`~paged_edu.core.seq_lookup` holds what the allocator answers about its sequences;
* :mod:`~paged_edu.core.contract` -- the allocator contract, checked against a brute-force model of
  the KV memory: the oracle of the allocator tests and of exercise 5.3 (lesson 5);
* :mod:`~paged_edu.core.validation` -- the one set of input checks (integers, token lists, seeds);
  :mod:`~paged_edu.core.host_memory` -- the host memory an allocator of ``num_blocks`` blocks takes,
  checked before it is built.

The lowest layer: nothing here imports the rest of the package, so ``pip install paged_edu``
without extras runs it. The seed's defective allocator is lesson material, in :mod:`paged_edu.labs`.
"""

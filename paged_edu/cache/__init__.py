"""The paged KV cache on real tensors (lessons 2-3): the pools ``(num_blocks, block_size,
num_kv_heads, head_dim)`` per layer that the allocator's block tables index
(:mod:`~paged_edu.cache.kv_cache`, with :func:`~paged_edu.cache.kv_cache.store_kv`, the one K/V
store call, by slot mapping), copy-on-write and swap copies on the device, and sizing from a
memory budget (:mod:`~paged_edu.cache.sizing`).

The attention kernels that read these pools live in :mod:`paged_edu.kernels` (lesson 4).
"""

"""The paged KV cache on real tensors (lessons 2-3): the pools ``(num_blocks, block_size,
num_kv_heads, head_dim)`` per layer that the allocator's block tables index, the one K/V store call
(by slot mapping), copy-on-write and swap copies on the device, and sizing from a memory budget.

The attention kernels that read these pools live in :mod:`paged_edu.kernels` (lesson 4).
"""

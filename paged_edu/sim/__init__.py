"""The serving simulator (lesson 7): workloads, a roofline cost model in place of the GPU, memory
managers (contiguous baselines and paged) under the engine's own scheduler, and ``paged-edu simulate``.

Needs no torch: the core install runs it.
"""

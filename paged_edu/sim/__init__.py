"""The serving simulator (lesson 7): the engine's own scheduler and the real allocator, with a
roofline cost model in place of the GPU, and ``paged-edu simulate``.

* :mod:`~paged_edu.sim.request` -- one request and the JSONL trace format;
* :mod:`~paged_edu.sim.workloads` -- ShareGPT/Alpaca-like lengths, Poisson arrivals, shared prefixes, samples;
* :mod:`~paged_edu.sim.costmodel` -- how long one step takes (FLOPs and bytes against a roofline);
* :mod:`~paged_edu.sim.managers` -- the memory managers: contiguous reservations and paged blocks;
* :mod:`~paged_edu.sim.simulator` -- the simulation loop; :mod:`~paged_edu.sim.results` what it measures;
* :mod:`~paged_edu.sim.compare` -- every manager side by side, the table, rate sweeps;
* :mod:`~paged_edu.cli` -- the command line.

Needs no torch: the core install runs it.
"""

"""The serving simulator (lesson 7, and lesson 8's cache comparison): the engine's own scheduler
(:mod:`paged_edu.sched`) and the real allocators (:mod:`paged_edu.core`), with a roofline cost model
in place of the GPU.

* :mod:`~paged_edu.sim.request` -- one request and the JSONL trace format;
* :mod:`~paged_edu.sim.arrivals` -- Poisson arrival times and the bounds every workload shares;
* :mod:`~paged_edu.sim.workloads` -- ShareGPT/Alpaca-like lengths, shared system prompts, parallel
  samples; :mod:`~paged_edu.sim.prefix_workloads` -- multi-turn, few-shot and agent-tree prefixes;
* :mod:`~paged_edu.sim.costmodel` -- how long one step takes (FLOPs and bytes against a roofline),
  with :mod:`~paged_edu.sim.block_cost` (the per-block kernel cost fitted from a benchmark);
* :mod:`~paged_edu.sim.managers` -- the memory managers: contiguous reservations and paged blocks;
* :mod:`~paged_edu.sim.simulator` -- the simulation loop; :mod:`~paged_edu.sim.results` what it measures;
* :mod:`~paged_edu.sim.compare` -- every manager side by side, the table, rate sweeps.

Needs no torch (it imports only core and sched): the core install runs it. The command line is
:mod:`paged_edu.cli`.
"""

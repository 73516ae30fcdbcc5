"""The experiments and widget models that lessons and views run: each takes stated inputs, runs the
library below (core, sched, sim, kernels, cache, models, engine) and returns plain numbers, tensors
or records that a lesson prints and a view draws.

* lessons 1-3: :mod:`~paged_edu.labs.experiments` (memory, addresses, copy-on-write on real K/V),
  :mod:`~paged_edu.labs.utilisation` (lesson 2's utilisation and how many requests fit, on a real
  allocator), :mod:`~paged_edu.labs.side_channel` (lesson 3's prefix-cache timing side channel, and
  cache salts),
  :mod:`~paged_edu.labs.toy_kv` (prefix-dependent toy K/V), :mod:`~paged_edu.labs.kv_view` (the
  tensors behind the block-table widgets), :mod:`~paged_edu.labs.seed_allocator` and
  :mod:`~paged_edu.labs.seed_defects` (the seed's allocator, kept with its defects, run on tensors);
* lesson 4: :mod:`~paged_edu.labs.softmax_stepper` (online softmax block by block, the stepper's
  model), :mod:`~paged_edu.labs.seed_kernel` (the seed's kernel as written, and its fix),
  :mod:`~paged_edu.labs.kernel_ladder` (loop -> torch -> Triton, split-KV), :mod:`~paged_edu.labs.timing`
  (how kernels are timed, shared with the benchmarks), :mod:`~paged_edu.labs.triton_decode_packed`
  (the whole-row decode experiment);
* lesson 5: :mod:`~paged_edu.labs.engine_lab` (the model, the transformers oracle, an engine on any
  allocator), :mod:`~paged_edu.labs.batching` (static against continuous batching, step phases);
* lesson 6: :mod:`~paged_edu.labs.preemption` (an engine under memory pressure),
  :mod:`~paged_edu.labs.troubleshooting` (the warm-up OOM case);
* lesson 7: :mod:`~paged_edu.labs.benchmark_table` (the paper's table, filled by the simulator),
  :mod:`~paged_edu.labs.paper_figures` (the simulations behind the paper's figures),
  :mod:`~paged_edu.labs.sim_vs_real` (simulator against the engine);
* lesson 8: :mod:`~paged_edu.labs.serving_flags` (a ``vllm serve`` command line read),
  :mod:`~paged_edu.labs.cache_compare` (hash chain against radix tree, FCFS against LPM),
  :mod:`~paged_edu.labs.cache_contents` (the prefix cache rebuilt from its store / evict / clear events);
* lesson 9: :mod:`~paged_edu.labs.timed_run` (a timed engine run: warm-up, the timed window, the
  roofline of the same steps -- what ``bench_engine`` times with too), :mod:`~paged_edu.labs.speed_ladder`
  (one engine option per rung), :mod:`~paged_edu.labs.step_timeline` (the step-timeline model that
  predicts the ladder from its parts), :mod:`~paged_edu.labs.card` (the card a run is on, and the GPU
  spec that prices its roofline: every benchmark's and lesson's);
* lesson 10: :mod:`~paged_edu.labs.tile_plan` (which key tiles a paged prefill program reads);
* lesson 11: :mod:`~paged_edu.labs.serving` (a live server read through its metrics and KV events, the
  simulator beside it).

Nothing here draws (that is :mod:`paged_edu.viz`) and nothing here is notebook glue (that is
:mod:`paged_edu.lessons`).
"""

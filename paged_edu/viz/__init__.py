"""Views over the library, and nothing else (every lesson draws with them):

* plotly figures, pure functions of library state or of what :mod:`paged_edu.labs` measured:
  :mod:`~paged_edu.viz.figures` (lessons 1-3 and the shared layout) and its parts
  :mod:`~paged_edu.viz.memory_figures` (lessons 1-2), :mod:`~paged_edu.viz.tensor_figures` (lesson 3),
  :mod:`~paged_edu.viz.kernel_figures` (lesson 4), :mod:`~paged_edu.viz.engine_figures` (lesson 5),
  :mod:`~paged_edu.viz.sim_figures` (lesson 7), :mod:`~paged_edu.viz.cache_figures` (lesson 8),
  :mod:`~paged_edu.viz.speed_figures` (lesson 9), :mod:`~paged_edu.viz.kernel_maps` (lesson 10), all in the
  colours of :mod:`~paged_edu.viz.palette`;
* live widgets (:mod:`~paged_edu.viz.widgets`, lessons 1-3: thin views whose callbacks drive library
  objects, so every callback is testable headless);
* the explorers of lessons 4-10: :mod:`~paged_edu.viz.softmax_stepper`, :mod:`~paged_edu.viz.engine_dashboard`,
  :mod:`~paged_edu.viz.preemption_explorer`, :mod:`~paged_edu.viz.sim_explorer`,
  :mod:`~paged_edu.viz.flags_explorer`, :mod:`~paged_edu.viz.cache_contents`,
  :mod:`~paged_edu.viz.overlap_explorer`, :mod:`~paged_edu.viz.step_timeline_explorer` (lesson 9; lesson 10's tile plan
  is in ``kernel_maps``);
* lesson 11's views of a live server: :mod:`~paged_edu.viz.serving_views` (the router's view of its
  prefix cache, the inter-token-latency histogram).

Everything below (core, sched, sim, kernels, cache, models, engine, labs) is used here; nothing
below imports viz, and viz imports nothing from :mod:`paged_edu.lessons`.
"""

"""Views over the library, and nothing else (every lesson draws with them): plotly figures
(:mod:`~paged_edu.viz.figures` and its parts -- memory, tensors, kernels, the engine, the simulator,
the cache comparison -- pure functions of library state or of what :mod:`paged_edu.labs` measured),
live widgets (:mod:`~paged_edu.viz.widgets`, lessons 1-3: thin views whose callbacks drive library
objects, so every callback is testable headless) and the explorers of lessons 4-8
(:mod:`~paged_edu.viz.softmax_stepper`, :mod:`~paged_edu.viz.engine_dashboard`,
:mod:`~paged_edu.viz.preemption_explorer`, :mod:`~paged_edu.viz.sim_explorer`,
:mod:`~paged_edu.viz.flags_explorer`, :mod:`~paged_edu.viz.cache_contents`).

Everything below (core, sched, sim, kernels, cache, models, engine, labs) is used here; nothing
below imports viz, and viz imports nothing from :mod:`paged_edu.lessons`.
"""

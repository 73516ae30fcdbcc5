"""Views over the library, and nothing else: plotly figures (:mod:`~paged_edu.viz.figures`, pure
functions of library state), live widgets (:mod:`~paged_edu.viz.widgets`, thin views whose callbacks
drive library objects, so every callback is testable headless) and the simulator's figures.

Everything below (core, cache, kernels, engine, sim) is used here; nothing below imports viz.
"""

"""Views over the library: plotly figures (:mod:`~paged_edu.viz.figures`, pure functions of library
state) and live widgets (:mod:`~paged_edu.viz.widgets`, thin views whose callbacks drive it).

The package depends on the core (allocator, memory model, KV cache); the core never imports it.
"""

from paged_edu.viz import figures
from paged_edu.viz.kv_view import KVView, default_dtype, pick_device

__all__ = ["figures", "KVView", "default_dtype", "pick_device"]

"""Live widgets: thin views whose callbacks drive the library.

Every widget keeps its state in ``paged_edu`` objects (a :class:`BlockAllocator`, a paged KV
cache) and redraws plotly ``FigureWidget``s from them with the pure functions of
:mod:`paged_edu.viz.figures`. Each button or slider callback is also a plain method
(``add_request``, ``append_tokens``, ``fork``, ``free``, ``pick``, ``set_preset`` ...), so tests and
notebooks can drive a widget headless; ``widget.ui`` is what a notebook displays. One module per widget:

* :class:`KVMemoryCalculator` (:mod:`.calculator`, lesson 1) -- bytes per token, per request, how many fit.
* :class:`BlockTableWidget` (:mod:`.block_table`, lesson 2) -- requests come and go; blocks, tables, addresses.
* :class:`PrefixSharingWidget` (:mod:`.prefix_sharing`, lesson 3) -- shared system prompts; fork; CoW; evict.

:mod:`.base` holds what they share (``_AllocatorView``, ``_figure_widget``, ``_update_heatmap``);
:mod:`.figure` the ``FigureWidget`` every widget draws into, made safe to load on a slow page.
"""

from paged_edu.viz.widgets.base import _AllocatorView, _figure_widget, _update_heatmap  # noqa: F401
from paged_edu.viz.widgets.block_table import BlockTableWidget
from paged_edu.viz.widgets.calculator import GPU_MEMORY, PARAMS, KVMemoryCalculator
from paged_edu.viz.widgets.prefix_sharing import PrefixSharingWidget

__all__ = ["GPU_MEMORY", "PARAMS", "BlockTableWidget", "KVMemoryCalculator", "PrefixSharingWidget"]

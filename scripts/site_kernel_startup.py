"""IPython start-up file for the kernels that execute lessons headless (scripts/run_lessons.py puts
it in a throw-away IPYTHONDIR; a learner's kernel never runs it), whose copies the website renders.

A plotly ``FigureWidget`` sends each later change (``batch_update``, restyle) to the browser as a
one-off message, so the widget state that papermill saves still holds the figure as it was first
shown. After every cell this copies each FigureWidget's current figure into the two traits that
the saved state records -- what plotly's own ``FigureWidget._repr_mimebundle_`` does on display --
so the site's static view of a widget shows its plot as the run left it.
"""

import copy
import weakref

from IPython import get_ipython
from ipywidgets import Widget

_figure_widgets = weakref.WeakValueDictionary()  # id -> FigureWidget (it is not hashable)


def _remember(widget) -> None:
    # called while the widget is being constructed, before plotly has set up its figure
    if hasattr(type(widget), "_widget_data") and hasattr(type(widget), "_widget_layout"):  # plotly's FigureWidget
        _figure_widgets[id(widget)] = widget


def _save_figures(*_) -> None:
    for widget in list(_figure_widgets.values()):
        if getattr(widget, "_layout_obj", None) is None:
            continue
        widget._widget_layout = copy.deepcopy(widget._layout_obj._props)
        widget._widget_data = copy.deepcopy(widget._data)


Widget.on_widget_constructed(_remember)
get_ipython().events.register("post_run_cell", _save_figures)

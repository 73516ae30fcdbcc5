"""The figure every widget draws into: plotly's ``FigureWidget``, made safe to load on a slow page.

plotly's ``FigureWidget`` is an anywidget whose front-end module is plotly.js itself (about 5 MB,
``plotly/package_data/widgetbundle.js``), compiled anew for every figure on the page. anywidget
(0.11) gives a model 2 s from its creation to load its module and run ``initialize``; past that it
rejects the model's ready promise, and every later message from the kernel to that model is
dropped for good (console: ``[anywidget] Failed to initialize model.``). plotly sends a figure's
traces in such a message (the model opens with ``_widget_data = []``), so on a busy machine a
figure stays empty and stops following its widget -- a failure seen in lesson 2.

:class:`FigureWidget` changes two things and keeps plotly's own front end:

* its module is a small loader: ``initialize`` returns at once (well inside anywidget's deadline),
  and plotly's bundle (the ``_plotly_esm`` trait) is imported once a page, when a first view is
  drawn, outside the deadline;
* after every change plotly sends as a one-off message (``_py2js_*``), the synced state
  (``_widget_data``, ``_widget_layout``) is set to the figure as it now is, so a view drawn later,
  or by a front-end model that saw none of those messages, still draws the current figure.
"""

from __future__ import annotations

import copy
from pathlib import Path

import plotly
import plotly.graph_objects as go
import traitlets

__all__ = ["PLOTLY_WIDGET_BUNDLE", "FigureWidget"]

PLOTLY_WIDGET_BUNDLE = Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"

# One plotly import a page (globalThis), one plotly widget (its model listeners) per figure model.
_LOADER_ESM = """
function plotlyWidgetModule(model) {
  globalThis.__paged_edu_plotly_widget ??= import(URL.createObjectURL(
    new Blob([model.get("_plotly_esm")], { type: "text/javascript" })));
  return globalThis.__paged_edu_plotly_widget;
}
export default () => {
  let figureModel;  // the model handed to initialize
  let plotlyWidget;  // a promise of plotly's widget for this model, made at its first view
  return {
    initialize({ model }) { figureModel = model; },
    async render({ el }) {
      plotlyWidget ??= plotlyWidgetModule(figureModel).then((mod) => {
        const widget = mod.default();
        widget.initialize({ model: figureModel });
        return widget;
      });
      return (await plotlyWidget).render({ el });
    },
  };
};
"""

_ONE_OFF_MESSAGES = (
    "_py2js_addTraces",
    "_py2js_restyle",
    "_py2js_relayout",
    "_py2js_update",
    "_py2js_animate",
    "_py2js_deleteTraces",
    "_py2js_moveTraces",
    "_py2js_removeLayoutProps",
    "_py2js_removeTraceProps",
)


class FigureWidget(go.FigureWidget):
    """plotly's ``FigureWidget`` with a loader that meets anywidget's deadline and a synced state
    that always holds the current figure (see the module's docstring)."""

    _esm = _LOADER_ESM
    _plotly_esm = traitlets.Unicode(PLOTLY_WIDGET_BUNDLE.read_text(encoding="utf-8")).tag(sync=True)

    @traitlets.observe(*_ONE_OFF_MESSAGES)
    def _state_follows(self, change) -> None:
        if change["new"] is None:  # plotly sends a message, then resets it: the figure has changed
            self._widget_layout = copy.deepcopy(self._layout_obj._props)
            self._widget_data = copy.deepcopy(self._data)

"""What a lesson's outputs become on the course website (used by scripts/build_site.py).

A plotly figure becomes ``<div class="plotly-figure">`` holding its JSON, drawn in the page by the
site's own copy of plotly.js (``scripts/site/_static/plotly-figures.js``): interactive without a
kernel. A widget needs a kernel to be live, so it becomes a static view of the state it had at the
end of the run -- boxes laid out, HTML values, plotly FigureWidgets drawn as figures, buttons,
sliders and dropdowns greyed out with their values -- under a note saying to run the lesson to
interact; a widget without saved state gets the note alone, never a broken placeholder. A progress
bar (tqdm's notebook bar is an HBox holding a FloatProgress) is left out: it meant something only
while the run was going.
"""

from __future__ import annotations

import html
import json

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
RUN_IT = "run the lesson (Open in Colab, or JupyterLab) to interact"


def plotly_html(spec: dict) -> str:
    """A figure as a ``<div class="plotly-figure">`` with its JSON (drawn by plotly-figures.js)."""
    text = json.dumps(spec, separators=(",", ":")).replace("</", "<\\/")
    return f'<div class="plotly-figure"><script type="application/json">{text}</script></div>'


def _label(state: dict) -> str:
    return html.escape(state.get("description") or "")


def widget_html(model_id: str, models: dict) -> str:
    """A static view of one widget from its saved state: boxes laid out, HTML and plots as they
    were at the end of the run, controls shown greyed out."""
    model = models.get(model_id)
    if model is None:
        return ""
    name, state = model["model_name"], model["state"]
    children = [c.removeprefix("IPY_MODEL_") for c in state.get("children", [])]
    if name in ("VBoxModel", "BoxModel", "GridBoxModel", "TabModel", "AccordionModel", "StackModel"):
        return '<div class="vbox">' + "".join(widget_html(c, models) for c in children) + "</div>"
    if name == "HBoxModel":
        return '<div class="hbox">' + "".join(widget_html(c, models) for c in children) + "</div>"
    if name in ("HTMLModel", "HTMLMathModel"):
        return f"<div>{state.get('value', '')}</div>"
    if name == "LabelModel":
        return f"<span>{html.escape(str(state.get('value', '')))}</span>"
    if name == "ButtonModel":
        return f'<button type="button" disabled>{_label(state)}</button>'
    if name == "ToggleButtonsModel":
        chosen = state.get("index")
        buttons = "".join(
            f'<button type="button" disabled{" class=chosen" if i == chosen else ""}>'
            f"{'&#10003; ' if i == chosen else ''}{html.escape(str(o))}</button>"
            for i, o in enumerate(state.get("_options_labels", []))
        )
        return f"<span>{_label(state)} {buttons}</span>"
    if name in ("DropdownModel", "SelectModel", "RadioButtonsModel"):
        chosen = state.get("index")
        options = "".join(
            f"<option{' selected' if i == chosen else ''}>{html.escape(str(o))}</option>"
            for i, o in enumerate(state.get("_options_labels", []))
        )
        return f"<label>{_label(state)} <select disabled>{options}</select></label>"
    if name.endswith("SliderModel") and not isinstance(state.get("value"), list):
        return (
            f'<label>{_label(state)} <input type="range" disabled min="{state.get("min", 0)}" '
            f'max="{state.get("max", 100)}" step="{state.get("step", 1)}" value="{state.get("value", 0)}"> '
            f"{html.escape(str(state.get('value', '')))}</label>"
        )
    if name == "CheckboxModel":
        return (
            f'<label><input type="checkbox" disabled{" checked" if state.get("value") else ""}> {_label(state)}</label>'
        )
    if name in ("TextModel", "IntTextModel", "FloatTextModel", "BoundedIntTextModel", "BoundedFloatTextModel"):
        return f'<label>{_label(state)} <input disabled value="{html.escape(str(state.get("value", "")))}"></label>'
    if name == "OutputModel":
        return "".join(output_html(o) for o in state.get("outputs", []))
    if "_widget_data" in state:  # plotly's FigureWidget (an anywidget)
        return plotly_html(
            {
                "data": state["_widget_data"],
                "layout": state.get("_widget_layout", {}),
                "config": state.get("_config", {}),
            }
        )
    return ""


PROGRESS_MODELS = ("FloatProgressModel", "IntProgressModel")


def is_progress_bar(model_id: str, models: dict) -> bool:
    """Whether the widget is, or holds, a progress bar (tqdm's notebook bar, a download bar)."""
    model = models.get(model_id)
    if model is None:
        return False
    children = [c.removeprefix("IPY_MODEL_") for c in model["state"].get("children", [])]
    return model["model_name"] in PROGRESS_MODELS or any(is_progress_bar(c, models) for c in children)


def output_html(output: dict) -> str:
    """One output captured inside a widget (an ``Output`` widget) as HTML."""
    if output.get("output_type") == "stream":
        return f"<pre>{html.escape(''.join(output.get('text', '')))}</pre>"
    data = output.get("data", {})
    if PLOTLY_MIME in data:
        return plotly_html(data[PLOTLY_MIME])
    if "text/html" in data:
        return "".join(data["text/html"])
    if "image/png" in data:
        return f'<img alt="output" src="data:image/png;base64,{data["image/png"]}">'
    if "text/plain" in data:
        return f"<pre>{html.escape(''.join(data['text/plain']))}</pre>"
    return ""


def site_outputs(outputs: list, models: dict) -> list:
    """The outputs as the site shows them: plotly as plotly-figure divs, widgets as static views,
    progress bars left out."""
    shown = []
    for output in outputs:
        data = output.get("data", {})
        if WIDGET_VIEW_MIME in data and is_progress_bar(data[WIDGET_VIEW_MIME].get("model_id", ""), models):
            continue
        if PLOTLY_MIME in data:
            output = {
                "output_type": "display_data",
                "metadata": {},
                "data": {"text/html": plotly_html(data[PLOTLY_MIME])},
            }
        elif WIDGET_VIEW_MIME in data:
            view = widget_html(data[WIDGET_VIEW_MIME].get("model_id", ""), models)
            note = (
                f'<div class="note">A live widget, shown as it was at the end of the run; {RUN_IT}.</div>'
                if view
                else f'<div class="note">A live widget: {RUN_IT}.</div>'
            )
            output = {
                "output_type": "display_data",
                "metadata": {},
                "data": {"text/html": f'<div class="widget-snapshot">{note}{view}</div>'},
            }
        shown.append(output)
    return shown

"""The one colour palette of every figure and widget: colour-blind safe, one meaning per colour.

Sequences are told apart by the Okabe-Ito palette (Okabe & Ito, "Color Universal Design", 2008;
the set Wong recommends in Nature Methods 8:441, 2011), which stays distinguishable under the
common colour-vision deficiencies. Its sky blue is kept out of the sequence colours because pale
blue means *evictable*; block states are greys and one pale blue, separated by lightness, so they
never look like a sequence:

=============  =========  ===================================================
name           colour     meaning
=============  =========  ===================================================
``FREE``       near white a free slot or block: holds nothing reusable
``IDLE``       mid grey   contiguous baseline: reserved for a request, no token
``EVICTABLE``  pale blue  ref count 0, but its K/V are still in the prefix cache
``SHARED``     near black a block in several block tables (``ref_count > 1``)
=============  =========  ===================================================

``GOOD`` / ``BAD`` mark a check that passed / failed (bluish green / vermillion, never red/green),
``ACCENT`` a chosen point, ``NEUTRAL`` a baseline line. ``DIVERGING`` is the colour scale of
signed values (K/V heat-maps), blue-white-orange; ``SEQUENTIAL`` the scale of a magnitude that is
worse the larger it is (a stall in steps), blue-orange-vermillion. Text, outlines and reference
lines are ``SHARED`` (near black) or ``NEUTRAL``; a background is white.
"""

from __future__ import annotations

__all__ = [
    "ACCENT",
    "BAD",
    "CODES",
    "COLORSCALE",
    "DIVERGING",
    "EVICTABLE",
    "FREE",
    "GOOD",
    "IDLE",
    "NEUTRAL",
    "OKABE_ITO",
    "OwnerColors",
    "SEQ0",
    "SEQUENTIAL",
    "SEQ_COLORS",
    "SHARED",
    "STATE_LABELS",
    "code_heatmap",
    "legend_traces",
    "series_color",
    "text_color",
]

OKABE_ITO = {
    "orange": "#E69F00",
    "sky blue": "#56B4E9",
    "bluish green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish purple": "#CC79A7",
    "black": "#000000",
}

SEQ_COLORS = (
    OKABE_ITO["orange"],
    OKABE_ITO["blue"],
    OKABE_ITO["bluish green"],
    OKABE_ITO["reddish purple"],
    OKABE_ITO["vermillion"],
    OKABE_ITO["yellow"],
)

FREE = "#F2F2F2"
IDLE = "#9E9E9E"
EVICTABLE = "#C6E2F5"
SHARED = "#262626"
STATE_LABELS = {
    FREE: "free",
    IDLE: "reserved but idle",
    EVICTABLE: "evictable (cached, ref count 0)",
    SHARED: "shared (ref count > 1)",
}

GOOD = OKABE_ITO["bluish green"]
BAD = OKABE_ITO["vermillion"]
ACCENT = OKABE_ITO["vermillion"]
NEUTRAL = "#666666"
DIVERGING = [[0.0, OKABE_ITO["blue"]], [0.5, "#FFFFFF"], [1.0, OKABE_ITO["orange"]]]
SEQUENTIAL = [[0.0, OKABE_ITO["blue"]], [0.5, OKABE_ITO["orange"]], [1.0, OKABE_ITO["vermillion"]]]


def series_color(k: int) -> str:
    """The ``k``-th series colour (sequences, block sizes, ...), cycling through :data:`SEQ_COLORS`."""
    return SEQ_COLORS[k % len(SEQ_COLORS)]


# -- heat-map colour codes shared by the block and slot figures ---------------------------------
# 0 free, 1 evictable, 2 shared, 3 reserved-idle, 4 + k the k-th sequence colour.
CODES = (FREE, EVICTABLE, SHARED, IDLE) + SEQ_COLORS
SEQ0 = 4
COLORSCALE = [[v, c] for k, c in enumerate(CODES) for v in (k / len(CODES), (k + 1) / len(CODES))]


class OwnerColors:
    """Sequence id -> colour code, assigned on first sight and kept while the view lives."""

    __slots__ = ("index",)

    def __init__(self) -> None:
        self.index: dict = {}

    def code(self, seq_id) -> int:
        if seq_id not in self.index:
            self.index[seq_id] = len(self.index)
        return SEQ0 + self.index[seq_id] % len(SEQ_COLORS)

    def color(self, seq_id) -> str:
        return CODES[self.code(seq_id)]


def text_color(background: str) -> str:
    """Black or white, whichever reads better on ``background`` (``#RRGGBB``)."""
    r, g, b = (int(background[k : k + 2], 16) for k in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#FFFFFF"


def code_heatmap(**kwargs):
    """A heat-map whose cells hold colour codes (:data:`CODES`): each cell painted in its code's colour,
    no colour bar (the figure draws a legend instead). ``kwargs``: the cells and their text, gaps, hover."""
    import plotly.graph_objects as go

    return go.Heatmap(
        colorscale=COLORSCALE, zmin=-0.5, zmax=len(CODES) - 0.5, showscale=False, showlegend=False, **kwargs
    )


def legend_traces(labels: dict[str, str]):
    """Invisible-data scatter traces that only draw a legend: ``{colour: label}``, square markers."""
    import plotly.graph_objects as go

    return [
        go.Scatter(
            x=[None],
            y=[None],
            mode="markers",
            name=label,
            showlegend=True,
            hoverinfo="skip",
            marker={"symbol": "square", "size": 13, "color": color, "line": {"color": NEUTRAL, "width": 1}},
        )
        for color, label in labels.items()
    ]

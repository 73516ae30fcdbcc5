"""Lesson 8's figure of the prefix-cache comparison: hit rate and TTFT p50 per cache and policy.

A pure function of the rows :func:`paged_edu.labs.cache_compare.compare_caches` measures.
"""

from __future__ import annotations

from plotly.subplots import make_subplots

from paged_edu.labs.cache_compare import CacheRow
from paged_edu.viz.palette import SEQ_COLORS

__all__ = ["cache_compare_figure"]


def cache_compare_figure(rows: list[CacheRow]):
    """Hit rate and TTFT p50 of every cell: one column per scenario, one bar per cache and policy."""
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    fig = make_subplots(
        rows=2,
        cols=len(scenarios),
        subplot_titles=[f"{s}: prefix hit rate" for s in scenarios] + [f"{s}: TTFT p50 (s)" for s in scenarios],
        vertical_spacing=0.22,
    )
    series = list(dict.fromkeys((r.cache, r.policy) for r in rows))
    for k, (cache, policy) in enumerate(series):
        for j, s in enumerate(scenarios, start=1):
            cells = [r for r in rows if (r.cache, r.policy, r.scenario) == (cache, policy, s)]
            style = dict(
                name=f"{cache} {policy}",
                legendgroup=f"{cache} {policy}",
                marker_color=SEQ_COLORS[k % 6],
                marker_pattern_shape="/" if policy == "lpm" else "",
            )
            fig.add_bar(
                x=[r.workload for r in cells], y=[r.hit_rate for r in cells], row=1, col=j, showlegend=j == 1, **style
            )
            fig.add_bar(
                x=[r.workload for r in cells], y=[r.ttft_p50 for r in cells], row=2, col=j, showlegend=False, **style
            )
    fig.update_xaxes(title_text="workload")
    for j in range(1, len(scenarios) + 1):
        fig.update_yaxes(title_text="prefix hit rate (share of prompt tokens)", row=1, col=j)
        fig.update_yaxes(title_text="TTFT p50 (s)", row=2, col=j)
    fig.update_layout(barmode="group", height=680, width=900, title="Hash chain vs radix tree, FCFS vs LPM")
    return fig

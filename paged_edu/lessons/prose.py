"""Sentences with numbers in them, rendered from the values a lesson computed (never typed).

A lesson's prose must state the number on the screen, so a sentence that quotes a measured or
computed figure is built in the cell right after the computation, from its value:

    from paged_edu.lessons.prose import say
    say("continuous batching took {steps:,} steps against {static_steps:,} ({speedup:.1f}x)",
        steps=cont.num_steps, static_steps=static.num_steps, speedup=cont.tokens_per_s / static.tokens_per_s)

``say`` formats like ``str.format`` (the template's own format specs win) and returns a
:class:`Prose`: a ``str`` that a notebook displays as Markdown (``_repr_markdown_``) and prints as
plain text, so nbval compares it like any printed line. A field without a format spec is formatted
the one way every lesson shares (:func:`fmt`): integers with thousands separators, floats to three
significant figures (``27,096``, ``4.49``, ``0.0123``). Plain Python, no IPython import.
"""

from __future__ import annotations

import math
import string

__all__ = ["Prose", "fmt", "say"]


def fmt(value) -> str:
    """The lessons' one default number format: ``1,739``; ``27,096``; ``4.49``; ``0.553``; ``nan``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        return str(value)
    if isinstance(value, int) or (hasattr(value, "__index__") and not isinstance(value, float)):
        return f"{int(value):,}"
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


class _Formatter(string.Formatter):
    def format_field(self, value, format_spec: str) -> str:
        return fmt(value) if not format_spec else super().format_field(value, format_spec)


class Prose(str):
    """A sentence rendered from computed values: Markdown in a notebook, plain text when printed."""

    def _repr_markdown_(self) -> str:
        return str(self)

    def __repr__(self) -> str:  # the text/plain a notebook stores next to the Markdown (nbval compares it)
        return str(self)


def say(template: str, /, **values) -> Prose:
    """``template`` with ``values`` filled in (``str.format`` syntax); a missing value is a ``KeyError``
    naming it, never a sentence with a hole."""
    if not isinstance(template, str):
        raise TypeError(f"say() takes a template string, got {type(template).__name__}")
    return Prose(_Formatter().vformat(template, (), values))

"""The machinery behind every exercise: verdicts, numeric and function comparisons, the registry."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["EXERCISES", "Exercise", "Verdict", "check", "check_function", "compare", "reference",
           "register", "solution"]


@dataclass(slots=True)
class Verdict:
    ok: bool
    lines: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "\n".join(self.lines)

    def __repr__(self) -> str:
        return f"Verdict(ok={self.ok})"


def compare(name: str, got, expected, rel_tol: float = 0.0, *, sig_figs: int | None = None,
            hints: dict | None = None) -> Verdict:
    """Karpathy-style ``cmp``: exact, approximate, or off by how much -- and, for a known tempting
    wrong answer, what it is.

    * ``rel_tol``: accept ``|got - expected| <= rel_tol * |expected|``.
    * ``sig_figs``: accept an answer that *is* ``expected`` correctly rounded to the significant
      figures the learner wrote (at least ``sig_figs`` of them), or equal to it within float noise.
      So with ``sig_figs=4`` the right 0.9927 passes while 0.9922 (another quantity) does not,
      however close.
    * ``hints``: ``{tempting wrong value: what it is}``; an answer matching one (at the precision
      given) is told which mistake it is. A right answer is never matched against hints.

    NaN, infinities and non-numbers get a verdict, never an exception.
    """
    if got is None:
        return Verdict(False, [f"[ ] {name}: not answered yet -- replace None with your answer"])
    try:
        g, e = float(got), float(expected)
    except (TypeError, ValueError, OverflowError):
        ok = got == expected
        return Verdict(ok, [f"[{'x' if ok else ' '}] {name}: {'matches' if ok else f'got {got!r}, expected {expected!r}'}"])
    if isinstance(got, bool):
        return Verdict(False, [f"[ ] {name}: got {got!r}, a bool; expected a number ({_fmt(e)})"])
    if not math.isfinite(g):
        return Verdict(False, [f"[ ] {name}: got {g!r}, not a finite number; expected {_fmt(e)}"])
    if g == e:
        return Verdict(True, [f"[x] {name}: exact ({_fmt(e)})"])
    diff = g - e
    rel = abs(diff) / abs(e) if e else math.inf
    if rel <= max(rel_tol, 1e-12):
        return Verdict(True, [f"[x] {name}: approximately right ({_fmt(g)} vs {_fmt(e)}, off by {rel:.2%})"])
    if sig_figs is not None:
        given = _sig_figs_of(got)
        if given >= sig_figs and _rounds_to(e, g, given):
            return Verdict(True, [f"[x] {name}: right to the {given} significant figures given "
                                  f"({_fmt(g)}; exactly {_fmt(e)})"])
    line = f"[ ] {name}: got {_fmt(g)}, expected {_fmt(e)} (off by {diff:+,.6g}, {rel:.2%})"
    # A hint matches exactly, or -- for an answer with a fractional part and at least two
    # significant figures (one is too loose to tell mistakes apart) -- at the precision given.
    loose = not float(g).is_integer() and _sig_figs_of(got) >= max(2, sig_figs or 0)
    for wrong, meaning in (hints or {}).items():
        if g == wrong or (loose and _rounds_to(float(wrong), g, _sig_figs_of(got))):
            return Verdict(False, [f"{line} -- that is {meaning}"])
    if sig_figs is not None and _sig_figs_of(got) < sig_figs and _rounds_to(e, g, _sig_figs_of(got)):
        return Verdict(False, [f"{line} -- give at least {sig_figs} significant figures: the difference this "
                               "exercise is about is in the last ones"])
    hint = ""
    ratio = g / e if e else math.inf
    if e and g and math.isfinite(ratio) and abs(round(ratio) - ratio) < 1e-9 and round(ratio) != 1:
        hint = f" -- a factor of {ratio:g}: a missing or extra term?"
    elif e and g and math.isfinite(1 / ratio) and abs(round(1 / ratio) - 1 / ratio) < 1e-9 and round(1 / ratio) != 1:
        hint = f" -- 1/{1 / ratio:g} of it: a missing or extra term?"
    return Verdict(False, [line + hint])


def _sig_figs_of(x) -> int:
    """Significant figures in the shortest text of ``x`` (``0.9927`` -> 4, ``0.56`` -> 2, ``302`` -> 3)."""
    if isinstance(x, int) and not isinstance(x, bool):
        return max(1, len(str(abs(x)).rstrip("0")))
    digits = repr(float(x)).lower().split("e")[0].replace("-", "").replace(".", "").lstrip("0")
    return max(1, len(digits))


def _rounds_to(exact: float, given: float, figures: int) -> bool:
    """Is ``given`` what ``exact`` rounds to at ``figures`` significant figures?"""
    if exact == 0 or not math.isfinite(exact):
        return given == exact
    return float(f"{exact:.{figures - 1}e}") == float(f"{given:.{figures - 1}e}")


def _fmt(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.6g}"


def check_function(name: str, fn, cases: list[tuple], reference: Callable, show: int = 3) -> Verdict:
    if fn is None:
        return Verdict(False, [f"[ ] {name}: not answered yet -- define the function and pass it in"])
    bad = []
    for args in cases:
        expected = reference(*args)
        try:
            got = fn(*args)
        except Exception as exc:  # a learner's bug is a verdict, not a crash
            got = f"{type(exc).__name__}: {exc}"
        if got != expected:
            bad.append((args, got, expected))
    if not bad:
        return Verdict(True, [f"[x] {name}: all {len(cases)} cases match"])
    lines = [f"[ ] {name}: {len(cases) - len(bad)} of {len(cases)} cases match; first differences:"]
    for args, got, expected in bad[:show]:
        lines.append(f"    {name}{_short(args)} -> {_short(got)}, expected {_short(expected)}")
    return Verdict(False, lines)


def _short(x, limit: int = 90) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[:limit - 3] + "..."



@dataclass(slots=True)
class Exercise:
    """One exercise: the question, the check, and the reference answer it accepts.

    ``reference`` is the library's answer: a value, or a callable for "write a function" exercises.
    ``check(answer)`` returns a :class:`Verdict`; it must be truthy for ``reference`` itself.
    """

    name: str
    question: str
    check: Callable[[object], Verdict]
    reference: object

    def solution_source(self) -> str:
        ref = self.reference
        if callable(ref):
            try:
                return inspect.getsource(ref)
            except (OSError, TypeError):
                pass
        return f"answer = {ref!r}"


EXERCISES: dict[str, Exercise] = {}


def register(name: str, question: str, reference: object):
    """Decorator: register the decorated function as the check of exercise ``name``."""

    def wrap(checker: Callable[[object], Verdict]):
        if name in EXERCISES:
            raise ValueError(f"exercise {name!r} is registered twice")
        EXERCISES[name] = Exercise(name, question, checker, reference)
        return checker

    return wrap


def _get(name: str) -> Exercise:
    try:
        return EXERCISES[name]
    except KeyError:
        raise KeyError(f"no exercise {name!r}; there are {', '.join(EXERCISES)}") from None


def check(name: str, answer) -> Verdict:
    """Check an answer to exercise ``name``; print and return the verdict (truthy exactly when right)."""
    verdict = _get(name).check(answer)
    if verdict.ok:
        verdict.lines.append("    Well done.")
    print(verdict)
    return verdict


def reference(name: str):
    """The reference answer of exercise ``name``: what ``check(name, ...)`` accepts."""
    return _get(name).reference


def solution(name: str) -> str:
    """Print (and return) the source of exercise ``name``'s reference answer."""
    exercise = _get(name)
    text = f"# Exercise {name}: {exercise.question}\n{exercise.solution_source()}"
    print(text)
    return text

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


def compare(name: str, got, expected, rel_tol: float = 0.0) -> Verdict:
    """Karpathy-style ``cmp``: exact, approximate (within ``rel_tol``), or off by how much."""
    if got is None:
        return Verdict(False, [f"[ ] {name}: not answered yet -- replace None with your answer"])
    try:
        g, e = float(got), float(expected)
    except (TypeError, ValueError):
        ok = got == expected
        return Verdict(ok, [f"[{'x' if ok else ' '}] {name}: {'matches' if ok else f'got {got!r}, expected {expected!r}'}"])
    if g == e:
        return Verdict(True, [f"[x] {name}: exact ({_fmt(e)})"])
    diff = g - e
    rel = abs(diff) / abs(e) if e else math.inf
    if rel <= rel_tol:
        return Verdict(True, [f"[x] {name}: approximately right ({_fmt(g)} vs {_fmt(e)}, off by {rel:.2%})"])
    hint = ""
    if e and g and abs(round(g / e) - g / e) < 1e-9 and round(g / e) != 1:
        hint = f" -- a factor of {g / e:g}: a missing or extra term?"
    elif e and g and abs(round(e / g) - e / g) < 1e-9 and round(e / g) != 1:
        hint = f" -- 1/{e / g:g} of it: a missing or extra term?"
    return Verdict(False, [f"[ ] {name}: got {_fmt(g)}, expected {_fmt(e)} (off by {diff:+,g}, {rel:.2%}){hint}"])


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

"""The machinery behind every exercise: verdicts, numeric and function comparisons, the registry.

``check(name, answer)`` gives a verdict for *any* answer, never an exception: ``None`` (and a stub
that raises ``NotImplementedError``) is "not answered yet"; a learner's function that raises some
other exception gets a verdict naming it; a string, a tensor, NaN, a dict or a list where a number
is asked, an instance where a class is asked, are each told what they are. A one-element tensor or
array counts as the number it holds.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "EXERCISES",
    "KINDS",
    "NOT_ANSWERED",
    "Exercise",
    "Verdict",
    "check",
    "check_function",
    "compare",
    "describe",
    "one_number",
    "plain",
    "raised",
    "reference",
    "register",
    "solution",
]

NOT_ANSWERED = "not answered yet"
# What an exercise asks for: a value (a number or a dict; a function of no arguments returning it is
# called), a function (called on the check's cases), or a class (instantiated by the check).
KINDS = ("value", "function", "class")


@dataclass(slots=True)
class Verdict:
    """What a check found: truthy exactly when the answer is right; ``str`` is the verdict's text.

    In a notebook, a verdict that :func:`check` has already printed displays nothing more when it is
    a cell's last expression (no ``Verdict(ok=False)`` echo); one that was not printed shows its text.
    """

    ok: bool
    lines: list[str] = field(default_factory=list)
    shown: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.ok = bool(self.ok)  # a numpy or one-element torch bool reads as the bool it holds

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "\n".join(self.lines)

    def __repr__(self) -> str:
        first = self.lines[0] if self.lines else ("right" if self.ok else "not right")
        return f"<verdict: {first}{' ...' if len(self.lines) > 1 else ''}>"

    def _ipython_display_(self) -> None:
        if not self.shown:
            print(self)
            self.shown = True


def not_answered(name: str, what: str = "replace None with your answer") -> Verdict:
    return Verdict(False, [f"[ ] {name}: {NOT_ANSWERED} -- {what}"])


def raised(name: str, exc: BaseException, where: str = "your code") -> Verdict:
    """The verdict on a learner's code that raised: a stub's ``NotImplementedError`` is "not answered
    yet"; any other exception is named, with its message."""
    if isinstance(exc, NotImplementedError):
        return not_answered(
            name,
            f"{where} still raises NotImplementedError{f' ({exc})' if str(exc) else ''}: replace it with your code",
        )
    return Verdict(False, [f"[ ] {name}: {where} raised {type(exc).__name__}: {exc}"])


def _array_like(x) -> bool:
    """A torch tensor, a numpy array or a numpy scalar (duck-typed: the core imports no torch)."""
    return hasattr(x, "shape") and hasattr(x, "tolist") and not isinstance(x, type)


def plain(x):
    """``x`` with tensors and arrays turned into Python numbers and lists (``tolist``), recursively
    inside tuples, lists and dict values; anything else unchanged."""
    if _array_like(x):
        try:
            return x.tolist()
        except Exception:  # a tensor that cannot leave its device, say: leave it to describe()
            return x
    if isinstance(x, (list, tuple)):
        return type(x)(plain(v) for v in x)
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


def one_number(x):
    """A tensor/array holding exactly one number, as that number; anything else unchanged."""
    if _array_like(x):
        v = plain(x)
        while isinstance(v, list) and len(v) == 1:
            v = v[0]
        return x if isinstance(v, list) else v
    return x


def describe(x, limit: int = 60) -> str:
    """What ``x`` is, in a few words, for a verdict: ``a str '131072'``, ``a tensor of shape (2, 3)``."""
    if isinstance(x, type):
        return f"the class {x.__name__}"
    if _array_like(x):
        kind = "tensor" if type(x).__module__.startswith("torch") else "array"
        return f"a {kind} of shape {tuple(x.shape)}"
    if callable(x):
        return f"the function {getattr(x, '__name__', type(x).__name__)}"
    text = repr(x)
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    if isinstance(x, (list, tuple, dict, set)):
        return f"a {type(x).__name__} of {len(x)} item{'s' if len(x) != 1 else ''}: {text}"
    if isinstance(x, (str, bool, int, float)):
        return f"{'an' if type(x).__name__[0] in 'aeiou' else 'a'} {type(x).__name__} {text}"
    return f"an instance of {type(x).__name__}"


def compare(
    name: str, got, expected, rel_tol: float = 0.0, *, sig_figs: int | None = None, hints: dict | None = None
) -> Verdict:
    """Karpathy-style ``cmp``: exact, approximate, or off by how much -- and, for a known tempting
    wrong answer, what it is.

    * ``rel_tol``: accept ``|got - expected| <= rel_tol * |expected|``.
    * ``sig_figs``: accept an answer that *is* ``expected`` correctly rounded to the significant
      figures the learner wrote (at least ``sig_figs`` of them), or equal to it within float noise.
      So with ``sig_figs=4`` the right 0.9927 passes while 0.9922 (another quantity) does not,
      however close.
    * ``hints``: ``{tempting wrong value: what it is}``; an answer matching one (at the precision
      given) is told which mistake it is. A right answer is never matched against hints.

    ``None`` is "not answered yet"; a one-element tensor or array is the number it holds; a string
    (even ``"131072"``), a bool, NaN, infinities and non-numbers get a verdict, never an exception.
    """
    if got is None:
        return not_answered(name)
    got = one_number(got)
    try:
        e = float(expected)
    except (TypeError, ValueError, OverflowError):  # a non-numeric reference: equal, of the same type
        ok = type(got) is type(expected) and _equal(got, expected)
        return Verdict(
            ok, [f"[{'x' if ok else ' '}] {name}: {'matches' if ok else f'got {describe(got)}, expected {expected!r}'}"]
        )
    if isinstance(got, str):
        try:
            as_number = float(got.replace(",", "").replace("_", ""))
        except ValueError:
            as_number = None
        tail = "; the number in it would be right" if as_number == e else ""
        return Verdict(False, [f"[ ] {name}: got the string {got!r}: give a number, not text (no quotes){tail}"])
    if isinstance(got, bool):
        return Verdict(False, [f"[ ] {name}: got {got!r}, a bool; expected a number ({_fmt(e)})"])
    try:
        g = float(got)
    except (TypeError, ValueError, OverflowError):
        return Verdict(False, [f"[ ] {name}: got {describe(got)}; expected a number ({_fmt(e)})"])
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
            return Verdict(
                True, [f"[x] {name}: right to the {given} significant figures given ({_fmt(g)}; exactly {_fmt(e)})"]
            )
    line = f"[ ] {name}: got {_fmt(g)}, expected {_fmt(e)} (off by {diff:+,.6g}, {rel:.2%})"
    # A hint matches exactly, or -- for an answer with a fractional part and at least two
    # significant figures (one is too loose to tell mistakes apart) -- at the precision given.
    loose = not float(g).is_integer() and _sig_figs_of(got) >= max(2, sig_figs or 0)
    for wrong, meaning in (hints or {}).items():
        if g == wrong or (loose and _rounds_to(float(wrong), g, _sig_figs_of(got))):
            return Verdict(False, [f"{line} -- that is {meaning}"])
    if sig_figs is not None and _sig_figs_of(got) < sig_figs and _rounds_to(e, g, _sig_figs_of(got)):
        return Verdict(
            False,
            [
                f"{line} -- give at least {sig_figs} significant figures: the difference this "
                "exercise is about is in the last ones"
            ],
        )
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


def _equal(got, expected) -> bool:
    """``got == expected`` for a learner's value: tensors and arrays by their numbers, a bool never
    equal to a number, and a comparison that raises (or is not a truth value) is a mismatch."""
    got = plain(got)
    if isinstance(got, bool) != isinstance(expected, bool):
        return False
    try:
        return bool(got == expected)
    except Exception:
        return False


def check_function(name: str, fn, cases: list[tuple], reference: Callable, show: int = 3) -> Verdict:
    """Run ``fn`` and ``reference`` on every case (``fn`` on copies of the arguments, so a function
    that mutates them spoils nothing); equal results, tensors and arrays by their numbers, pass."""
    if fn is None:
        return not_answered(name, "define the function and pass it in")
    bad = []
    for args in cases:
        expected = reference(*args)
        try:
            got = fn(*copy.deepcopy(args))
        except NotImplementedError as exc:
            return raised(name, exc, "your function")
        except Exception as exc:  # a learner's bug is a verdict, not a crash
            got = f"{type(exc).__name__}: {exc}"
        if not _equal(got, expected):
            bad.append((args, got, expected))
    if not bad:
        return Verdict(True, [f"[x] {name}: all {len(cases)} cases match"])
    lines = [f"[ ] {name}: {len(cases) - len(bad)} of {len(cases)} cases match; first differences:"]
    for args, got, expected in bad[:show]:
        lines.append(f"    {name}{_short(args)} -> {_short(got)}, expected {_short(expected)}")
    return Verdict(False, lines)


def _short(x, limit: int = 90) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(slots=True)
class Exercise:
    """One exercise: the question, the check, and the reference answer it accepts.

    ``reference`` is the library's answer: a value, a function of no arguments returning it (a value
    exercise whose answer takes a run to compute), a function (``kind="function"``) or a class
    (``kind="class"``). ``check(answer)`` returns a :class:`Verdict`; it must be truthy for the
    reference. :meth:`grade` reads any answer into what ``check`` expects first (see :func:`check`).
    """

    name: str
    question: str
    check: Callable[[object], Verdict]
    reference: object
    kind: str = "value"
    needs_triton: bool = False  # its check runs Triton kernels: without Triton the verdict says so

    def grade(self, answer) -> Verdict:
        """The verdict on ``answer``, whatever it is: never an exception."""
        if self.needs_triton:
            from paged_edu.kernels import triton_available
            from paged_edu.lessons.setup import NO_TRITON

            if not triton_available():
                return Verdict(False, [f"[ ] {self.name} needs Triton to be checked: {NO_TRITON}."])
        try:
            answer, early = self._read(answer)
            if early is not None:
                return early
            verdict = self.check(answer)
        except Exception as exc:  # the learner's code raised inside the check, or an answer of an unforeseen form
            return raised(self.name, exc, "checking your answer")
        return verdict

    def _read(self, answer) -> tuple[object, Verdict | None]:
        name = self.name
        if answer is None:
            return None, not_answered(
                name,
                {
                    "value": "replace None with your answer",
                    "function": "define the function and pass it in",
                    "class": "pass your class",
                }[self.kind],
            )
        if self.kind == "function":
            if isinstance(answer, type) or not callable(answer):
                return None, Verdict(False, [f"[ ] {name}: expected a function (def ...), got {describe(answer)}"])
            return answer, None
        if self.kind == "class":
            if isinstance(answer, type):
                return answer, None
            if (
                not callable(answer)
                and not isinstance(answer, (str, int, float, list, tuple, dict))
                and not _array_like(answer)
            ):
                return None, Verdict(
                    False,
                    [
                        f"[ ] {name}: got an instance of {type(answer).__name__}; pass the class "
                        f"itself ({type(answer).__name__}, not {type(answer).__name__}(...)): the "
                        "check builds its own instances"
                    ],
                )
            return None, Verdict(False, [f"[ ] {name}: expected a class, got {describe(answer)}"])
        # A value: a function of no arguments stands for what it returns (as the references of 6.3, 7.2, 8.x).
        if callable(answer) and not isinstance(answer, type):
            try:
                answer = answer()
            except Exception as exc:
                return None, raised(name, exc, "your function")
            if answer is None:
                return None, not_answered(name, "your function returned None")
        if isinstance(answer, dict):
            answer = {k: one_number(v) for k, v in answer.items()}
            missing = [k for k, v in answer.items() if v is None]
            if missing:
                return None, not_answered(name, f"fill in {', '.join(map(repr, missing))} (still None)")
        return answer, None

    def solution_source(self) -> str:
        ref = self.reference
        if callable(ref):
            try:
                return inspect.getsource(ref)
            except (OSError, TypeError):
                pass
        return f"answer = {ref!r}"


EXERCISES: dict[str, Exercise] = {}


def register(name: str, question: str, reference: object, kind: str = "value", *, needs_triton: bool = False):
    """Decorator: register the decorated function as the check of exercise ``name``; ``kind`` says
    what the answer is (one of :data:`KINDS`); ``needs_triton``, that the check runs Triton kernels (where
    Triton is not installed, the verdict says so instead)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; it takes one of {KINDS}")

    def wrap(checker: Callable[[object], Verdict]):
        if name in EXERCISES:
            raise ValueError(f"exercise {name!r} is registered twice")
        EXERCISES[name] = Exercise(name, question, checker, reference, kind, needs_triton)
        return checker

    return wrap


def _get(name: str) -> Exercise:
    try:
        return EXERCISES[name]
    except (KeyError, TypeError):
        raise KeyError(f"no exercise {name!r}; there are {', '.join(EXERCISES)}") from None


def check(name: str, answer) -> Verdict:
    """Check an answer to exercise ``name``; print and return the verdict (truthy exactly when right).

    Any ``answer`` gets a verdict, never an exception: ``None`` or a stub that raises
    ``NotImplementedError`` is "not answered yet"; for a value exercise, a function of no arguments
    is called and its result checked; a one-element tensor is the number it holds.
    """
    verdict = _get(name).grade(answer)
    if verdict.ok:
        verdict.lines.append("    Well done.")
    print(verdict)
    verdict.shown = True
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

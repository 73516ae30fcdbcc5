""" "Your turn" exercises: one check per exercise that serves the learner's answer and the library's
reference alike, with verdicts that say what matched and by how much.

    from paged_edu.lessons import exercises as ex
    ex.check("1.1", my_answer)   # prints and returns a Verdict, truthy exactly when the answer is right;
                                 # any answer gets a verdict (None or a stub: "not answered yet"), never an exception
    ex.reference("1.1")          # the reference answer (a value or a callable) that check accepts
    ex.solution("1.1")           # prints the reference's source, to read after trying
    ex.EXERCISES                 # every exercise name -> its Exercise

Each lesson's exercises live in their own module (:mod:`.lesson1`, :mod:`.lesson2`, ... :mod:`.lesson10`), written
as plain Python: the reference is a function or value in the library, never a string run with
``exec``. A learner's stub raises ``NotImplementedError("Exercise 3.1: ...")``; ``check`` turns that
(and any other exception in a learner's function) into a verdict, not a crash. :mod:`.framework`
holds what they share: the registry, ``check`` and the verdicts.
"""

from __future__ import annotations

from paged_edu.lessons.exercises.framework import (
    EXERCISES,
    KINDS,
    NOT_ANSWERED,
    Exercise,
    Verdict,
    check,
    check_function,
    compare,
    reference,
    register,
    solution,
)

# Importing a lesson's module registers its exercises, in course order.
from paged_edu.lessons.exercises import (  # noqa: E402,F401
    lesson1,
    lesson2,
    lesson3,
    lesson4,
    lesson5,
    lesson6,
    lesson7,
    lesson8,
    lesson9,
    lesson10,
    lesson11,
)

__all__ = [
    "EXERCISES",
    "KINDS",
    "NOT_ANSWERED",
    "Exercise",
    "Verdict",
    "check",
    "check_function",
    "compare",
    "reference",
    "register",
    "solution",
]

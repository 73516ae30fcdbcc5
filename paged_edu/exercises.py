"""Kept so ``from paged_edu import exercises as ex`` still works: the exercises live in
:mod:`paged_edu.lessons.exercises`, and this name is that same module."""

import sys

from paged_edu.lessons import exercises as _exercises

sys.modules[__name__] = _exercises

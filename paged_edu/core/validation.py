"""One place for input checks on integers, token lists and seeds, used by every module.

Each check returns the clean value or raises ``TypeError`` / ``ValueError`` whose message names the
argument, so bad input is refused before any state changes. Plain Python, no torch.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Sequence

__all__ = ["as_int", "token_array"]


def as_int(value: object, rule: str) -> int:
    """``value`` as a Python int: any integer type (numpy and torch integers too), never a bool,
    a float or anything else -- those raise ``TypeError(f"{rule}, got <type> <value>")``."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{rule}, got {type(value).__name__} {value!r}")
    return operator.index(value)


def token_array(token_ids: Sequence[int]) -> array:
    """Validate token ids and pack them as int64 (``array('q')``): non-negative integers only."""
    try:
        packed = array("q", token_ids)
    except TypeError as exc:
        bad = next((t for t in token_ids if not isinstance(t, int)), None)
        raise TypeError(
            f"token ids must be integers, got {type(bad).__name__} {bad!r}"
        ) from exc
    except OverflowError as exc:
        raise ValueError("token ids must fit in 64 bits") from exc
    if packed:
        low = min(packed)
        if low < 0:
            raise ValueError(f"token ids must be non-negative, got {low}")
        if low <= 1 and isinstance(token_ids, (list, tuple)):
            _refuse_bools(token_ids, packed)
    return packed


def _refuse_bools(token_ids: Sequence, packed: array) -> None:
    """``True``/``False`` pack as 1/0; refuse them as append does. Only 0s and 1s need a look, found
    by ``array.index`` at C speed, so a prompt pays nothing unless it holds such ids."""
    for value in (0, 1):
        pos = -1
        while True:
            try:
                pos = packed.index(value, pos + 1)
            except ValueError:
                break
            if type(token_ids[pos]) is bool:
                raise TypeError(f"token ids must be integers, got a bool at position {pos}")

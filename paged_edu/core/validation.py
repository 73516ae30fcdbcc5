"""One place for input checks on integers, fractions, choices, flags, token lists and seeds, used by every module.

Each check returns the clean value or raises ``TypeError`` (wrong kind of value) / ``ValueError``
(right kind, out of range) with a message that names the argument, so a caller can check every
input before it changes any state. The checks that take a ``name`` raise :class:`FieldTypeError` /
:class:`FieldValueError` whose ``.field`` is that name, so a CLI maps an error to its flag without
reading the message. "An integer" means any integer type -- Python ``int``, numpy and torch integers
(anything with ``__index__``) -- and never a ``bool``, a float or a string.

Where a public entry (``Engine(...)``, ``Engine.add_request``, ``simulate``, the CLI, a kernel with
``validate=True``) has checked a value, the calls it makes inside the package take it as checked.

    from paged_edu.core import validation as check
    n = check.integer("num_blocks", n, low=1)
    tokens = check.token_list("prompt_token_ids", prompt)   # list[int]
    seed = check.seed("seed", seed)                         # 0 <= seed < 2**64

Plain Python, no torch.
"""

from __future__ import annotations

import numbers
import operator
from array import array
from collections.abc import Iterable, Mapping, Set

__all__ = [
    "MAX_CACHE_SALT_LEN",
    "MAX_NUM_BLOCKS",
    "MAX_TOKEN_ID",
    "SEED_LIMIT",
    "FieldTypeError",
    "FieldValueError",
    "as_int",
    "cache_key",
    "choice",
    "flag",
    "fraction",
    "integer",
    "new_id",
    "real",
    "seed",
    "token_array",
    "token_id",
    "token_list",
]

MAX_TOKEN_ID = 2**63 - 1  # token ids are hashed as int64 (``array('q')``)
SEED_LIMIT = 2**64  # seeds are unsigned 64-bit, as ``numpy.random.SeedSequence`` and torch take them
MAX_NUM_BLOCKS = 2**31 - 1  # block ids travel to the kernels in int32 block tables
MAX_CACHE_SALT_LEN = 256  # characters in a cache salt or an extra cache key
# Requests a simulated workload generates up front and holds for the run (up to ~8 KB each with
# their prompt tokens; the simulator serves ~1,000 a second): a million is a quarter of an hour.
MAX_NUM_REQUESTS = 1_000_000


class FieldTypeError(TypeError, ValueError):
    """A value of the wrong kind for the argument (configuration field) ``field``.

    Also a ``ValueError``: whatever is wrong with a setting, ``except ValueError`` refuses it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class FieldValueError(ValueError):
    """A value out of range for the argument (configuration field) ``field``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def as_int(value: object, rule: str) -> int:
    """``value`` as a Python int: any integer type (numpy and torch integers too), never a bool,
    a float or anything else -- those raise ``TypeError(f"{rule}, got <type> <value>")``."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{rule}, got {_describe(value)}")
    try:
        return operator.index(value)
    except TypeError:  # e.g. numpy.bool_ has __index__ but refuses to be one
        raise TypeError(f"{rule}, got {_describe(value)}") from None


def integer(name: str, value: object, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]`` (either bound optional, both inclusive)."""
    try:
        value = as_int(value, f"{name} must be an integer")
    except TypeError as exc:
        raise FieldTypeError(name, str(exc)) from None
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            bounds = f">= {low}"
        elif low is None:
            bounds = f"<= {high}"
        else:
            bounds = f"in [{low}, {high}]"
        raise FieldValueError(name, f"{name} must be {bounds}, got {value}")
    return value


def real(name: str, value: object) -> float:
    """A real number as a Python float: an int or a float, numpy's too; never a bool, a string or a tensor.
    (NaN and infinities pass: the caller's range says whether it takes them.)"""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's ints and floats are Real
        raise FieldTypeError(name, f"{name} must be a real number, got {_describe(value)}")
    return float(value)


def fraction(name: str, value: object) -> float:
    """A share such as ``gpu_memory_utilization``: a real number in ``(0, 1]`` (never NaN)."""
    share = real(name, value)
    if not 0 < share <= 1:  # NaN fails this too
        raise FieldValueError(name, f"{name} must be in (0, 1], got {value!r}")
    return share


def choice(name: str, value: object, choices) -> object:
    """``value`` if it is one of ``choices`` (a tuple of names); the message lists them."""
    if value not in choices:
        listed = ", ".join(map(repr, choices))
        raise FieldValueError(name, f"unknown {name} {value!r}: {name} must be one of {listed}")
    return value


def flag(name: str, value: object) -> bool:
    """A yes/no setting: ``True`` or ``False`` (a numpy bool too), never a string or a number --
    ``bool("no")`` is True, so ``enable_prefix_caching="no"`` must not read as "yes"."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise FieldTypeError(name, f"{name} must be True or False, got {_describe(value)}")


def seed(name: str, value: object) -> int:
    """A random seed: an integer in ``[0, 2**64)``."""
    value = integer(name, value)
    if not 0 <= value < SEED_LIMIT:
        raise FieldValueError(name, f"{name} must be in [0, 2**64), got {value}")
    return value


def cache_key(name: str, value: object) -> str:
    """A cache salt or an extra prefix-cache key: a non-empty ``str`` of at most
    ``MAX_CACHE_SALT_LEN`` characters that encodes as UTF-8 (no lone surrogates)."""
    if not isinstance(value, str):
        raise FieldTypeError(
            name, f"{name} must be a non-empty str of at most {MAX_CACHE_SALT_LEN} characters, got {_describe(value)}"
        )
    if not 1 <= len(value) <= MAX_CACHE_SALT_LEN:
        raise FieldValueError(
            name, f"{name} must be a non-empty str of at most {MAX_CACHE_SALT_LEN} characters, got one of {len(value)}"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise FieldValueError(name, f"{name} must encode as UTF-8, got {_describe(value)}") from None
    return value


def token_id(name: str, value: object) -> int:
    """One token id: an integer in ``[0, 2**63)``."""
    value = integer(name, value, low=0)
    if value > MAX_TOKEN_ID:
        raise FieldValueError(name, f"{name} must fit in 64 bits (< 2**63), got {value}")
    return value


def new_id(name: str, value: object, existing) -> object:
    """``value`` as a key for ``existing`` (a dict or set): hashable and not in it yet."""
    try:
        taken = value in existing
    except TypeError:
        raise TypeError(f"{name} must be hashable, got {type(value).__name__}") from None
    if taken:
        raise ValueError(f"{name} {value!r} already exists")
    return value


def token_array(name: str, value: object) -> array:
    """A sequence of token ids, checked and packed as int64 (``array('q')``).

    Accepts any ordered collection of integers -- a list, tuple, range, numpy array, ``array('q')``
    -- and any iterator (a generator is read once, then checked like a list). Refuses ``str``,
    ``bytes`` and other byte buffers (``array('q', b"abcdefgh")`` would read the bytes as one
    token), sets and mappings (no order), bools and everything that is not an integer; the message
    names the first bad element and its position.
    """
    if type(value) is list:  # the common case: no ABC checks (a list is none of the refused kinds)
        pass
    elif isinstance(value, (str, bytes, bytearray, memoryview, Set, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a sequence of integer token ids, got {_describe(value)}")
    elif not hasattr(value, "__len__"):
        value = list(value)  # a generator or iterator: read it once
    try:
        packed = array("q", value)  # C speed; refuses floats and strings, not bools
    except (TypeError, OverflowError):
        packed = None
    if packed is None or _has_bool_or_negative(value, packed):
        _raise_first_bad(name, value)
    return packed


def _has_bool_or_negative(value, packed: array) -> bool:
    """Does ``value`` (packed as ``packed``) hold a bool (an int to ``array``) or a negative id?"""
    if type(value) is list:
        # A bool equals 0 or 1: a list whose least element is 2 or more holds neither a bool nor a
        # negative id, found in one scan (most lists of ids; two scans by ``0 in`` / ``1 in`` took
        # more), and the list's own min makes no int objects (the packed array's does). The allocator
        # checks each block's ids as they arrive (16 at a time, 850,000 times in the beam benchmark):
        # 2.9 -> 2.3 us a call of 16 ids with the scans by ==; then 1.28 -> 0.96 us with the min first.
        try:
            least = min(value) if value else 2
            if least >= 2:
                return False
        except TypeError:  # integers only by ``__index__``, without an order: the packed ones have one
            return bool in map(type, value) or min(packed) < 0
        return least < 0 or bool in map(type, value)  # 0 <= least < 2: a 0 or a 1 is there, maybe a bool
    return bool in map(type, value) or (bool(packed) and min(packed) < 0)


def token_list(name: str, value: object) -> list[int]:
    """:func:`token_array` as a list of Python ints."""
    return token_array(name, value).tolist()


def _raise_first_bad(name: str, values: Iterable) -> None:
    """Raise for the first element of ``values`` that is not a token id, naming it and its position."""
    try:
        values = list(values)
    except TypeError:  # e.g. a 0-d numpy array
        raise TypeError(f"{name} must be a sequence of integer token ids, got {_describe(values)}") from None
    for position, value in enumerate(values):
        where = f"element {position} is {_describe(value)}"
        try:
            value = as_int(value, "")
        except TypeError:
            raise TypeError(f"{name} must be a sequence of integers: {where}") from None
        if value < 0:
            raise ValueError(f"{name} must hold non-negative token ids: {where}")
        if value > MAX_TOKEN_ID:
            raise ValueError(f"{name} must hold token ids that fit in 64 bits (< 2**63): {where}")
    raise AssertionError(f"{name}: no bad element found")  # unreachable: the caller saw one

"""One request of a workload, its checks, and the JSONL trace format it is saved in.

Trace format (one JSON object per line)::

    {"arrival_time": 0.0, "prompt_len": 161, "output_len": 338}
    {"arrival_time": 0.5, "prompt": [1, 2, 3], "output_len": 7, "prefix_group": "sys", "prefix_len": 2}
    {"arrival_time": 0.9, "prompt_len": 40, "output_len": 20, "n": 4, "fork": "beam"}
    {"arrival_time": 1.2, "prompt": [1, 2, 3], "output_len": 2, "output": [9, 10]}
    {"arrival_time": 1.5, "prompt_len": 40, "output_len": 8, "prefix_group": "sys", "prefix_len": 32, "cache_salt": "tenant-1"}

``prompt_len`` or ``prompt`` (token ids) is required, not both; ``prefix_group``, ``prefix_len``,
``n`` (default 1), ``fork`` (``"parallel"``/``"beam"``) and ``output`` (the reply's token ids, one
sample: a later prompt that quotes the reply then hits the reply's cached blocks) and
``cache_salt`` (the request's prefix-cache salt: it hits only blocks cached under the same salt)
are optional.

Plain Python, no torch.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from paged_edu.core.validation import FieldValueError, cache_key, choice, integer, real, token_list

__all__ = ["FORK_MODES", "Request", "TraceKeyError", "load_trace", "prompt_token_ids", "save_trace"]

FORK_MODES = ("parallel", "beam")


@dataclass(slots=True)
class Request:
    """One request of a workload.

    ``prompt_len`` is always set; ``prompt`` holds explicit token ids when the trace gave them
    (else the simulator makes unique ids, so that only declared sharing can hit the prefix
    cache). The first ``prefix_len`` prompt tokens are shared by every request of ``prefix_group``.
    ``n`` samples are generated, each ``output_len`` tokens long. ``output``, when given, holds the
    token ids the (one) sample generates, so that a later prompt carrying them -- the next turn of a
    chat -- hits the blocks the reply left in the cache; without it the simulator makes up ids that
    no prompt carries.
    """

    arrival_time: float
    prompt_len: int
    output_len: int
    prompt: list[int] | None = None
    prefix_group: str | None = None
    prefix_len: int = 0
    n: int = 1
    fork: str = "parallel"
    output: list[int] | None = None
    cache_salt: str | None = None  # its tenant's prefix-cache salt (None: shared with every unsalted request)

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def total_len(self) -> int:
        """``s`` at the end: prompt plus generated tokens of one sample."""
        return self.prompt_len + self.output_len

    def to_json(self) -> dict:
        record: dict = {"arrival_time": self.arrival_time}
        if self.prompt is not None:
            record["prompt"] = list(self.prompt)
        else:
            record["prompt_len"] = self.prompt_len
        record["output_len"] = self.output_len
        if self.output is not None:
            record["output"] = list(self.output)
        if self.prefix_group is not None:
            record["prefix_group"] = self.prefix_group
            record["prefix_len"] = self.prefix_len
        if self.n != 1:
            record["n"] = self.n
            record["fork"] = self.fork
        if self.cache_salt is not None:
            record["cache_salt"] = self.cache_salt
        return record


def check_fields(r: Request) -> None:
    """Clear errors for a request's impossible fields (a trace record's, a workload's); normalises
    numpy scalars to Python ones. Whether a server can serve it is ``sim.simulator.prepare``'s check."""
    r.arrival_time = real("arrival_time", r.arrival_time)
    if not math.isfinite(r.arrival_time) or r.arrival_time < 0:
        raise ValueError(f"arrival_time must be finite and >= 0, got {r.arrival_time}")
    if r.prompt is not None:  # token ids are hashed as int64: each in [0, 2**63), the bad one named
        r.prompt = token_list("prompt", r.prompt)
        if r.prompt_len != len(r.prompt):
            raise ValueError(f"prompt_len {r.prompt_len} disagrees with the {len(r.prompt)} prompt tokens")
    r.prompt_len = integer("prompt_len", r.prompt_len, low=1)
    r.output_len = integer("output_len", r.output_len, low=1)
    r.n = integer("n", r.n)
    r.prefix_len = integer("prefix_len", r.prefix_len)
    if r.n < 1:
        raise FieldValueError("n", f"n (samples per request) must be >= 1, got {r.n}")
    if r.output is not None:
        r.output = token_list("output", r.output)
        if r.output_len != len(r.output):
            raise ValueError(f"output_len {r.output_len} disagrees with the {len(r.output)} output tokens")
        if r.n != 1:
            raise ValueError(f"output (the reply's token ids) names one sample; this request has n={r.n}")
    if r.cache_salt is not None:
        cache_key("cache_salt", r.cache_salt)
    choice("fork", r.fork, FORK_MODES)
    if r.prefix_group is None:
        if r.prefix_len:
            raise ValueError("prefix_len given without a prefix_group")
    else:
        if not isinstance(r.prefix_group, (str, int)) or isinstance(r.prefix_group, bool):
            raise TypeError(f"prefix_group must be a str or int, got {type(r.prefix_group).__name__}")
        r.prefix_group = str(r.prefix_group)
        if not 0 <= r.prefix_len <= r.prompt_len:
            raise ValueError(f"prefix_len must be in [0, prompt_len={r.prompt_len}], got {r.prefix_len}")


def prompt_token_ids(requests: list[Request]) -> list[list[int]]:
    """Token ids for every prompt: the trace's own, or unique ids plus each group's shared prefix.

    Unique ids mean only declared sharing (``prefix_group``) can ever hit a prefix cache.
    """
    groups: dict[str, list[int]] = {}
    next_id = 1
    prompts = []
    for r in requests:
        if r.prompt is not None:
            prompts.append(r.prompt)
            continue
        head: list[int] = []
        if r.prefix_group is not None and r.prefix_len:
            shared = groups.get(r.prefix_group, [])
            if len(shared) < r.prefix_len:  # the group's prefix grows to the longest asked for
                extra = r.prefix_len - len(shared)
                shared = shared + list(range(next_id, next_id + extra))
                next_id += extra
                groups[r.prefix_group] = shared
            head = shared[: r.prefix_len]
        tail = r.prompt_len - len(head)
        prompts.append(head + list(range(next_id, next_id + tail)))
        next_id += tail
    return prompts


class TraceKeyError(KeyError):
    """A trace record misses a required field (a KeyError whose message reads plainly)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "missing field"


_FIELDS = {
    "arrival_time",
    "prompt_len",
    "prompt",
    "output_len",
    "output",
    "prefix_group",
    "prefix_len",
    "n",
    "fork",
    "cache_salt",
}


def save_trace(requests: list[Request], path: str | os.PathLike) -> None:
    """Write one JSON object per request (the format in the module doc)."""
    with open(path, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(r.to_json()) + "\n")


def load_trace(path: str | os.PathLike) -> list[Request]:
    """Read a JSONL trace; a bad record raises ``ValueError``/``TypeError`` naming its line.

    Requests are returned sorted by arrival time (stable, so ties keep file order).
    """
    requests = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                requests.append(_parse_record(json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            except KeyError as exc:
                raise TraceKeyError(f"{path}:{lineno}: {exc.args[0] if exc.args else exc}") from None
            except (ValueError, TypeError) as exc:  # a FieldTypeError is both: a TypeError
                raise (TypeError if isinstance(exc, TypeError) else ValueError)(f"{path}:{lineno}: {exc}") from None
    if not requests:
        raise ValueError(f"{path}: the trace holds no requests")
    requests.sort(key=lambda r: r.arrival_time)
    return requests


def _parse_record(record: object) -> Request:
    if not isinstance(record, dict):
        raise TypeError(f"a trace record must be a JSON object, got {type(record).__name__}")
    unknown = set(record) - _FIELDS
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}; allowed: {sorted(_FIELDS)}")
    for key in ("arrival_time", "output_len"):
        if key not in record:
            raise KeyError(f"missing field {key!r}")
    prompt = record.get("prompt")
    if (prompt is None) == ("prompt_len" not in record):
        raise ValueError("give exactly one of 'prompt_len' or 'prompt' (token ids)")
    if prompt is not None and not isinstance(prompt, list):
        raise TypeError(f"'prompt' must be a list of token ids, got {type(prompt).__name__}")
    prompt_len = len(prompt) if prompt is not None else record["prompt_len"]
    return Request(
        arrival_time=record["arrival_time"],
        prompt_len=prompt_len,
        output_len=record["output_len"],
        prompt=prompt,
        prefix_group=record.get("prefix_group"),
        prefix_len=record.get("prefix_len", 0),
        n=record.get("n", 1),
        fork=record.get("fork", "parallel"),
        output=record.get("output"),
        cache_salt=record.get("cache_salt"),
    )

"""Workloads whose prompts share prefixes in the ways that separate prefix caches and policies.

Each request carries explicit token ids (``Request.prompt``), so a prefix cache hits exactly the
tokens two prompts share; ids are drawn from disjoint ranges so nothing else is shared.

* :func:`multiturn` -- chat conversations: turn ``t``'s prompt is the whole conversation so far
  (every earlier user message and reply) plus the new user message. Turns of one conversation
  arrive one round of conversations apart, so the cache must keep a conversation while others run.
* :func:`fewshot` -- few-shot prompts: a shared instruction, then ``shots`` examples drawn from a
  pool *in varying order*, then a question. A prefix cache hits the instruction and only as many
  examples as lead in the same order.
* :func:`agents` -- a tree of agent calls: each call's prompt is a path from a task's root
  context down a tree of tool results (``branching`` children per node, up to ``depth`` deep),
  plus the call's own instruction; calls on sibling branches share everything above the branch.

A multi-turn request names its reply (``Request.output``): the simulator generates exactly those
ids, and the next turn's prompt carries them, so the next turn hits the full blocks of the reply as
vLLM and SGLang do (both cache blocks of generated tokens). Plain Python and numpy.
"""

from __future__ import annotations

import math
from itertools import count

import numpy as np

from paged_edu.sim.arrivals import L_MAX, check_num_requests, poisson_arrivals, workload_rng
from paged_edu.core.validation import integer
from paged_edu.sim.request import Request

__all__ = ["agents", "fewshot", "multiturn"]


def _positive(name: str, value: object) -> int:
    return integer(name, value, low=1)


class _Ids:
    """Fresh token ids, never repeated."""

    def __init__(self) -> None:
        self._next = count(1)

    def take(self, n: int) -> list[int]:
        return [next(self._next) for _ in range(n)]


def _outputs(rng: np.random.Generator, num: int, low: int = 16, high: int = 128) -> list[int]:
    return rng.integers(low, high + 1, size=num).tolist()


def multiturn(
    num_requests: int,
    rate: float = math.inf,
    seed: int = 0,
    num_turns: int = 4,
    user_len: int = 64,
    reply_len: int = 96,
) -> list[Request]:
    """``ceil(num_requests / num_turns)`` conversations of up to ``num_turns`` turns each."""
    check_num_requests(num_requests)
    num_turns, user_len, reply_len = (
        _positive(n, v) for n, v in (("num_turns", num_turns), ("user_len", user_len), ("reply_len", reply_len))
    )
    rng = workload_rng(seed)
    times = poisson_arrivals(num_requests, rate, rng).tolist()
    num_convs = -(-num_requests // num_turns)
    ids = _Ids()
    history: list[list[int]] = [[] for _ in range(num_convs)]
    requests = []
    for i, t in enumerate(times):  # all first turns, then all second turns, ...
        conv = i % num_convs
        prompt = history[conv] + ids.take(user_len)
        output = min(reply_len, L_MAX - len(prompt))
        if output < 1:  # the conversation outgrew the context: start it again
            prompt, output = ids.take(user_len), reply_len
        reply = ids.take(output)
        history[conv] = prompt + reply  # the reply, as generated, joins the conversation
        requests.append(Request(float(t), len(prompt), output, prompt=prompt, output=reply))
    return requests


def fewshot(
    num_requests: int,
    rate: float = math.inf,
    seed: int = 0,
    num_examples: int = 8,
    shots: int = 4,
    instruction_len: int = 128,
    example_len: int = 96,
    question_len: int = 32,
) -> list[Request]:
    """Prompts of ``instruction + shots examples (of num_examples, random order) + question``."""
    check_num_requests(num_requests)
    for name, value in (
        ("num_examples", num_examples),
        ("shots", shots),
        ("instruction_len", instruction_len),
        ("example_len", example_len),
        ("question_len", question_len),
    ):
        _positive(name, value)
    if shots > num_examples:
        raise ValueError(f"shots={shots} cannot exceed num_examples={num_examples}")
    rng = workload_rng(seed)
    times = poisson_arrivals(num_requests, rate, rng).tolist()
    ids = _Ids()
    instruction = ids.take(instruction_len)
    examples = [ids.take(example_len) for _ in range(num_examples)]
    outputs = _outputs(rng, num_requests)
    requests = []
    for t, output in zip(times, outputs):
        chosen = rng.choice(num_examples, size=shots, replace=False).tolist()
        prompt = instruction + [tok for e in chosen for tok in examples[e]] + ids.take(question_len)
        requests.append(Request(float(t), len(prompt), output, prompt=prompt))
    return requests


def agents(
    num_requests: int,
    rate: float = math.inf,
    seed: int = 0,
    num_tasks: int = 4,
    branching: int = 3,
    depth: int = 3,
    root_len: int = 256,
    step_len: int = 64,
    call_len: int = 16,
) -> list[Request]:
    """Agent calls down trees of tool results: ``root + steps on one path + the call's own tokens``."""
    check_num_requests(num_requests)
    for name, value in (
        ("num_tasks", num_tasks),
        ("branching", branching),
        ("depth", depth),
        ("root_len", root_len),
        ("step_len", step_len),
        ("call_len", call_len),
    ):
        _positive(name, value)
    rng = workload_rng(seed)
    times = poisson_arrivals(num_requests, rate, rng).tolist()
    ids = _Ids()
    roots = [ids.take(root_len) for _ in range(num_tasks)]
    steps: dict[tuple, list[int]] = {}  # (task, branch, branch, ...) -> that node's tokens
    outputs = _outputs(rng, num_requests)
    requests = []
    for t, output in zip(times, outputs):
        task = int(rng.integers(num_tasks))
        path = (task,)
        prompt = list(roots[task])
        for _ in range(int(rng.integers(depth + 1))):
            path += (int(rng.integers(branching)),)
            prompt += steps.setdefault(path, ids.take(step_len))
        prompt += ids.take(call_len)
        requests.append(Request(float(t), len(prompt), output, prompt=prompt))
    return requests

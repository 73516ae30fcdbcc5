"""The engine core's wait while idle (:meth:`paged_edu.serve.core.EngineCore._take_inputs`), asleep
(``paged-edu serve``'s default) or spinning (``--no-sleep-on-idle``), with fake sockets and a fake engine:
the oracle is the list of timeouts the core handed ``poll`` -- one ``poll(None)`` asleep, ``poll(0)`` again
and again until the message is there spinning -- and the message handled either way. The real server
spinning is in ``test_server.py``."""

from __future__ import annotations

from types import SimpleNamespace

import msgpack
import pytest

from paged_edu.serve.core import EngineCore


class FakeInputs:
    """The core's PULL socket: ``messages`` arrive after ``idle_polls`` polls that found nothing (a blocking
    ``poll(None)`` waits for them, so it finds them). ``timeouts``: every poll's timeout, in order."""

    def __init__(self, messages: list, idle_polls: int) -> None:
        self.messages = [msgpack.packb(m) for m in messages]
        self.idle_polls = idle_polls
        self.timeouts: list[int | None] = []

    def poll(self, timeout=None) -> bool:
        self.timeouts.append(timeout)
        if timeout is None:  # blocked until the messages came
            self.idle_polls = 0
        if self.idle_polls:
            self.idle_polls -= 1
            return False
        return bool(self.messages)

    def recv(self) -> bytes:
        return self.messages.pop(0)


class FakeOutputs:
    """An API server's PULL end: the messages the core sent, unpacked."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, data, copy=True) -> None:
        self.sent.append(msgpack.unpackb(data))


class FakeEngine:
    """Accepts every request (ids 0, 1, ...), never has anything to compute, and forgets what it is asked
    to abort; its gauges and counters (the core's stats) are all zero."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []
        self.scheduler = SimpleNamespace(running=[], waiting=[], swapped=[], num_preemptions=0)
        self.allocator = SimpleNamespace(usage=0.0, stats=SimpleNamespace(queried_tokens=0, hit_tokens=0))

    def add_request(self, prompt, params, cache_salt=None) -> int:
        self.prompts.append(prompt)
        return len(self.prompts) - 1

    def has_unfinished(self) -> bool:
        return False

    def abort_request(self, request_id, sample_index=None):
        return None


ADD = ["add", 7, [1, 2, 3], {"max_tokens": 4}, None, 0]  # rid 7, from channel 0


@pytest.mark.parametrize("sleep_on_idle", [True, False], ids=["asleep", "spinning"])
def test_an_idle_core_waits_for_the_message_then_handles_it(sleep_on_idle):
    inputs, engine = FakeInputs([ADD], idle_polls=3), FakeEngine()
    core = EngineCore(engine, inputs, FakeOutputs(), sleep_on_idle=sleep_on_idle)
    core._take_inputs(wait=True)
    if sleep_on_idle:  # one blocking poll; then the drain finds nothing more
        assert inputs.timeouts == [None, 0]
    else:  # 3 empty polls, the one that sees the message, the drain's poll before recv, its last (empty) one
        assert inputs.timeouts == [0] * (3 + 1 + 2)
    assert engine.prompts == [[1, 2, 3]]
    assert core.channels[0].replies == [["added", 7]]


@pytest.mark.parametrize("sleep_on_idle", [True, False], ids=["asleep", "spinning"])
def test_a_busy_core_never_waits_either_way(sleep_on_idle):
    inputs = FakeInputs([ADD], idle_polls=3)
    core = EngineCore(FakeEngine(), inputs, FakeOutputs(), sleep_on_idle=sleep_on_idle)
    core._take_inputs(wait=False)  # work to do: take what is there (nothing yet) and go on
    assert inputs.timeouts == [0]
    assert core.channels[0].replies == []


@pytest.mark.parametrize("sleep_on_idle", [True, False], ids=["asleep", "spinning"])
def test_a_stop_while_idle_ends_the_loop(sleep_on_idle):
    inputs, outputs = FakeInputs([ADD, ["stop"]], idle_polls=5), FakeOutputs()
    core = EngineCore(FakeEngine(), inputs, outputs, sleep_on_idle=sleep_on_idle)
    core.run()  # returns: the stop came while the core waited
    assert inputs.timeouts[0] == (None if sleep_on_idle else 0)
    assert core.num_steps == 0
    added, ended = outputs.sent  # the add answered at once; then, as the loop ends, the request aborted
    assert added[5] == [["added", 7]]
    assert ended[4] == [[7, ["abort"], 0, None, "the server is shutting down", None]]

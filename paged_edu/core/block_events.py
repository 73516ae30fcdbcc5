"""What the allocator reports: :class:`BlockEvent`, and the :class:`Subscribers` that receive them.

Widgets draw the block grid from these events, the engine's tests count copy-on-writes with them,
and the simulator could trace memory with them. The allocator builds an event only when someone
subscribes, and delivers it only after the operation that it reports has committed.

A subscriber that raises must not break the allocator's caller half-way through its own work (a
scheduler step, a widget callback): :meth:`Subscribers.deliver` catches the exception, reports it
with ``warnings.warn`` (a ``RuntimeWarning`` naming the callback, the event and the error) and goes
on with the other subscribers. The allocator's state is already complete when that happens.

A subscriber may also *change* the allocator from inside its callback (free a sequence, admit one).
That operation happens after the one being reported, so its events must reach every subscriber after
that one's -- also the subscribers that have not been called yet. The publisher's channels therefore
share one :class:`EventQueue`: an operation posts all its events (:meth:`Subscribers.post`), then
flushes; a flush called from inside a callback returns at once, and the flush already running delivers
the new events when it reaches them. Every subscriber gets every event in the order things happened, and a
callback sees the state after the event (and after whatever earlier callbacks changed).
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["BlockEvent", "EventQueue", "Subscribers"]


@dataclass(slots=True)
class BlockEvent:
    """One thing the allocator did.

    ``kind`` is one of ``allocate``, ``cache_hit``, ``append``, ``copy_on_write``, ``fork``,
    ``free``, ``evict``, ``replace``, ``store``, ``clear``. ``block_ids`` are the physical blocks
    involved: the new table (allocate, fork), the reused blocks (cache_hit), the block written
    (append), ``[src, dst]`` (copy_on_write), the released blocks (free), the block evicted to make
    room or dropped by ``reset_prefix_cache`` (evict: one event per block, before the other events
    of the operation that evicted it), ``[own, cached]`` (replace: a sequence holds the cache's copy
    instead of its own, uncached, block), the blocks that just entered the prefix cache (store,
    ``num_tokens`` their tokens: vLLM's ``BlockStored``), or those dropped when ``reset_prefix_cache``
    emptied the cache (clear: nothing is cached any more, vLLM's ``AllBlocksCleared``). store and
    clear go to ``subscribe_cache`` subscribers, with every evict; replaying store (add), evict
    (remove) and clear (empty) gives the set of cached blocks.
    """

    kind: str
    seq_id: Hashable | None
    block_ids: list[int]
    num_tokens: int = 0  # tokens involved: cached tokens for cache_hit, the prompt for allocate
    slot: int = -1  # the physical slot written (append)


class EventQueue:
    """The events a publisher has posted and not delivered yet, in the order they happened, for all of
    its channels (:class:`Subscribers`). Only the outermost :meth:`flush` delivers."""

    def __init__(self) -> None:
        self._pending: deque[tuple[Subscribers, object]] = deque()
        self._flushing = False

    def post(self, subscribers: Subscribers, event: object) -> None:
        self._pending.append((subscribers, event))

    def flush(self) -> None:
        """Deliver every posted event, first posted first -- those posted by callbacks meanwhile too.
        From inside a callback: nothing (the running flush gets to them after the current event)."""
        if self._flushing:
            return
        self._flushing = True
        try:
            while self._pending:
                subscribers, event = self._pending.popleft()
                subscribers.call_each(event)
        finally:  # only a BaseException (KeyboardInterrupt) gets here early: what is left waits
            self._flushing = False


class Subscribers:
    """The callbacks listening to one channel of a publisher. ``callbacks`` is a tuple, empty when
    nobody listens (test it before building an event), replaced on every change, so (un)subscribing
    from inside a callback is safe. Channels given the same ``queue`` are delivered in one order."""

    def __init__(self, source: str, queue: EventQueue | None = None) -> None:
        self.source = source  # who publishes, for the warning: "allocator"
        self.queue = EventQueue() if queue is None else queue
        self.callbacks: tuple[Callable, ...] = ()

    def add(self, callback: Callable) -> Callable[[], None]:
        """Add ``callback``; returns a function that removes it again."""
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self.callbacks = (*self.callbacks, callback)

        def unsubscribe() -> None:
            self.callbacks = tuple(cb for cb in self.callbacks if cb is not callback)

        return unsubscribe

    def post(self, event: object) -> None:
        """Queue ``event`` for every callback; the publisher flushes the queue when its operation is done."""
        self.queue.post(self, event)

    def deliver(self, event: object) -> None:
        """:meth:`post` ``event`` and flush the queue (from inside a callback, the flush already
        running delivers it in its turn)."""
        self.queue.post(self, event)
        self.queue.flush()

    def call_each(self, event: object) -> None:
        """Call every callback with ``event``; one that raises is reported, not propagated."""
        for callback in self.callbacks:
            try:
                callback(event)
            except Exception as exc:  # noqa: BLE001 -- isolating subscribers is the point
                name = getattr(callback, "__qualname__", repr(callback))
                kind = getattr(event, "kind", type(event).__name__)
                warnings.warn(
                    f"{self.source} subscriber {name} raised {exc!r} on a {kind!r} event; "
                    f"the {self.source}'s state is unaffected",
                    RuntimeWarning,
                    stacklevel=3,
                )

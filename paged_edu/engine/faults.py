"""Faults injected into an engine's step: the fault tests and the soak make a phase raise on purpose.

A step has six places that can fail half-way: the three kinds of block copy
(swap-out, copy-on-write, swap-in: half of the batch is copied, then the copy dies, as a copy that
runs out of memory part-way), ``prepare``, the forward pass (the last layer raises after the first
has written its K/V) and sampling. :func:`inject_fault` wraps the one that ``phase`` names on this
engine's objects (instance attributes, nothing global) so that it raises :class:`InjectedFault`
whenever ``armed()`` says so; the engine must undo the step and raise
:class:`~paged_edu.engine.step.StepFailed` naming :data:`PHASES` ``[phase]``.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["PHASES", "InjectedFault", "inject_fault", "inject_persistent_copy_fault"]

# The phase a fault is injected at -> the phase StepFailed names.
PHASES = {
    "swap_out": "block copies",
    "copy": "block copies",
    "swap_in": "block copies",
    "prepare": "prepare",
    "forward": "forward",
    "sample": "sample",
}


class InjectedFault(RuntimeError):
    """The error an injected fault raises (the ``__cause__`` of the engine's ``StepFailed``)."""


def inject_fault(engine, phase: str, armed: Callable[[], bool]) -> Callable[[], None]:
    """Make ``phase`` raise :class:`InjectedFault` each time it runs while ``armed()`` is true (a
    block copy only asks when it has something to copy). Returns a function that removes the fault
    (the model's patches matter: a model may serve several engines)."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {sorted(PHASES)}, got {phase!r}")
    if phase in ("swap_out", "copy", "swap_in"):
        owner, name = engine.kv_cache, "copy_blocks" if phase == "copy" else phase
        real = getattr(owner, name)

        def patched(pairs):
            if pairs and armed():
                real(pairs[: len(pairs) // 2])  # part of the batch lands, then the copy dies
                raise InjectedFault(f"injected: {phase}")
            real(pairs)

    else:
        owner, name = {
            "prepare": (engine.runner, "prepare"),
            "forward": (engine.model.layers[-1], "forward"),  # the first layer has written its K/V
            "sample": (engine.model, "compute_logits"),
        }[phase]
        real = getattr(owner, name)

        def patched(*args):
            if armed():
                raise InjectedFault(f"injected: {phase}")
            return real(*args)

    setattr(owner, name, patched)
    return lambda: owner.__dict__.pop(name, None)


def inject_persistent_copy_fault(engine, kind: str) -> tuple[dict, Callable[[], None]]:
    """Make block copies of ``kind`` (``"swap_out"``, ``"copy"`` or ``"swap_in"``) fail forever for one
    pair: the first ``(src, dst)`` they are asked to copy. Any batch that holds it copies half, then
    raises :class:`InjectedFault`, every time. Returns ``(state, remove)``: ``state["pair"]`` is the
    pair, ``state["batches"]`` every batch that failed, in order."""
    if kind not in ("swap_out", "copy", "swap_in"):
        raise ValueError(f"kind must be 'swap_out', 'copy' or 'swap_in', got {kind!r}")
    owner, name = engine.kv_cache, "copy_blocks" if kind == "copy" else kind
    real = getattr(owner, name)
    state: dict = {"pair": None, "batches": []}

    def patched(pairs):
        pairs = list(pairs)
        if state["pair"] is None and pairs:
            state["pair"] = tuple(pairs[0])
        if state["pair"] in map(tuple, pairs):
            state["batches"].append(pairs)
            real(pairs[: len(pairs) // 2])
            raise InjectedFault(f"injected: {kind} of {state['pair']} fails forever")
        real(pairs)

    setattr(owner, name, patched)
    return state, lambda: owner.__dict__.pop(name, None)

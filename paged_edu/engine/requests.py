"""Is a request servable? The engine's checks of its inputs, made before anything is queued.

A request is refused with a message naming what is wrong -- a type, a token outside the
vocabulary -- so that nothing fails half-way through a run. The scheduler checks the limits (the
model's positions as ``max_model_len``, the whole pool, ``max_num_seqs`` for ``n`` samples, the
prefill budget) in ``Scheduler.add``; :class:`~paged_edu.engine.sampling.SamplingParams` checks its
fields when made.
"""

from __future__ import annotations

from collections.abc import Sequence

from paged_edu.core.validation import FieldTypeError, FieldValueError, as_int, integer
from paged_edu.engine.sampling import SamplingParams

__all__ = ["check_inputs", "check_max_model_len", "check_tokens"]


def check_inputs(prompt_token_ids, params, vocab_size: int) -> list[int]:
    """What can be wrong with a request's inputs against the model: their types, and token ids
    outside the vocabulary. Returns the prompt as a list of ints.

    Its length (``max_model_len``), the pool and ``max_num_seqs`` are the scheduler's limits:
    ``Scheduler.add`` checks them (:func:`paged_edu.sched.admission.check_fits`).
    """
    if not isinstance(params, SamplingParams):
        raise FieldTypeError("params", f"sampling params must be SamplingParams, got {type(params).__name__}")
    prompt = check_tokens(prompt_token_ids, "prompt", vocab_size)
    if not prompt:
        raise FieldValueError("prompt", "a prompt needs at least one token")
    check_tokens(params.stop_token_ids, "stop_token_ids", vocab_size)
    return prompt


def check_tokens(token_ids, what: str, vocab_size: int) -> list[int]:
    """``token_ids`` as a list of ints in ``[0, vocab_size)``; the error names ``what`` and the position."""
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
        raise FieldTypeError(what, f"{what} must be a list of token ids, got {type(token_ids).__name__}")
    if token_ids and all(type(t) is int for t in token_ids) and min(token_ids) >= 0 and max(token_ids) < vocab_size:
        return list(token_ids)  # the common case, checked at C speed; anything else: the loop names the culprit
    tokens = []
    for i, t in enumerate(token_ids):
        try:
            t = as_int(t, f"{what}: token ids must be ints (position {i})")
        except TypeError as exc:
            raise FieldTypeError(what, str(exc)) from None
        if not 0 <= t < vocab_size:
            raise FieldValueError(
                what, f"{what}: token id {t} at position {i} is outside the vocabulary [0, {vocab_size})"
            )
        tokens.append(t)
    return tokens


def check_max_model_len(max_model_len, num_positions: int, num_blocks: int, block_size: int) -> int:
    """The longest sequence: at most the model's positions (its rotary table ends there)."""
    if max_model_len is None:
        return min(num_positions, num_blocks * block_size)
    value = integer("max_model_len", max_model_len, low=1)
    if value > num_positions:
        raise FieldValueError(
            "max_model_len",
            f"max_model_len={value} exceeds the model's {num_positions} positions "
            "(max_position_embeddings); a longer sequence has no rotary position",
        )
    return value

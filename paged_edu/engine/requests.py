"""Is a request servable? The engine's checks, made before anything is queued.

A request is refused with a message naming the limit it breaks -- the vocabulary, the model's
positions (``max_model_len``) -- so that nothing fails half-way through a run. The scheduler checks
its own limits (the whole pool, ``max_num_seqs`` for ``n`` samples, the prefill budget) in
``Scheduler.add``; :class:`~paged_edu.engine.sampling.SamplingParams` checks its fields when made.
"""

from __future__ import annotations

from collections.abc import Sequence

from paged_edu.core.validation import as_int
from paged_edu.engine.sampling import SamplingParams

__all__ = ["check_max_model_len", "check_request", "check_tokens"]


def check_request(prompt_token_ids, params, config, *, max_model_len: int) -> list[int]:
    """What can be wrong with a request against the model (``config``, a LlamaConfig): its types,
    its token ids, its length against ``max_model_len``. Returns the prompt as a list of ints.

    The pool and ``max_num_seqs`` are the scheduler's limits: ``Scheduler.add`` checks them.
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"sampling params must be SamplingParams, got {type(params).__name__}")
    prompt = check_tokens(prompt_token_ids, "prompt", config.vocab_size)
    if not prompt:
        raise ValueError("a prompt needs at least one token")
    check_tokens(params.stop_token_ids, "stop_token_ids", config.vocab_size)
    longest = len(prompt) + params.max_tokens
    if longest > max_model_len:
        raise ValueError(
            f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}) = {longest} tokens exceeds "
            f"max_model_len={max_model_len} (the model has {config.max_position_embeddings} positions)"
        )
    return prompt


def check_tokens(token_ids, what: str, vocab_size: int) -> list[int]:
    """``token_ids`` as a list of ints in ``[0, vocab_size)``; the error names ``what`` and the position."""
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
        raise TypeError(f"{what} must be a list of token ids, got {type(token_ids).__name__}")
    tokens = []
    for i, t in enumerate(token_ids):
        t = as_int(t, f"{what}: token ids must be ints (position {i})")
        if not 0 <= t < vocab_size:
            raise ValueError(f"{what}: token id {t} at position {i} is outside the vocabulary [0, {vocab_size})")
        tokens.append(t)
    return tokens


def check_max_model_len(max_model_len, num_positions: int, num_blocks: int, block_size: int) -> int:
    """The longest sequence: at most the model's positions (its rotary table ends there)."""
    if max_model_len is None:
        return min(num_positions, num_blocks * block_size)
    value = as_int(max_model_len, "max_model_len must be an int")
    if value < 1:
        raise ValueError(f"max_model_len must be >= 1, got {value}")
    if value > num_positions:
        raise ValueError(
            f"max_model_len={value} exceeds the model's {num_positions} positions "
            "(max_position_embeddings); a longer sequence has no rotary position"
        )
    return value

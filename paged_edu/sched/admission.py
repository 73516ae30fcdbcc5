"""Admission: the limits a request must fit before a scheduler queues it.

A request that can never run -- longer than the model's context, bigger than the whole KV pool,
more parallel samples than the batch may hold -- is refused when it is added, with a message
naming the limit, instead of waiting forever or failing half-way through a run.
:meth:`paged_edu.sched.scheduler.Scheduler.check_fits` applies these limits with its own
configuration (``Scheduler.add`` calls it before it queues anything). Each error is a
:class:`~paged_edu.core.validation.FieldValueError` whose ``.field`` is the limit broken, so a
command line can name the flag that sets it. Plain Python, no torch.
"""

from __future__ import annotations

from paged_edu.core.validation import FieldValueError

__all__ = ["check_fits"]


def check_fits(
    num_prompt_tokens: int,
    max_new_tokens: int,
    num_samples: int = 1,
    *,
    max_model_len: int | None,
    block_size: int,
    num_blocks: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    enable_chunked_prefill: bool,
) -> None:
    """Raise ``FieldValueError`` naming the first limit the request breaks; return None if it fits.

    The limits: ``max_model_len`` (prompt + output tokens; None: no limit of its own), the whole
    pool (one sequence's blocks at its longest), ``max_num_seqs`` (samples that run at once), and
    without chunked prefill ``max_num_batched_tokens`` (the longest prefill: a recompute after a
    preemption re-prefills the prompt plus every generated token but the last).
    """
    longest = num_prompt_tokens + max_new_tokens
    if max_model_len is not None and longest > max_model_len:
        raise FieldValueError(
            "max_model_len",
            f"prompt ({num_prompt_tokens}) + max_tokens ({max_new_tokens}) = {longest} tokens exceeds "
            f"max_model_len={max_model_len}",
        )
    needed = -(-longest // block_size)
    if needed > num_blocks:
        raise FieldValueError(
            "num_blocks",
            f"prompt ({num_prompt_tokens}) + max_tokens ({max_new_tokens}) = {longest} tokens needs {needed} "
            f"blocks of {block_size}, more than the whole pool holds ({num_blocks} blocks)",
        )
    if num_samples > max_num_seqs:
        raise FieldValueError(
            "max_num_seqs", f"n={num_samples} parallel samples can never run at once with max_num_seqs={max_num_seqs}"
        )
    longest_prefill = longest - 1
    if not enable_chunked_prefill and longest_prefill > max_num_batched_tokens:
        raise FieldValueError(
            "max_num_batched_tokens",
            f"the request may need a {longest_prefill}-token prefill (prompt plus generated tokens, after a "
            f"preemption), more than max_num_batched_tokens={max_num_batched_tokens}; "
            "enable chunked prefill or raise the budget",
        )

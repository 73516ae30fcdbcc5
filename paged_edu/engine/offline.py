"""Offline batches on top of :class:`~paged_edu.engine.engine.Engine`: add prompts, step until done.

What vLLM's ``LLM.generate`` / ``LLM.chat`` do over its engine, in three functions that
:meth:`Engine.run`, :meth:`Engine.generate` and :meth:`Engine.chat` call. They only use the
engine's public calls: :meth:`Engine.add_requests` (all or nothing) and :meth:`Engine.step`.
"""

from __future__ import annotations

from collections.abc import Sequence

from paged_edu.engine.outputs import RequestOutput
from paged_edu.engine.sampling import SamplingParams

__all__ = ["chat", "generate", "run"]


def run(
    engine,
    prompts: Sequence[Sequence[int]],
    sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    *,
    use_tqdm: bool | None = None,
) -> list[RequestOutput]:
    """Add every prompt, step until all are done; outputs in the order of ``prompts``.

    Nothing is queued unless every request is accepted (see :meth:`Engine.add_requests`).
    """
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        params_list = [sampling_params or SamplingParams()] * len(prompts)
    elif isinstance(sampling_params, (str, bytes)) or not isinstance(sampling_params, Sequence):
        raise TypeError(
            "sampling_params must be a SamplingParams, a list of them (one per prompt) or None, "
            f"got {type(sampling_params).__name__} {sampling_params!r}"
        )
    else:
        params_list = list(sampling_params)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(params_list)} sampling params for {len(prompts)} prompts")
    ids = engine.add_requests(prompts, params_list)
    wanted = set(ids)
    results: dict[int, RequestOutput] = {}
    bar = None
    if len(prompts) >= 64 if use_tqdm is None else use_tqdm:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(ids), desc="requests", unit="req")
    try:
        while len(results) < len(ids):
            for out in engine.step():
                if out.request_id in wanted:
                    results[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
            if not engine.has_unfinished() and len(results) < len(ids):
                raise RuntimeError("the engine stopped with requests unfinished (one was aborted during the run?)")
    finally:
        if bar is not None:
            bar.close()
    return [results[i] for i in ids]


def generate(
    engine,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int = 32,
    sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    *,
    use_tqdm: bool | None = None,
) -> list[list[int]]:
    """New tokens for each prompt: greedy with ``max_new_tokens`` unless ``sampling_params`` say otherwise.

    One sample per prompt; for ``n > 1`` use :func:`run`, which returns every sample.
    """
    if sampling_params is None:
        sampling_params = SamplingParams(max_tokens=max_new_tokens)
    params = [sampling_params] if isinstance(sampling_params, SamplingParams) else list(sampling_params)
    if any(not isinstance(p, SamplingParams) for p in params):
        raise TypeError("sampling_params must be SamplingParams or a list of them")
    if any(p.n != 1 for p in params):
        raise ValueError("generate returns one sample per prompt; use Engine.run for n > 1")
    return [out.outputs[0] for out in run(engine, prompts, sampling_params, use_tqdm=use_tqdm)]


def chat(
    engine, conversations, tokenizer, sampling_params: SamplingParams | None = None, *, max_new_tokens: int = 64
) -> list[str]:
    """Reply to chat conversations: apply the tokenizer's chat template, generate, decode.

    ``conversations`` is one conversation (a list of ``{"role", "content"}`` dicts) or a list of
    them; the tokenizer's end-of-sequence token stops a reply. Returns one string each.
    """
    if conversations and isinstance(conversations[0], dict):
        conversations = [conversations]
    eos = tokenizer.eos_token_id
    if sampling_params is None:
        sampling_params = SamplingParams(max_tokens=max_new_tokens, stop_token_ids=(eos,) if eos is not None else ())
    prompts = []
    for messages in conversations:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    replies = generate(engine, prompts, sampling_params=sampling_params)
    return [tokenizer.decode(r, skip_special_tokens=True) for r in replies]

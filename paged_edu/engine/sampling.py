"""Turning logits into tokens: greedy, temperature, top-p (nucleus), reproducible by seed.

What you will learn
-------------------
* greedy decoding is ``argmax`` -- what ``transformers`` ``generate(do_sample=False)`` does, so
  the engine's greedy output can be compared token for token;
* temperature ``T`` divides the logits before the softmax: ``p_i ∝ exp(z_i / T)``;
* top-p keeps the smallest set of most likely tokens whose mass reaches ``p`` and renormalises;
* one uniform number ``u`` per request and step, drawn from that request's own
  ``torch.Generator``, picks the token by inverse CDF. A request's draws therefore do not depend
  on which other requests share its batch, so a fixed seed reproduces its samples in any batch,
  on any device.

All rows of a step are sampled together: one sort and one cumulative sum for the whole batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from paged_edu.core.validation import as_int

__all__ = ["SamplingParams", "Sampler", "sample"]


@dataclass(slots=True)
class SamplingParams:
    """How one request is decoded.

    ``temperature = 0`` is greedy. ``n > 1`` asks for ``n`` samples of the same prompt: they share
    the prompt's blocks (fork) and diverge by copy-on-write. ``seed`` makes sampling reproducible;
    sample ``i`` of a request draws from ``torch.Generator().manual_seed(seed + i)``.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    n: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an int >= 1, got {self.n!r}")
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(self.seed).__name__}")
        try:  # integers only (numpy and torch ones too): int() would turn 1.5 or "7" into a token id
            self.stop_token_ids = tuple(as_int(t, "stop token ids must be ints") for t in self.stop_token_ids)
        except (TypeError, ValueError):
            raise TypeError(f"stop_token_ids must be a sequence of ints, got {self.stop_token_ids!r}") from None
        if self.n > 1 and self.temperature == 0:
            raise ValueError("n > 1 with temperature 0 would give n identical greedy samples; set temperature > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample(
    logits: torch.Tensor,  # (N, vocab) fp32
    temperatures: Sequence[float],  # (N,): 0 = greedy
    top_ps: Sequence[float],  # (N,)
    uniforms: Sequence[float],  # (N,): one draw in [0, 1) per row (ignored for greedy rows)
) -> list[int]:
    """One token per row. Greedy rows take the argmax; the others sample by inverse CDF."""
    N, vocab = logits.shape
    greedy_tokens = logits.argmax(dim=-1)  # (N,)
    if all(t == 0 for t in temperatures):
        return greedy_tokens.tolist()
    device = logits.device
    temp = torch.tensor([t if t > 0 else 1.0 for t in temperatures], device=device)  # (N,)
    probs = torch.softmax(logits / temp[:, None], dim=-1)  # (N, vocab)
    sorted_p, sorted_idx = probs.sort(dim=-1, descending=True)  # (N, vocab) each
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # (N, vocab): mass of strictly more likely tokens
    top_p = torch.tensor(list(top_ps), device=device, dtype=sorted_p.dtype)  # (N,)
    sorted_p = sorted_p * (mass_before < top_p[:, None])  # the nucleus; the most likely token always stays
    cdf = sorted_p.cumsum(dim=-1)  # (N, vocab)
    target = torch.tensor(list(uniforms), device=device, dtype=cdf.dtype)[:, None] * cdf[:, -1:]  # (N, 1)
    choice = torch.searchsorted(cdf, target, right=True).clamp_(max=vocab - 1)  # first index with cdf > target
    sampled = sorted_idx.gather(-1, choice).squeeze(-1)  # (N,)
    is_greedy = torch.tensor([t == 0 for t in temperatures], device=device)
    return torch.where(is_greedy, greedy_tokens, sampled).tolist()


class Sampler:
    """Per-sample random streams: one CPU ``torch.Generator`` per (request, sample index), seeded once."""

    def __init__(self, seed: int = 0) -> None:
        self._seed_source = torch.Generator().manual_seed(seed)  # for requests without a seed
        self._generators: dict[tuple[int, int], torch.Generator] = {}

    def add(self, request_id: int, params: SamplingParams) -> None:
        """Seed the ``n`` streams of a request (nothing for greedy ones)."""
        if params.greedy:
            return
        base = params.seed
        if base is None:
            base = int(torch.randint(0, 2**62, (), generator=self._seed_source))
        for i in range(params.n):
            self._generators[(request_id, i)] = torch.Generator().manual_seed(base + i)

    def remove(self, request_id: int, sample_index: int) -> None:
        self._generators.pop((request_id, sample_index), None)

    def uniform(self, request_id: int, sample_index: int = 0) -> float:
        """The next draw in [0, 1) of one sample's stream (0.0 for a greedy request)."""
        gen = self._generators.get((request_id, sample_index))
        return 0.0 if gen is None else float(torch.rand((), generator=gen))

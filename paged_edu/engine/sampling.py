"""Turning logits into tokens: greedy, temperature, top-p (nucleus), reproducible by seed -- and a
step's sampling, decided, drawn and handed back in one place.

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

All rows of a step are sampled together: one sort and one cumulative sum for the whole batch. The
inverse CDF runs in token-id order (see :func:`sample`), so a rounding-level change of the logits
between batch compositions cannot reorder it.

A step's sampling, in the order it happens:

1. :func:`plan_sampling` -- before the batch is staged: which chunks emit a token, how many tokens
   each draws (``n`` for a parallel-sampling prompt that ends, then 1), and per token drawn its
   stream's ``(temperature, top_p, uniform)`` -- the :class:`SamplingPlan`;
2. the runner stages the plan's rows (the hidden-state row of each token drawn) and parameters with
   the batch, as a :class:`SamplingBatch` on the device;
3. :func:`draw` -- after the forward pass: the LM head over the sampled rows only, then
   :func:`sample_on_device` (or the argmax a CUDA graph already computed), the tokens left on the device;
4. :func:`tokens_by_sequence` -- once the tokens are on the host: each sequence's token, or the ``n``
   of a parallel-sampling prompt, from which the scheduler forks the other samples in ``update``.
"""

from __future__ import annotations

import math
from itertools import compress, count, repeat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from paged_edu.core.validation import SEED_LIMIT, FieldTypeError, FieldValueError, as_int, fraction, integer, real
from paged_edu.core.validation import seed as check_seed

__all__ = [
    "GREEDY_BELOW",
    "MAX_SAMPLES",
    "SamplingBatch",
    "SamplingParams",
    "SamplingPlan",
    "Sampler",
    "draw",
    "plan_sampling",
    "sample",
    "sample_on_device",
    "tokens_by_sequence",
]


# The most samples one request may ask for (``n``). Every sample is a sequence of the batch from its
# request's admission (it counts against ``max_num_seqs``) with a random stream of its own, and the
# engine refuses an ``n`` above its ``max_num_seqs`` before it builds anything; this bound refuses an
# absurd ``n`` (2**31) where no engine is known yet, before a list of its samples is made.
MAX_SAMPLES = 1024

# A temperature below this is greedy, as in vLLM (``_SAMPLING_EPS = 1e-5`` in vllm/sampling_params.py and
# vllm/v1/sample/sampler.py): dividing fp32 logits by ~1e-38 overflows to inf, the softmax gives NaN,
# and the inverse CDF then always lands on the last token of the vocabulary.
GREEDY_BELOW = 1e-5


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How one request is decoded; every field is checked here, once, and cannot change after.

    ``temperature = 0`` is greedy, and so is any temperature below :data:`GREEDY_BELOW` (it is stored as
    0: the limit of sampling as ``T -> 0`` is the argmax, which fp32 cannot compute by division). ``n > 1``
    asks for ``n`` samples of the same prompt, at most :data:`MAX_SAMPLES` (and an engine's
    ``max_num_seqs``): they share the prompt's blocks (fork) and diverge by copy-on-write. Integer
    fields take integers only (a float or a bool is refused, naming the field). ``seed`` makes sampling reproducible;
    sample ``i`` of a request draws from ``torch.Generator().manual_seed(seed + i)``, so
    ``seed + n - 1`` must be a valid generator seed (``< 2**64``).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    n: int = 1

    def __post_init__(self) -> None:
        max_tokens = integer("max_tokens", self.max_tokens, low=1)
        n = integer("n", self.n, low=1, high=MAX_SAMPLES)
        temperature = real("temperature", self.temperature)
        if not math.isfinite(temperature) or temperature < 0:
            raise FieldValueError("temperature", f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if temperature < GREEDY_BELOW:
            temperature = 0.0
        top_p = fraction("top_p", self.top_p)
        seed = self.seed
        if seed is not None:
            seed = integer("seed", seed)
            if not 0 <= seed <= SEED_LIMIT - n:
                raise FieldValueError(
                    "seed",
                    f"seed must be in [0, 2**64 - n] = [0, {SEED_LIMIT - n}] (sample i uses seed + i), got {seed}",
                )
        if isinstance(self.stop_token_ids, (str, bytes)) or not isinstance(self.stop_token_ids, Iterable):
            raise FieldTypeError(
                "stop_token_ids", f"stop_token_ids must be a sequence of ints, got {self.stop_token_ids!r}"
            )
        try:  # integers only (numpy and torch ones too): int() would turn 1.5 or "7" into a token id
            stop = tuple(as_int(t, "stop token ids must be ints") for t in self.stop_token_ids)
        except (TypeError, ValueError):
            raise FieldTypeError(
                "stop_token_ids", f"stop_token_ids must be a sequence of ints, got {self.stop_token_ids!r}"
            ) from None
        if any(t < 0 for t in stop):
            raise FieldValueError("stop_token_ids", f"stop_token_ids must be token ids >= 0, got {stop!r}")
        if n > 1 and temperature == 0:
            raise ValueError(
                f"n > 1 with temperature {self.temperature!r} (greedy: below {GREEDY_BELOW}) would give "
                "n identical samples; set a higher temperature"
            )
        for name, value in (
            ("max_tokens", max_tokens),
            ("n", n),
            ("temperature", temperature),
            ("top_p", top_p),
            ("seed", seed),
            ("stop_token_ids", stop),
        ):
            object.__setattr__(self, name, value)  # the checked, plain-Python values

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample(
    logits: torch.Tensor,  # (N, vocab) fp32
    temperatures: Sequence[float],  # (N,): 0 = greedy
    top_ps: Sequence[float],  # (N,)
    uniforms: Sequence[float],  # (N,): one draw in [0, 1) per row (ignored for greedy rows)
) -> list[int]:
    """One token per row. Greedy rows take the argmax; the others sample by inverse CDF.

    The nucleus is found in sorted order (a stable sort: tied probabilities keep token-id order);
    the inverse CDF then runs over the nucleus in *token-id* order, not in sorted order. So two
    nearly tied tokens that swap places in the sort when a different batch shifts their logits by
    a rounding error (1e-6) pick the same token for the same ``u``: only a ``u`` within a rounding
    error of a CDF boundary can change the outcome, where in sorted order any ``u`` in the pair's
    mass could. (The engine calls :func:`sample_on_device`, the same math on tensors.)
    """
    if all(t == 0 for t in temperatures):
        return logits.argmax(dim=-1).tolist()
    device = logits.device
    as_tensor = lambda v: torch.tensor(list(v), device=device, dtype=torch.float32)  # noqa: E731
    return sample_on_device(logits, as_tensor(temperatures), as_tensor(top_ps), as_tensor(uniforms)).tolist()


def sample_on_device(
    logits: torch.Tensor,  # (N, vocab) fp32
    temperatures: torch.Tensor,  # (N,) fp32: 0 = greedy
    top_ps: torch.Tensor,  # (N,) fp32
    uniforms: torch.Tensor,  # (N,) fp32 in [0, 1)
    greedy_tokens: torch.Tensor | None = None,  # (N,) the argmax, if already computed
) -> torch.Tensor:
    """:func:`sample` on tensors that stay on the device: no host round trip, no branch on data,
    so it can run inside a captured CUDA graph. Returns ``(N,)`` int64 token ids."""
    N, vocab = logits.shape
    if greedy_tokens is None:
        greedy_tokens = logits.argmax(dim=-1)  # (N,)
    is_greedy = temperatures < GREEDY_BELOW  # (N,): a smaller divisor overflows fp32 (see GREEDY_BELOW)
    temp = torch.where(is_greedy, torch.ones_like(temperatures), temperatures)  # (N,)
    probs = torch.softmax(logits / temp[:, None], dim=-1)  # (N, vocab)
    sorted_p, sorted_idx = probs.sort(dim=-1, descending=True, stable=True)  # (N, vocab) each
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # (N, vocab): mass of more likely tokens
    in_nucleus = torch.zeros_like(probs, dtype=torch.bool).scatter_(
        -1, sorted_idx, mass_before < top_ps.to(sorted_p.dtype)[:, None]
    )  # (N, vocab) token-id order; the top token stays
    cdf = (probs * in_nucleus).cumsum(dim=-1)  # (N, vocab), token-id order
    target = uniforms.to(cdf.dtype)[:, None] * cdf[:, -1:]  # (N, 1)
    sampled = (
        torch.searchsorted(cdf, target, right=True).clamp_(max=vocab - 1).squeeze(-1)
    )  # first id with cdf > target
    return torch.where(is_greedy, greedy_tokens, sampled)


class Sampler:
    """Per-sample random streams: one CPU ``torch.Generator`` per (request, sample index), seeded once.

    A stream's ``k``-th draw is ``torch.rand`` element ``k`` of its generator. Drawing one scalar
    per token costs a few microseconds of dispatch (milliseconds per step at 256 sampled rows), so
    each stream draws :attr:`PREFETCH` at a time and hands them out in order: the CPU generator
    produces the same numbers in one call of ``k`` as in ``k`` calls of one (a test checks it), so
    the stream is unchanged.

    A step that fails after drawing (its forward pass raised) gives its draws back with
    :meth:`rollback`, so the retried step draws the same numbers; :meth:`commit` keeps them.
    """

    PREFETCH = 64

    def __init__(self, seed: int = 0) -> None:
        seed = check_seed("seed", seed)
        self._seed_source = torch.Generator().manual_seed(seed)  # for requests without a seed
        self._generators: dict[tuple[int, int], torch.Generator] = {}
        self._drawn: dict[tuple[int, int], list[float]] = {}  # prefetched draws, next one last
        self._taken: list[tuple[tuple[int, int], float]] = []  # this step's draws, until commit or rollback

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
        self._drawn.pop((request_id, sample_index), None)

    def remove_request(self, request_id: int, num_samples: int) -> None:
        """Drop every stream of a request (an abort)."""
        for i in range(num_samples):
            self.remove(request_id, i)

    def __len__(self) -> int:
        """Live streams (a finished or aborted request leaves none behind)."""
        return len(self._generators)

    def uniform(self, request_id: int, sample_index: int = 0) -> float:
        """The next draw in [0, 1) of one sample's stream (0.0 for a greedy request)."""
        key = (request_id, sample_index)
        gen = self._generators.get(key)
        if gen is None:
            return 0.0
        drawn = self._drawn.get(key)
        if not drawn:
            drawn = self._drawn[key] = torch.rand(self.PREFETCH, generator=gen).tolist()[::-1]
        u = drawn.pop()
        self._taken.append((key, u))
        return u

    def commit(self) -> None:
        """The step's draws were used: forget them."""
        self._taken.clear()

    def rollback(self) -> None:
        """Give the draws since the last :meth:`commit` back: each stream's next draws are them again."""
        for key, u in reversed(self._taken):
            if key in self._generators:  # a stream dropped since (an abort) takes nothing back
                self._drawn.setdefault(key, []).append(u)
        self._taken.clear()


# ----------------------------------------------------------------------------------------------
# A step's sampling: planned before the batch is staged, drawn after the forward pass
# ----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class SamplingPlan:
    """Who samples in a step and how, decided before its batch is staged (:func:`plan_sampling`).

    ``emitting`` lists every chunk that emits, in the scheduler's order, as ``(chunk index, sequence,
    tokens it draws)``; ``chunks`` has one entry per token drawn: its chunk's index (``N`` in all).
    ``params`` is ``(temperatures, top_ps, uniforms)``, one of each per token drawn, or ``None`` when
    no live request samples (all greedy: every chunk draws one token, by argmax). ``forks`` maps a
    parallel-sampling sequence whose prompt ends to the sample indices of the tokens it draws.
    """

    emitting: list[tuple[int, object, int]]  # (chunk index, Sequence, tokens drawn)
    chunks: list[int]  # (N,) the chunk of each token drawn
    params: tuple[list[float], list[float], list[float]] | None  # (temperatures, top_ps, uniforms), (N,) each
    forks: dict[int, tuple[int, ...]] = field(default_factory=dict)  # seq id -> sample indices drawn


def plan_sampling(sched, sampler: Sampler, requests: Mapping) -> SamplingPlan:
    """The :class:`SamplingPlan` of a step that computes ``sched`` (a ``SchedulerOutput``, read as its
    columns: no ``ScheduledSeq`` made for a decode); ``requests`` maps a request id to its state (its
    ``params``), ``sampler`` holds the streams. Draws the uniforms, which :meth:`Sampler.rollback` gives
    back if the step fails."""
    seqs, emits = sched.chunk_seqs(), sched.chunk_emits()
    if not len(sampler):  # all greedy: one token per emitting chunk, nothing to draw
        # (chunk index, sequence, 1) of the chunks that emit: [(i, seq, 1) for i, seq in enumerate(seqs) if emits[i]]
        emitting = list(compress(zip(count(), seqs, repeat(1)), emits))
        # every chunk emits (a decode step): its chunks are 0 .. C-1 (a range, 11.6 against 14.4 us the
        # plan of 256 decodes, timeit on this 2-core CPU)
        everyone = len(emitting) == len(seqs)
        return SamplingPlan(emitting, list(range(len(emitting))) if everyone else [i for i, _, _ in emitting], None)
    emitting = [(i, seq, seq.samples.num_tokens_to_sample) for i, seq in compress(enumerate(seqs), emits)]
    chunks, temps, top_ps, uniforms, forks = [], [], [], [], {}
    for i, seq, n in emitting:
        params = requests[seq.request_id].params
        indices = seq.samples.sample_indices(seq)  # one stream per sample it stands for: its own first
        if n > 1:
            forks[seq.seq_id] = indices
        for k in indices:
            chunks.append(i)
            temps.append(params.temperature)
            top_ps.append(params.top_p)
            uniforms.append(sampler.uniform(seq.request_id, k))
    return SamplingPlan(emitting, chunks, (temps, top_ps, uniforms), forks)


@dataclass(slots=True)
class SamplingBatch:
    """A plan's rows on the device: ``rows`` index the hidden states (one per token drawn);
    ``temperatures``/``top_ps``/``uniforms`` are ``None`` when every row is greedy (then sampling
    is one ``argmax``)."""

    rows: torch.Tensor  # (N,) int64: row of the hidden states
    temperatures: torch.Tensor | None  # (N,) fp32, 0 = greedy
    top_ps: torch.Tensor | None  # (N,) fp32
    uniforms: torch.Tensor | None  # (N,) fp32 in [0, 1)
    in_order: bool = False  # rows are 0 .. N-1: a graph's greedy tokens are then a view, no gather


def draw(model, kernels, hidden: torch.Tensor, greedy: torch.Tensor | None, s: SamplingBatch) -> torch.Tensor:
    """One token per sampled row, ``(N,)`` int64, left on the device (no wait). ``hidden`` ``(rows,
    hidden)`` are the step's hidden states; ``greedy`` ``(rows,)`` the argmax a CUDA graph computed
    (or None). The LM head runs over the sampled rows only, by ``kernels`` (the model's ``Kernels``)."""
    if s.temperatures is None and greedy is not None:
        return greedy[: s.rows.shape[0]] if s.in_order else greedy[s.rows]  # (N,) from the graph
    logits = model.compute_logits(hidden[s.rows], kernels)  # (N, vocab) fp32
    argmax = greedy[s.rows] if greedy is not None else logits.argmax(dim=-1)  # (N,)
    if s.temperatures is None:
        return argmax
    return sample_on_device(logits, s.temperatures, s.top_ps, s.uniforms, greedy_tokens=argmax)


def tokens_by_sequence(plan: SamplingPlan, tokens: list[int], first: int = 0) -> dict[int, int | list[int]]:
    """The drawn ``tokens`` (in the plan's order) by sequence id: one each, or a list for a
    parallel-sampling prompt that ended (the scheduler forks the others from it). A sample aborted
    since the plan was made (async scheduling reads the tokens a step later) drops its token.
    ``first``: leave out the plan's first ``first`` emitting chunks (one token each: the caller has
    their tokens in order)."""
    if len(tokens) == len(plan.emitting):  # one each (no parallel-sampling prompt ended)
        return {seq.seq_id: tok for (_, seq, _), tok in zip(plan.emitting[first:], tokens[first:])}
    if first:
        raise ValueError("first > 0 needs one token per emitting chunk")
    sampled: dict[int, int | list[int]] = {}
    pos = 0
    for _, seq, n in plan.emitting:
        sampled[seq.seq_id] = tokens[pos] if n == 1 else tokens[pos : pos + n]
        pos += n
    for _, seq, _ in plan.emitting:
        drawn = plan.forks.get(seq.seq_id)
        if drawn is not None:
            by_sample = dict(zip(drawn, sampled[seq.seq_id]))
            sampled[seq.seq_id] = [by_sample[i] for i in seq.samples.sample_indices(seq)]
    return sampled

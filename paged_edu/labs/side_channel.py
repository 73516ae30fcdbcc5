"""Lesson 3's timing side channel: a probe's time to first token tells whether another user's
prefix is in the shared prefix cache -- and per-tenant cache salts close the channel.

A shared prefix cache serves a prompt's cached blocks without computing them, so a request whose
prefix another user sent recently reaches its first token sooner. An attacker who guesses a prefix
(a document, a system prompt, a half-typed secret) sends it as a *probe* and times the first token:
fast means someone sent it. That was vLLM's CVE-2025-46570 (GHSA-4qjh-9fv9-r85r), fixed in 0.9.0
by a per-request ``cache_salt`` that enters the first block's hash (vllm-project/vllm#17045), so
requests of different salts share no block.

* :func:`probe_ttft` -- one probe on a fresh engine, after a victim request (or none), salted or
  not; its TTFT from the scheduler's own accounting (prompt tokens computed before the first token,
  the steps that took, the cost model's time for those steps: deterministic, so a lesson can check
  them) and the wall clock (live on a GPU; shown, never checked);
* :func:`side_channel` -- the three cases side by side: no victim, victim unsalted, both salted;
* :func:`tenant_hit_rates` -- what salting costs: N tenants sending the same system prompt share it
  without salts and each compute it with them.

The engine is the real one (:class:`~paged_edu.engine.Engine`) on a model you give it.
"""

from __future__ import annotations

from dataclasses import dataclass

from paged_edu.engine import Engine, SamplingParams, StepMetrics
from paged_edu.sim.costmodel import CostModel, StepShape

__all__ = ["ProbeTTFT", "probe_ttft", "side_channel", "tenant_hit_rates"]


@dataclass(slots=True)
class ProbeTTFT:
    """How long the probe waited for its first token, counted three ways."""

    case: str
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens the prefix cache served (the victim's blocks, if shared)
    num_computed_tokens: int  # prompt tokens computed before the first token
    num_steps: int  # engine steps from the probe's arrival to its first token
    modeled_ttft_s: float  # the cost model's time for those steps (a big model on a big GPU)
    wall_ttft_s: float  # measured on this machine (live on a GPU; noise on a CPU)


def _engine(model, block_size: int, chunk: int) -> Engine:
    return Engine(
        model,
        num_blocks=max(64, 4 * model.config.max_position_embeddings // block_size),
        block_size=block_size,
        enable_chunked_prefill=True,
        max_num_batched_tokens=chunk,
        max_num_seqs=4,
    )


def _run(engine: Engine, prompt: list[int], salt: str | None) -> None:
    engine.add_request(prompt, SamplingParams(max_tokens=1), cache_salt=salt)
    while engine.has_unfinished():
        engine.step()


def probe_ttft(
    model,
    secret: list[int],
    probe_tail: list[int],
    *,
    victim: bool,
    victim_salt: str | None = None,
    probe_salt: str | None = None,
    block_size: int = 16,
    chunk: int = 64,
    cost_model: CostModel | None = None,
    case: str = "",
) -> ProbeTTFT:
    """On a fresh engine (chunked prefill, ``chunk`` tokens a step): if ``victim``, the victim's
    request ``secret + [0]`` runs to its end under ``victim_salt``; then the probe
    ``secret + probe_tail`` arrives under ``probe_salt`` and runs to its first token.

    The probe's TTFT is read from the engine's :class:`~paged_edu.engine.StepMetrics` (prefill tokens
    per step) and priced with ``cost_model`` (default: the simulator's OPT-13B on an H200), step by
    step; the wall clock is the engine's own ``RequestMetrics.ttft``."""
    cost = cost_model or CostModel()
    with _engine(model, block_size, chunk) as engine:
        if victim:
            _run(engine, list(secret) + [0], victim_salt)
        steps: list[StepMetrics] = []
        unsubscribe = engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepMetrics) else None)
        prompt = list(secret) + list(probe_tail)
        engine.add_request(prompt, SamplingParams(max_tokens=1), cache_salt=probe_salt)
        outputs = []
        while engine.has_unfinished():
            outputs += engine.step()
        unsubscribe()
        [out] = outputs
        cached = out.metrics.num_cached_tokens
        start, modeled = cached, 0.0
        for m in steps:  # the probe runs alone: each step is one chunk of its prompt
            shape = StepShape()
            shape.add(start, m.num_batched_tokens, start + m.num_batched_tokens == len(prompt))
            start += m.num_batched_tokens
            modeled += cost.step_time(shape)
        return ProbeTTFT(
            case, len(prompt), cached, sum(m.num_batched_tokens for m in steps), len(steps), modeled, out.metrics.ttft
        )


def side_channel(model, secret: list[int], probe_tail: list[int], **kwargs) -> list[ProbeTTFT]:
    """The probe in three cases: nobody sent the secret; the victim did, nobody salts; the victim
    did, and every user has their own salt."""
    return [
        probe_ttft(model, secret, probe_tail, victim=False, case="no victim", **kwargs),
        probe_ttft(model, secret, probe_tail, victim=True, case="victim sent it, no salts", **kwargs),
        probe_ttft(
            model,
            secret,
            probe_tail,
            victim=True,
            victim_salt="victim",
            probe_salt="attacker",
            case="victim sent it, salted per user",
            **kwargs,
        ),
    ]


def tenant_hit_rates(
    model,
    system_prompt: list[int],
    *,
    num_tenants: int,
    requests_per_tenant: int,
    block_size: int = 16,
    chunk: int = 64,
) -> dict[str, float]:
    """The prefix hit rate of ``num_tenants x requests_per_tenant`` requests (each the system prompt
    plus its own two tokens, one at a time) without salts and with a salt per tenant."""
    rates = {}
    for salted in (False, True):
        with _engine(model, block_size, chunk) as engine:
            for r in range(requests_per_tenant):
                for t in range(num_tenants):
                    own = [1 + (2 * (r * num_tenants + t)) % (model.config.vocab_size - 2), 1 + r]
                    _run(engine, list(system_prompt) + own, f"tenant-{t}" if salted else None)
            rates["salted per tenant" if salted else "no salts"] = engine.allocator.stats.hit_rate
    return rates

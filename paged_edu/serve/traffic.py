"""The course's workloads as HTTP traffic: what ``paged-edu bench-serve`` sends, and when.

The simulator's workloads (:mod:`paged_edu.sim.workloads`, :mod:`paged_edu.sim.prefix_workloads`)
give each request its arrival time (Poisson at the rate asked for), its prompt as token ids (shared
where the workload shares them: a system prompt, a conversation so far, an instruction and its
examples, an agent's context) and its output length. :func:`build_traffic` turns them into
:class:`Send` items for a server:

* token ids are mapped into the server's vocabulary by a fixed hash (:func:`map_token`): equal ids
  stay equal, so the workload's sharing is kept exactly, and distinct ids almost never make a full
  block equal by chance (16 ids colliding at once: ``vocab**-16``);
* the prompt is sent as token ids to ``/v1/completions`` -- an OpenAI API form that vLLM and SGLang
  accept too -- so a request has exactly its workload length, with no tokenizer on the client;
* a multi-turn conversation's next turn is sent after the reply it carries has come back, and
  carries the reply the *server* generated (asked for with vLLM's ``return_token_ids``,
  vllm-project/vllm#22587: each choice's ``token_ids``; where a
  server does not return ids, the workload's own reply stands in), so the prefix cache is tested on
  blocks of generated tokens too, as a chat client tests it;
* ``probe`` is lesson 3's side channel as traffic: ``victim`` sends a secret document plus a
  question; after its answer, ``probe`` sends the same document plus another question, and
  ``control`` a fresh document of the same length. A shared prefix cache makes ``probe``'s TTFT
  short and its ``cached_tokens`` high; a cache salt per user (``--tenants 2``: the victim one
  salt, the attacker another) closes the channel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged_edu.sim import workloads as W

__all__ = ["Send", "build_traffic", "map_token"]


@dataclass(slots=True)
class Send:
    """One request to send: ``at`` seconds after the start (or after ``after`` finished)."""

    at: float
    prompt: list[int]  # token ids, already in the server's vocabulary
    max_tokens: int
    cache_salt: str | None = None
    role: str = "request"  # probe traffic: "victim", "probe", "control"
    after: int | None = None  # index of the request whose reply this one waits for
    carries: int = 0  # ... and how many leading prompt tokens are that request's prompt and reply
    workload_reply: list[int] = field(default_factory=list)  # the workload's own reply ids (mapped)


def map_token(token: int, vocab_size: int) -> int:
    """A workload id in ``[0, vocab_size)``: a multiplicative hash (Knuth's), the same id the same token."""
    return (token * 2654435761 + 40503) % (2**32) % vocab_size


def _scaled(n: int, scale: float) -> int:
    return max(1, int(round(n * scale)))


# The length parameters of each generator, scaled by --length-scale (their defaults, from sim).
_LENGTHS = {
    "chat": {"system_prompt_len": 512},
    "multiturn": {"user_len": 64, "reply_len": 96},
    "fewshot": {"instruction_len": 128, "example_len": 96, "question_len": 32},
    "agents": {"root_len": 256, "step_len": 64, "call_len": 16},
}


def build_traffic(
    workload: str,
    num_prompts: int,
    rate: float,
    seed: int,
    vocab_size: int,
    *,
    scale: float = 1.0,
    max_model_len: int | None = None,
    tenants: int | None = None,
) -> list[Send]:
    """The requests of ``workload`` for a server of ``vocab_size`` ids (and ``max_model_len``, if known:
    lengths are cut so that prompt + output fits)."""
    if not 0 < scale <= 1:
        raise ValueError(f"--length-scale must be in (0, 1], got {scale}")
    if workload == "probe":
        return _probe(num_prompts, rate, seed, vocab_size, scale, tenants)
    lengths = {k: _scaled(v, scale) for k, v in _LENGTHS.get(workload, {}).items()}
    requests = W.make_workload(workload, num_prompts, rate, seed, **lengths)
    if workload in ("sharegpt", "alpaca", "chat"):
        for r in requests:  # only their lengths are sampled: scale those (a chat's system prompt already is)
            r.output_len = _scaled(r.output_len, scale)
            r.prompt_len = r.prefix_len + _scaled(r.prompt_len - r.prefix_len, scale)
    if tenants:
        W.assign_tenants(requests, tenants)
    prompts = [list(p) for p in _prompts(requests)]
    sends = []
    for r, prompt in zip(requests, prompts):
        out = r.output_len if r.output is None else len(r.output)
        if workload in ("fewshot", "agents"):
            out = _scaled(out, scale)
        if max_model_len is not None:  # cut the prompt's head, then the output, to fit
            prompt = prompt[-(max_model_len - 1) :]
            out = max(1, min(out, max_model_len - len(prompt)))
        mapped = [map_token(t, vocab_size) for t in prompt]
        reply = [map_token(t, vocab_size) for t in (r.output or [])]
        sends.append(Send(r.arrival_time, mapped, out, r.cache_salt, workload_reply=reply))
    _link_turns(sends)
    return sends


def _prompts(requests) -> list[list[int]]:
    from paged_edu.sim.request import prompt_token_ids

    return prompt_token_ids(requests)


def _link_turns(sends: list[Send]) -> None:
    """A request whose prompt starts with an earlier request's prompt and reply is its next turn."""
    known: dict[tuple[int, tuple], int] = {}
    lengths: set[int] = set()
    for j, s in enumerate(sends):
        for L in sorted(lengths, reverse=True):
            if L < len(s.prompt) and (k := known.get((L, tuple(s.prompt[:L])))) is not None:
                s.after, s.carries = k, L
                break
        if s.workload_reply:
            full = s.prompt + s.workload_reply
            known[(len(full), tuple(full))] = j
            lengths.add(len(full))


def _probe(num_prompts: int, rate: float, seed: int, vocab_size: int, scale: float, tenants) -> list[Send]:
    """``num_prompts // 3`` triples: victim, then probe (after the victim's answer), and control."""
    import numpy as np

    from paged_edu.sim.arrivals import poisson_arrivals

    num = max(1, num_prompts // 3)
    rng = np.random.default_rng(seed)
    times = poisson_arrivals(num, rate, rng).tolist()
    secret_len, tail_len, out = _scaled(1024, scale), 8, _scaled(32, scale)
    next_id = iter(range(1, 10**9))
    take = lambda n: [map_token(next(next_id), vocab_size) for _ in range(n)]  # noqa: E731
    salts = ("tenant-0", "tenant-1") if tenants and tenants >= 2 else (None, None)
    sends: list[Send] = []
    for t in times:
        secret, fresh = take(secret_len), take(secret_len)
        victim = len(sends)
        sends.append(Send(t, secret + take(tail_len), out, salts[0], role="victim"))
        sends.append(Send(t, secret + take(tail_len), out, salts[1], role="probe", after=victim))
        sends.append(Send(t, fresh + take(tail_len), out, salts[1], role="control"))
    return sends


def describe(sends: list[Send]) -> dict:
    """Counts and mean lengths, for the report."""
    n = len(sends)
    return {
        "num_requests": n,
        "mean_prompt_len": sum(len(s.prompt) for s in sends) / n,
        "mean_output_len": sum(s.max_tokens for s in sends) / n,
        "num_follow_ups": sum(s.after is not None for s in sends),
        "arrival_span_s": (max(s.at for s in sends) - min(s.at for s in sends)) if n else 0.0,
    }

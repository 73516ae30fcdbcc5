"""Serving workloads for the simulator: request lengths, arrivals, sharing, and a JSONL trace format.

A workload is a list of :class:`Request` records: when a request arrives, how long its prompt is
(or its actual prompt tokens), how many tokens it will generate, and what it shares with others.

Length distributions are *stated assumptions*, not data: we do not ship the datasets. They are
log-normal, truncated so that ``prompt + output <= L_max``, with the location fitted so that the
truncated means equal the means the PagedAttention paper reports for its two traces (Kwon et al.,
SOSP 2023, Fig. 11):

=========  =============  =============  ===============================
dataset    mean prompt    mean output    assumed shape (sigma of ln len)
=========  =============  =============  ===============================
ShareGPT   161.31         337.99         1.00 / 0.90, heavy right tail
Alpaca     19.31          58.45          0.55 / 0.75, short and narrow
=========  =============  =============  ===============================

The paper's ShareGPT trace has 8.4x longer prompts and 5.8x longer outputs than Alpaca, and a
higher variance; the sigmas above encode that qualitatively. Arrivals are Poisson at ``rate``
requests per second (exponential gaps), as in the paper's §6.1; ``rate=inf`` puts every request at
time 0 (an offline batch).

Sharing:

* ``chat`` -- every request starts with the same system prompt (``prefix_group`` names the group,
  ``prefix_len`` its length), followed by a ShareGPT-like user turn.
* ``parallel`` -- each request asks for ``n`` samples (n = 2, 4, 6 in the paper's Fig. 14) that
  share the prompt; ``fork="beam"`` makes beam-style trees whose branches also share a growing
  part of the output (sample ``j`` forks from sample 0 after ``j/n`` of the output).

Isolation: :func:`assign_tenants` spreads a workload's requests round-robin over ``N`` tenants,
each with its own cache salt (``tenant-0`` ...): a tenant's requests hit only its own cached
blocks, so ``chat`` with tenants is N tenants sending the same system prompt, each computing it.

Requests and their JSONL trace format live in :mod:`paged_edu.sim.request`, arrival times in
:mod:`paged_edu.sim.arrivals`, the prefix-sharing workloads in :mod:`paged_edu.sim.prefix_workloads`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from paged_edu.sim.arrivals import L_MAX, check_num_requests, poisson_arrivals, workload_rng
from paged_edu.sim.prefix_workloads import agents, fewshot, multiturn
from paged_edu.core.validation import choice, integer
from paged_edu.sim.request import Request, check_fields

__all__ = [
    "DATASETS",
    "LengthDistribution",
    "alpaca",
    "chat",
    "make_workload",
    "parallel",
    "sharegpt",
    "summarize",
]

# ----------------------------------------------------------------------------------------------
# Length distributions
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """Truncated log-normal prompt and output lengths with fitted means (see the module doc).

    ``prompt ~ clip(round(exp(mu_p + sigma_p z)), 1, max_prompt)`` and
    ``output ~ clip(round(exp(mu_o + sigma_o z')), 1, L_max - prompt)`` with independent standard
    normals ``z, z'``; ``mu_p`` and ``mu_o`` are solved so the truncated means hit the targets.
    """

    name: str
    mean_prompt: float
    mean_output: float
    sigma_prompt: float
    sigma_output: float
    max_prompt: int = 1024
    max_total: int = L_MAX
    source: str = ""

    def sample(self, num: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``num`` (prompt_len, output_len) pairs as two int64 arrays."""
        mu_p, mu_o = _fit(self)
        prompt = _clip_round(np.exp(mu_p + self.sigma_prompt * rng.standard_normal(num)), self.max_prompt)
        output = _clip_round(np.exp(mu_o + self.sigma_output * rng.standard_normal(num)), self.max_total - prompt)
        return prompt, output

    def describe(self) -> str:
        mu_p, mu_o = _fit(self)
        return (
            f"{self.name}: prompt ~ lognormal(mu={mu_p:.3f}, sigma={self.sigma_prompt}) clipped to "
            f"[1, {self.max_prompt}], mean {self.mean_prompt}; output ~ lognormal(mu={mu_o:.3f}, "
            f"sigma={self.sigma_output}) clipped to [1, {self.max_total} - prompt], mean {self.mean_output}"
            + (f" ({self.source})" if self.source else "")
        )


def _clip_round(x: np.ndarray, upper: int | np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x), 1, upper).astype(np.int64)


# Quasi-random standard normals (normal quantiles of a regular grid) for fitting mu: the fitted
# distribution is deterministic and independent of any seed.
_GRID = 20001


def _normal_quantiles(num: int) -> np.ndarray:
    from statistics import NormalDist

    inv_cdf = NormalDist().inv_cdf
    return np.array([inv_cdf((i + 0.5) / num) for i in range(num)])


@lru_cache(maxsize=None)
def _fit(dist: LengthDistribution) -> tuple[float, float]:
    z = _normal_quantiles(_GRID)

    def bisect(mean_of, target: float) -> float:
        lo, hi = -5.0, 12.0
        for _ in range(80):
            mid = (lo + hi) / 2
            if mean_of(mid) < target:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    mu_p = bisect(lambda mu: _clip_round(np.exp(mu + dist.sigma_prompt * z), dist.max_prompt).mean(), dist.mean_prompt)
    # Output mean over a joint grid: 101 prompt quantiles against every output quantile.
    prompt = _clip_round(np.exp(mu_p + dist.sigma_prompt * _normal_quantiles(101)), dist.max_prompt)
    cap = (dist.max_total - prompt)[:, None]

    def mean_output(mu: float) -> float:
        return float(np.clip(np.rint(np.exp(mu + dist.sigma_output * z))[None, :], 1, cap).mean())

    mu_o = bisect(mean_output, dist.mean_output)
    return mu_p, mu_o


SHAREGPT = LengthDistribution(
    "sharegpt", 161.31, 337.99, 1.00, 0.90, source="means from Kwon et al., SOSP 2023, Fig. 11a"
)
ALPACA = LengthDistribution("alpaca", 19.31, 58.45, 0.55, 0.75, source="means from Kwon et al., SOSP 2023, Fig. 11b")
DATASETS = {"sharegpt": SHAREGPT, "alpaca": ALPACA}


# ----------------------------------------------------------------------------------------------
# Arrivals and generators
# ----------------------------------------------------------------------------------------------


def _from_arrays(times, prompt, output, **extra) -> list[Request]:
    return [
        Request(float(t), int(p), int(o), **extra) for t, p, o in zip(times.tolist(), prompt.tolist(), output.tolist())
    ]


def sharegpt(num_requests: int, rate: float = math.inf, seed: int = 0) -> list[Request]:
    """ShareGPT-like requests (mean 161.31 prompt / 337.99 output tokens) with Poisson arrivals."""
    return _dataset(SHAREGPT, num_requests, rate, seed)


def alpaca(num_requests: int, rate: float = math.inf, seed: int = 0) -> list[Request]:
    """Alpaca-like requests (mean 19.31 prompt / 58.45 output tokens) with Poisson arrivals."""
    return _dataset(ALPACA, num_requests, rate, seed)


def _dataset(dist: LengthDistribution, num_requests: int, rate: float, seed: int) -> list[Request]:
    check_num_requests(num_requests)
    rng = workload_rng(seed)
    times = poisson_arrivals(num_requests, rate, rng)
    prompt, output = dist.sample(num_requests, rng)
    return _from_arrays(times, prompt, output)


def chat(
    num_requests: int,
    rate: float = math.inf,
    seed: int = 0,
    system_prompt_len: int = 512,
    num_groups: int = 1,
) -> list[Request]:
    """A chat service: every request is ``system prompt + ShareGPT-like user turn``.

    Requests are spread round-robin over ``num_groups`` system prompts of ``system_prompt_len``
    tokens each; the user turn and the reply follow the ShareGPT-like distribution, truncated so
    that the total stays within ``L_max``.
    """
    check_num_requests(num_requests)
    integer("system_prompt_len", system_prompt_len, low=1, high=L_MAX - 2)
    integer("num_groups", num_groups, low=1)
    rng = workload_rng(seed)
    times = poisson_arrivals(num_requests, rate, rng)
    user, output = SHAREGPT.sample(num_requests, rng)
    user = np.minimum(user, L_MAX - 1 - system_prompt_len)
    prompt = system_prompt_len + user
    output = np.clip(output, 1, L_MAX - prompt)
    return [
        Request(float(t), int(p), int(o), prefix_group=f"system-{i % num_groups}", prefix_len=system_prompt_len)
        for i, (t, p, o) in enumerate(zip(times.tolist(), prompt.tolist(), output.tolist()))
    ]


def parallel(
    num_requests: int,
    rate: float = math.inf,
    seed: int = 0,
    n: int = 4,
    fork: str = "parallel",
    dataset: str = "sharegpt",
) -> list[Request]:
    """Requests that each generate ``n`` samples sharing their prompt (``fork="beam"``: a beam tree)."""
    choice("dataset", dataset, tuple(sorted(DATASETS)))
    requests = _dataset(DATASETS[dataset], num_requests, rate, seed)
    for r in requests:
        r.n, r.fork = n, fork
        check_fields(r)
    return requests


def assign_tenants(requests: list[Request], num_tenants: int) -> list[Request]:
    """Give request ``i`` the cache salt ``tenant-{i % num_tenants}`` (in place; returns ``requests``)."""
    integer("num_tenants", num_tenants, low=1)
    for i, r in enumerate(requests):
        r.cache_salt = f"tenant-{i % num_tenants}"
    return requests


WORKLOADS = {"sharegpt": sharegpt, "alpaca": alpaca, "chat": chat, "parallel": parallel}


PREFIX_WORKLOADS = {"multiturn": multiturn, "fewshot": fewshot, "agents": agents}


def make_workload(name: str, num_requests: int, rate: float = math.inf, seed: int = 0, **kwargs) -> list[Request]:
    """Build a named workload: ``sharegpt``, ``alpaca``, ``chat``, ``parallel``, or one of
    :mod:`~paged_edu.sim.prefix_workloads`: ``multiturn``, ``fewshot``, ``agents``."""
    builders = {**WORKLOADS, **PREFIX_WORKLOADS}
    build = builders[choice("workload", name, tuple(sorted(builders)))]
    return build(num_requests, rate, seed, **kwargs)


def summarize(requests: list[Request]) -> dict:
    """Counts and means of a workload, for printing next to results."""
    prompt = np.array([r.prompt_len for r in requests])
    output = np.array([r.output_len for r in requests])
    span = max(r.arrival_time for r in requests) - min(r.arrival_time for r in requests)
    return {
        "num_requests": len(requests),
        "num_sequences": int(sum(r.n for r in requests)),
        "mean_prompt_len": float(prompt.mean()),
        "mean_output_len": float(output.mean()),
        "max_total_len": int((prompt + output).max()),
        "arrival_span_s": float(span),
    }

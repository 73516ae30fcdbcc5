"""When a workload's requests arrive, and the bounds every workload builder shares.

Arrivals are Poisson at ``rate`` requests per second (exponential gaps), as in the PagedAttention
paper's §6.1 (Kwon et al., SOSP 2023); ``rate=inf`` puts every request at time 0 (an offline
batch). ``L_MAX`` is the longest request (prompt + output) a workload builds. Plain Python and
numpy, no torch.
"""

from __future__ import annotations

import math

import numpy as np

from paged_edu.core.validation import integer, real, seed

L_MAX = 2048  # OPT's context length, the paper's L_max for its contiguous baselines.


def poisson_arrivals(num: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a Poisson process: exponential gaps of mean ``1/rate`` seconds, first at 0.

    ``rate = inf`` (or 0 requests per second meaning "all at once" is refused) gives all zeros.
    """
    rate = real("rate", rate)
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests/s (use inf for an offline batch), got {rate}")
    if math.isinf(rate):
        return np.zeros(num)
    gaps = rng.exponential(1.0 / rate, num)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def check_num_requests(num_requests: int) -> None:
    """Refuse a workload size that is not an int >= 1 (``True`` included)."""
    integer("num_requests", num_requests, low=1)


def workload_rng(seed_value: int) -> np.random.Generator:
    """The random generator a workload builder draws from: ``seed_value`` checked as a seed (an
    integer in ``[0, 2**64)``, never ``True`` or ``1.0``), named ``seed`` in the error."""
    return np.random.default_rng(seed("seed", seed_value))

"""Values that pass a type check but break the math, and inputs refused at the one boundary (issue 23)."""

from __future__ import annotations

import pytest
import torch

from paged_edu.engine.sampling import GREEDY_BELOW, SamplingParams, sample, sample_on_device


@pytest.mark.parametrize("temperature", [1e-39, 1e-30, GREEDY_BELOW / 2])
def test_a_temperature_below_the_floor_is_greedy(temperature):
    """fp32 logits / 1e-39 overflow to inf and the softmax to NaN: the inverse CDF then returned the
    last vocabulary id every time. Below GREEDY_BELOW (vLLM's _SAMPLING_EPS) the row is greedy."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    argmax = logits.argmax(dim=-1).tolist()
    assert SamplingParams(temperature=temperature).greedy
    assert sample(logits, [temperature] * 4, [1.0] * 4, [0.3, 0.5, 0.7, 0.99]) == argmax
    t = torch.full((4,), temperature)
    out = sample_on_device(logits, t, torch.ones(4), torch.tensor([0.3, 0.5, 0.7, 0.99]))
    assert out.tolist() == argmax
    with pytest.raises(ValueError, match="n identical samples"):
        SamplingParams(temperature=temperature, n=2)


def test_a_temperature_at_the_floor_still_samples():
    assert not SamplingParams(temperature=GREEDY_BELOW).greedy

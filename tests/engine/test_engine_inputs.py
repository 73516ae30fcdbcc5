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


# ----------------------------------------------------------------------------------------------
# Inputs, refused at the public entry with the field they are about
# ----------------------------------------------------------------------------------------------

import numpy as np  # noqa: E402

from paged_edu.core.allocator import BlockAllocator  # noqa: E402
from paged_edu.core.validation import FieldTypeError, FieldValueError, MAX_NUM_BLOCKS  # noqa: E402
from paged_edu.engine import Engine  # noqa: E402
from paged_edu.labs.engine_lab import tiny_model  # noqa: E402
from paged_edu.lessons.setup import check_parameters  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=1)


@pytest.mark.parametrize(
    "kwargs,error,field",
    [
        (dict(num_blocks="8"), FieldTypeError, "num_blocks"),
        (dict(num_blocks=8, enable_prefix_caching="no"), FieldTypeError, "enable_prefix_caching"),
        (dict(num_blocks=8, enable_chunked_prefill="false"), FieldTypeError, "enable_chunked_prefill"),
        (dict(num_blocks=8, sync_timing=1), FieldTypeError, "sync_timing"),
        (dict(num_blocks=8, allocator=object()), FieldTypeError, "allocator"),
        (dict(num_blocks=10**10), FieldValueError, "num_blocks"),  # past int32 block ids
        (dict(num_blocks=10**9), FieldValueError, "num_blocks"),  # 7,600 GiB of K/V: more than the machine has
        (dict(num_blocks=8, preemption_mode="swap", num_cpu_blocks=10**9), FieldValueError, "num_cpu_blocks"),
        (dict(num_blocks=8, max_num_seqs=0), FieldValueError, "max_num_seqs"),
        (dict(num_blocks=8, preemption_mode="spill"), FieldValueError, "preemption_mode"),
    ],
)
def test_engine_arguments_are_refused_naming_their_field(model, kwargs, error, field):
    with pytest.raises(error, match=field) as info:
        Engine(model, **kwargs)
    assert info.value.field == field


def test_numpy_integers_are_integers_everywhere(model):
    engine = Engine(
        model,
        num_blocks=np.int64(12),
        block_size=np.int64(3),
        max_num_seqs=np.int32(4),
        max_num_batched_tokens=np.int64(64),
        preemption_mode="swap",
        num_cpu_blocks=np.int64(4),
    )
    assert engine.max_model_len == 36 and type(engine.allocator.block_size) is int
    (out,) = engine.run([[1, 2, 3]], SamplingParams(max_tokens=np.int64(2)))
    assert len(out.outputs[0]) == 2


def test_block_allocator_flags_sizes_and_unknown_ids():
    with pytest.raises(FieldTypeError, match="cache_when_computed must be True or False") as info:
        BlockAllocator(4, 4, cache_when_computed="False")
    assert info.value.field == "cache_when_computed"
    with pytest.raises(FieldValueError, match=str(MAX_NUM_BLOCKS)):
        BlockAllocator(10**10)
    with pytest.raises(KeyError, match="unknown sequence id 3"):
        BlockAllocator(4, 4).num_tokens(3)


def test_offline_calls_say_what_is_wrong_with_their_params(model):
    engine = Engine(model, num_blocks=8, block_size=4)
    with pytest.raises(ValueError, match="one SamplingParams per prompt: 1 sampling params for 2 prompts"):
        engine.add_requests([[1], [2]], [SamplingParams()])
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams.*'greedy'"):
        engine.run([[1], [2]], "greedy")
    assert not engine.has_unfinished()


def test_jointly_impossible_lesson_parameters_name_the_one_to_change():
    with pytest.raises(ValueError, match="pool_blocks=1 is too small.*needs 7 blocks"):
        check_parameters(pool_blocks=1, pressure_prompt_len=24, max_new_tokens=32)
    assert check_parameters(pool_blocks=7, pressure_prompt_len=24, max_new_tokens=32)["pool_blocks"] == 7


# ----------------------------------------------------------------------------------------------
# Sizes: n bounded and checked before anything is built from it; integers are integers
# ----------------------------------------------------------------------------------------------


def test_n_has_a_stated_bound():
    """``SamplingParams(n=2**31)`` was accepted, and an engine then built ``list(range(n))``."""
    from paged_edu.engine.sampling import MAX_SAMPLES

    for n in (MAX_SAMPLES + 1, 2**31):
        with pytest.raises(FieldValueError, match=rf"n must be in \[1, {MAX_SAMPLES}\]") as err:
            SamplingParams(temperature=1.0, n=n)
        assert err.value.field == "n"
    assert SamplingParams(temperature=1.0, n=MAX_SAMPLES).n == MAX_SAMPLES


MAX_N_OVER = 1000  # within SamplingParams' bound, above the engine's max_num_seqs


def test_an_n_above_max_num_seqs_is_refused_before_its_samples_are_built(model, monkeypatch):
    from paged_edu.sched.parallel_sampling import ParallelSamples

    engine = Engine(model, num_blocks=64, block_size=4, max_num_seqs=4)
    built, real = [], ParallelSamples.__init__

    def spy(self, seq, num_samples, *args):
        built.append(num_samples)
        real(self, seq, num_samples, *args)

    monkeypatch.setattr(ParallelSamples, "__init__", spy)
    with pytest.raises(FieldValueError, match="max_num_seqs=4") as err:
        engine.add_request([1, 2, 3], SamplingParams(temperature=1.0, n=MAX_N_OVER))
    assert err.value.field == "max_num_seqs" and built == []  # refused before a record of n samples exists
    assert not engine.has_unfinished() and engine.generate([[1, 2, 3]], max_new_tokens=2)
    assert built == [1]


@pytest.mark.parametrize("bad", [2.0, True])
@pytest.mark.parametrize("field", ["max_tokens", "n", "seed"])
def test_sampling_params_integers_refuse_floats_and_bools_alike(field, bad):
    with pytest.raises(FieldTypeError) as err:
        SamplingParams(**{"temperature": 1.0, field: bad})
    assert err.value.field == field

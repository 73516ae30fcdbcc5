"""The KV memory model against hand arithmetic and a brute-force fill of the real allocators."""

import math

import pytest

from paged_edu import BlockAllocator, ContiguousAllocator, OutOfBlocksError
from paged_edu.core.hardware import ModelGeometry, find_model
from paged_edu.core.memory import (
    eta_naive,
    eta_paged,
    eta_paged_bound,
    format_bytes,
    kv_bytes,
    max_requests_contiguous,
    max_requests_paged,
    seed_70b_example,
)


def test_seed_70b_example_exactly_and_its_unit_slip():
    ex = seed_70b_example(8192)
    assert ex["bytes_per_token"] == 2 * 80 * 8 * 128 * 2 == 327_680
    assert ex["kib_per_token"] == 320
    assert ex["total_bytes"] == 2_684_354_560
    assert ex["total_gib"] == 2.5
    assert round(ex["total_gb"], 2) == 2.68
    # The seed's "2.62 GB": 320 KiB x 8192 = 2,621,440 KiB, read as if KiB were kB.
    assert ex["seed_mixed_units_gb"] == pytest.approx(2.62144)
    assert format_bytes(ex["total_bytes"]) == "2.50 GiB (2.68 GB)"


@pytest.mark.parametrize(
    "name, per_token",
    [
        ("Llama-3-8B", 2 * 32 * 8 * 128 * 2),
        ("Llama-2-7B", 2 * 32 * 32 * 128 * 2),
        ("OPT-13B", 800 * 1024),  # the paper's "800 KB per token"
        ("SmolLM2-135M", 2 * 30 * 3 * 64 * 2),
        ("DeepSeek-V3 (MLA)", 61 * (512 + 64) * 2),
    ],
)
def test_presets_bytes_per_token(name, per_token):
    assert find_model(name).kv_bytes_per_token == per_token
    assert kv_bytes(find_model(name), 10) == 10 * per_token


def test_gqa_and_mla_shrink_the_cache():
    assert find_model("Llama-2-7B").kv_bytes_per_token / find_model("Llama-3-8B").kv_bytes_per_token == 4
    assert find_model("DeepSeek-V3 (MLA)").kv_bytes_per_token < find_model("Seed 70B example").kv_bytes_per_token / 4


@pytest.mark.parametrize("B", [8, 16, 32])
def test_eta_paged_counts_slots_of_a_real_allocation_and_respects_the_bound(B):
    for s in range(1, 300):
        a = BlockAllocator(64, B)
        a.allocate("r", list(range(s)))
        slots = len(a.block_table("r")) * B  # brute force: slots actually reserved
        assert eta_paged(s, B) == s / slots
        assert eta_paged(s, B) >= eta_paged_bound(s, B) - 1e-12
    assert eta_paged_bound(2048, 16) == pytest.approx(0.99224806)  # the seed's 99.22 %


def test_eta_naive():
    assert eta_naive(512, 2048) == 0.25
    with pytest.raises(ValueError, match="exceeds"):
        eta_naive(3000, 2048)


def test_capacity_matches_filling_the_allocators():
    spec = ModelGeometry("toy", 2, 2, 8, "fp16")  # 128 bytes per token
    budget = 128 * 1000
    L_max, s, B = 200, 37, 8
    contiguous = ContiguousAllocator(budget // spec.kv_bytes_per_token, L_max)
    n_contiguous = 0
    with pytest.raises(OutOfBlocksError):
        while True:
            contiguous.allocate(n_contiguous, [1] * s)
            n_contiguous += 1
    paged = BlockAllocator(budget // spec.block_bytes(B), B, enable_prefix_caching=False)
    n_paged = 0
    with pytest.raises(OutOfBlocksError):
        while True:
            paged.allocate(n_paged, [1] * s)
            n_paged += 1
    assert max_requests_contiguous(budget, spec, L_max) == n_contiguous == 5
    assert max_requests_paged(budget, spec, s, B) == n_paged == 125 // math.ceil(s / B)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_layers": 0},
        {"num_kv_heads": -1},
        {"head_dim": 1.5},
        {"dtype": "fp64"},
    ],
)
def test_bad_specs(kwargs):
    args = {"name": "x", "num_layers": 2, "num_kv_heads": 2, "head_dim": 8, **kwargs}
    with pytest.raises(ValueError):
        ModelGeometry(**args)


@pytest.mark.parametrize(
    "call", [lambda: eta_paged(0, 16), lambda: eta_paged(5, 0), lambda: kv_bytes(find_model("OPT-13B"), -1)]
)
def test_bad_lengths(call):
    with pytest.raises(ValueError):
        call()


def test_one_hardware_table_read_by_memory_and_cost_model():
    """The GPU sizes are nvidia-smi's MiB exactly; the memory model and the cost model read one table."""
    from paged_edu.core.hardware import GPUS, MODELS
    from paged_edu.sim.costmodel import CostModel

    assert GPUS["h200"].memory_bytes == 143_771 * 1024 * 1024 == 150_754_820_096
    assert GPUS["h100"].memory_bytes == 85_520_809_984  # nvidia-smi's 81,559 MiB
    cost = CostModel()
    assert cost.model is MODELS["opt-13b"] and cost.gpu is GPUS["h200"]
    for key, geometry in MODELS.items():
        assert geometry.source and geometry.key == key and find_model(geometry.name) is geometry
        assert kv_bytes(geometry, 3) == 3 * geometry.kv_bytes_per_token
    for gpu in GPUS.values():
        assert gpu.source and gpu.hbm_bandwidth <= gpu.datasheet_bandwidth
        assert gpu.memory_bytes % (1 << 20) == 0

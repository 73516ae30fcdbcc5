"""The lessons' tensor experiments, each against an oracle computed here by hand or brute force."""

from __future__ import annotations

import math
import random

import pytest
import torch

from paged_edu.cache.kv_cache import PagedKVCache
from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.hardware import find_model
from paged_edu.labs.seed_allocator import SeedAllocator
from paged_edu.labs import experiments as E
from paged_edu.labs import seed_defects as SD
from paged_edu.labs.kv_view import KVView
from paged_edu.labs.toy_kv import ToyLayer
from paged_edu.sim.request import Request
from paged_edu.viz import figures as F
from paged_edu.viz import memory_figures as MF
from paged_edu.viz import tensor_figures as TF
from paged_edu.viz import palette as P

LAYER = ToyLayer(num_kv_heads=2, head_dim=16, num_q_heads=4, seed=0)


# -- lesson 2: the address formula ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_address_check_runs_the_seed_formula_as_written_and_the_corrected_one(dtype):
    B, H, D, size = 4, 2, 16, torch.tensor([], dtype=dtype).element_size()
    cache = PagedKVCache(1, 8, B, H, D, dtype=dtype)
    table = [5, 2, 7]
    k_true = torch.randn(12, H, D).to(dtype)
    for t in range(12):
        cache.k_caches[0][table[t // B], t % B] = k_true[t]
    for t in range(12):
        for h in range(H):
            a = E.address_check(cache, table, t, k_true, kv_head=h)
            block, j = table[t // B], t % B
            assert a["strides_match"] and a["symbols"] == {
                "S_token": H * D * size,
                "S_block": B * H * D * size,
                "S_head": D * size,
            }
            assert a["right"]["byte_offset"] == block * B * H * D * size + j * H * D * size + h * D * size
            assert a["right"]["k_matches"] and a["right"]["token"] == t and a["right"]["head"] == h
            seed_offset = block * B * H * D * size + j * D  # bytes + elements: the seed's formula
            assert a["seed"]["byte_offset"] == seed_offset
            element = seed_offset // size
            assert (a["seed"]["slot_in_block"], a["seed"]["head"], a["seed"]["dim"]) == (
                element % (B * H * D) // (H * D),
                element % (H * D) // D,
                element % D,
            )
            if j or h:  # only token j = 0, head 0 happens to start where the seed points
                assert not a["seed"]["k_matches"]


def test_the_seed_offset_is_right_for_one_head_counted_in_elements_and_the_check_can_fail():
    B, D = 4, 8
    cache = PagedKVCache(1, 4, B, 1, D, dtype=torch.float32)
    k = cache.k_caches[0]
    k.copy_(torch.randn_like(k))
    flat = k.reshape(-1)
    for block in range(4):
        for j in range(B):  # in elements, with one head: B(i) * (B * d_head) + j * d_head
            start = block * B * D + j * D
            assert torch.equal(flat[start : start + D], k[block, j, 0])
    table = [3, 1]
    truth = torch.stack([k[table[t // B], t % B] for t in range(8)])  # (8, 1, D)
    assert E.address_check(cache, table, 6, truth)["right"]["k_matches"]
    k[1, 2, 0] += 1  # corrupt token 6's K: the check must notice
    assert not E.address_check(cache, table, 6, truth)["right"]["k_matches"]


def test_kv_view_check_address_uses_symbols_and_reports_the_seed_landing():
    kv = KVView(BlockAllocator(8, 4), seed=0)
    kv.allocator.allocate("s", list(range(10)))
    kv.write_prompt("s", list(range(10)))
    r = kv.check_address("s", 9)
    assert r["address_match"] and r["value_match"] and r["s_token"] == 2 * 64 * 4
    assert r["seed_lands"]["token"] == 8 and not r["seed_lands"]["k_matches"]


# -- lesson 1: bytes on the device, idle share ------------------------------------------------------
def test_measured_cache_bytes_equal_the_formula():
    m = E.measure_cache_memory(find_model("SmolLM2-135M"), 100, block_size=16)
    assert m["num_tokens"] == 112 and m["num_blocks"] == 7 and m["num_tensors"] == 60
    assert m["numel_bytes"] == m["m_kv"] == 2 * 30 * 3 * 64 * 2 * 112
    assert m["mem_get_info_drop"] is None  # no CUDA here
    with pytest.raises(ValueError, match="MLA"):
        E.measure_cache_memory(find_model("DeepSeek-V3 (MLA)"), 16)


def test_idle_share_against_a_step_by_step_count():
    rng = random.Random(0)
    reqs = [Request(0.0, rng.randint(1, 50), rng.randint(1, 50)) for _ in range(40)]
    L = 128
    idle_at_finish = sum(L - r.total_len for r in reqs) / (len(reqs) * L)
    steps = [(r.prompt_len + k + 1) for r in reqs for k in range(r.output_len)]  # tokens held at each step
    r = E.contiguous_idle_share(reqs, L)
    assert r["at_finish"] == pytest.approx(idle_at_finish)
    assert r["over_lifetime"] == pytest.approx(1 - sum(steps) / (len(steps) * L))
    with pytest.raises(ValueError, match="shorter than the longest"):
        E.contiguous_idle_share(reqs, 10)


# -- lesson 2: the batch claim ----------------------------------------------------------------------
def test_decode_throughput_follows_the_roofline_by_hand():
    from paged_edu.core.hardware import GPUS, MODELS

    m, g = MODELS["llama-3-8b"], GPUS["h200"]
    rows = E.decode_throughput(m, g, [1, 64, 1024], context=500)
    for r in rows:
        bytes_moved = m.matmul_weight_bytes + r["batch"] * 501 * m.kv_bytes_per_token
        assert r["kv_share"] == pytest.approx(r["batch"] * 501 * m.kv_bytes_per_token / bytes_moved)
        assert r["tokens_per_s"] == pytest.approx(r["batch"] / r["step_s"])
        assert r["step_s"] >= bytes_moved / g.hbm_bandwidth  # never faster than reading the bytes once
    speedup = [r["tokens_per_s"] / rows[0]["tokens_per_s"] for r in rows]
    assert speedup[1] > 0.8 * 64 and speedup[2] < 0.5 * 1024  # near-linear, then not


# -- lesson 3: copy-on-write values, shared-prefix memory, the seed's defects -----------------------
def test_cow_experiment_shows_the_values_and_counts_the_bytes():
    kv = KVView(BlockAllocator(16, 4), seed=0)
    r = E.cow_experiment(kv, [1, 2, 3, 4, 5, 6], 7)
    (s0, d0), (s1, d1), (s2, d2) = r["stages"].values()
    assert torch.count_nonzero(d0) == 0 and torch.equal(d1, s1) and torch.equal(s2, s0)
    assert torch.equal(d2[:2], s2[:2]) and not torch.equal(d2[2], s2[2])  # slot 2: the child's new token
    assert r["slot_written"] == 2 and r["bytes_copied"] == 2 * 1 * 4 * 2 * 64 * 4
    assert r["copy_equal"] and r["source_untouched"] and all(r["reads_back"].values())
    fig = TF.cow_heatmap_figure(r)
    assert len(fig.data) == 6 and f"{r['bytes_copied']:,} bytes copied" in fig.layout.title.text
    with pytest.raises(ValueError, match="one copy-on-write"):
        E.cow_experiment(KVView(BlockAllocator(16, 4), seed=0), [1, 2, 3, 4], 7)  # full last block: no copy


def test_block_rounded_shared_prefix_memory_matches_the_allocator():
    rng = random.Random(1)
    seed_wrong = 0
    for _ in range(60):
        B, prefix = rng.choice([4, 8, 16]), rng.randint(1, 70)
        gens = [rng.randint(1, 40) for _ in range(rng.randint(1, 6))]
        m = E.shared_prefix_blocks(prefix, gens, B)
        brute = prefix // B + sum(math.ceil((prefix + g) / B) - prefix // B for g in gens)
        assert m["allocator"] == m["block_rounded"] == brute
        seed_wrong += m["seed_blocks_per_term"] != m["allocator"]
        if prefix % B == 0:
            assert m["seed_blocks_per_term"] == m["allocator"]
    assert seed_wrong > 10  # the seed's formula is wrong whenever the prefix ends mid-block


def test_the_seed_defects_break_attention_and_ours_do_not():
    tol = 1e-4
    seed = SD.stale_entry_experiment(SeedAllocator(4, 4), LAYER)
    ours = SD.stale_entry_experiment(BlockAllocator(4, 4), LAYER)
    assert seed["reused_overwritten_by_d"] == [True] and seed["e_error"] > 0.05
    assert ours["reused_overwritten_by_d"] == [False] and ours["e_error"] < tol
    seed = SD.no_rollback_experiment(SeedAllocator(4, 4), LAYER)
    ours = SD.no_rollback_experiment(BlockAllocator(4, 4), LAYER)
    assert (seed["leaked"], isinstance(seed["y"], str)) == (4, True)
    assert (ours["leaked"], ours["free_after"]) == (0, 4) and ours["y"] < tol
    seed = SD.no_copy_on_write_experiment(SeedAllocator(8, 4), LAYER)
    ours = SD.no_copy_on_write_experiment(BlockAllocator(8, 4), LAYER)
    assert seed["tables"]["child"] == seed["tables"]["parent"] and not seed["child_k5_after_parent_write"]
    assert seed["errors"]["child"] > 0.05 and seed["errors"]["parent"] < tol
    assert ours["tables"]["child"][-1] != ours["tables"]["parent"][-1] and ours["child_k5_after_parent_write"]
    assert max(ours["errors"].values()) < tol
    with pytest.raises(ValueError, match="num_blocks=4"):
        SD.stale_entry_experiment(BlockAllocator(8, 4), LAYER)


# -- the palette and the figures' legends -----------------------------------------------------------
def test_one_colour_blind_safe_palette_with_a_legend_for_every_colour():
    assert set(P.SEQ_COLORS) <= set(P.OKABE_ITO.values())
    states = {P.FREE, P.IDLE, P.EVICTABLE, P.SHARED}
    assert len(states) == 4 and not states & set(P.SEQ_COLORS)
    a = BlockAllocator(8, 4)
    a.allocate("A", list(range(6)))
    a.fork("A", "B")
    names = {t.name for t in F.block_grid_figure(a).data if t.showlegend}
    assert {P.STATE_LABELS[P.SHARED], P.STATE_LABELS[P.EVICTABLE], P.STATE_LABELS[P.FREE]} <= names
    from paged_edu.core.contiguous import ContiguousAllocator

    c = ContiguousAllocator(num_slots=16, max_seq_len=8)
    c.allocate("r0", [1, 2, 3])
    legend = {t.name: t.marker.color for t in MF.contiguous_figure(c, cols=8).data if t.showlegend}
    assert legend["reserved but idle"] == P.IDLE and legend["tokens of r0"] in P.SEQ_COLORS
    fig = MF.kv_memory_figure(find_model("Llama-3-8B"), 4096, 8, 10**11)
    assert fig.layout.xaxis.type in (None, "linear") and "(tokens)" in fig.layout.xaxis.title.text
    assert "(GiB)" in fig.layout.yaxis.title.text
    assert {"the batch fits", "the batch does NOT fit"} <= {t.name for t in fig.data}

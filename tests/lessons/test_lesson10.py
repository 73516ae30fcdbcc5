"""Lesson 10's library and exercises: the learner's K/V store and paged prefill checked against the
library's kernels (10.1, 10.2), with Triton answers written here (run in the interpreter) and the tempting wrong
ones; the prefill tile plan against a brute-force visibility oracle; the figures and the widget.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from paged_edu.labs.tile_plan import DIAGONAL_MASKED, DIAGONAL_SEEN, FULL, SKIPPED, tile_plan, visibility
from paged_edu.lessons import exercises as ex
from paged_edu.lessons.exercises import lesson10 as ex10


@triton.jit
def my_store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    ROW: tl.constexpr,
    ROW_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    cols = tl.arange(0, ROW_PAD)
    mask = cols < ROW
    dst = (block * BLOCK_SIZE + offset) * ROW + cols
    tl.store(k_cache_ptr + dst, tl.load(key_ptr + token * ROW + cols, mask=mask), mask=mask)
    tl.store(v_cache_ptr + dst, tl.load(value_ptr + token * ROW + cols, mask=mask), mask=mask)


def my_store_kv(key, value, k_cache, v_cache, slot_mapping):
    row = key.shape[1] * key.shape[2]
    my_store_kv_kernel[(key.shape[0],)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        ROW=row,
        ROW_PAD=triton.next_power_of_2(row),
        BLOCK_SIZE=k_cache.shape[1],
    )


@triton.jit
def my_prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    cu_seqlens_q_ptr,
    out_ptr,
    scale,
    max_blocks,
    H: tl.constexpr,
    H_KV: tl.constexpr,
    D: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
):
    seq, kv_head, j = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if j >= q_len:
        return
    ctx = tl.load(seq_lens_ptr + seq) - q_len
    p = ctx + j
    G: tl.constexpr = H // H_KV
    g = tl.arange(0, GROUP_PAD)
    g_ok = g < G
    d = tl.arange(0, D)
    q_rows = (q_start + j) * H * D + (kv_head * G + g)[:, None] * D + d[None, :]
    q = tl.load(q_ptr + q_rows, mask=g_ok[:, None], other=0.0).to(tl.float32)
    offs_t = tl.arange(0, TILE)
    bt_row = block_tables_ptr + seq * max_blocks
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D], tl.float32)
    for tile in range(0, tl.cdiv(p + 1, TILE)):
        pos = tile * TILE + offs_t
        seen = pos <= p
        block = tl.load(bt_row + pos // BLOCK_SIZE, mask=seen, other=0).to(tl.int64)
        row = (block * BLOCK_SIZE + pos % BLOCK_SIZE) * (H_KV * D) + kv_head * D
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=seen[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=seen[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], 2) * scale
        s = tl.where(seen[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        w = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(w, 1)
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * v[None, :, :], 1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + q_rows, out, mask=g_ok[:, None])


def my_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale):
    H, D, H_kv = q.shape[1], q.shape[2], k_cache.shape[2]
    out = torch.empty_like(q)
    longest = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    my_prefill_kernel[(seq_lens.shape[0], H_kv, longest)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        cu_seqlens_q,
        out,
        scale,
        block_tables.shape[1],
        H=H,
        H_KV=H_kv,
        D=D,
        GROUP_PAD=triton.next_power_of_2(H // H_kv),
        BLOCK_SIZE=k_cache.shape[1],
        TILE=8,
    )
    return out


@triton.jit
def store_no_padding_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    ROW: tl.constexpr,
    ROW_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)  # no test for -1: the padding row is written before the cache
    cols = tl.arange(0, ROW_PAD)
    mask = cols < ROW
    tl.store(k_cache_ptr + slot * ROW + cols, tl.load(key_ptr + token * ROW + cols, mask=mask), mask=mask)
    tl.store(v_cache_ptr + slot * ROW + cols, tl.load(value_ptr + token * ROW + cols, mask=mask), mask=mask)


def store_no_padding(key, value, k_cache, v_cache, slot_mapping):
    row = key.shape[1] * key.shape[2]
    store_no_padding_kernel[(key.shape[0],)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        ROW=row,
        ROW_PAD=triton.next_power_of_2(row),
        BLOCK_SIZE=k_cache.shape[1],
    )


def _torch_store(**variant):
    def store(key, value, k_cache, v_cache, slots):
        B = k_cache.shape[1]
        for i, s in enumerate(slots.tolist()):
            if s < 0:
                continue
            block, offset = (s % B, s // B) if variant.get("swap") else (s // B, s % B)
            heads = slice(0, 1) if variant.get("one_head") else slice(None)
            src_k, src_v = (value, key) if variant.get("kv") else (key, value)
            k_cache[block, offset, heads] = src_k[i, heads]
            v_cache[block, offset, heads] = src_v[i, heads]

    return store


def test_the_references_and_a_triton_answer_pass():
    for name in ("10.1", "10.2"):
        assert ex.check(name, ex.reference(name))
    assert ex.check("10.1", my_store_kv) and ex.check("10.2", my_paged_prefill)
    assert ex.check("10.1", _torch_store())  # the check reads the caches, not how they were written


@pytest.mark.parametrize(
    "wrong, words",
    [
        (store_no_padding, "slot -1 means 'store nothing'"),
        (_torch_store(swap=True), "block and offset swapped"),
        (_torch_store(kv=True), "K and V swapped"),
        (_torch_store(one_head=True), "only the first KV head"),
        (lambda key, value, k_cache, v_cache, slots: (k_cache.clone(), v_cache.clone()), "the caches are unchanged"),
        (lambda *args: 1 / 0, "ZeroDivisionError"),
    ],
)
def test_10_1_names_what_the_store_got_wrong(wrong, words):
    verdict = ex.check("10.1", wrong)
    assert not verdict and words in str(verdict), str(verdict)


def _prefill_variant(**variant):
    def prefill(q, k_cache, v_cache, tables, seq_lens, cu, scale):
        return ex10._prefill_by_hand(q, k_cache, v_cache, tables, seq_lens, cu, scale, **variant).to(q.dtype)

    return prefill


@pytest.mark.parametrize(
    "variant, words",
    [
        (dict(causal=False), "no causal mask"),
        (dict(prefix=False), "cached prefix is missing"),
        (dict(table=False), "through the block table"),
        (dict(own_token=False), "attends to itself"),
        (dict(gqa=False), "h // group"),
    ],
)
def test_10_2_names_what_the_prefill_got_wrong(variant, words):
    verdict = ex.check("10.2", _prefill_variant(**variant))
    assert not verdict and words in str(verdict), str(verdict)


def test_10_2_by_hand_equals_the_library_and_refuses_nan_and_shapes():
    assert ex.check("10.2", _prefill_variant())
    assert "NaN" in str(ex.check("10.2", lambda q, *a: torch.full_like(q, float("nan"))))
    assert "shaped like q" in str(ex.check("10.2", lambda q, *a: q[:1]))
    assert "differs from the library's kernel" in str(ex.check("10.2", lambda q, *a: q * 0))


@pytest.mark.parametrize(
    "ctx, q_len, block_q, tile", [(0, 1, 1, 4), (5, 3, 2, 4), (20, 24, 8, 8), (7, 33, 16, 4), (64, 1, 4, 16)]
)
def test_the_tile_plan_reads_exactly_the_visible_keys_and_masks_only_on_the_diagonal(ctx, q_len, block_q, tile):
    plan = tile_plan(ctx, q_len, block_q, tile)
    seen = visibility(ctx, q_len)
    cells = plan.cells[:, : ctx + q_len]
    # every visible key is read, unmasked; every key read but not visible is masked; none is read twice over
    assert ((cells == FULL) | (cells == DIAGONAL_SEEN))[seen].all()
    assert not ((cells == FULL) | (cells == DIAGONAL_SEEN))[~seen].any()
    assert (plan.cells[:, ctx + q_len :] != DIAGONAL_SEEN).all()
    # a full tile is visible to every token of its program; tiles are whole
    for p in plan.programs:
        rows = slice(p["tokens"][0], p["tokens"][1] + 1)
        assert (plan.cells[rows, : p["num_full"] * tile] == FULL).all()
        assert (plan.cells[rows, p["num_tiles"] * tile :] == SKIPPED).all()
    assert plan.keys_needed == seen.sum() and plan.keys_scored >= plan.keys_needed
    assert plan.tiles_masked == sum(p["num_tiles"] - p["num_full"] for p in plan.programs)
    assert (plan.cells == DIAGONAL_MASKED).any() == (plan.keys_scored > plan.keys_needed)
    with pytest.raises(ValueError, match="q_len"):
        tile_plan(0, 0, 1, 4)


def test_the_kernel_maps_and_the_explorer():
    from paged_edu.viz import kernel_maps as KM

    data = KM.store_map_data([4, 10, -1], num_blocks=3, block_size=4)
    assert data["z"][1][0] == 0 and data["z"][2][2] == 1 and data["padding"] == [2]
    assert sum(v is not None for row in data["z"] for v in row) == 2
    e = KM.TilePlanExplorer(ctx=8, q_len=8, block_q=4, tile=4)
    before = e.plan.tiles_read
    e.tile.value = 16
    assert e.plan.tile == 16 and e.plan.tiles_read < before
    assert (
        np.array_equal(np.array(e.fig.data[0].z), e.plan.cells)
        and f"{e.plan.tiles_read} tiles read" in e.fig.layout.title.text
    )


# -- 10.3: the split plan, its reference against what the kernel does ----------------------------------


def test_the_split_plan_reference_is_what_the_decode_kernel_does(monkeypatch):
    """Run the tutorial decode kernel (interpreter) with a forced split count and read its partial results: the
    empty splits write lse = -inf, the holder is the last split with a token."""
    from paged_edu.kernels.decode import tutorial
    from paged_edu.kernels.decode.tuning import decode_config

    seen = {}
    real_merge = tutorial.merge

    def spy(part_o, part_lse, out, num_splits, cfg, launch):
        seen["lse"] = part_lse.clone()
        return real_merge(part_o, part_lse, out, num_splits, cfg, launch)

    monkeypatch.setattr(tutorial, "merge", spy)
    tile = decode_config(16, 2, on_gpu=False)["TILE"]
    g = torch.Generator().manual_seed(3)
    for seq_len, splits in ((300, 4), (5 * tile, 3), (2 * tile + 1, 5)):
        blocks = -(-seq_len // 16)
        k, v = torch.randn(blocks, 16, 2, 16, generator=g), torch.randn(blocks, 16, 2, 16, generator=g)
        q = torch.randn(1, 4, 16, generator=g)
        tables = torch.randperm(blocks, generator=g).to(torch.int32)[None]
        tutorial.paged_attention_triton(
            q, k, v, tables, torch.tensor([seq_len], dtype=torch.int32), scale=0.25, num_splits=splits
        )
        lse = seen["lse"][0, 0]  # (splits,) of the first query head
        finite = [j for j in range(splits) if torch.isfinite(lse[j])]
        num_tiles = -(-seq_len // tile)
        per_split = -(-num_tiles // splits)
        assert finite == list(range(len(finite)))  # the empty splits are the last ones
        holder = (num_tiles - 1) // per_split
        assert finite[-1] == holder and splits - len(finite) == sum(j * per_split >= num_tiles for j in range(splits))
    ref = ex10.split_plan_reference()
    assert ref["holder"] < ref["splits"] and ref["empty"] == ref["splits"] - ref["holder"] - 1


@pytest.mark.parametrize(
    "answer, words",
    [
        ({"splits": 39, "holder": 26, "empty": 12}, "sequence's length"),
        ({"splits": 132, "holder": 39, "empty": 26}, "one split per SM"),
        ({"splits": 66, "holder": 40, "empty": 26}, "counted from 1"),
        ({"splits": 66, "holder": 65, "empty": 0}, "last split is not the holder"),
        ({"splits": 66, "holder": 39, "empty": 0}, "empty splits"),
        ({"splits": 66, "holder": None, "empty": 26}, "not answered yet"),
        ({"splits": "66", "holder": 39, "empty": 26}, "whole number"),
        ({"splits": 66}, "keys"),
    ],
)
def test_10_3_names_the_misreading(answer, words):
    verdict = ex.check("10.3", answer)
    assert not verdict and words in str(verdict), str(verdict)


def test_10_3_reference_passes():
    assert ex.check("10.3", {"splits": 66, "holder": 39, "empty": 26})
    assert ex.check("10.3", ex.reference("10.3"))

"""Headless tests of the lesson widgets, figures, exercises and the seed re-creation.

Clicks (``button.click()``) and slider changes (``slider.value = ...``) fire the same callbacks a
browser would; we check that they drive the library and that the figures' data follow. Oracles are
independent: hand-computed memory formulas, brute-force slot arithmetic, K/V recomputed from the
toy layer, attention recomputed densely.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.contiguous import ContiguousAllocator
from paged_edu.core.memory import eta_paged, kv_bytes
from paged_edu.labs.seed_allocator import SeedAllocator
from paged_edu.labs.seed_defects import prefix_reuse_experiment
from paged_edu.labs import utilisation
from paged_edu.labs.toy_kv import ToyLayer
from paged_edu.viz import figures as F
from paged_edu.viz import memory_figures as MF
from paged_edu.viz.widgets import BlockTableWidget, KVMemoryCalculator, PrefixSharingWidget

FREE, EVICTABLE, SHARED = 0, 1, 2


# ----------------------------------------------------------------------------------------------
# Lesson 1: the calculator
# ----------------------------------------------------------------------------------------------


def test_calculator_presets_drive_sliders_and_numbers():
    calc = KVMemoryCalculator(preset="Llama-3-8B", seq_len=4096, batch=4)
    assert (calc.layers.value, calc.kv_heads.value, calc.head_dim.value, calc.dtype.value) == (32, 8, 128, "bf16")
    r = calc.readout()
    assert r["bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    assert r["bytes_per_request"] == 2 * 32 * 8 * 128 * 2 * 4096
    assert r["bytes_batch"] == 4 * r["bytes_per_request"]
    calc.preset.value = "DeepSeek-V3 (MLA)"  # a dropdown change, as in the browser
    assert calc.readout()["bytes_per_token"] == 61 * (512 + 64) * 2
    calc.preset.value = "Seed 70B example"
    assert calc.readout()["bytes_per_token"] == 327_680
    assert "327,680 B" in calc.html.value


def test_calculator_sliders_update_figure_and_fit():
    calc = KVMemoryCalculator(preset="Llama-3-8B", gpu="H200 (141 GB)", seq_len=8192, batch=8)
    before = list(calc.fig.data[0].y)
    calc.layers.value = 64  # doubles every per-token cost; the preset turns "custom"
    assert calc.preset.value == "custom"
    assert calc.readout()["bytes_per_token"] == 2 * 64 * 8 * 128 * 2
    assert list(calc.fig.data[0].y) == pytest.approx([2 * y for y in before])
    calc.seq_len.value = 2048
    assert calc.fig.data[1].x == (2048,)
    need = kv_bytes(calc.spec(), 2048) * 8
    assert calc.fig.data[2].y[0] == pytest.approx(need / 2**30)
    # requests that fit, against a brute-force count of 16-token blocks in the budget
    calc.weights_gb.value = 16.0
    r = calc.readout()
    budget = 0.9 * 143_771 * 2**20 - 16e9  # nvidia-smi 143,771 MiB, not the datasheet "141 GB"
    block = 16 * 2 * 64 * 8 * 128 * 2
    assert r["kv_budget_bytes"] == pytest.approx(budget)
    assert r["requests_that_fit"] == int(budget // block) // (2048 // 16)
    calc.num_gpus.value = 2
    assert calc.readout()["kv_budget_bytes"] == pytest.approx(0.9 * 2 * 143_771 * 2**20 - 16e9)


def test_calculator_gpu_dropdown_and_does_not_fit():
    calc = KVMemoryCalculator(preset="Seed 70B example", gpu="H200 (141 GB)")
    assert calc.readout()["kv_budget_bytes"] == 0  # 141 GB of fp16 weights leave nothing on one H200
    assert "does NOT fit" in calc.html.value
    calc.gpu.value = "T4 (16 GB)"
    assert calc.gpu_gb.value == pytest.approx(15_360 * 2**20 / 1e9)  # what a T4 reports: 15,360 MiB
    calc.set_gpu("h100")  # a table key works too
    assert calc.gpu.value == "H100 80GB" and calc.gpu_gb.value == pytest.approx(81_559 * 2**20 / 1e9)
    with pytest.raises(ValueError, match="not in the GPU table"):
        calc.set_gpu("H300")


def test_calculator_reads_the_one_hardware_table():
    from paged_edu.core.hardware import GPUS, MODELS
    from paged_edu.viz.widgets import GPU_MEMORY, PARAMS

    assert GPU_MEMORY == {g.label: g.memory_bytes for g in GPUS.values()}
    assert PARAMS == {m.name: m.num_params for m in MODELS.values()}
    assert GPU_MEMORY["H200 (141 GB)"] == 143_771 * 2**20 != 141e9
    calc = KVMemoryCalculator(preset="Llama-3-8B", gpu="h200")
    assert calc.weights_gb.value == pytest.approx(8.03e9 * 2 / 1e9, abs=0.05)


# ----------------------------------------------------------------------------------------------
# Lesson 2: the block-table widget
# ----------------------------------------------------------------------------------------------


def _expected_slot(table, t, B):
    return table[t // B] * B + t % B


def test_block_table_widget_buttons_drive_allocator_and_figures():
    w = BlockTableWidget(num_blocks=8, block_size=4, seed=0)
    z0 = [row[:] for row in w.grid.data[0].z]
    assert all(v == FREE for row in z0 for v in row)
    w.prompt_len.value = 6
    w.add_button.click()
    assert w.allocator.seq_ids == ["req0"] and w.allocator.num_tokens("req0") == 6
    assert w.allocator.block_table("req0") == [0, 1]
    z1 = w.grid.data[0].z
    assert z1 != z0 and z1[0][0] not in (FREE, EVICTABLE, SHARED) and z1[0][2] == FREE
    assert list(w.table.data[0].text[0][:2]) == ["0", "1"]
    w.num_append.value = 3
    w.append_button.click()  # 6 -> 9 tokens: a third block
    assert w.allocator.num_tokens("req0") == 9 and len(w.allocator.block_table("req0")) == 3
    assert w.position.max == 8
    w.position.value = 8
    assert "8 // 4 = 2, j = t mod B = 0" in w.address.value and "(match)" in w.address.value
    w.free_button.click()
    assert "req0" not in w.allocator and w.allocator.num_free_blocks == 8
    assert all(v == FREE for row in w.grid.data[0].z for v in row)


def test_block_table_widget_out_of_blocks_is_reported_and_changes_nothing():
    w = BlockTableWidget(num_blocks=4, block_size=4, seed=0)
    w.add_request(12)  # 3 blocks
    before = (w.allocator.num_free_blocks, w.allocator.block_table("req0"))
    w.prompt_len.value = 8
    w.add_button.click()  # needs 2 blocks, 1 free
    assert "OutOfBlocksError" in w.status.value
    assert (w.allocator.num_free_blocks, w.allocator.block_table("req0")) == before
    assert w.allocator.seq_ids == ["req0"]


def test_block_table_widget_addresses_values_and_attention_match_oracles():
    rng = random.Random(1)
    w = BlockTableWidget(num_blocks=32, block_size=4, seed=3)
    for _ in range(40):  # random add / append / free
        op = rng.random()
        live = w.allocator.seq_ids
        try:
            if op < 0.35 or not live:
                w.add_request(rng.randint(1, 9))
            elif op < 0.85:
                w.append_tokens(rng.choice(live), rng.randint(1, 5))
            else:
                w.free(rng.choice(live))
        except MemoryError:
            pass
    live = w.allocator.seq_ids
    assert live
    for seq in live:
        table = w.allocator.block_table(seq)
        for t in range(w.allocator.num_tokens(seq)):
            p = w.pick(seq, t)
            assert p["slot"] == _expected_slot(table, t, 4)
            assert p["address_match"] and p["value_match"]
        assert w.kv.reads_back(seq)
    out = w.kv.attention(live, impl="torch")
    assert torch.allclose(out.float(), w.kv.attention_truth(live), atol=1e-5)


def test_block_table_widget_pick_rejects_bad_position():
    w = BlockTableWidget(num_blocks=8, block_size=4, kv=False)
    w.add_request(3)
    with pytest.raises(ValueError, match="outside"):
        w.pick("req0", 3)


# ----------------------------------------------------------------------------------------------
# Lesson 3: prefix sharing, fork, copy-on-write, eviction
# ----------------------------------------------------------------------------------------------


def test_prefix_widget_shares_system_prompt_blocks_and_counts_hits():
    w = PrefixSharingWidget(num_blocks=24, block_size=4, system_len=10, seed=0)
    w.user_len.value = 3
    for _ in range(3):
        w.chat_button.click()
    tables = [w.allocator.block_table(s) for s in w.allocator.seq_ids]
    assert all(t[:2] == tables[0][:2] for t in tables)  # 10 system tokens = 2 full shared blocks
    assert len({t[2] for t in tables}) == 3  # the block where private tokens begin is private
    assert [w.allocator.ref_count(b) for b in tables[0][:2]] == [3, 3]
    st = w.allocator.stats
    assert (st.hit_tokens, st.queried_tokens) == (2 * 8, 3 * 13)
    assert "41.0%" in w.metrics.value
    grid = w.grid.data[0].z
    assert grid[0][tables[0][0]] == SHARED and grid[0][tables[0][1]] == SHARED
    assert all(w.kv.reads_back(s) for s in w.allocator.seq_ids)


def test_prefix_widget_fork_append_copy_on_write_checked_on_tensors():
    w = PrefixSharingWidget(num_blocks=24, block_size=4, system_len=10, seed=0)
    w.add_chat(3)  # 13 tokens: blocks 0..3, last one holds 1 token
    w.seq.value = "chat0"
    w.fork_button.click()
    child = w.seq.value
    assert child != "chat0" and w.allocator.block_table(child) == w.allocator.block_table("chat0")
    last = w.allocator.block_table("chat0")[-1]
    assert w.allocator.ref_count(last) == 2
    w.append_button.click()  # the child writes into the shared, partly filled last block
    assert w.allocator.block_table(child)[-1] != last
    assert w.allocator.ref_count(last) == 1
    assert len(w.cow_checks) == 1
    c = w.cow_checks[0]
    assert (c["src"], c["copy_equal"], c["source_untouched"]) == (last, True, True)
    assert "copy-on-write" in w.status.value
    assert w.kv.reads_back("chat0") and w.kv.reads_back(child)
    w.append_token("chat0")  # the parent now owns its block alone: no copy
    assert len(w.cow_checks) == 1


def test_prefix_widget_timestamp_first_kills_hits_and_eviction_is_logged():
    w = PrefixSharingWidget(num_blocks=12, block_size=4, system_len=8, seed=0)
    w.dynamic.value = "start"
    w.add_chat(3)
    w.add_chat(3)
    assert w.allocator.num_cached_tokens("chat1") == 0
    w.set_dynamic("end")
    w.add_chat(3)
    w.add_chat(3)
    assert w.allocator.num_cached_tokens("chat3") == 8
    for s in list(w.allocator.seq_ids):
        w.free(s)
    assert w.allocator.num_evictable_blocks > 0
    assert any(row for row in w.grid.data[0].z if EVICTABLE in row)
    w.set_dynamic("none")
    for _ in range(3):
        w.add_chat(8)
    assert any(e.kind == "evict" for e in w.events)
    assert "evict" in w.log.value
    with pytest.raises(ValueError):
        w.set_dynamic("middle")


# ----------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------


def test_figures_follow_allocator_state():
    a = BlockAllocator(8, 4)
    a.allocate("A", list(range(10)))  # blocks 0, 1 full (cached), 2 partial
    a.fork("A", "B")
    a.allocate("C", [50, 51])
    a.free("C")  # a partial block: nothing cached, plain free
    data = F.block_grid_data(a, cols=4)
    assert data["z"][0][:3] == [SHARED, SHARED, SHARED] and data["z"][0][3] == FREE
    assert "rc=2" in data["text"][0][0]
    table = F.block_table_data(a)
    assert table["text"][0][:3] == ["0", "1", "2"] and len(table["y"]) == 2
    fig = F.logical_physical_figure(a)
    assert fig.layout.width is None and fig.layout.autosize  # it follows the column's width
    assert F.logical_physical_figure(a, fixed_width=True).layout.width == 62 * a.num_blocks + 200
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == 2  # one trace per sequence
    assert sum(x is None for x in lines[0].x) == 3  # one segment per logical block
    a.free("A")
    a.free("B")
    assert F.block_grid_data(a, cols=4)["z"][0][:2] == [EVICTABLE, EVICTABLE]


def test_figures_accept_the_seed_allocator():
    s = SeedAllocator(8, 4)
    s.allocate_prompt("A", [1, 2, 3, 4, 5, 6, 7, 8])
    s.allocate_prompt("B", [9, 9, 9, 9, 5, 6, 7, 8])
    assert F.block_grid_data(s, cols=4)["z"][0][1] == SHARED  # the wrongly shared block
    assert len([t for t in F.logical_physical_figure(s).data if t.mode == "lines"]) == 2


def test_measured_utilisation_matches_formula_and_capacity():
    rng = random.Random(0)
    for B in (8, 16, 32):
        for _ in range(20):
            s = rng.randint(1, 600)
            assert utilisation.measure_eta_paged([s], B) == pytest.approx(eta_paged(s, B))
            assert utilisation.measure_eta_paged([s], B) >= 1 - B / (s + B)
    lengths = [rng.randint(1, 2048) for _ in range(300)]
    budget = 65_536
    assert utilisation.admit_until_full(lengths, budget, max_seq_len=2048) == 32
    used, expected = 0, 0
    for s in lengths:  # brute force: blocks of 16 until the budget runs out
        if used + math.ceil(s / 16) * 16 > budget:
            break
        used += math.ceil(s / 16) * 16
        expected += 1
    assert utilisation.admit_until_full(lengths, budget, block_size=16) == expected
    fig = MF.utilisation_figure({16: ([10, 20], [0.625, 0.625])}, s_max=64, naive_l_max=64)
    assert [t.name for t in fig.data] == ["bound B=16", "measured B=16", "contiguous, L_max=64"]
    with pytest.raises(ValueError):
        utilisation.admit_until_full(lengths, budget)


def test_contiguous_figure_shows_idle_reservations():
    c = ContiguousAllocator(num_slots=16, max_seq_len=8)
    c.allocate("r0", [1, 2, 3])
    z = MF.contiguous_data(c, cols=8)["z"]
    assert z[0][:3] == [z[0][0]] * 3 and z[0][0] >= 4  # tokens in the owner's colour
    assert z[0][3:8] == [3] * 5  # reserved but idle
    assert z[1] == [FREE] * 8


# ----------------------------------------------------------------------------------------------
# The seed's allocator, re-created to show its defects (the wrong way)
# ----------------------------------------------------------------------------------------------


def test_seed_hash_shares_blocks_across_prefixes_and_corrupts_attention():
    layer = ToyLayer(num_kv_heads=2, head_dim=16, num_q_heads=4, seed=0)
    prompts = {"A": [11, 12, 13, 14, 31, 32, 33, 34, 41, 42], "B": [21, 22, 23, 24, 31, 32, 33, 34, 51, 52]}
    seed = prefix_reuse_experiment(SeedAllocator(16, 4), prompts, layer)
    assert seed["B"]["reused_blocks"] == [seed["A"]["block_table"][1]]
    assert seed["A"]["max_abs_diff"] < 1e-5 and seed["B"]["max_abs_diff"] > 0.05
    ours = prefix_reuse_experiment(BlockAllocator(16, 4), prompts, layer)
    assert ours["B"]["reused_blocks"] == [] and ours["B"]["max_abs_diff"] < 1e-5
    same = {"A": prompts["A"], "C": prompts["A"][:8] + [99]}  # a true shared prefix is reused by both
    assert prefix_reuse_experiment(BlockAllocator(16, 4), same, layer)["C"]["reused_blocks"] == [0, 1]


def test_seed_allocator_keeps_its_other_defects():
    s = SeedAllocator(3, 2)
    s.allocate_prompt("A", [1, 2])
    s.free_request("A")  # stale: the hash still points at block 0
    s.allocate_prompt("B", [7, 8])  # block 1 ... (free list order: 1, 2, 0)
    s.allocate_prompt("C", [5, 6])
    s.allocate_prompt("D", [9, 9])  # takes block 0, A's old block
    assert s.allocate_prompt("E", [1, 2]) == [0]  # a stale hit on D's data
    t = SeedAllocator(2, 2)
    with pytest.raises(MemoryError):
        t.allocate_prompt("X", [1, 2, 3, 4, 5, 6])  # needs 3 blocks of 2
    assert t.num_free_blocks == 0  # no rollback: the two blocks taken stay taken
    u = SeedAllocator(4, 4)
    u.allocate_prompt("P", [1, 2, 3, 4, 5])
    u.allocate_prompt("Q", [1, 2, 3, 4, 6])
    assert u.append_token_slot("Q", 5) == u.block_table("Q")[-1]  # writes in place, no copy


def test_toy_layer_kv_depends_on_prefix():
    layer = ToyLayer(num_kv_heads=2, head_dim=8, seed=0)
    k1, _ = layer.kv([1, 2, 3, 4, 9, 9])
    k2, _ = layer.kv([5, 6, 7, 8, 9, 9])
    assert not torch.allclose(k1[4:], k2[4:])  # same tokens, different prefix
    k3, _ = layer.kv([1, 2, 3, 4])
    assert torch.equal(k1[:4], k3)  # causal: earlier K never change


def test_figure_colours_come_from_the_palette():
    """Issue 21: every colour a view draws is named in viz/palette.py (white backgrounds aside)."""
    import re
    from pathlib import Path

    viz = Path(__file__).resolve().parents[2] / "paged_edu" / "viz"
    stray = {
        f"{p.name}: {c}"
        for p in viz.rglob("*.py")
        if p.name != "palette.py"
        for c in re.findall(r"#[0-9a-fA-F]{6}\b", p.read_text())
        if c.upper() != "#FFFFFF"
    }
    assert not stray, sorted(stray)


def test_figure_widgets_synced_state_is_the_figure_after_every_change():
    """The state a front-end model holds (``_widget_data``, ``_widget_layout``) is the figure as it
    now is, after changes plotly sends only as one-off messages -- so a view drawn late, or a model
    that missed those messages, draws the widget's current figure (issue 25: an empty lesson 2 plot).
    Oracle: the figure's own JSON. plotly's FigureWidget keeps its state as first constructed."""
    import json

    import plotly.io as pio

    from paged_edu.viz.widgets.figure import PLOTLY_WIDGET_BUNDLE

    def synced(fig):
        return json.loads(pio.to_json({"data": fig._widget_data, "layout": fig._widget_layout}))

    def current(fig):
        return json.loads(pio.to_json({"data": fig._data, "layout": fig._layout_obj._props}))

    w = BlockTableWidget(num_blocks=24, block_size=4, kv=False)
    w.add_request(6)
    w.add_request(9)
    w.append_tokens("req0", 5)
    w.prompt_len.value = 3
    w.add_button.click()
    for fig in (w.grid, w.table):
        assert synced(fig) == current(fig)
    assert len(w.table._widget_layout) and synced(w.table)["layout"]["height"] == 110 + 36 * 3
    assert (
        [y.split()[0] for y in synced(w.table)["data"][0]["y"]] == list(w.allocator.seq_ids) == ["req0", "req1", "req2"]
    )
    w.table.data[0].z = [[1, 2]]  # a single restyle, outside batch_update
    w.table.layout.title = "after"  # a single relayout
    assert synced(w.table) == current(w.table)
    assert synced(w.table)["data"][0]["z"] == [[1, 2]]
    # plotly's module is not the widget's own (loaded by it, once a page, outside anywidget's deadline)
    assert "_plotly_esm" in w.table.keys and len(w.table._esm) < 2000
    assert w.table._plotly_esm == PLOTLY_WIDGET_BUNDLE.read_text(encoding="utf-8")

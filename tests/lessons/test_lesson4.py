"""Lesson 4: the online-softmax stepper against the oracle, the seed's kernel as written, the exercises,
and every callback of the stepper widget (headless)."""

from __future__ import annotations

import pytest
import torch

from paged_edu.kernels import paged_attention_decode, triton_available, triton_interpreting
from paged_edu.kernels.online_softmax import block_update, empty_state, merge_states
from paged_edu.kernels.reference import paged_attention_torch
from paged_edu.labs.seed_kernel import paged_attention_decode_step, paged_attention_decode_step_fixed
from paged_edu.labs.timing import decode_bytes, random_paged_case, wall_us
from paged_edu.lessons import exercises as ex
from paged_edu.lessons.exercises import lesson4 as L4
from paged_edu.labs.kernel_ladder import cpu_ladder, source_between, stored_gpu_figures
from paged_edu.labs.softmax_stepper import OnlineSoftmaxStepper
from paged_edu.viz.kernel_figures import ladder_figure, split_figure, stored_split_points
from paged_edu.viz.softmax_stepper import SoftmaxStepperWidget, stepper_traces


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the kernels run where the suite runs


def brute_force(stepper: OnlineSoftmaxStepper) -> torch.Tensor:
    """float64 attention over the sequence's own K/V, token by token: no blocks, no online softmax."""
    q = stepper.query.double()
    G = stepper.num_q_heads // stepper.num_kv_heads
    out = torch.empty(stepper.num_q_heads, stepper.head_dim, dtype=torch.float64)
    for h in range(stepper.num_q_heads):
        k, v = stepper.keys[:, h // G].double(), stepper.values[:, h // G].double()
        w = torch.softmax(k @ q[h] * stepper.scale, dim=0)
        out[h] = w @ v
    return out


# ----------------------------------------------------------------------------------------------
# The stepper
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("update", [block_update, ex.reference("4.3")], ids=["library", "exercise-reference"])
@pytest.mark.parametrize("seq_len,block_size,hq,hkv", [(45, 8, 4, 2), (32, 8, 8, 1), (1, 4, 2, 2), (77, 16, 6, 3)])
def test_stepper_reaches_the_oracle_at_the_last_block_and_not_before(update, seq_len, block_size, hq, hkv):
    s = OnlineSoftmaxStepper(
        seq_len,
        block_size=block_size,
        num_blocks=-(-seq_len // block_size) + 4,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=8,
        seed=seq_len,
        update=update,
    )
    truth = brute_force(s)
    assert torch.allclose(s.truth.double(), truth, atol=1e-5)
    errors = [s.step()["error"].max().item() for _ in range(s.num_logical_blocks)]
    assert s.done and errors[-1] < 1e-5
    assert torch.allclose(s.output().double(), truth, atol=1e-5)
    if s.num_logical_blocks > 1:
        assert all(e > 1e-3 for e in errors[:-1])  # the answer is only complete at the last block
    with pytest.raises(RuntimeError, match="call reset"):
        s.step()


def test_the_stepper_state_is_the_definition_of_m_l_o_over_the_tokens_seen():
    s = OnlineSoftmaxStepper(45, block_size=8, num_blocks=10, num_q_heads=4, num_kv_heads=2, head_dim=16)
    G = 2
    for _ in range(3):
        r = s.step()
    n = 3 * 8  # tokens seen
    k = s.keys[:n].float()[:, torch.arange(4) // G]  # (n, H_q, D)
    v = s.values[:n].float()[:, torch.arange(4) // G]
    S = torch.einsum("hd,nhd->hn", s.query.float(), k) * s.scale
    m, _ = S.max(dim=-1)
    assert torch.allclose(r["m"], m)
    assert torch.allclose(r["l"], torch.exp(S - m[:, None]).sum(-1), rtol=1e-5)
    assert torch.allclose(r["o"], torch.einsum("hn,nhd->hd", torch.exp(S - m[:, None]), v), rtol=1e-5, atol=1e-5)


def test_the_partial_last_block_is_masked_and_its_stale_slots_would_change_the_answer():
    s = OnlineSoftmaxStepper(45, block_size=8, num_blocks=10)
    scores, values, valid = s.block_inputs(5)
    assert valid.tolist() == [True] * 5 + [False] * 3
    assert torch.isfinite(scores[:, 5:]).all()  # the tail holds a previous occupant's K: real numbers
    s.run()
    wrong = OnlineSoftmaxStepper(45, block_size=8, num_blocks=10, update=L4._no_mask)
    wrong.run()
    assert s.error().max() < 1e-5 and wrong.error().max() > 1e-3


def test_shuffle_changes_the_table_not_the_answer():
    s = OnlineSoftmaxStepper(45, block_size=8, num_blocks=10)
    for _ in range(2):
        s.step()
    mid = s.output().clone()
    old = s.block_table
    new = s.shuffle()
    assert new == s.block_table != old and sorted(set(new)) == sorted(new)
    assert s.num_processed == 2 and torch.equal(s.output(), mid)  # replayed: bit for bit
    assert s.allocator.block_table("query") == new
    k, v = s.kv.gather(0, new, s.seq_len)  # the K/V really moved to the new blocks
    assert torch.equal(k, s.keys) and torch.equal(v, s.values)
    final = s.run().clone()
    s.shuffle()
    assert torch.equal(s.output(), final)


def test_stepper_agrees_with_every_decode_kernel_on_its_cache():
    s = OnlineSoftmaxStepper(45, block_size=8, num_blocks=10, device=DEVICE)
    s.run()
    for impl in ("loop", "torch", "triton"):
        out = paged_attention_decode(*s.decode_inputs(), impl=impl)[0].float()
        assert torch.allclose(out, s.output(), atol=1e-5), impl


def test_stepper_refuses_bad_input_and_a_bad_update_leaves_the_state_as_it_was():
    with pytest.raises(ValueError, match="needs 6 blocks"):
        OnlineSoftmaxStepper(45, block_size=8, num_blocks=5)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        OnlineSoftmaxStepper(10, num_q_heads=3, num_kv_heads=2)
    with pytest.raises(TypeError, match="seq_len must be an int"):
        OnlineSoftmaxStepper(4.5)
    with pytest.raises(TypeError, match="update must be a function"):
        OnlineSoftmaxStepper(10, update=3)
    s = OnlineSoftmaxStepper(20, block_size=8, update=lambda m, l, o, *rest: (m, l))
    with pytest.raises(TypeError, match="tuple"):
        s.step()
    assert s.num_processed == 0 and torch.isinf(s.m).all()
    s.update = L4.block_update_stub
    with pytest.raises(NotImplementedError, match="Exercise 4.3"):
        s.step()
    assert s.num_processed == 0
    with pytest.raises(ValueError, match="b must be in"):
        s.block_inputs(3)


# ----------------------------------------------------------------------------------------------
# The seed's kernel, as written, and fixed
# ----------------------------------------------------------------------------------------------


def _seed_case(dtype):
    case = random_paged_case(2, 48, 8, 2, 32, 16, dtype=dtype, device="cpu", seed=1)
    q, k, v, t, _ = case
    lens = torch.tensor([48, 21], dtype=torch.int32)  # a partial last block in the second
    return q, k, v, t, lens


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_seeds_kernel_fails_on_half_precision_as_written(dtype):
    with pytest.raises(RuntimeError, match="dtype|scalar type"):
        paged_attention_decode_step(*_seed_case(dtype), block_size=16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_fixed_seed_kernel_matches_the_oracle(dtype):
    q, k, v, t, lens = _seed_case(dtype)
    ref = paged_attention_torch(q, k, v, t, lens, scale=32**-0.5).float()
    out = paged_attention_decode_step_fixed(q, k, v, t, lens, block_size=16)
    assert out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(out.float(), ref, atol=tol)
    if dtype == torch.float32:  # as written, fp32 works: the fix changes nothing there
        assert torch.equal(paged_attention_decode_step(q, k, v, t, lens, block_size=16), out)


def test_the_seeds_fudge_changes_nothing_for_a_real_sequence():
    l = torch.tensor([1.0, 1.5, 37.0])
    assert torch.equal(l + 1e-8, l)


# ----------------------------------------------------------------------------------------------
# Merge, bytes, timing helpers
# ----------------------------------------------------------------------------------------------


def test_merge_states_of_two_halves_is_the_state_of_the_whole_and_empty_is_neutral():
    g = torch.Generator().manual_seed(0)
    S, V = 4 * torch.randn(3, 20, generator=g), torch.randn(3, 20, 5, generator=g)
    valid = torch.ones(20, dtype=torch.bool)
    whole = block_update(*empty_state(3, 5), S, V, valid)
    a = block_update(*empty_state(3, 5), S[:, :7], V[:, :7], valid[:7])
    b = block_update(*empty_state(3, 5), S[:, 7:], V[:, 7:], valid[7:])
    for got, want in zip(merge_states(*a, *b), whole):
        assert torch.allclose(got, want, rtol=1e-5)
    for got, want in zip(merge_states(*a, *empty_state(3, 5)), a):
        assert torch.equal(got, want)
    m, l, o = merge_states(*empty_state(3, 5), *empty_state(3, 5))
    assert torch.isinf(m).all() and (l == 0).all() and (o == 0).all()


def test_decode_bytes_counts_kv_once_per_kv_head_plus_q_and_out():
    assert decode_bytes(1, 8192, 32, 8, 128, 2) == 2 * 8192 * 8 * 128 * 2 + 2 * 32 * 128 * 2
    q, k, v, _, _ = random_paged_case(3, 64, 8, 2, 16, 16, dtype=torch.float16, device="cpu")
    assert decode_bytes(3, 64, 8, 2, 16, 2) == 2 * k.numel() * 2 + 2 * q.numel() * 2


def test_cpu_ladder_times_three_correct_implementations():
    row = cpu_ladder(num_seqs=1, seq_len=32, num_q_heads=2, num_kv_heads=1, head_dim=16, reps=1)
    assert set(row["impls"]) == {"seed", "loop", "torch"} | ({"triton"} if triton_interpreting() else set())
    for m in row["impls"].values():
        assert m["us"] > 0 and m["rel_err"] < 1e-5
    us, out = wall_us(lambda: 3, reps=2)
    assert us >= 0 and out == 3


def test_stored_figures_and_kernel_source():
    figures = stored_gpu_figures()
    assert figures is not None and {r["case"] for r in figures["cases"]} >= {"1x8192", "64x4096"}
    assert stored_gpu_figures(path="/nonexistent/kernel_bench.json") is None
    sweep = stored_split_points(stored_gpu_figures("kernel_sweep.json"), "1x8192")
    assert sweep["chosen_splits"] == 64 and [p["splits"] for p in sweep["points"]] == sorted(
        {p["splits"] for p in sweep["points"]}
    )
    assert stored_split_points({"cases": []}, "1x8192") is None
    assert len(split_figure([sweep], "t").data) == 3 and len(ladder_figure(figures["cases"], "t").data) == 4
    from paged_edu.kernels.decode import tuning, tutorial

    text = source_between(tutorial.paged_decode_kernel, "tl.program_id", "seq_len = ")
    assert "program_id" in text and "seq_len = " not in text
    with pytest.raises(ValueError, match="not in the source"):
        source_between(tuning.choose_num_splits, "no such line")


@pytest.mark.skipif(not triton_available(), reason="reads the Triton kernels' sources")
def test_the_engines_decode_kernel_calls_every_piece_the_lessons_kernel_calls():
    """Section 6's claim, read from the sources: the engine's pure-decode kernel is assembled from the
    pieces of the kernel the lesson reads (and more); both stay within 30 parameters, the lesson's
    within 80 lines."""
    from paged_edu.kernels.decode import fast, tutorial
    from paged_edu.labs.kernel_ladder import kernel_outline

    lesson, engine = kernel_outline(tutorial.paged_decode_kernel), kernel_outline(fast.rotary_store_decode_kernel)
    assert lesson["helpers"] == [f"pieces.{p}" for p in ("tile_range", "group_offsets", "attend_tiles", "write_result")]
    assert set(lesson["helpers"]) < set(engine["helpers"]) and "fast.store_new_token" in engine["helpers"]
    assert lesson["lines"] <= 80 and max(lesson["parameters"], engine["parameters"]) <= 30
    assert 0 < lesson["compile_time"] < lesson["parameters"]
    assert kernel_outline(kernel_outline)["helpers"] == []  # a plain function: no Triton helpers


# ----------------------------------------------------------------------------------------------
# Exercises: right and tempting wrong answers
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["4.1", "4.2", "4.3"])
def test_references_pass_and_stubs_and_none_do_not(name, capsys):
    assert ex.check(name, ex.reference(name))
    assert not ex.check(name, None)
    stub = {"4.1": L4.merge_stub, "4.3": L4.block_update_stub}.get(name)
    if stub is not None:
        verdict = ex.check(name, stub)
        assert not verdict and f"Exercise {name}" in str(verdict)
    assert f"Exercise {name}" in ex.solution(name)


@pytest.mark.parametrize("hint", list(L4.WRONG_MERGES))
def test_wrong_merges_get_their_own_verdict(hint):
    verdict = ex.check("4.1", L4.WRONG_MERGES[hint])
    assert not verdict and hint in str(verdict)


@pytest.mark.parametrize("hint", list(L4.WRONG_BYTES))
def test_wrong_byte_counts_get_their_own_verdict(hint):
    verdict = ex.check("4.2", L4.WRONG_BYTES[hint])
    assert not verdict and hint in str(verdict)


@pytest.mark.parametrize("hint", list(L4.WRONG_UPDATES))
def test_wrong_updates_get_their_own_verdict(hint):
    verdict = ex.check("4.3", L4.WRONG_UPDATES[hint])
    assert not verdict and hint in str(verdict)


def test_a_learners_correct_update_is_checked_by_the_same_stepper_test():
    def mine(m, l, o, scores, values, valid):  # written from the equations, not the library
        S = torch.where(valid, scores, torch.tensor(float("-inf")))
        m_new = torch.maximum(m, S.max(dim=1).values)
        P = torch.exp(S - m_new.unsqueeze(1))
        alpha = torch.exp(m - m_new)
        return m_new, alpha * l + P.sum(1), alpha.unsqueeze(1) * o + (P.unsqueeze(2) * values).sum(1)

    assert L4.run_stepper_check(mine) == (True, "")
    assert ex.check("4.3", mine)
    assert not ex.check("4.2", lambda *a: "many")
    for name in ("4.1", "4.2", "4.3"):  # the notebook's starting point: a function that returns None
        verdict = ex.check(name, lambda *a: None)
        assert not verdict and "returned None" in str(verdict)


# ----------------------------------------------------------------------------------------------
# The widget, headless: every callback
# ----------------------------------------------------------------------------------------------


def test_widget_next_block_run_reset_shuffle_and_head_slider():
    w = SoftmaxStepperWidget(OnlineSoftmaxStepper(45, block_size=8, num_blocks=10))
    assert len(w.fig.data) == 8 and len(w.fig.data[1].x) == 0 and "no block processed" in w.status.value
    w.next_button.click()
    assert w.stepper.num_processed == 1 and len(w.fig.data[1].x) == 8 and len(w.fig.data[7].y) == 1
    assert list(w.fig.data[0].z[0]).count(3) == 1  # the block just processed is marked in the pool
    w.run_button.click()
    assert w.stepper.done and w.next_button.disabled and w.fig.data[7].y[-1] < 1e-5
    assert len(w.fig.data[2].x) == 3  # the masked tail of the last block: 48 - 45 slots
    assert "last block" in w.status.value
    before = w.stepper.block_table
    w.shuffle_button.click()
    assert w.stepper.block_table != before and "differs by 0.0e+00" in w.status.value
    assert "#%d" % w.stepper.block_table[0] in w.fig.data[0].text[0][w.stepper.block_table[0]]
    w.head.value = 3
    assert list(w.fig.data[5].y) == w.stepper.truth[3].tolist()
    assert w.fig.data[3].y[0] == pytest.approx(float(w.stepper.history[0]["m"][3]))
    w.reset_button.click()
    assert w.stepper.num_processed == 0 and not w.next_button.disabled and len(w.fig.data[4].x) == 0
    w.next_button.click()  # and it starts again
    assert w.stepper.num_processed == 1


def test_stepper_traces_refuse_a_bad_head():
    with pytest.raises(ValueError, match="head must be in"):
        stepper_traces(OnlineSoftmaxStepper(10), head=7)


def test_every_piece_of_the_kernel_the_lesson_shows_is_still_in_its_source():
    """Lesson 4 prints pieces of the decode kernels (paged_edu/kernels/decode/) between marker lines: a
    kernel edit that removes a marker must fail here, not in the middle of the lesson."""
    import json
    import re
    from pathlib import Path

    from paged_edu.kernels.decode import fast, pieces, tutorial
    from paged_edu.labs import kernel_ladder as ladder

    nb = json.loads(
        (Path(__file__).resolve().parents[2] / "notebooks" / "04_online_softmax_and_the_kernel.ipynb").read_text()
    )
    calls = [
        m
        for c in nb["cells"]
        if c["cell_type"] == "code"
        for m in re.findall(r"ladder\.source_between\([^\n]*\)(?=\))", "".join(c["source"]))
    ]
    assert len(calls) >= 5
    for call in calls:
        assert eval(call, {"ladder": ladder, "tutorial": tutorial, "pieces": pieces, "fast": fast}).strip(), call  # noqa: S307


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times CUDA graphs on a GPU")
def test_gpu_ladder_and_split_sweep_measure_correct_kernels():
    """The lesson's live GPU cells: every implementation's output checked against the fp32 oracle,
    the copy ceiling positive, and the kernel's own split count among the measured points."""
    from paged_edu.labs.kernel_ladder import gpu_ladder, split_sweep

    (row,) = gpu_ladder([(2, 512)], num_q_heads=8, num_kv_heads=2, head_dim=64, loop_cases=[(2, 512)], reps=5, warmup=2)
    assert row["ceiling_us"] > 0 and set(row["impls"]) == {"seed", "loop", "torch", "triton"}
    assert all(r["rel_err"] < 2e-2 and r["us"] > 0 for r in row["impls"].values()), row
    sweep = split_sweep(1, 2048, [1, 2, 4], num_q_heads=8, num_kv_heads=2, head_dim=64, reps=5, warmup=2)
    assert {p["splits"] for p in sweep["points"]} >= {1, 2, 4, sweep["chosen_splits"]}
    assert all(p["rel_err"] < 2e-2 for p in sweep["points"]), sweep

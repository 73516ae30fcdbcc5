"""KV bytes per GPU under tensor / pipeline parallelism, fp8 and MLA, against hand arithmetic."""

import pytest

from paged_edu.core.hardware import GPUS, ModelGeometry, find_model, kv_heads_per_rank
from paged_edu.core.parallel_kv import parallel_kv_rows, plan_kv_per_gpu

H200 = 143_771 * 2**20  # nvidia-smi's MiB


@pytest.mark.parametrize(
    "n_kv, tp, want",
    [
        (8, 1, (8, 1)),
        (8, 2, (4, 1)),
        (8, 4, (2, 1)),
        (8, 8, (1, 1)),  # split
        (8, 16, (1, 2)),
        (8, 32, (1, 4)),
        (2, 8, (1, 4)),
        (1, 4, (1, 4)),  # replicated: tp > N_kv
    ],
)
def test_kv_heads_per_rank_split_then_replicate(n_kv, tp, want):
    assert kv_heads_per_rank(n_kv, tp) == want
    heads, replicas = want
    assert heads * tp == n_kv * replicas  # every head is stored `replicas` times over the tp ranks


@pytest.mark.parametrize("n_kv, tp", [(8, 3), (8, 12), (6, 4)])
def test_uneven_head_splits_are_refused(n_kv, tp):
    with pytest.raises(ValueError, match="divisible|multiple"):
        kv_heads_per_rank(n_kv, tp)


def test_per_gpu_bytes_by_hand():
    llama8 = find_model("Llama-3-8B")  # 32 layers, 8 KV heads of 128, bf16
    assert llama8.per_gpu().kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert llama8.per_gpu(2).kv_bytes_per_token == 2 * 32 * 4 * 128 * 2
    assert llama8.per_gpu(8).kv_bytes_per_token == 2 * 32 * 1 * 128 * 2 == 16_384
    assert llama8.per_gpu(16).kv_bytes_per_token == 16_384  # one head per GPU, each on two GPUs
    assert llama8.per_gpu(1, 2).kv_bytes_per_token == 2 * 16 * 8 * 128 * 2  # 16 layers per stage
    assert llama8.per_gpu(1, 3).kv_bytes_per_token == 2 * 11 * 8 * 128 * 2  # ceil(32 / 3) = 11 on the busiest
    assert llama8.per_gpu(kv_cache_dtype="fp8").kv_bytes_per_token == 131_072 // 2
    assert llama8.per_gpu(4, 2, "fp8").kv_bytes_per_token == 2 * 16 * 2 * 128 * 1
    mla = find_model("DeepSeek-V3 (MLA)")  # 61 layers x (512 + 64), bf16: one latent, not per head
    for tp in (1, 2, 8, 16):
        assert mla.per_gpu(tp).kv_bytes_per_token == 61 * (512 + 64) * 2 == 70_272  # every rank keeps it whole
    assert mla.per_gpu(1, 2, "fp8").kv_bytes_per_token == 31 * 576


def test_per_gpu_bad_arguments():
    spec = find_model("Llama-3-8B")
    for kwargs, match in [
        (dict(tensor_parallel_size=0), "tensor_parallel_size"),
        (dict(pipeline_parallel_size=33), "pipeline_parallel_size"),
        (dict(kv_cache_dtype="fp4"), "kv_cache_dtype"),
        (dict(tensor_parallel_size=3), "divisible"),
    ]:
        with pytest.raises(ValueError, match=match):
            spec.per_gpu(**kwargs)


def test_plan_blocks_by_hand():
    # Llama-3-8B, bf16 weights (8.03e9 x 2 bytes), H200 at 0.9, tp = 2: 4 KV heads per GPU.
    plan = plan_kv_per_gpu("llama-3-8b", "h200", tensor_parallel_size=2, gpu_memory_utilization=0.9)
    weights = int(8.03e9 * 2) // 2
    budget = int(0.9 * H200) - weights
    per_token = 2 * 32 * 4 * 128 * 2
    assert (plan.weights_bytes_per_gpu, plan.kv_budget_bytes_per_gpu) == (weights, budget)
    assert plan.bytes_per_token_per_gpu == per_token
    assert plan.num_blocks == budget // (16 * per_token) and plan.num_tokens == plan.num_blocks * 16
    assert plan.bytes_per_token_all_gpus == 2 * per_token == find_model("Llama-3-8B").kv_bytes_per_token
    assert plan.max_sequences(2048) == plan.num_blocks // 128
    # tp = 16 > 8 KV heads: each head on two GPUs, so a token costs twice the model's M_KV in all.
    wide = plan_kv_per_gpu("Llama-3-8B", tensor_parallel_size=16)
    assert wide.kv_head_replicas == 2 and wide.bytes_per_token_all_gpus == 2 * 131_072


def test_llama3_70b_needs_more_than_one_h200_and_fp8_doubles_the_tokens():
    g = find_model("Llama-3-70B")
    assert (g.num_layers, g.num_q_heads, g.num_kv_heads, g.head_dim) == (80, 64, 8, 128)
    assert g.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    one = plan_kv_per_gpu("llama-3-70b", tensor_parallel_size=1)
    assert one.weights_bytes_per_gpu > 0.9 * GPUS["h200"].memory_bytes and not one.fits and one.num_tokens == 0
    bf16 = plan_kv_per_gpu("llama-3-70b", tensor_parallel_size=8)
    fp8 = plan_kv_per_gpu("llama-3-70b", tensor_parallel_size=8, kv_cache_dtype="fp8")
    assert bf16.bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 2 == 2 * fp8.bytes_per_token_per_gpu
    assert fp8.num_blocks == fp8.kv_budget_bytes_per_gpu // (16 * 20_480)
    assert fp8.num_blocks in (2 * bf16.num_blocks, 2 * bf16.num_blocks + 1)


def test_rows_and_bad_inputs():
    rows = parallel_kv_rows(models=("Llama-3-8B",), tensor_parallel_sizes=(1, 8), kv_cache_dtypes=(None, "fp8"))
    want = [(1, "bf16"), (8, "bf16"), (1, "fp8"), (8, "fp8")]
    assert [(r["tensor_parallel_size"], r["kv_cache_dtype"]) for r in rows] == want
    assert all(r["num_tokens"] == r["num_blocks"] * 16 and r["fits"] for r in rows)
    for kwargs, match in [
        (dict(model="llama-9"), "unknown model"),
        (dict(model="llama-3-8b", gpu="h900"), "unknown gpu"),
        (dict(model="llama-3-8b", gpu_memory_utilization=1.5), "gpu_memory_utilization"),
        (dict(model="llama-3-8b", block_size=0), "block_size"),
        (dict(model="llama-3-8b", reserve_bytes=-1), "reserve_bytes"),
    ]:
        with pytest.raises(ValueError, match=match):
            plan_kv_per_gpu(**kwargs)
    assert find_model("Llama-3-70B") is find_model("llama-3-70b")
    assert ModelGeometry("x", 2, 2, 8).per_gpu(2).num_kv_heads == 1


def test_lesson_table_and_cited_claims():
    import re

    from paged_edu.lessons.past_one_gpu import (
        MULTI_GPU_CLAIMS,
        kv_per_gpu_rows,
        kv_per_gpu_table_html,
        kv_per_gpu_table_markdown,
        multi_gpu_markdown,
    )

    rows = kv_per_gpu_rows(models=("Llama-3-70B",), tensor_parallel_sizes=(1, 8), kv_cache_dtypes=(None,))
    assert rows[0][-2:] == ("weights do not fit", "-")
    tp8 = plan_kv_per_gpu("llama-3-70b", tensor_parallel_size=8)
    assert rows[1][5] == "40,960" and rows[1][-1] == f"{tp8.num_tokens:,}"
    md = kv_per_gpu_table_markdown(models=("Llama-3-8B",), tensor_parallel_sizes=(16,), kv_cache_dtypes=(None,))
    assert "| 1 | 2 | 16,384 |" in md  # one head per GPU, each head on two GPUs
    assert kv_per_gpu_table_html().count("<tr>") == 1 + 2 * 4 * 2
    source = re.compile(r"^([\w.-]+/[\w.-]+:[\w./-]+( \(.+\))?|https?://\S+)$")
    assert MULTI_GPU_CLAIMS and all(c.text and source.match(c.source) for c in MULTI_GPU_CLAIMS)
    assert multi_gpu_markdown().count("\n- ") == len(MULTI_GPU_CLAIMS) - 1


def test_one_rule_for_vllms_pool_everywhere():
    """The simulator, the parallel plan and the lesson-1 calculator size vLLM's pool by one function."""
    from paged_edu.core.memory import vllm_kv_budget
    from paged_edu.core.parallel_kv import plan_kv_per_gpu
    from paged_edu.sim.costmodel import CostModel

    total = GPUS["h200"].memory_bytes
    assert vllm_kv_budget(total, 0.9, 10**9) == 0.9 * total - 10**9  # the rule itself, by hand
    g = find_model("Llama-3-8B")
    weights = int(g.num_params * 2)
    assert plan_kv_per_gpu("Llama-3-8B", "h200").kv_budget_bytes_per_gpu == int(vllm_kv_budget(total, 0.9, weights))
    cm = CostModel()
    assert cm.kv_budget_bytes(0.8, weight_bytes=weights) == vllm_kv_budget(cm.gpu.memory_bytes, 0.8, weights)

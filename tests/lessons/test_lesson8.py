"""Lesson 8: vllm serve flags read and translated, the flags explorer, hash chain vs radix tree, exercises 8.1-8.3.

Oracles: the block counts are worked out here by hand from the model and GPU tables (the
arithmetic, not the library's functions); the chat hit rate from the workload's lengths; the
simulated runs against their own settings (the pool, ``max_num_seqs``).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from paged_edu.core.hardware import GPUS, find_model
from paged_edu.labs import cache_compare as cc
from paged_edu.lessons import exercises as ex
from paged_edu.labs import serving_flags as sf
from paged_edu.lessons.exercises import lesson8 as ex8
from paged_edu.sim.costmodel import CostModel

LLAMA = "vllm serve meta-llama/Meta-Llama-3-8B-Instruct"


def _blocks_by_hand(model: str, gpu: str, util: float, block_size: int, value_bytes: int) -> int:
    g, total = find_model(model), GPUS[gpu].memory_bytes
    per_token = 2 * g.num_layers * g.num_kv_heads * g.head_dim * value_bytes
    return int((util * total - g.num_params * g.dtype_bytes) // (block_size * per_token))


# -- parsing ---------------------------------------------------------------------------------------


def test_defaults_are_vllms():
    f = sf.parse_vllm_serve(LLAMA)
    assert (
        f.model,
        f.gpu_memory_utilization,
        f.block_size,
        f.enable_prefix_caching,
        f.swap_space,
        f.kv_cache_dtype,
    ) == ("meta-llama/Meta-Llama-3-8B-Instruct", 0.9, 16, True, 4.0, "auto")
    assert f.max_num_seqs is f.max_num_batched_tokens is f.max_model_len is None
    # Hardware-dependent defaults of `vllm serve`: >= 70 GiB and not an A100 -> 1024 / 8192, else 256 / 2048.
    big = sf.translate(f, gpu="h200").flags
    small = sf.translate(f, gpu="a100-80gb").flags
    assert (big.max_num_seqs, big.max_num_batched_tokens, big.max_model_len) == (1024, 8192, 8192)
    assert (small.max_num_seqs, small.max_num_batched_tokens) == (256, 2048)
    # max_num_seqs = min(default, max_num_batched_tokens)
    assert sf.translate(LLAMA + " --max-num-batched-tokens 512", gpu="h200").flags.max_num_seqs == 512


def test_every_flag_in_both_spellings_and_human_readable_ints():
    f = sf.parse_vllm_serve(
        "vllm serve 'facebook/opt-13b' --gpu-memory-utilization=0.8 --block-size 32 --max-num-seqs 64 \\\n"
        " --max-num-batched-tokens 4K --no-enable-prefix-caching --swap-space 0 --max-model-len 1k "
        "--kv-cache-dtype fp8_e5m2"
    )
    assert (
        f.model,
        f.gpu_memory_utilization,
        f.block_size,
        f.max_num_seqs,
        f.max_num_batched_tokens,
        f.enable_prefix_caching,
        f.swap_space,
        f.max_model_len,
        f.kv_cache_dtype,
    ) == ("facebook/opt-13b", 0.8, 32, 64, 4096, False, 0.0, 1000, "fp8_e5m2")
    assert sf.parse_vllm_serve("vllm serve x --no-enable-prefix-caching --enable-prefix-caching").enable_prefix_caching
    assert sf.parse_vllm_serve("vllm serve x --max-model-len 2M").max_model_len == 2 * 2**20
    assert sf.parse_vllm_serve("vllm serve x --max-model-len 1.5k").max_model_len == 1500


@pytest.mark.parametrize(
    "tail, words",
    [
        ("--gpu-memory-utilization 1.5", ["--gpu-memory-utilization", "(0, 1]"]),
        ("--gpu-memory-utilization 0", ["--gpu-memory-utilization", "(0, 1]"]),
        ("--gpu-memory-utilization lots", ["--gpu-memory-utilization", "not a number"]),
        ("--gpu-memory-utilization nan", ["--gpu-memory-utilization", "finite"]),
        ("--block-size 12", ["--block-size", "invalid choice '12'", "1, 8, 16, 32, 64, 128, 256"]),
        ("--block-size sixteen", ["--block-size", "invalid choice"]),
        ("--max-num-seqs 0", ["--max-num-seqs", ">= 1"]),
        ("--max-num-seqs 2.5", ["--max-num-seqs", "not an integer"]),
        ("--max-num-batched-tokens 1.5K", ["--max-num-batched-tokens", "decimals only with k/m/g"]),
        ("--enable-prefix-caching=true", ["--enable-prefix-caching", "takes no value"]),
        ("--swap-space -1", ["--swap-space", "negative"]),
        ("--max-model-len", ["--max-model-len", "expects a value"]),
        ("--max-model-len --block-size 16", ["--max-model-len", "expects a value"]),
        ("--kv-cache-dtype float16", ["--kv-cache-dtype", "invalid choice 'float16'", "fp8_e4m3"]),
        ("--kv-cache-dtype fp8_ds_mla", ["--kv-cache-dtype", "does not model"]),
        ("--max-num-seq 8", ["unrecognized flag --max-num-seq", "did you mean --max-num-seqs?"]),
        ("--max_model_len 8", ["unrecognized flag --max_model_len", "did you mean --max-model-len?"]),
        ("--tensor-parallel-size 2", ["unrecognized flag --tensor-parallel-size"]),
        ("extra", ["unexpected argument 'extra'"]),
    ],
)
def test_a_bad_flag_is_refused_by_name(tail, words):
    with pytest.raises(ValueError) as err:
        sf.parse_vllm_serve(f"vllm serve some/model {tail}")
    assert all(w in str(err.value) for w in words), str(err.value)


@pytest.mark.parametrize(
    "command, words",
    [
        ("python -m vllm serve x", ["must start with 'vllm serve MODEL'"]),
        ("vllm serve", ["needs the model first"]),
        ("vllm serve --block-size 16", ["needs the model first"]),
        ("vllm serve 'x", ["does not split"]),
    ],
)
def test_a_malformed_command_line_is_refused(command, words):
    with pytest.raises(ValueError) as err:
        sf.parse_vllm_serve(command)
    assert all(w in str(err.value) for w in words), str(err.value)
    with pytest.raises(TypeError):
        sf.parse_vllm_serve(None)


# -- translation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, gpu, util, block, dtype, value_bytes",
    [
        ("Llama-3-8B", "h200", 0.9, 16, "auto", 2),
        ("Llama-3-8B", "h200", 0.9, 16, "fp8", 1),
        ("OPT-13B", "a100-80gb", 0.85, 32, "fp8", 1),
        ("Llama-2-7B", "h100", 0.7, 8, "bfloat16", 2),
        ("SmolLM2-135M", "t4", 0.5, 256, "auto", 2),
    ],
)
def test_blocks_tokens_and_concurrency_against_the_arithmetic(model, gpu, util, block, dtype, value_bytes):
    key = find_model(model).key
    t = sf.translate(
        f"vllm serve org/{key} --gpu-memory-utilization {util} --block-size {block} --kv-cache-dtype {dtype}", gpu=gpu
    )
    assert t.model == model and t.num_blocks == _blocks_by_hand(model, gpu, util, block, value_bytes)
    assert t.kv_tokens == t.num_blocks * block
    length = find_model(model).max_position_embeddings
    assert t.max_concurrency == pytest.approx(t.num_blocks / math.ceil(length / block))
    assert t.num_cpu_blocks == int(4 * 2**30 // t.block_bytes)
    assert f"{t.num_blocks:,} blocks" in t.describe()


def test_fp8_doubles_the_blocks_and_the_dropdown_overrides_the_command():
    auto = sf.translate(LLAMA, gpu="h200")
    fp8 = sf.translate(LLAMA + " --kv-cache-dtype fp8", gpu="h200")
    assert fp8.bytes_per_token * 2 == auto.bytes_per_token and abs(fp8.num_blocks - 2 * auto.num_blocks) <= 1
    other = sf.translate(LLAMA, model="Llama-2-7B", gpu="h200")
    assert other.model == "Llama-2-7B" and other.num_blocks < auto.num_blocks  # no GQA: 4x the bytes per token


def test_impossible_settings_are_refused_naming_the_flag():
    with pytest.raises(ValueError, match=r"--max-model-len: User-specified max_model_len \(4096\) is greater"):
        sf.translate("vllm serve facebook/opt-13b --max-model-len 4096")
    # OPT-13B on an A100-40GB: at 0.62 the pool holds fewer blocks than one 2,048-token request needs.
    assert _blocks_by_hand("OPT-13B", "a100-40gb", 0.62, 16, 2) < 2048 // 16
    with pytest.raises(ValueError, match="--max-model-len / --gpu-memory-utilization: to serve at least one request"):
        sf.translate("vllm serve facebook/opt-13b --gpu-memory-utilization 0.62", gpu="a100-40gb")
    with pytest.raises(ValueError, match="--gpu-memory-utilization=0.9: .*weights .* do not fit"):
        sf.translate("vllm serve meta-llama/Llama-2-70b-hf", gpu="h200")
    with pytest.raises(ValueError, match="--max-num-batched-tokens: max_num_batched_tokens \\(256\\) must be"):
        sf.translate(LLAMA + " --max-num-seqs 512 --max-num-batched-tokens 256")
    with pytest.raises(ValueError, match="not in paged_edu's model table"):
        sf.translate("vllm serve mistralai/Mistral-7B")
    with pytest.raises(ValueError, match="gpu='b200'"):
        sf.translate(LLAMA, gpu="b200")


def test_the_simulated_run_uses_the_translated_settings():
    t = sf.translate("vllm serve facebook/opt-13b --max-num-seqs 4 --gpu-memory-utilization 0.7", gpu="a100-80gb")
    res = sf.simulate_flags(t, "fewshot", 40)
    assert res.config.manager == "paged-prefix" and res.num_kv_slots == t.kv_tokens
    assert res.max_concurrent <= 4 and res.config.max_num_batched_tokens == 2048
    off = sf.simulate_flags(
        sf.translate("vllm serve facebook/opt-13b --no-enable-prefix-caching", gpu="a100-80gb"), "fewshot", 40
    )
    assert off.config.manager == "paged" and off.prefix_hit_rate == 0 < res.prefix_hit_rate
    fp8 = sf.translate("vllm serve facebook/opt-13b --kv-cache-dtype fp8", gpu="a100-80gb")
    assert sf.simulate_flags(fp8, "fewshot", 40).assumptions["kv_bytes_per_token"] == fp8.bytes_per_token
    with pytest.raises(ValueError, match="--max-model-len=300: the multiturn workload has requests"):
        sf.simulate_flags(sf.translate("vllm serve facebook/opt-13b --max-model-len 300"), "multiturn", 40)


def test_the_cost_models_default_pool_is_unchanged():
    cost = CostModel()
    expected = int((cost.gpu.memory_bytes * 0.9 - cost.model.matmul_weight_bytes) // cost.model.kv_bytes_per_token)
    assert cost.kv_capacity_tokens() == expected and cost.model.kv_cache_dtype is None


# -- the explorer ----------------------------------------------------------------------------------


def test_explorer_callbacks_redraw_and_a_bad_flag_shows_the_error():
    from paged_edu.viz.flags_explorer import FlagsExplorer

    e = FlagsExplorer(num_requests=40)
    assert e.error is None and e.translation.model == "Llama-3-8B"
    assert e.memory.data[1].x[0] == pytest.approx(e.translation.num_blocks * e.translation.block_bytes / 2**30)
    first = (e.memory.data[1].x, e.ttft.data[0].y)
    e.command.value = LLAMA + " --block-size 12"
    assert "invalid choice '12'" in e.error and "refused" in e.status.value and e.translation.model == "Llama-3-8B"
    assert (e.memory.data[1].x, e.ttft.data[0].y) == first  # the plots keep the last good run
    e.command.value = "vllm serve facebook/opt-13b --kv-cache-dtype fp8"
    assert e.error is None and e.translation.kv_dtype == "fp8" and e.memory.data[1].x != first[0]
    e.model.value = "Llama-2-7B"
    assert e.translation.model == "Llama-2-7B"
    e.gpu.value = "a100-40gb"
    assert e.translation.gpu == "a100-40gb" and e.result.num_kv_slots == e.translation.kv_tokens
    e.workload.value = "agents"
    assert e.result.prefix_hit_rate > 0.5 and "agents" in e.ttft.layout.title.text
    e.num_requests.value = 60
    assert len(e.result.requests) == 60 and len(e.ttft.data[0].y) == 60
    e.model.value = "DeepSeek-V3 (MLA)"
    assert "do not fit" in e.error
    assert e.widget() is not None


# -- hash chain vs radix tree ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def roomy():
    return cc.compare_caches(60, scenarios=("roomy",))


def test_roomy_claims_hold(roomy):
    results = cc.checks(roomy)
    assert len(results) == 3 * (2 + 2 + 3) and all(ok for _, ok, _ in results), [r for r in results if not r[1]]


def test_the_checks_can_fail(roomy):
    bent = [
        r
        if (r.manager, r.block_size, r.policy) != ("paged-radix", 16, "lpm")
        else replace(r, hit_rate=r.hit_rate + 0.01)
        for r in roomy
    ]
    failed = [name for name, ok, _ in cc.checks(bent) if not ok]
    assert any("hit alike" in n for n in failed) and any("LPM == FCFS" in n for n in failed)
    assert any("B=1 hits at least" in n for n in failed)
    tight = [
        cc.CacheRow("w", "tight", m, 16, "fcfs", h, 0, 0, 0, 0, 0, 0)
        for m, h in (("paged-prefix", 0.5), ("paged-radix", 0.6))
    ]
    assert cc.checks(tight) == [
        ("tight: neither B=16 cache hits more everywhere", False, "radix - hash from +0.100 to +0.100 (widest: w/fcfs)")
    ]


def test_token_granularity_hits_the_partial_block_and_matches_the_arithmetic():
    rows = {r.cache: r for r in cc.granularity(120)}
    assert rows["radix B=1"].hit_rate > rows["radix B=16"].hit_rate == rows["hash B=16"].hit_rate
    assert rows["radix B=1"].kv_slots_in_use < rows["radix B=16"].kv_slots_in_use  # no half-empty last block
    # 120 requests = 30 conversations of 4 turns: the same per-conversation ratio as exercise 8.2's formula.
    assert {k: r.hit_rate for k, r in rows.items()} == pytest.approx(ex8.chat_hit_rates(), abs=1e-12)


def test_lookup_cost_and_figure(roomy):
    cost = cc.lookup_cost(num_prompts=4, prompt_len=128, shared_len=64, repeats=2)
    assert set(cost) == {"hash B=16", "radix B=16", "hash B=1", "radix B=1"} and all(v > 0 for v in cost.values())
    from paged_edu.viz.cache_figures import cache_compare_figure

    fig = cache_compare_figure(roomy)
    assert len(fig.data) == 2 * 6 and {t.name for t in fig.data} >= {"hash B=16 fcfs", "radix B=1 lpm"}
    assert "| multiturn | roomy | hash B=16 | fcfs |" in cc.markdown_table(roomy)
    with pytest.raises(ValueError, match="scenario must be one of"):
        cc.run_cell("multiturn", "crowded", "paged-radix", 16, "fcfs")


# -- exercises -------------------------------------------------------------------------------------


def test_exercise_8_1_right_and_wrong():
    right = _blocks_by_hand("OPT-13B", "a100-80gb", 0.85, 32, 1)
    assert ex.reference("8.1")() == right and ex.check("8.1", right) and ex.check("8.1", ex.reference("8.1"))
    total, weights, m = GPUS["a100-80gb"].memory_bytes, 12.9e9 * 2, 2 * 40 * 40 * 128
    for wrong, words in (
        (_blocks_by_hand("OPT-13B", "a100-80gb", 0.85, 32, 2), "fp16 cache"),
        (_blocks_by_hand("OPT-13B", "a100-80gb", 0.85, 16, 1), "blocks of 16"),
        (int(0.85 * (total - weights) // (32 * m)), "TOTAL"),
        (int((0.85 * 80e9 - weights) // (32 * m)), "decimal"),
        (int((0.85 * total - weights) // m), "tokens, not blocks"),
        (int(0.85 * total // (32 * m)), "weights were not subtracted"),
    ):
        v = ex.check("8.1", wrong)
        assert not v and words in str(v), str(v)


def test_exercise_8_2_right_and_wrong():
    # Turn t's prompt carries every earlier message and reply; the earlier turns stored prompt + reply - 1 tokens
    # (the reply's last sampled token is never fed back): 95, 191, 287 of 736 queried.
    assert ex.check("8.2", ex.reference("8.2"))
    assert ex.check("8.2", {"hash B=16": 0.717, "radix B=16": 0.717, "radix B=1": 0.779})  # 528/736, 573/736
    v = ex.check("8.2", {"hash B=16": 0.522, "radix B=16": 0.522, "radix B=1": 0.554})  # replies never cached
    assert not v and "never cached" in str(v)
    v = ex.check("8.2", {"hash B=16": 0.779, "radix B=16": 0.779, "radix B=1": 0.779})
    assert not v and "only whole blocks" in str(v)
    v = ex.check("8.2", {"hash B=16": 0.717, "radix B=16": 0.717, "radix B=1": 0.783})  # (96+192+288)/736
    assert not v and "whole reply counted as cached" in str(v)
    v = ex.check("8.2", {"hash B=16": 0.75, "radix B=16": 0.717, "radix B=1": 0.779})
    assert not v and "share of requests" in str(v)
    v = ex.check("8.2", {"hash B=16": 0.783, "radix B=16": 0.717, "radix B=1": 0.779})  # ceil: (96+192+288)/736
    assert not v and "rounded up" in str(v)
    assert not ex.check("8.2", {"hash B=16": 0.5})


def test_exercise_8_3_right_and_wrong():
    assert ex.check("8.3", ex.reference("8.3"))
    roomy = {"workload": "fewshot", "num_kv_slots": None, "rate": 20.0}
    v = ex.check("8.3", {"lpm_wins": roomy, "lpm_does_not_win": roomy})
    assert not v and "identical runs: no queue forms" in str(v) and "[x] lpm_does_not_win" in str(v)
    # No shared prompts, but a tight pool: a preempted request's own blocks stay cached and LPM re-admits it first.
    sharegpt = {"workload": "sharegpt", "num_kv_slots": 6144, "rate": math.inf}
    v = ex.check("8.3", {"lpm_wins": sharegpt, "lpm_does_not_win": roomy})
    assert v and "[x] lpm_wins" in str(v)
    tight_agents = {"workload": "agents", "num_kv_slots": 6144, "rate": math.inf}
    v = ex.check("8.3", {"lpm_wins": tight_agents, "lpm_does_not_win": tight_agents})
    assert not v and "[x] lpm_wins" in str(v) and "LPM wins here" in str(v)
    v = ex.check("8.3", {"lpm_wins": {"workload": "fewshot", "num_kv_slots": -5, "rate": 1}, "lpm_does_not_win": roomy})
    assert not v and "num_kv_slots must be None" in str(v)
    v = ex.check("8.3", {"lpm_wins": {"workload": "nope", "num_kv_slots": None, "rate": 1}, "lpm_does_not_win": roomy})
    assert not v and "unknown workload" in str(v)


@pytest.mark.parametrize("name", ["8.1", "8.2", "8.3"])
# ids without addresses (" at 0x..."): every pytest-xdist worker must collect the same names
@pytest.mark.parametrize(
    "answer",
    [None, float("nan"), "abc", [1, 2], {"x": 1}, True, -1, lambda: 1 / 0],
    ids=lambda a: re.sub(" at 0x[0-9a-f]+", "", repr(a)),
)
def test_no_answer_crashes_a_check(name, answer):
    verdict = ex.check(name, answer)
    assert not verdict and str(verdict).startswith("[ ]")
    assert f"Exercise {name}" in ex.solution(name)


def test_a_measured_total_and_the_pool_really_allocated():
    g = find_model("SmolLM2-135M")
    total = int((g.num_params * 2 + 50e6) / 0.9)  # leaves 50 MB at 0.9
    t = sf.translate("vllm serve HuggingFaceTB/SmolLM2-135M --max-model-len 256", gpu="t4", total_bytes=total)
    per_block = 16 * 2 * 30 * 3 * 64 * 2
    assert t.total_bytes == total and t.num_blocks == int((0.9 * total - g.num_params * 2) // per_block)
    cache = sf.allocate_pool(t, "cpu")
    assert cache.num_blocks == t.num_blocks and cache.nbytes == t.num_blocks * t.block_bytes
    fp8 = sf.translate(
        "vllm serve HuggingFaceTB/SmolLM2-135M --max-model-len 256 --kv-cache-dtype fp8", gpu="t4", total_bytes=total
    )
    with pytest.raises(ValueError, match="--kv-cache-dtype: allocate_pool builds"):
        sf.allocate_pool(fp8, "cpu")

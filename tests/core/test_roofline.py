"""The honest yardstick (issue 22): ``CostModel.roofline()`` -- full efficiency, no overhead, the tied LM
head's weight read counted -- on each step's exact chunks, which the engine's ``StepMetrics`` now carry.
Oracles: the byte and FLOP formulas by hand, and the issue's own figures recomputed from the H200
run's schedule (replayed here through the real scheduler by the simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from paged_edu.core.hardware import GPUS, MODELS
from paged_edu.sim.costmodel import ROOFLINE_NAME, CostModel, StepShape

SMOL = MODELS["smollm2-135m"]
H200 = GPUS["h200"]
M_KV = 2 * 30 * 3 * 64 * 2  # SmolLM2-135M: layers x KV heads x head_dim x (K, V) x bf16 = 23,040 bytes per token
LM_HEAD = 49152 * 576 * 2  # the tied head: vocab x d_model x bf16 = 56.6 MB


def test_tied_lm_head_bytes_are_counted_once_untied_ones_are_already_in_p():
    assert SMOL.tie_word_embeddings and SMOL.lm_head_bytes == LM_HEAD == 56_623_104
    llama = MODELS["llama-3-8b"]  # untied: P (7.50e9 = 8.03e9 - the input embedding) holds the head
    assert not llama.tie_word_embeddings and llama.lm_head_bytes == 0


def test_decode_step_roofline_256_by_512_matches_the_hand_formula():
    # 256 sequences, 511 cached tokens each, one new token each: every weight once, the head once,
    # K/V of 512 tokens per sequence; memory-bound at the copy ceiling (4.24 TB/s), efficiency 1.
    weights = 0.1065e9 * 2
    kv = 256 * 512 * M_KV
    flops = 2 * 0.1065e9 * 256 + 2 * 576 * 49152 * 256 + 4 * 30 * 9 * 64 * 256 * 512
    expected = max((weights + LM_HEAD + kv) / 4.24e12, flops / 989e12)
    assert expected == (weights + LM_HEAD + kv) / 4.24e12  # bandwidth-bound
    roof = CostModel(model=SMOL).roofline()
    assert roof.decode_step_time(256, 511) == pytest.approx(expected, rel=1e-12)
    # 762 us without the head (the README's bench_layer figure), 13.4 us more with it
    assert roof.decode_step_time(256, 511) * 1e6 == pytest.approx(775.8, abs=0.1)
    # batch 1, 512 tokens: the weights dominate
    assert roof.decode_step_time(1, 511) == pytest.approx((weights + LM_HEAD + 512 * M_KV) / 4.24e12, rel=1e-12)


def test_the_head_is_read_only_by_a_step_that_samples():
    roof = CostModel(model=SMOL).roofline()
    chunk = StepShape.of_chunks([0], [64], num_emitting=0)  # a prefill chunk that does not reach the prompt's end
    sampling = StepShape.of_chunks([0], [64], num_emitting=1)
    assert roof.bytes_moved(sampling) - roof.bytes_moved(chunk) == LM_HEAD


def test_roofline_is_a_copy_at_full_efficiency_and_the_default_model_is_unchanged():
    base = CostModel(model=SMOL)
    roof = base.roofline()
    assert (
        roof.compute_efficiency,
        roof.memory_efficiency,
        roof.step_overhead_s,
        roof.per_seq_overhead_s,
        roof.per_block_s,
        roof.lm_head_read,
    ) == (1.0, 1.0, 0.0, 0.0, 0.0, True)
    assert (base.compute_efficiency, base.memory_efficiency, base.step_overhead_s, base.lm_head_read) == (
        0.6,
        0.85,
        1e-3,
        False,
    )
    # the default model's formula as it was: no head bytes, 85 % of the bandwidth, 1 ms per step
    old = (0.1065e9 * 2 + 64 * 513 * M_KV) / (4.24e12 * 0.85) + 1e-3
    assert base.decode_step_time(64, 512) == pytest.approx(old, rel=1e-12)
    assert "LM head included" in ROOFLINE_NAME and "per-chunk" in ROOFLINE_NAME


def test_the_h200_runs_schedule_gives_the_issues_recomputed_roofline():
    """paged_edu/data/engine_bench.json's run (512 ShareGPT-like requests, seed 0, 8,192 blocks of 16, 512
    running, 4,096 batch tokens) replayed through the real scheduler: 1,978 steps, 1,957 decode and
    20 mixed; the issue recomputed 0.259 ms per decode step, 0.944 ms per mixed step, 0.526 s in all."""
    import paged_edu.sim.simulator as S
    from paged_edu.sim.request import Request
    from paged_edu.sim.results import SimConfig
    from paged_edu.sim.workloads import sharegpt

    rng = np.random.default_rng(1)  # labs.batching.sharegpt_requests: random prompt ids from seed + 1
    trace = []
    for r in sharegpt(512, seed=0):
        p = max(1, int(round(r.prompt_len)))
        trace.append(Request(0.0, p, max(1, int(round(r.output_len))), prompt=rng.integers(3, 49152, size=p).tolist()))
    shapes, kinds = [], []
    shape_of = S.step_shape

    def record(out, *args, **kwargs):
        chunks = out.scheduled
        prefill = [c.start < c.seq.num_prompt_tokens or c.num_new_tokens > 1 for c in chunks]
        shapes.append(
            StepShape.of_chunks(
                [c.start for c in chunks], [c.num_new_tokens for c in chunks], sum(c.emits_token for c in chunks)
            )
        )
        kinds.append("decode" if not any(prefill) else "mixed" if not all(prefill) else "prefill")
        return shape_of(out, *args, **kwargs)

    config = SimConfig(
        manager="paged-prefix", block_size=16, num_kv_slots=8192 * 16, max_num_seqs=512, max_num_batched_tokens=4096
    )
    mp = pytest.MonkeyPatch()
    mp.setattr(S, "step_shape", record)
    try:
        S.simulate(trace, config, CostModel(model=SMOL))
    finally:
        mp.undo()
    kinds = np.array(kinds)
    assert len(shapes) == 1978 and (kinds == "decode").sum() == 1957 and (kinds == "mixed").sum() == 20
    t = np.array([CostModel(model=SMOL).roofline().step_time(s) for s in shapes])
    assert t[kinds == "decode"].mean() * 1e3 == pytest.approx(0.259, abs=5e-4)
    assert t[kinds == "mixed"].mean() * 1e3 == pytest.approx(0.944, abs=5e-4)
    assert t.sum() == pytest.approx(0.526, abs=5e-4)
    assert 156_698 / t.sum() / 1e3 == pytest.approx(297.8, abs=0.05)  # k tok/s


def test_step_metrics_carry_each_chunks_shape():
    """One 20-token prompt, a budget of 8 tokens per step, 3 output tokens: chunks 0+8, 8+8, 16+4 (the
    last reaches the prompt's end and samples), then decodes at 20 and 21."""
    from paged_edu.engine import Engine, StepMetrics
    from paged_edu.engine.sampling import SamplingParams
    from paged_edu.models.config import LlamaConfig
    from paged_edu.models.llama import PagedLlama

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        max_position_embeddings=64,
    )
    model = PagedLlama(cfg)
    engine = Engine(
        model,
        num_blocks=16,
        block_size=4,
        max_num_batched_tokens=8,
        enable_prefix_caching=False,
        attn_impl="torch",  # the PyTorch paths: the shapes are the point, not the kernels
        prefill_impl="torch",
        fused_impl="torch",
    )
    steps = []
    engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepMetrics) else None)
    engine.run([list(range(3, 23))], [SamplingParams(max_tokens=3)], use_tqdm=False)
    assert [s.chunk_starts for s in steps] == [[0], [8], [16], [20], [21]]
    assert [s.chunk_counts for s in steps] == [[8], [8], [4], [1], [1]]
    assert [s.num_emitting for s in steps] == [0, 0, 1, 1, 1]
    shape = StepShape.of_chunks(steps[1].chunk_starts, steps[1].chunk_counts, steps[1].num_emitting)
    assert (shape.num_context_tokens, shape.num_new_tokens, shape.attention_pairs) == (8, 8, 8 * 8 + 8 * 9 // 2)


def test_the_geometry_views_the_cost_model_reads_against_hand_arithmetic():
    """Issue 20: one geometry type; the cost model's FLOPs and bytes per token are views of it."""
    from dataclasses import replace

    from paged_edu.core.hardware import ModelGeometry

    llama = MODELS["llama-3-8b"]  # 32 layers, 32 query / 8 KV heads of 128, d_model 4096, vocab 128,256, bf16
    assert llama.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 and llama.block_bytes(16) == 16 * 131_072
    assert llama.weight_bytes == 8.03e9 * 2 and llama.matmul_weight_bytes == 7.50e9 * 2
    assert llama.matmul_flops_per_token == 2 * 7.50e9
    assert llama.lm_head_flops_per_token == 2 * 4096 * 128_256
    assert llama.attention_flops_per_pair == 4 * 32 * 32 * 128
    assert replace(llama, kv_cache_dtype="fp8").kv_bytes_per_token == 131_072 // 2  # the weights stay bf16
    assert replace(llama, kv_cache_dtype="fp8").matmul_weight_bytes == llama.matmul_weight_bytes
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        ModelGeometry("x", 1, 1, 8, kv_cache_dtype="fp64")
    with pytest.raises(ValueError, match="needs the model's size"):
        CostModel(model=ModelGeometry("cache only", 2, 2, 8))  # a geometry without its sizes

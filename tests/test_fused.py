"""The fused per-token kernels against the PyTorch modules they replace (the oracle).

On the CPU they run in Triton's interpreter (``tests/conftest.py``); the ``gpu`` tests run them
compiled. Every kernel keeps the PyTorch path's rounding points, so most outputs are
bit-identical; the norm's mean is summed in another order and ``exp``/``rsqrt`` differ in their
last bits, so those are held to one rounding step of the dtype and a share of identical values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paged_edu.cache.kv_cache import store_kv
from paged_edu.kernels import kernel_support, triton_available
from paged_edu.models.config import LlamaConfig, smollm2_config
from paged_edu.models.llama import Kernels, RMSNorm, Rotary, SwiGLU, _rotate_half

if not triton_available():
    pytest.skip("triton is not installed", allow_module_level=True)

from paged_edu.kernels.triton_fused import add_rms_norm_triton, silu_and_mul_triton  # noqa: E402
from paged_edu.kernels.triton_store import rotary_store_kv_triton  # noqa: E402

DEVICE = "cpu" if kernel_support("cpu").fused else "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# The relative size of one ulp (the spacing next to 1.0) per dtype.
ULP = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def close_in_ulps(out: torch.Tensor, ref: torch.Tensor, ulps: float = 2, min_identical: float = 0.98) -> None:
    """Every value within ``ulps`` ulps of the reference (relative), and most of them bit-identical.

    fp32 gets 8 ulps and no share: nothing re-rounds its results to a coarser dtype, so the
    last bits of a sum order or of the GPU's fast ``exp`` (up to 4.4 ulps seen) stay visible."""
    if out.dtype == torch.float32:
        ulps, min_identical = 8, 0.0
    assert out.dtype == ref.dtype and out.shape == ref.shape
    o, r = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(o).all()
    err = (o - r).abs() / r.abs().clamp_min(1e-30)
    worst = err[r != 0].max().item() if bool((r != 0).any()) else 0.0
    assert worst <= ULP[out.dtype] * ulps, f"max relative error {worst:.2e} > {ulps} ulps of {out.dtype}"
    same = (o == r).double().mean().item()
    assert same >= min_identical, f"only {same:.1%} of values bit-identical"


def rand(*shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


# ----------------------------------------------------------------------------------------------
# Residual add + RMSNorm
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [576, 64, 100])
def test_add_rms_norm_matches_the_module(dtype, hidden):
    norm = RMSNorm(hidden, 1e-5).to(DEVICE, dtype)
    norm.weight.data = rand(hidden, dtype=dtype, seed=1)
    h, r = rand(7, hidden, dtype=dtype, seed=2), rand(7, hidden, dtype=dtype, seed=3, scale=4.0)
    y_ref, r_ref = norm(h, r)
    y, r_out = add_rms_norm_triton(h, norm.weight, norm.eps, r)
    assert torch.equal(r_out, r_ref)  # one add, rounded once: exact
    close_in_ulps(y, y_ref)
    y0, r0 = add_rms_norm_triton(h, norm.weight, norm.eps)  # the first layer: no residual yet
    assert r0 is h
    close_in_ulps(y0, norm(h)[0])


def test_add_rms_norm_reads_strided_rows():
    norm = RMSNorm(64, 1e-6).to(DEVICE, torch.bfloat16)
    wide = rand(5, 128, dtype=torch.bfloat16, seed=4)
    h, r = wide[:, :64], wide[:, 64:]  # row stride 128
    y, r_out = add_rms_norm_triton(h, norm.weight, norm.eps, r)
    y_ref, r_ref = norm(h, r)
    assert torch.equal(r_out, r_ref)
    close_in_ulps(y, y_ref)


# ----------------------------------------------------------------------------------------------
# SiLU-and-mul
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [96, 1536, 40])
def test_silu_and_mul_matches_the_module(dtype, inter):
    gate_up = rand(6, 2 * inter, dtype=dtype, seed=5, scale=3.0)
    gate, up = gate_up.split(inter, dim=-1)
    close_in_ulps(silu_and_mul_triton(gate_up), torch.nn.functional.silu(gate) * up)
    with pytest.raises(ValueError, match="even number of columns"):
        silu_and_mul_triton(gate_up[:, :-1])


# ----------------------------------------------------------------------------------------------
# Rotary + K/V store
# ----------------------------------------------------------------------------------------------


def rotary_case(dtype, H, H_kv, D, seed=0):
    T, B, num_blocks = 6, 4, 5
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    rot = Rotary(inv_freq.to(DEVICE), 64)
    qkv = rand(T, (H + 2 * H_kv) * D, dtype=dtype, seed=seed)  # as the fused qkv projection gives it
    q, k, v = qkv.split([H * D, H_kv * D, H_kv * D], dim=-1)
    q, k, v = q.view(T, H, D), k.view(T, H_kv, D), v.view(T, H_kv, D)  # strided views
    positions = torch.tensor([3, 17, 0, 63, 40, 8], device=DEVICE)
    slots = torch.tensor([5, -1, 0, 19, 7, -1], device=DEVICE)  # -1: padding, store nothing
    pool = rand(num_blocks, B, H_kv, D, dtype=dtype, seed=seed + 1, scale=100.0)  # stale garbage
    return rot, q, k, v, positions, slots, pool


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H,H_kv,D", [(9, 3, 64), (4, 2, 16), (6, 1, 32)])
def test_rotary_store_is_the_plain_path_bit_for_bit(dtype, H, H_kv, D):
    rot, q, k, v, positions, slots, pool = rotary_case(dtype, H, H_kv, D)
    k_cache, v_cache = pool.clone(), pool.clone() * -1
    q_out = rotary_store_kv_triton(q, k, v, k_cache, v_cache, slots, positions, rot.cos_table, rot.sin_table)

    cos, sin = rot(positions, dtype)  # the model's plain path
    q_ref = q * cos + _rotate_half(q) * sin
    k_ref = k * cos + _rotate_half(k) * sin
    k_ref_cache, v_ref_cache = pool.clone(), pool.clone() * -1
    store_kv(k_ref, v, k_ref_cache, v_ref_cache, slots, impl="torch")
    assert q_out.is_contiguous() and torch.equal(q_out, q_ref)
    assert torch.equal(k_cache, k_ref_cache)  # rotated keys at their slots, the rest untouched
    assert torch.equal(v_cache, v_ref_cache)
    assert not torch.equal(k_cache, pool)  # something was stored


def test_rotary_store_rejects_mismatched_heads():
    rot, q, k, v, positions, slots, pool = rotary_case(torch.float32, 4, 2, 16)
    with pytest.raises(ValueError, match="same tokens"):
        rotary_store_kv_triton(q[:3], k, v, pool, pool.clone(), slots, positions, rot.cos_table, rot.sin_table)


# ----------------------------------------------------------------------------------------------
# The whole model: fused against plain
# ----------------------------------------------------------------------------------------------


def run_model(model, fused_impl, dtype, sizes=(9, 1, 1)):
    """Prefill a chunk then decode, through a shuffled block table; hidden states of every row."""
    from paged_edu.engine.batch import BatchChunk, prepare_batch

    c = model.config
    kernels = Kernels(decode="torch", prefill="torch", fused=fused_impl)
    caches = [
        (
            rand(8, 4, c.num_kv_heads, c.head_dim, dtype=dtype, seed=10 + i),
            rand(8, 4, c.num_kv_heads, c.head_dim, dtype=dtype, seed=20 + i),
        )
        for i in range(c.num_layers)
    ]
    tokens, pos, hidden = list(range(3, 3 + sum(sizes))), 0, []
    for n in sizes:
        batch = prepare_batch([BatchChunk(tokens[pos : pos + n], pos, [5, 1, 7, 2])], 4, DEVICE)
        hidden.append(model(batch, caches, kernels))
        pos += n
    return torch.cat(hidden), caches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_model_matches_plain_model(dtype):
    from paged_edu.models.loaders import random_llama

    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=64,
    )
    model = random_llama(cfg, seed=2, dtype=dtype, device=DEVICE)
    plain, plain_caches = run_model(model, "torch", dtype)
    fused, fused_caches = run_model(model, "triton", dtype)
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(fused, plain, atol=tol, rtol=tol)
    if dtype == torch.bfloat16:  # the same rounding points: nearly every value bit-identical
        assert (fused == plain).double().mean().item() >= 0.95
    for (kf, vf), (kp, vp) in zip(fused_caches, plain_caches):
        torch.testing.assert_close(kf, kp, atol=tol, rtol=tol)
        torch.testing.assert_close(vf, vp, atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="fused_impl must be"):
        run_model(model, "fast", dtype)


def test_auto_runs_the_fused_kernels_only_where_they_compile():
    support = kernel_support(DEVICE)
    assert support.use_triton("fused") == (support.fused and not support.interpreted)


# ----------------------------------------------------------------------------------------------
# Compiled, on a GPU: SmolLM2's shapes
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_fused_kernels_at_smollm2_shapes():
    cfg = smollm2_config()
    dtype = torch.bfloat16
    norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps).to(DEVICE, dtype)
    norm.weight.data = rand(cfg.hidden_size, dtype=dtype, seed=1)
    h, r = rand(256, cfg.hidden_size, dtype=dtype, seed=2), rand(256, cfg.hidden_size, dtype=dtype, seed=3)
    y, r_out = add_rms_norm_triton(h, norm.weight, norm.eps, r)
    y_ref, r_ref = norm(h, r)
    assert torch.equal(r_out, r_ref)
    close_in_ulps(y, y_ref)
    mlp = SwiGLU(cfg).to(DEVICE, dtype)
    gate_up = rand(256, 2 * cfg.intermediate_size, dtype=dtype, seed=4, scale=3.0)
    gate, up = gate_up.split(cfg.intermediate_size, dim=-1)
    close_in_ulps(silu_and_mul_triton(gate_up), torch.nn.functional.silu(gate) * up)
    assert mlp.intermediate_size == cfg.intermediate_size
    rot, q, k, v, positions, slots, pool = rotary_case(dtype, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    k_cache, v_cache = pool.clone(), pool.clone()
    q_out = rotary_store_kv_triton(q, k, v, k_cache, v_cache, slots, positions, rot.cos_table, rot.sin_table)
    cos, sin = rot(positions, dtype)
    assert torch.equal(q_out, q * cos + _rotate_half(q) * sin)


@pytest.mark.gpu
def test_gpu_fused_model_matches_plain_model_under_graph_capture():
    """The 30-layer SmolLM2 geometry, bf16, through the engine's CUDA graphs: fused == plain."""
    from paged_edu.engine.cuda_graphs import DecodeCudaGraphs
    from paged_edu.models.loaders import random_llama

    model = random_llama(smollm2_config(), seed=0, dtype=torch.bfloat16, device="cuda")
    c = model.config
    out = {}
    for impl in ("torch", "triton"):
        g = torch.Generator(device="cuda").manual_seed(7)  # the same stale pool for both
        caches = [
            tuple(
                torch.randn(64, 16, c.num_kv_heads, c.head_dim, device="cuda", generator=g).to(torch.bfloat16)
                for _ in range(2)
            )
            for _ in range(c.num_layers)
        ]
        graphs = DecodeCudaGraphs(model, caches, max_batch_size=8, max_blocks_per_seq=8, kernels=Kernels(fused=impl))
        inputs = graphs.staging.np  # the graphs' static inputs, written on the host, copied in one go
        inputs["input_ids"][:8] = np.arange(100, 108)
        inputs["positions"][:8] = 5  # the 6th token of each sequence, whose first 5 are in the pool
        inputs["block_tables"][:8, 0] = np.arange(8) * 3
        inputs["slot_mapping"][:8] = np.arange(8) * 3 * 16 + 5
        inputs["seq_lens"][:8] = 6
        graphs.staging.upload(8)
        graphs.graphs[8].replay()
        out[impl] = graphs.outputs[8][0].float().clone()  # (hidden, greedy): the hidden states
    err = (out["triton"] - out["torch"]).norm() / out["torch"].norm()
    assert err < 2e-2, f"relative error {err:.2e}"

"""The fused per-token kernels against the PyTorch modules they replace (the oracle).

On the CPU they run in Triton's interpreter (``tests/conftest.py``); the ``gpu`` tests run them
compiled. Every kernel keeps the PyTorch path's rounding points, so most outputs are
bit-identical; the norm's mean is summed in another order and ``exp``/``rsqrt`` differ in their
last bits, so those are held to one rounding step of the dtype and a share of identical values.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from model_helpers import TINY_LLAMA, stale_gpu_pools

from paged_edu.cache.kv_cache import store_kv
from paged_edu.kernels import kernel_support, triton_available
from paged_edu.models.config import smollm2_config
from paged_edu.models.llama import Kernels, RMSNorm, Rotary, SwiGLU, _rotate_half

if not triton_available():
    pytest.skip("triton is not installed", allow_module_level=True)

from paged_edu.kernels.triton_fused import INTERPRETING, add_rms_norm_triton, silu_and_mul_triton  # noqa: E402
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
# Rotary + store inside the decode kernel (a pure-decode step)
# ----------------------------------------------------------------------------------------------

DB = 16  # tokens per block in the decode cases
# Each sequence's length s (its new token at position s - 1): a padding row (s = 1, slot -1, table
# row at block 0, as a captured graph pads), a token that starts a new block (17), one that ends a
# block (16), a token alone in a new tile of 64 (65) and one deep in a third tile (150).
DECODE_LENS = [1, 17, 16, 65, 150]


def fused_decode_case(dtype, H, H_kv, D, seed=0):
    """Unrotated q, k, v (views of one qkv row), a pool of stale garbage, shuffled block tables, and
    the new tokens' slots (through the tables) and positions."""
    g = torch.Generator().manual_seed(seed)
    N, max_blocks = len(DECODE_LENS), -(-max(DECODE_LENS) // DB) + 1
    need = [-(-s // DB) for s in DECODE_LENS]
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks - 1, generator=g) + 1  # block 0 stays for the padding row
    tables = torch.zeros(N, max_blocks, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        if i == 0:
            continue  # padding: table row 0 ... (block 0), as the graphs' spare rows have it
        tables[i, :n] = perm[used : used + n].to(torch.int32)
        used += n
    lens = torch.tensor(DECODE_LENS, dtype=torch.int32)
    positions = (lens - 1).long()
    slots = (tables[torch.arange(N), positions // DB].long() * DB + positions % DB).clone()
    slots[0] = -1  # padding row: store nothing
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    rot = Rotary(inv_freq.to(DEVICE), 256)
    qkv = rand(N, (H + 2 * H_kv) * D, dtype=dtype, seed=seed + 1)
    q, k, v = qkv.split([H * D, H_kv * D, H_kv * D], dim=-1)
    q, k, v = q.view(N, H, D), k.view(N, H_kv, D), v.view(N, H_kv, D)  # strided views
    pool = rand(num_blocks, DB, H_kv, D, dtype=dtype, seed=seed + 2)  # stale: earlier tokens and garbage
    to = lambda t: t.to(DEVICE)  # noqa: E731
    return rot, q, k, v, pool, to(tables), to(lens), to(slots), to(positions)


def assert_same_attention(out: torch.Tensor, out2: torch.Tensor) -> None:
    """The one-launch decode kernel's output against the two-launch path's: bit for bit under the
    interpreter; compiled, the two kernels are different code (the one-launch kernel is built without
    FMA contraction, for its rotation), so a few values may differ in their last bits -- at most one
    ulp of the largest output, and 99 % identical."""
    if INTERPRETING:
        assert torch.equal(out, out2)
        return
    diff = (out.double() - out2.double()).abs().max().item()
    # fp32 is never re-rounded to a coarser type, so contraction's last bits stay visible everywhere:
    # 8 ulps of the largest output and no share of identical values (as close_in_ulps treats fp32).
    ulps, share = (8, 0.0) if out.dtype == torch.float32 else (1, 0.99)
    assert diff <= ULP[out.dtype] * ulps * out2.double().abs().max().item(), f"max difference {diff:.2e}"
    assert (out == out2).double().mean().item() >= share


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,H_kv,D", [(9, 3, 64), (4, 4, 16), (4, 1, 24)])  # GQA 3 (SmolLM2), MHA, MQA + odd D
@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("preload", [False, True], ids=["", "preload"])
def test_fused_decode_is_rotary_store_then_decode(dtype, H, H_kv, D, num_splits, preload):
    """One launch against two (rotary_store_kv_triton, then the decode kernel): the same output and
    the same pool, bit for bit, split or not, with the first tile loaded before the stores or not
    (``PRELOAD``: the new token's row patched in registers); and both against plain PyTorch (rotary by
    hand, the scatter store, the vectorised oracle)."""
    from paged_edu.kernels import paged_attention_torch
    from paged_edu.kernels.triton_decode import paged_attention_triton, rotary_store_decode_triton

    rot, q, k, v, pool, tables, lens, slots, positions = fused_decode_case(dtype, H, H_kv, D)
    tabs = (rot.cos_table, rot.sin_table)
    scale = D**-0.5
    kc, vc = pool.clone(), -pool
    out = rotary_store_decode_triton(
        q,
        k,
        v,
        kc,
        vc,
        tables,
        lens,
        slots,
        positions,
        *tabs,
        scale=scale,
        num_splits=num_splits,
        config=dict(PRELOAD=preload),
    )

    kc2, vc2 = pool.clone(), -pool  # the unfused Triton path
    q_rot = rotary_store_kv_triton(q, k, v, kc2, vc2, slots, positions, *tabs)
    out2 = paged_attention_triton(q_rot, kc2, vc2, tables, lens, scale=scale, num_splits=num_splits)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    assert_same_attention(out, out2)

    cos, sin = rot(positions, dtype)  # plain PyTorch
    q_ref = q * cos + _rotate_half(q) * sin
    k_ref = k * cos + _rotate_half(k) * sin
    kc3, vc3 = pool.clone(), -pool
    store_kv(k_ref, v, kc3, vc3, slots, impl="torch")
    assert torch.equal(kc, kc3) and torch.equal(vc, vc3)  # the rotation's rounding is PyTorch's
    changed = (kc != pool).any(-1).any(-1)  # (num_blocks, B): the rows the kernel wrote
    assert int(changed.sum()) == len(DECODE_LENS) - 1  # every real token, not the padding row
    ref = paged_attention_torch(q_ref.float(), kc3.float(), vc3.float(), tables, lens, scale=scale)
    err = ((out[1:].double() - ref[1:].double()).norm() / ref[1:].double().norm()).item()
    # Compiled, fp32 meets the GPU's fast exp2 (test_kernels' fp32 tolerance); interpreted, numpy's.
    fp32_bound = 2e-6 if INTERPRETING else 2e-5
    assert err < {torch.float32: fp32_bound, torch.bfloat16: 1e-2}[dtype], f"relative error {err:.1e}"


def run_splits_in_reverse(monkeypatch) -> None:
    """Make the interpreter run each (sequence, head)'s programs from the last split to the first.

    It runs a grid in order, the split axis innermost, so a store by the wrong split would still
    land before a later split reads; a GPU runs them in any order. Both orders must give the answer."""
    from triton.runtime import interpreter

    builder = type(interpreter.interpreter_builder)
    if not hasattr(builder, "set_grid_idx"):
        pytest.skip("this Triton's interpreter has no set_grid_idx to reorder")
    forward = builder.set_grid_idx
    monkeypatch.setattr(builder, "set_grid_idx", lambda self, x, y, z: forward(self, x, y, self.grid_dim[2] - 1 - z))


@pytest.mark.parametrize("preload", [False, True], ids=["", "preload"])
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_fused_decode_reads_the_token_it_stores(order, preload, monkeypatch):
    """The new token's own K/V enter its attention: a pool that holds NaN at every new token's slot
    gives a finite output only if the program that reads the token's tile stored it first (split
    or not, whichever split runs first) -- or, with ``PRELOAD``, replaced the stale row it loaded
    before the store by the values it stored."""
    from paged_edu.kernels.triton_decode import rotary_store_decode_triton

    if order == "reverse":
        if not INTERPRETING:
            pytest.skip("program order is the interpreter's to set")
        run_splits_in_reverse(monkeypatch)
    rot, q, k, v, pool, tables, lens, slots, positions = fused_decode_case(torch.float32, 9, 3, 64, seed=3)
    real = slots >= 0
    for num_splits in (1, 3):
        kc, vc = pool.clone(), pool.clone()
        kc.view(-1, 3, 64)[slots[real]] = float("nan")  # stale NaN where the new tokens go
        vc.view(-1, 3, 64)[slots[real]] = float("nan")
        out = rotary_store_decode_triton(
            q,
            k,
            v,
            kc,
            vc,
            tables,
            lens,
            slots,
            positions,
            rot.cos_table,
            rot.sin_table,
            scale=0.125,
            num_splits=num_splits,
            config=dict(PRELOAD=preload),
        )
        assert torch.isfinite(out[real]).all()


def test_fused_decode_checks_shapes():
    from paged_edu.kernels.triton_decode import rotary_store_decode_triton

    rot, q, k, v, pool, tables, lens, slots, positions = fused_decode_case(torch.float32, 4, 2, 16)
    args = (pool, pool.clone(), tables, lens, slots, positions, rot.cos_table, rot.sin_table)
    with pytest.raises(ValueError, match="same tokens"):
        rotary_store_decode_triton(q[:3], k, v, *args, scale=0.25)
    with pytest.raises(ValueError, match="one shape"):
        rotary_store_decode_triton(q, k, v[:, :1], *args, scale=0.25)


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

    model = random_llama(TINY_LLAMA, seed=2, dtype=dtype, device=DEVICE)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pure_decode_step_stores_inside_the_decode_kernel(dtype, monkeypatch):
    """A pure-decode batch with the fused ops and the Triton decode kernel takes the one-launch path
    (one call per layer, no separate store), and gives the two-launch path's hidden states and pool
    bit for bit; plain PyTorch agrees to rounding. A step with a prompt chunk keeps the store."""
    from paged_edu.engine.batch import BatchChunk, prepare_batch
    from paged_edu.kernels import triton_decode, triton_store
    from paged_edu.models.loaders import random_llama

    cfg = replace(TINY_LLAMA, hidden_size=96, intermediate_size=64, num_heads=6)  # groups of 3, as SmolLM2's
    model = random_llama(cfg, seed=4, dtype=dtype, device=DEVICE)
    pool = [
        (rand(12, 4, 2, 16, dtype=dtype, seed=30 + i), rand(12, 4, 2, 16, dtype=dtype, seed=40 + i)) for i in range(2)
    ]
    # Three sequences after their prompts (7, 4 and 2 tokens): the second one's token starts block 2.
    decode = [BatchChunk([11], 7, [5, 1]), BatchChunk([12], 4, [2, 7]), BatchChunk([13], 2, [9])]
    calls = {"fused": 0, "store": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(
        triton_decode, "rotary_store_decode_triton", counted("fused", triton_decode.rotary_store_decode_triton)
    )
    monkeypatch.setattr(triton_store, "rotary_store_kv_triton", counted("store", triton_store.rotary_store_kv_triton))

    def step(kernels, chunks, two_launches=False):
        caches = [(k.clone(), v.clone()) for k, v in pool]
        with monkeypatch.context() as m:
            if two_launches:
                m.setattr(Kernels, "fused_decode", property(lambda self: False))
            hidden = model(prepare_batch(chunks, 4, DEVICE), caches, kernels)
        return hidden, caches

    # gemm pinned: "auto" would give the two-launch path (no programmatic launches) cuBLAS's GEMMs, whose
    # fp32 sums need not match the skinny GEMM's bit for bit.
    fused = Kernels(decode="triton", prefill="torch", fused="triton", fuse_decode_store=True, gemm="triton")
    got, got_kv = step(fused, decode)
    assert calls == {"fused": 2, "store": 0}  # one launch per layer
    want, want_kv = step(fused, decode, two_launches=True)
    assert calls == {"fused": 2, "store": 2}
    assert torch.equal(got, want)
    for (kf, vf), (kp, vp) in zip(got_kv, want_kv):
        assert torch.equal(kf, kp) and torch.equal(vf, vp)
    plain, plain_kv = step(Kernels(decode="torch", prefill="torch", fused="torch"), decode)
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(got, plain, atol=tol, rtol=tol)
    for (kf, vf), (kp, vp) in zip(got_kv, plain_kv):
        torch.testing.assert_close(kf, kp, atol=tol, rtol=tol)
        torch.testing.assert_close(vf, vp, atol=tol, rtol=tol)
    step(fused, decode + [BatchChunk([14, 15], 0, [3])])  # a mixed step: the separate store
    assert calls == {"fused": 2, "store": 4}


def test_engine_with_the_fused_decode_gives_transformers_tokens(hf_greedy_case):
    """The engine with the fused ops and the Triton decode kernel (interpreted here), its decode
    steps through the decode graphs' padded staging (8 rows for 7 sequences: a padding row with
    slot -1 every step), gives transformers' greedy tokens."""
    from paged_edu.engine import Engine
    from paged_edu.engine.cuda_graphs import DecodeCudaGraphs
    from paged_edu.models.llama import PagedLlama

    hf, prompts, want = hf_greedy_case
    engine = Engine(
        PagedLlama.from_hf(hf, device=DEVICE),  # compiled on a GPU machine (no interpreter there)
        num_blocks=64,
        block_size=4,
        max_num_seqs=8,
        attn_impl="triton",
        fused_impl="triton",
        fuse_decode_store=True,
    )
    assert engine.runner.kernels.fused_decode
    r = engine.runner
    r.graphs = DecodeCudaGraphs(engine.model, r.kv_pairs, 8, 64, r.kernels, capture_graphs=False)
    replays = []
    replay = r.graphs.replay
    r.graphs.replay = lambda bs: replays.append(bs) or replay(bs)
    assert engine.generate(prompts, max_new_tokens=9) == want
    assert 8 in replays  # the 7 sequences' decode steps, padded to 8 rows


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
        caches = stale_gpu_pools(c)  # the same stale pool for both
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


def test_random_decode_step_is_one_decode_step_through_its_tables():
    """The GPU test's case (labs.timing.random_decode_step), checked where it runs everywhere: each
    sequence's new token at s - 1, its slot the one its own table gives, tables of distinct blocks."""
    from paged_edu.labs.timing import random_decode_step

    q, k, v, pool, tables, lens, pos, slots = random_decode_step(9, 3, 64, num_seqs=8, device="cpu")
    assert q.shape == (8, 9, 64) and k.shape == v.shape == (8, 3, 64) and pool.shape == (320, 16, 3, 64)
    assert torch.equal(pos, (lens - 1).long()) and int(lens.min()) >= 1 and int(lens.max()) < 600
    assert tables.unique().numel() == tables.numel() and int(tables.max()) < pool.shape[0]
    for n in range(8):
        p = int(pos[n])
        assert int(slots[n]) == int(tables[n, p // 16]) * 16 + p % 16
    assert torch.equal(random_decode_step(9, 3, 64, num_seqs=8, device="cpu")[7], slots)  # seeded


@pytest.mark.gpu
def test_gpu_one_launch_rotation_rounds_as_pytorch_at_smollm2_scale():
    """64 sequences of SmolLM2's attention geometry, bf16, up to 600 tokens: the keys the decode
    kernel rotates and stores are PyTorch's ``k * cos + rotate_half(k) * sin`` bit for bit (with FMA
    contraction on, 2,119 of these 12,288 values differed on the H200), and its output is the
    two-launch path's to the last bits."""
    from paged_edu.kernels.triton_decode import paged_attention_triton, rotary_store_decode_triton
    from paged_edu.labs.timing import random_decode_step
    from paged_edu.models.loaders import random_llama

    c = smollm2_config()
    rot = random_llama(replace(c, num_layers=1), seed=0, dtype=torch.bfloat16, device="cuda").rotary
    q, k, v, pool, tables, lens, pos, slots = random_decode_step(c.num_heads, c.num_kv_heads, c.head_dim)
    D = c.head_dim
    tabs, scale = (rot.cos_table, rot.sin_table), D**-0.5
    kc, vc = pool.clone(), -pool
    out = rotary_store_decode_triton(q, k, v, kc, vc, tables, lens, slots, pos, *tabs, scale=scale)

    cos, sin = rot(pos, torch.bfloat16)
    k_ref = k * cos + _rotate_half(k) * sin
    kc_ref, vc_ref = pool.clone(), -pool
    store_kv(k_ref, v, kc_ref, vc_ref, slots, impl="torch")
    assert int((kc != kc_ref).sum()) == 0 and torch.equal(vc, vc_ref)
    kc2, vc2 = pool.clone(), -pool
    q_rot = rotary_store_kv_triton(q, k, v, kc2, vc2, slots, pos, *tabs)
    assert torch.equal(q_rot, q * cos + _rotate_half(q) * sin) and torch.equal(kc2, kc_ref)
    assert_same_attention(out, paged_attention_triton(q_rot, kc2, vc2, tables, lens, scale=scale))


@pytest.mark.gpu
def test_gpu_fused_decode_in_a_captured_graph_and_one_launch_fewer_per_layer(monkeypatch):
    """SmolLM2's geometry, bf16: the decode graph (the one-launch path, a padding row included)
    replays to the eager forward pass of the same batch and stores the same K/V; it agrees with the
    two-launch path; and an eager step launches exactly one kernel fewer per layer than that path."""
    from torch.profiler import ProfilerActivity, profile

    from paged_edu.engine.cuda_graphs import DecodeCudaGraphs
    from paged_edu.models.loaders import random_llama

    model = random_llama(smollm2_config(), seed=0, dtype=torch.bfloat16, device="cuda")
    c = model.config
    pool = stale_gpu_pools(c)
    copy = lambda: [(k.clone(), v.clone()) for k, v in pool]  # noqa: E731
    graph_kv = copy()
    graphs = DecodeCudaGraphs(
        model, graph_kv, max_batch_size=8, max_blocks_per_seq=8, kernels=Kernels(fuse_decode_store=True)
    )
    assert graphs.kernels.fused_decode  # the one-launch path was captured
    inputs = graphs.staging.np
    inputs["input_ids"][:8] = np.arange(100, 108)
    inputs["positions"][:7] = [5, 16, 31, 0, 17, 40, 63]  # 16: a token that starts a new block
    inputs["seq_lens"][:7] = inputs["positions"][:7] + 1
    for i in range(7):  # distinct blocks per sequence
        inputs["block_tables"][i, :4] = np.arange(4) + 4 * i + 1
    pos = inputs["positions"][:7]
    inputs["slot_mapping"][:7] = inputs["block_tables"][np.arange(7), pos // 16].astype(np.int64) * 16 + pos % 16
    inputs["positions"][7], inputs["seq_lens"][7], inputs["slot_mapping"][7] = 0, 1, -1  # padding row
    inputs["block_tables"][7] = 0
    graphs.staging.upload(8)
    graphs.graphs[8].replay()
    torch.cuda.synchronize()
    got = graphs.outputs[8][0].float().clone()  # (8, hidden)

    batch = graphs._batch(8)  # the same staged inputs, run eagerly
    eager_kv, two_kv = copy(), copy()
    eager = model(batch, eager_kv, graphs.kernels).float()
    torch.testing.assert_close(got[:7], eager[:7], rtol=2e-2, atol=2e-2)
    for (kg, vg), (ke, ve) in zip(graph_kv, eager_kv):
        torch.testing.assert_close(kg, ke, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(vg, ve, rtol=2e-2, atol=2e-2)
    assert int((graph_kv[0][0] != pool[0][0]).any(-1).any(-1).sum()) == 7  # 7 tokens stored, padding none

    def kernels_in(kv, two_launches):
        with monkeypatch.context() as m:
            if two_launches:
                m.setattr(Kernels, "fused_decode", property(lambda self: False))
            step = lambda: model(batch, kv, graphs.kernels)  # noqa: E731
            out = step().float()  # compiles outside the profile
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return out, len([n for n in names if not n.startswith(("Memcpy", "Memset"))])

    one_kv = copy()
    one, n_one = kernels_in(one_kv, two_launches=False)
    two, n_two = kernels_in(two_kv, two_launches=True)
    # Layer 0 sees the same inputs on both paths: the same 7 slots written, the same bits (the
    # rotation launched without FMA contraction, which changed 2,119 of 12,288 keys on the H200).
    for one_t, two_t, before in zip(one_kv[0], two_kv[0], pool[0]):
        written = (one_t != before).any(-1).any(-1)  # (num_blocks, B) slots the one-launch path wrote
        assert int(written.sum()) == 7
        assert torch.equal(one_t, two_t)
    # After 30 layers of random weights the attention kernel's own last bits (its code differs
    # from the two-launch kernel's) are amplified; the bound is the fused-against-plain one above.
    err = (one[:7] - two[:7]).norm() / two[:7].norm()
    assert err < 2e-2, f"one launch against two: relative error {err:.2e}"
    assert n_two - n_one == c.num_layers, f"{n_two} kernels with the separate store, {n_one} without"


def test_the_one_launch_store_is_on_where_both_kernels_are_triton():
    """On by default with the Triton decode kernel and the fused ops, off when asked, and checked."""
    from paged_edu.engine import Engine
    from paged_edu.labs.engine_lab import tiny_model

    device = torch.device(DEVICE)
    assert Kernels(decode="triton", fused="triton").resolve(device).fused_decode
    assert not Kernels(decode="triton", fused="triton", fuse_decode_store=False).resolve(device).fused_decode
    assert not Kernels(decode="torch", fused="triton").resolve(device).fused_decode
    assert not Kernels(decode="triton", fused="torch").resolve(device).fused_decode
    with pytest.raises(ValueError, match="fuse_decode_store"):
        Engine(tiny_model(), num_blocks=16, block_size=4, fuse_decode_store="yes")

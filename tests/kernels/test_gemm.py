"""The skinny GEMM (``y = x @ W^T`` for a few rows) against a plain fp32 matmul (the oracle).

On the CPU it runs in Triton's interpreter (``tests/conftest.py``), where bf16 tiles are upcast
after their loads and the final store truncates to bf16 (the GPU rounds): one ulp. The ``gpu``
tests run it compiled, inside a CUDA graph.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from model_helpers import TINY_LLAMA, stale_gpu_pools

from paged_edu.kernels import kernel_support, triton_available
from paged_edu.models.config import smollm2_config
from paged_edu.models.llama import Kernels, PagedLlama

if not triton_available():
    pytest.skip("triton is not installed", allow_module_level=True)

from paged_edu.kernels.triton_gemm import MAX_ROWS, skinny_config, skinny_matmul  # noqa: E402

DEVICE = "cpu" if kernel_support("cpu").decode else "cuda"
C = smollm2_config()
# name -> (N, K) of nn.Linear's weight: qkv (960, 576), o_proj (576, 576), gate_up (3072, 576),
# down (576, 1536), lm_head (49152, 576)
SHAPES = C.linear_shapes()
# Relative tolerance: fp32 sums in another order; bf16 also rounds (truncates, interpreted) its output once.
RTOL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-7}


def case(M, N, K, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEVICE)  # (M, K)
    w = (torch.randn(N, K, generator=g) * 0.05).to(dtype).to(DEVICE)  # (N, K), nn.Linear's layout
    return x, w


def check(y, x, w):
    """``y`` against ``x @ w^T`` computed in fp32 from the same (rounded) inputs."""
    ref = x.float() @ w.float().T  # (M, N)
    assert y.dtype == x.dtype and y.shape == ref.shape
    torch.testing.assert_close(y.float(), ref, rtol=RTOL[x.dtype], atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 16, 32, 64])
@pytest.mark.parametrize("name", [n for n in SHAPES if n != "lm_head"])
def test_matches_fp32_matmul_at_smollm2_shapes(name, M, dtype):
    N, K = SHAPES[name]
    x, w = case(M, N, K, dtype, seed=M)
    check(skinny_matmul(x, w), x, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 16, 32])
def test_lm_head_shape(M, dtype):
    """49,152 rows: wide tiles keep the interpreter to 48 programs (the default's 768 take ~15 s);
    compiled, the default config (a 1024-row tile does not fit a GPU's shared memory)."""
    from paged_edu.kernels.triton_gemm import INTERPRETING

    N, K = SHAPES["lm_head"]
    x, w = case(M, N, K, dtype, seed=M)
    check(skinny_matmul(x, w, config=dict(BLOCK_N=1024) if INTERPRETING else None), x, w)


@pytest.mark.slow
def test_lm_head_default_config():
    N, K = SHAPES["lm_head"]
    x, w = case(5, N, K, torch.bfloat16)
    check(skinny_matmul(x, w), x, w)


def test_the_default_configs_split_k_where_n_tiles_are_few():
    """The N = 576 and 960 shapes take the split-K path by default (the tests above run it)."""
    for name, (N, K) in SHAPES.items():
        cfg = skinny_config(1, N, K)
        programs = -(-N // cfg["BLOCK_N"]) * cfg["SPLIT_K"]
        assert programs >= 0.75 * 132, (name, cfg)
        assert cfg["BLOCK_N"] >= 16 and cfg["BLOCK_K"] >= 16  # tl.dot's minimum on a GPU
        assert (cfg["SPLIT_K"] > 1) == (name in ("qkv", "o_proj", "down")), (name, cfg)


def test_the_weight_is_preloaded_where_it_was_measured_to_pay():
    """``PRELOAD`` (module docstring): at most 16 rows, slices of at most 8,192 weight elements, never with
    ``swiglu`` -- on for SmolLM2's qkv, o and down at 1 and 16 rows; off at 17, for the LM head's
    64 x 1,024 tiles and for the SwiGLU GEMM."""
    for name in ("qkv", "o_proj", "down"):
        N, K = SHAPES[name]
        assert skinny_config(1, N, K)["PRELOAD"] and skinny_config(16, N, K)["PRELOAD"], name
        assert not skinny_config(17, N, K)["PRELOAD"], name
    assert not skinny_config(1, *SHAPES["lm_head"])["PRELOAD"]
    assert not skinny_config(1, SHAPES["gate_up"][0] // 2, SHAPES["gate_up"][1], swiglu=True)["PRELOAD"]


@pytest.mark.parametrize(
    "config",
    [
        dict(SPLIT_K=1),
        dict(SPLIT_K=4),  # 9 steps of 64: cdiv gives 3 a slice, the last slice has none
        dict(SPLIT_K=2, BLOCK_K=256),  # 576 = 2.25 x 256: a masked tail
        dict(BLOCK_N=32, BLOCK_K=32, SPLIT_K=8),
        dict(BLOCK_N=128),  # 576 rows: the last tile half empty
        # PRELOAD: the whole slice before the wait, padded to a power of two and masked
        dict(SPLIT_K=1, PRELOAD=True),  # 576 columns in a 1,024-wide tile
        dict(SPLIT_K=4, PRELOAD=True),  # slices of 192 in 256; the last slice past K, all masked
        dict(SPLIT_K=2, BLOCK_K=256, PRELOAD=True),  # 512-column slices: the second's tail past K
        dict(BLOCK_N=32, BLOCK_K=32, SPLIT_K=8, PRELOAD=True),  # 9 slices of 64 (18 steps of 32 over 8)
    ],
)
def test_configs_of_a_sweep_agree(config):
    x, w = case(7, 576, 576, torch.float32, seed=3)
    check(skinny_matmul(x, w, config=config), x, w)


def test_split_k_leaves_its_counters_zeroed_for_the_next_launch():
    from paged_edu.kernels.triton_gemm import _counters

    x, w = case(2, 96, 256, torch.float32)
    for _ in range(3):  # a counter left at 1 would make the next launch's sum fire early
        check(skinny_matmul(x, w, config=dict(BLOCK_N=16, BLOCK_K=32, SPLIT_K=4)), x, w)
    assert int(_counters[x.device].abs().sum()) == 0


def test_strided_x_and_out_are_handled():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, 5, generator=g).to(DEVICE).T  # (5, 64) with strides (1, 5): a transposed view
    w = torch.randn(48, 64, generator=g).to(DEVICE)
    out = torch.full((48, 5), float("nan"), device=DEVICE).T  # (5, 48), strides (1, 5)
    y = skinny_matmul(x, w, out=out)
    assert y.data_ptr() == out.data_ptr()
    check(y, x, w)
    sliced = torch.randn(5, 128, generator=g).to(DEVICE)[:, ::2]  # (5, 64), column stride 2
    check(skinny_matmul(sliced, w), sliced, w)


def test_bad_inputs_raise_clear_errors():
    x, w = case(MAX_ROWS + 1, 32, 64, torch.float32)
    with pytest.raises(ValueError, match=f"at most {MAX_ROWS} rows"):
        skinny_matmul(x, w)
    with pytest.raises(ValueError, match="K=64 columns"):
        skinny_matmul(x[:4], w[:, :32])
    with pytest.raises(ValueError, match="share dtype"):
        skinny_matmul(x[:4], w.double())
    with pytest.raises(ValueError, match="out must be"):
        skinny_matmul(x[:4], w, out=torch.empty(4, 31, device=DEVICE))
    assert skinny_matmul(x[:0], w).shape == (0, 32)


# ----------------------------------------------------------------------------------------------
# The SwiGLU epilogue: gate_up and silu(gate) * up in one kernel
# ----------------------------------------------------------------------------------------------


def exact_case(M, I, K, dtype, seed=0):
    """``x`` and gate_up's ``w`` ``(2I, K)`` of few significant bits (eighths, 256ths): every product and
    every partial sum is exact in fp32, so each GEMM's sum is the same whatever its order (the skinny
    GEMM's tiles, split-K, cuBLAS, the CPU's BLAS), and the fused kernel must equal the two-kernel path
    bit for bit -- only the roundings the two share are left. The sums need up to ~12 significant bits:
    bf16 (8) rounds them, so the "round to bf16 first" of the epilogue is exercised."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randint(-16, 17, (M, K), generator=g) / 8).to(dtype).to(DEVICE)  # (M, K)
    w = (torch.randint(-32, 33, (2 * I, K), generator=g) / 256).to(dtype).to(DEVICE)  # (2I, K): gate, up
    return x, w


def silu_mul_oracle(x, w):
    """Plain PyTorch in fp64, no intermediate rounding: ``F.silu(g) * u`` for ``g, u = x @ w^T`` halves."""
    gate, up = F.linear(x.double(), w.double()).chunk(2, dim=-1)  # (M, I) each
    return F.silu(gate) * up


# Relative tolerance against the fp64 oracle: fp32 sums in another order; bf16 rounds g, u, silu(g) and
# the product (four roundings of at most 2**-9 each, silu's slope amplifying g's for g < 0).
SWIGLU_RTOL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-6}
SWIGLU_SPLITS = [
    dict(SPLIT_K=1),
    dict(SPLIT_K=3, BLOCK_K=16),  # 4 steps of 16: 2 a slice, the last slice has none
    dict(BLOCK_N=64, BLOCK_K=16, SPLIT_K=2),  # I = 96: the second tile (gate and up halves) half empty
    dict(SPLIT_K=3, BLOCK_K=16, PRELOAD=True),  # both halves' slices loaded before the wait
]
# At SmolLM2's MLP shape: the SwiGLU rule's tiling (no split) and the plain rule's it replaced (split in three)
SMOLLM2_SWIGLU_CONFIGS = pytest.mark.parametrize(
    "config", [None, dict(SPLIT_K=3, num_stages=4)], ids=["default", "split3"]
)


@pytest.mark.parametrize("config", SWIGLU_SPLITS, ids=["split1", "split3", "split2-wide", "split3-preload"])
@pytest.mark.parametrize("M", [1, 5, 16, 17, 32, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_equals_the_two_kernel_path(dtype, M, config):
    """``skinny_matmul(x, w, swiglu=True)`` == ``silu_and_mul_triton(F.linear(x, w))`` bit for bit on
    exact sums (:func:`exact_case`), at TINY_LLAMA's MLP shape, split-K 1 and > 1; and close to the fp64
    oracle. The interpreter's truncating bf16 store (module docstring) does not touch this path: its
    epilogue rounds to nearest by hand, as F.linear does."""
    from paged_edu.kernels.triton_fused import silu_and_mul_triton
    from paged_edu.kernels.triton_gemm import _counters

    I, K = TINY_LLAMA.intermediate_size, TINY_LLAMA.hidden_size
    x, w = exact_case(M, I, K, dtype, seed=M)
    y = skinny_matmul(x, w, config=config, swiglu=True)
    assert y.shape == (M, I) and y.dtype == dtype
    assert torch.equal(y, silu_and_mul_triton(F.linear(x, w)))
    torch.testing.assert_close(y.double(), silu_mul_oracle(x, w), rtol=SWIGLU_RTOL[dtype], atol=1e-4)
    if config["SPLIT_K"] > 1:
        assert int(_counters[x.device].abs().sum()) == 0  # left zeroed for the next launch


@SMOLLM2_SWIGLU_CONFIGS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_at_smollm2_mlp_shape_with_random_values(dtype, config):
    """SmolLM2's MLP (K = 576, I = 1536) with its default config (no split: the SwiGLU rule) and split in
    three, Gaussian values: the sums' order differs from F.linear's, so a bf16 value next to a rounding
    boundary may land one ulp apart -- held to the fp64 oracle, and to the two-kernel path on all but a
    few values."""
    from paged_edu.kernels.triton_fused import silu_and_mul_triton

    I, K = C.intermediate_size, C.hidden_size
    x, w = case(5, 2 * I, K, dtype, seed=11)
    assert skinny_config(5, I, K, swiglu=True)["SPLIT_K"] == 1 and skinny_config(5, I, K)["SPLIT_K"] == 3
    y = skinny_matmul(x, w, config=config, swiglu=True)
    torch.testing.assert_close(y.double(), silu_mul_oracle(x, w), rtol=SWIGLU_RTOL[dtype], atol=1e-4)
    two = silu_and_mul_triton(F.linear(x, w))
    torch.testing.assert_close(y, two, rtol=RTOL[dtype], atol=1e-5)
    if dtype == torch.bfloat16:  # fp32 keeps the sums' last bits; bf16 rounds them away, nearly always
        assert (y != two).double().mean().item() <= 0.01


def test_swiglu_writes_out_in_place_and_rejects_bad_shapes():
    I, K = 48, 32
    x, w = exact_case(4, I, K, torch.float32)
    out = torch.full((I, 4), float("nan"), device=DEVICE).T  # (4, I), strides (1, 4)
    y = skinny_matmul(x, w, out=out, swiglu=True)
    assert y.data_ptr() == out.data_ptr()
    torch.testing.assert_close(y.double(), silu_mul_oracle(x, w), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="even number"):
        skinny_matmul(x, w[:-1], swiglu=True)
    with pytest.raises(ValueError, match=f"out must be \\(4, {I}\\)"):
        skinny_matmul(x, w, out=torch.empty(4, 2 * I, device=DEVICE), swiglu=True)  # gate_up's shape
    assert skinny_matmul(x[:0], w, swiglu=True).shape == (0, I)
    assert torch.equal(skinny_matmul(x[:, :0], w[:, :0], swiglu=True), torch.zeros(4, I, device=DEVICE))


# ----------------------------------------------------------------------------------------------
# Wired into the model and the engine (gemm_impl="triton"): the same numbers and tokens
# ----------------------------------------------------------------------------------------------


# Room for a prompt of MAX_ROWS + 6 tokens (past the skinny GEMM's rows) and its decodes
LONGER_TINY_LLAMA = replace(TINY_LLAMA, max_position_embeddings=128)


def run_tiny_model(model, kernels, sizes):
    """Chunks of ``sizes`` tokens of one sequence (prefill, then decodes) through ``kernels``: hidden
    states and logits."""
    from paged_edu.engine.batch import BatchChunk, prepare_batch

    c = model.config
    g = torch.Generator().manual_seed(1)
    caches = [
        tuple(torch.randn(32, 4, c.num_kv_heads, c.head_dim, generator=g).to(model.dtype).to(DEVICE) for _ in range(2))
        for _ in range(c.num_layers)
    ]
    tokens, pos, hidden, logits = list(range(3, 3 + sum(sizes))), 0, [], []
    for n in sizes:
        batch = prepare_batch([BatchChunk(tokens[pos : pos + n], pos, list(range(32)))], 4, DEVICE)
        h = model(batch, caches, kernels)  # (n, hidden)
        hidden.append(h)
        logits.append(model.compute_logits(h, kernels))  # (n, vocab): every row, to test the LM head
        pos += n
    return torch.cat(hidden), torch.cat(logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_with_the_skinny_gemm_matches_the_torch_path(dtype, monkeypatch):
    """Prefill MAX_ROWS + 6 tokens (cuBLAS), then 7, then decode 2: the skinny GEMM's rows only."""
    import paged_edu.kernels.triton_gemm as gemm_module
    from paged_edu.models.loaders import random_llama

    rows = []
    real = gemm_module.skinny_matmul
    monkeypatch.setattr(gemm_module, "skinny_matmul", lambda x, w, **kw: rows.append(x.shape[0]) or real(x, w, **kw))
    model = random_llama(LONGER_TINY_LLAMA, seed=2, dtype=dtype, device=DEVICE)
    sizes = (MAX_ROWS + 6, 7, 1, 1)
    plain = run_tiny_model(model, Kernels(decode="torch", prefill="torch", fused="torch", gemm="torch"), sizes)
    assert rows == []
    skinny = run_tiny_model(model, Kernels(decode="torch", prefill="torch", fused="torch", gemm="triton"), sizes)
    # Per chunk of <= MAX_ROWS rows: 4 projections a layer, then the LM head; the prompt chunk: none.
    assert rows == [n for n in sizes[1:] for _ in range(4 * TINY_LLAMA.num_layers + 1)]
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]
    for got, want in zip(skinny, plain):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    n = sizes[0]
    assert torch.equal(skinny[0][:n], plain[0][:n])  # the prompt chunk ran cuBLAS in both


def test_the_engine_with_gemm_impl_triton_gives_transformers_tokens(hf_greedy_case):
    """The engine's graph path (a stand-in replaying eagerly: no CUDA needed) and its eager
    prompt steps with the skinny GEMM: transformers' greedy tokens."""
    from paged_edu.engine import Engine
    from paged_edu.engine.cuda_graphs import DecodeCudaGraphs

    hf, prompts, want = hf_greedy_case
    kw = dict(num_blocks=64, block_size=4, max_num_seqs=8, attn_impl="torch", prefill_impl="torch")
    engine = Engine(PagedLlama.from_hf(hf, device=DEVICE), cuda_graphs=False, gemm_impl="triton", **kw)
    r = engine.runner
    assert r.kernels.gemm == "triton"
    r.graphs = DecodeCudaGraphs(engine.model, r.kv_pairs, 8, 64, r.kernels, capture_graphs=False)
    assert engine.generate(prompts, max_new_tokens=9) == want
    assert r.num_graph_steps > 0


def test_gemm_impl_is_checked_like_fused_impl(hf_greedy_case):
    from paged_edu.engine import Engine

    model = PagedLlama.from_hf(hf_greedy_case[0])
    with pytest.raises(ValueError, match="gemm_impl must be"):
        Engine(model, num_blocks=8, block_size=4, gemm_impl="cublas")
    kernels = Engine(model, num_blocks=8, block_size=4).runner.kernels  # the default, "auto":
    assert kernels.gemm == ("triton" if kernels.pdl else "torch")  # the skinny GEMM only in a PDL chain
    assert Kernels(gemm="auto", pdl=False).resolve(torch.device(DEVICE)).gemm == "torch"
    elsewhere = "cuda" if DEVICE == "cpu" else "cpu"
    with pytest.raises(ValueError, match="gemm_impl='triton', but"):
        Kernels(gemm="triton").resolve(torch.device(elsewhere))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_with_the_swiglu_gemm_matches_the_two_kernel_mlp(dtype, monkeypatch):
    """TINY_LLAMA with the fused ops: ``swiglu_gemm=True`` gives the hidden states and logits of the
    two-kernel MLP (gate_up by F.linear, then silu_and_mul_triton). Prefill MAX_ROWS + 6 tokens (the
    two kernels on both paths), then 7, 1, 1 rows: one swiglu GEMM a layer. The GEMMs' sums differ in
    order only: fp32 keeps that in its last bits; bf16 rounds it away, barring a sum next to a rounding
    boundary (one ulp; none here, seeded -- ``equal`` says so)."""
    import paged_edu.kernels.triton_fused as fused_module
    import paged_edu.kernels.triton_gemm as gemm_module
    from paged_edu.models.loaders import random_llama

    calls = {"swiglu": [], "silu_and_mul": []}
    real_gemm, real_silu = gemm_module.skinny_matmul, fused_module.silu_and_mul_triton

    def counted_gemm(x, w, out=None, config=None, *, swiglu=False, pdl=False):
        calls["swiglu"].append(x.shape[0]) if swiglu else None
        return real_gemm(x, w, out, config, swiglu=swiglu, pdl=pdl)

    monkeypatch.setattr(gemm_module, "skinny_matmul", counted_gemm)
    monkeypatch.setattr(
        fused_module, "silu_and_mul_triton", lambda gu: calls["silu_and_mul"].append(gu.shape[0]) or real_silu(gu)
    )
    model = random_llama(LONGER_TINY_LLAMA, seed=2, dtype=dtype, device=DEVICE)
    sizes, layers = (MAX_ROWS + 6, 7, 1, 1), TINY_LLAMA.num_layers
    kw = dict(decode="torch", prefill="torch", fused="triton")
    two = run_tiny_model(model, Kernels(**kw, swiglu_gemm=False).resolve(torch.device(DEVICE)), sizes)
    assert calls == {"swiglu": [], "silu_and_mul": [n for n in sizes for _ in range(layers)]}
    calls["silu_and_mul"].clear()
    one = run_tiny_model(model, Kernels(**kw).resolve(torch.device(DEVICE)), sizes)  # on by default
    assert calls == {"swiglu": [n for n in sizes[1:] for _ in range(layers)], "silu_and_mul": [sizes[0]] * layers}
    for got, want in zip(one, two):
        assert torch.equal(got[: sizes[0]], want[: sizes[0]])  # the prompt chunk: the two kernels on both
        if dtype == torch.bfloat16:
            assert torch.equal(got, want)
        else:  # fp32 keeps the sums' order in its last bits
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    plain = run_tiny_model(model, Kernels(decode="torch", prefill="torch", fused="torch"), sizes)
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(one[0], plain[0], atol=tol, rtol=tol)  # and the plain PyTorch MLP's


def test_swiglu_gemm_is_an_engine_option_on_by_default(hf_greedy_case):
    """``Engine(swiglu_gemm=True)`` (fused ops, interpreted here): transformers' greedy tokens through the
    decode graphs' path; checked like the other flags; on by default, ``False`` turns it off."""
    from paged_edu.engine import Engine
    from paged_edu.engine.cuda_graphs import DecodeCudaGraphs

    hf, prompts, want = hf_greedy_case
    model = PagedLlama.from_hf(hf, device=DEVICE)
    kw = dict(num_blocks=64, block_size=4, max_num_seqs=8, attn_impl="torch", prefill_impl="torch")
    assert Engine(model, **kw).runner.kernels.swiglu_gemm
    assert not Engine(model, swiglu_gemm=False, **kw).runner.kernels.swiglu_gemm
    with pytest.raises(ValueError, match="swiglu_gemm"):
        Engine(model, swiglu_gemm="yes", **kw)
    engine = Engine(model, cuda_graphs=False, fused_impl="triton", swiglu_gemm=True, **kw)
    r = engine.runner
    assert r.kernels.swiglu_gemm and r.kernels.fused_ops
    r.graphs = DecodeCudaGraphs(engine.model, r.kv_pairs, 8, 64, r.kernels, capture_graphs=False)
    assert engine.generate(prompts, max_new_tokens=9) == want
    assert r.num_graph_steps > 0


# ----------------------------------------------------------------------------------------------
# Compiled, on a GPU: every shape and M, inside a CUDA graph
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 4, 16, 32, 33, 64])
def test_gpu_skinny_matmul_in_a_cuda_graph(M):
    for name, (N, K) in SHAPES.items():
        x, w = case(M, N, K, torch.bfloat16, seed=M)
        skinny_matmul(x, w)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = skinny_matmul(x, w)
        for _ in range(3):  # replays reuse the split-K counters: each must leave them at zero
            y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ref = x.float() @ w.float().T
            torch.testing.assert_close(y.float(), ref, rtol=2.0**-7, atol=2e-3, msg=name)


@pytest.mark.gpu
def test_gpu_model_with_the_skinny_gemm_under_graph_capture():
    """SmolLM2's 30-layer geometry, bf16, through the engine's decode CUDA graphs: gemm "triton" ==
    "torch" (hidden states close), batch sizes 1..64 captured."""
    import numpy as np

    from paged_edu.engine.cuda_graphs import DecodeCudaGraphs
    from paged_edu.models.loaders import random_llama

    model = random_llama(C, seed=0, dtype=torch.bfloat16, device="cuda")
    out = {}
    for impl in ("torch", "triton"):
        caches = stale_gpu_pools(C)  # the same stale pool for both
        graphs = DecodeCudaGraphs(model, caches, MAX_ROWS, 8, kernels=Kernels(fused="triton", gemm=impl))
        inputs = graphs.staging.np
        inputs["input_ids"][:8] = np.arange(100, 108)
        inputs["positions"][:8] = 5
        inputs["block_tables"][:8, 0] = np.arange(8) * 3
        inputs["slot_mapping"][:8] = np.arange(8) * 3 * 16 + 5
        inputs["seq_lens"][:8] = 6
        graphs.staging.upload(8)
        hidden, greedy = graphs.replay(8)
        out[impl] = hidden.float().clone(), greedy.clone()
    err = (out["triton"][0] - out["torch"][0]).norm() / out["torch"][0].norm()
    agree = (out["triton"][1] == out["torch"][1]).float().mean().item()  # near-ties of random weights may flip
    assert err < 2e-2, f"relative error {err:.2e} (greedy tokens agree on {agree:.0%})"


@pytest.mark.gpu
@SMOLLM2_SWIGLU_CONFIGS
@pytest.mark.parametrize("M", [1, 8, 32])
def test_gpu_swiglu_at_smollm2_mlp_shape(M, config, monkeypatch):
    """K = 576, I = 1536, bf16, the default config (no split) and split-K 3, inside a CUDA graph: bit for
    bit the two-kernel path on exact sums (cuBLAS made to reduce in fp32, as the skinny GEMM does; and
    the skinny GEMM's own two launches), close to the oracle on Gaussian values."""
    from paged_edu.kernels.triton_fused import silu_and_mul_triton

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", False)
    I, K = C.intermediate_size, C.hidden_size
    x, w = exact_case(M, I, K, torch.bfloat16, seed=M)
    skinny_matmul(x, w, config=config, swiglu=True)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = skinny_matmul(x, w, config=config, swiglu=True)
    for _ in range(3):  # replays reuse the split-K counters: each must leave them at zero
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, silu_and_mul_triton(F.linear(x, w)))
        assert torch.equal(y, silu_and_mul_triton(skinny_matmul(x, w)))
    x, w = case(M, 2 * I, K, torch.bfloat16, seed=M)
    y = skinny_matmul(x, w, config=config, swiglu=True)
    torch.testing.assert_close(y.double(), silu_mul_oracle(x, w), rtol=SWIGLU_RTOL[torch.bfloat16], atol=1e-3)
    two = silu_and_mul_triton(F.linear(x, w))
    assert (y != two).double().mean().item() <= 0.01


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", ["torch", "triton"])
def test_gpu_decode_step_with_the_swiglu_gemm_launches_one_kernel_fewer_per_layer(gemm):
    """SmolLM2's 30 layers, bf16, a decode step of 8 rows: ``swiglu_gemm=True`` launches exactly 30
    kernels fewer than the two-kernel MLP (torch.profiler; gate_up's GEMM and silu_and_mul become one
    kernel a layer -- with ``gemm="torch"`` this assumes cuBLAS runs gate_up as one kernel, as it did
    at batch 1 on the H200), and the hidden states agree."""
    from torch.profiler import ProfilerActivity, profile

    from paged_edu.engine.batch import BatchChunk, prepare_batch
    from paged_edu.models.loaders import random_llama

    model = random_llama(C, seed=0, dtype=torch.bfloat16, device="cuda")
    kv = stale_gpu_pools(C)
    chunks = [BatchChunk([100 + i], 5 + 3 * i, [4 * i + 1, 4 * i + 2]) for i in range(8)]
    batch = prepare_batch(chunks, 16, "cuda")

    def kernels_in(swiglu_gemm):
        kernels = Kernels(gemm=gemm, swiglu_gemm=swiglu_gemm).resolve(torch.device("cuda"))
        assert kernels.fused_ops
        step = lambda: model(batch, [(k.clone(), v.clone()) for k, v in kv], kernels)  # noqa: E731
        out = step().float()  # compiles (and allocates the split-K counters) outside the profile
        torch.cuda.synchronize()
        caches = [(k.clone(), v.clone()) for k, v in kv]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(batch, caches, kernels)
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return out, [n for n in names if not n.startswith(("Memcpy", "Memset"))]

    one, n_one = kernels_in(True)
    two, n_two = kernels_in(False)
    assert len(n_two) - len(n_one) == C.num_layers, (len(n_two), len(n_one))
    assert sum("silu_and_mul" in n for n in n_one) == 0 and sum("silu_and_mul" in n for n in n_two) == C.num_layers
    err = (one - two).norm() / two.norm()
    assert err < 2e-2, f"relative error {err:.2e}"

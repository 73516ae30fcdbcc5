"""Paged-attention kernels against an independent oracle.

On the CPU the Triton kernels run under the interpreter (``tests/conftest.py`` sets
``TRITON_INTERPRET=1``); the same checks marked ``gpu`` run compiled on a CUDA device.
The oracle chain: a float64 brute force (token by token through the block table) checks
``impl="torch"``; ``impl="torch"`` then checks the loop and Triton over many shapes.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from hang_guard import HANG_GUARD_S

from paged_edu.kernels import (
    paged_attention_decode,
    paged_attention_prefill,
    triton_available,
    triton_interpreting,
)

CUDA = torch.cuda.is_available()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Relative error ||out - ref|| / ||ref|| allowed per dtype (fp32 runs exact in the interpreter
# and with ieee dots on the GPU; 16-bit outputs are rounded, and P is rounded before P @ V).
RTOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def make_case(
    num_seqs,
    num_q_heads,
    num_kv_heads,
    head_dim,
    block_size,
    lens,
    dtype,
    device="cpu",
    seed=0,
    extra_blocks=3,
    max_blocks=None,
):
    """Random q and pools; block tables that are shuffled and hold garbage past each sequence's end."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lens, dtype=torch.int32)
    need = [-(-int(s) // block_size) for s in lens]
    max_blocks = max_blocks or max(need)
    num_blocks = sum(need) + extra_blocks
    k = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    q = torch.randn(num_seqs, num_q_heads, head_dim, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.randint(-(2**31), 2**31 - 1, (num_seqs, max_blocks), generator=g, dtype=torch.int64)
    tables[:, ::2] = -1  # garbage: huge, negative and -1 entries past the end
    used = 0
    for i, n in enumerate(need):
        tables[i, :n] = perm[used : used + n]
        used += n
    tables = tables.to(torch.int32)
    return q.to(device), k.to(device), v.to(device), tables.to(device), lens.to(device)


def brute_force(q, k_cache, v_cache, tables, lens, scale):
    """float64, one token at a time through the block table: independent of every implementation."""
    B, H_kv = k_cache.shape[1], k_cache.shape[2]
    N, H, D = q.shape
    G = H // H_kv
    out = torch.zeros(N, H, D, dtype=torch.float64)
    for i in range(N):
        s = int(lens[i])
        ks = torch.stack([k_cache[int(tables[i, t // B]), t % B] for t in range(s)]).double().cpu()  # (s, H_kv, D)
        vs = torch.stack([v_cache[int(tables[i, t // B]), t % B] for t in range(s)]).double().cpu()
        for h in range(H):
            scores = ks[:, h // G] @ q[i, h].double().cpu() * scale  # (s,)
            out[i, h] = torch.softmax(scores, 0) @ vs[:, h // G]
    return out


def rel_err(out, ref):
    out, ref = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out).all(), "non-finite output"
    return ((out - ref).norm() / ref.norm()).item()


def check(out, ref, dtype, label=""):
    assert out.dtype == dtype and out.shape == ref.shape
    err = rel_err(out, ref)
    assert err < RTOL[dtype], f"{label}: relative error {err:.2e} >= {RTOL[dtype]:.0e}"


B = 16
LENS = [1, B - 1, B, B + 1, 45]  # one sequence of each edge case, mixed in one batch


# ----------------------------------------------------------------------------------------------
# The oracle itself
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(4, 4), (6, 2), (8, 1)])
def test_torch_oracle_matches_brute_force(num_q_heads, num_kv_heads):
    q, k, v, t, lens = make_case(5, num_q_heads, num_kv_heads, 16, 4, [1, 3, 4, 5, 23], torch.float32, seed=1)
    ref = brute_force(q, k, v, t, lens, 0.25)
    out = paged_attention_decode(q, k, v, t, lens, scale=0.25, impl="torch")
    assert rel_err(out, ref) < 1e-6


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k, v, t, lens = make_case(2, 4, 2, 64, B, [7, 20], torch.float32)
    a = paged_attention_decode(q, k, v, t, lens, impl="torch")
    b = paged_attention_decode(q, k, v, t, lens, scale=1 / math.sqrt(64), impl="torch")
    assert torch.equal(a, b)


# ----------------------------------------------------------------------------------------------
# The loop (the seed's algorithm, corrected)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ratio", [1, 2, 3, 4, 8])
def test_loop_matches_oracle(dtype, ratio):
    H_kv = 3 if ratio == 3 else 2
    q, k, v, t, lens = make_case(len(LENS), H_kv * ratio, H_kv, 64, B, LENS, dtype, seed=ratio)
    ref = paged_attention_decode(q.float(), k.float(), v.float(), t, lens, impl="torch")
    check(paged_attention_decode(q, k, v, t, lens, impl="loop"), ref, dtype, "loop")


# ----------------------------------------------------------------------------------------------
# The Triton kernel (interpreter on the CPU)
# ----------------------------------------------------------------------------------------------

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (Linux only)")
needs_interp = pytest.mark.skipif(not triton_interpreting(), reason="needs TRITON_INTERPRET=1 (CPU run)")


@needs_triton
@needs_interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ratio", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_triton_matches_oracle(dtype, ratio, head_dim):
    H_kv = 3 if ratio == 3 else 2  # 3:1 is SmolLM2's 9 query / 3 KV heads
    q, k, v, t, lens = make_case(len(LENS), H_kv * ratio, H_kv, head_dim, B, LENS, dtype, seed=head_dim + ratio)
    ref = paged_attention_decode(q.float(), k.float(), v.float(), t, lens, impl="torch")
    check(paged_attention_decode(q, k, v, t, lens, impl="triton"), ref, dtype, "triton")


@needs_triton
@needs_interp
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7])
def test_triton_split_kv_matches_oracle(num_splits):
    from paged_edu.kernels.triton_decode import paged_attention_triton

    # Lengths from 1 token (most splits empty) to 200 (4 tiles of 64): every split shape occurs.
    q, k, v, t, lens = make_case(3, 8, 2, 64, B, [1, 70, 200], torch.float32, seed=num_splits)
    ref = paged_attention_decode(q, k, v, t, lens, impl="torch")
    out = paged_attention_triton(q, k, v, t, lens, scale=64**-0.5, num_splits=num_splits)
    check(out, ref, torch.float32, f"{num_splits} splits")


@needs_triton
@needs_interp
@pytest.mark.parametrize(
    "num_q_heads,num_kv_heads,head_dim,block_size", [(9, 3, 64, 16), (4, 2, 16, 8), (8, 1, 64, 16), (6, 3, 24, 4)]
)
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_packed_kernel_matches_oracle(num_q_heads, num_kv_heads, head_dim, block_size, num_splits):
    """Whole token rows per program (SmolLM2's 9/3 heads of 64 and others, head_dim 24 not a power of
    two): each query head must see only its own KV head's columns."""
    from paged_edu.labs.triton_decode_packed import paged_attention_packed

    q, k, v, t, lens = make_case(
        3, num_q_heads, num_kv_heads, head_dim, block_size, [1, 37, 80], torch.float32, seed=num_q_heads
    )
    ref = brute_force(q, k, v, t, lens, head_dim**-0.5)
    out = paged_attention_packed(q, k, v, t, lens, scale=head_dim**-0.5, num_splits=num_splits)
    check(out, ref.float(), torch.float32, "packed")


def test_packed_kernel_applies_to_small_contiguous_rows_only():
    if not triton_available():
        pytest.skip("triton is not installed")
    from paged_edu.labs.triton_decode_packed import packs, paged_attention_packed

    small = torch.zeros(4, 16, 3, 64)  # SmolLM2: 192-value rows
    assert packs(9, small, small)
    assert not packs(32, torch.zeros(4, 16, 8, 128), torch.zeros(4, 16, 8, 128))  # 1024-value rows: per head
    strided = torch.zeros(4, 16, 3, 128)[..., :64]  # rows not contiguous
    assert not packs(9, strided, strided)
    q, k, v, t, lens = make_case(1, 32, 8, 128, B, [5], torch.float32)
    with pytest.raises(ValueError, match="contiguous token rows"):
        paged_attention_packed(q, k, v, t, lens, scale=1.0)


@needs_triton
@needs_interp
@pytest.mark.parametrize("block_size,head_dim,lens", [(8, 256, [1, 9, 30]), (32, 96, [31, 33, 64]), (1, 64, [1, 5])])
def test_triton_other_geometries(block_size, head_dim, lens):
    q, k, v, t, lens = make_case(len(lens), 4, 2, head_dim, block_size, lens, torch.bfloat16, seed=block_size)
    ref = paged_attention_decode(q.float(), k.float(), v.float(), t, lens, impl="torch")
    check(paged_attention_decode(q, k, v, t, lens, impl="triton"), ref, torch.bfloat16)


@needs_triton
@needs_interp
def test_auto_uses_triton_under_the_interpreter_and_reads_strided_q():
    q, k, v, t, lens = make_case(2, 4, 2, 64, B, [5, 40], torch.float32)
    wide = torch.zeros(2, 4, 3 * 64)
    wide[:, :, 64:128] = q
    q_view = wide[:, :, 64:128]  # non-contiguous, as a slice of a fused qkv projection
    ref = paged_attention_decode(q, k, v, t, lens, impl="torch")
    check(paged_attention_decode(q_view, k, v, t, lens), ref, torch.float32, "auto")
    check(paged_attention_decode(q_view, k, v, t, lens, impl="torch"), ref, torch.float32, "torch strided")


# ----------------------------------------------------------------------------------------------
# Prefill / extend
# ----------------------------------------------------------------------------------------------


def make_prefill(q_lens, seq_lens, num_q_heads, num_kv_heads, head_dim, dtype, device="cpu", seed=0):
    q1, k, v, t, lens = make_case(len(seq_lens), num_q_heads, num_kv_heads, head_dim, B, seq_lens, dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(sum(q_lens), num_q_heads, head_dim, generator=g).to(dtype)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    return q.to(device), k.to(device), v.to(device), t.to(device), lens.to(device), cu.to(device)


def prefill_via_decode(q, k, v, t, lens, cu):
    """Each new token is a decode query over the first p + 1 positions: an independent oracle."""
    out = torch.empty_like(q)
    for i in range(len(lens)):
        s, start, end = int(lens[i]), int(cu[i]), int(cu[i + 1])
        for j in range(end - start):
            p = s - (end - start) + j
            out[start + j] = paged_attention_decode(
                q[start + j : start + j + 1], k, v, t[i : i + 1], torch.tensor([p + 1], dtype=torch.int32), impl="torch"
            )[0]
    return out


def test_prefill_reference_matches_per_token_decode():
    q, k, v, t, lens, cu = make_prefill([1, 5, 17], [1, 20, 17], 6, 2, 32, torch.float32)
    ref = prefill_via_decode(q, k, v, t, lens, cu)
    out = paged_attention_prefill(q, k, v, t, lens, cu, impl="torch")
    assert rel_err(out, ref) < 1e-6
    assert paged_attention_prefill(q, k, v, t, lens, cu).shape == q.shape  # auto on CPU: torch


@needs_triton
@needs_interp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_prefill_matches_reference(dtype):
    q, k, v, t, lens, cu = make_prefill([1, 5, 20], [1, 37, 20], 6, 2, 64, dtype, seed=3)
    ref = paged_attention_prefill(q.float(), k.float(), v.float(), t, lens, cu, impl="torch")
    check(paged_attention_prefill(q, k, v, t, lens, cu, impl="triton"), ref, dtype, "prefill")


@needs_triton
@needs_interp
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_prefill_into_out_rows_after_decodes_with_padding_chunks(impl):
    """The engine's layout: the chunks own rows ``cu[0]..cu[-1]`` of the step's queries (decode rows
    before them, padding rows after), ``out`` is written there only, and padding chunks of q_len 0
    (a CUDA graph's spare chunks) do nothing -- each chunk's rows equal the plain call's."""
    from paged_edu.kernels.triton_prefill import paged_prefill_triton

    q, k, v, t, lens, cu = make_prefill([1, 5, 20], [1, 37, 20], 6, 2, 64, torch.float32, seed=3)
    ref = paged_attention_prefill(q, k, v, t, lens, cu, impl="torch")
    D, pad_rows = 7, 5
    q_all = torch.cat([torch.randn(D, 6, 64), q, torch.randn(pad_rows, 6, 64)])  # decodes, chunks, padding
    t_pad = torch.cat([t, t[:1], t[:1]])  # two padding chunks: any table, seq_len 0, q_len 0
    lens_pad = torch.cat([lens, torch.zeros(2, dtype=torch.int32)])
    cu_abs = torch.cat([cu + D, (cu[-1:] + D).repeat(2)])
    out = torch.full_like(q_all, float("nan"))
    if impl == "triton":
        got = paged_prefill_triton(q_all, k, v, t_pad, lens_pad, cu_abs, scale=64**-0.5, out=out)
    else:
        got = paged_attention_prefill(q_all, k, v, t_pad, lens_pad, cu_abs, impl="torch", validate=False, out=out)
    assert got is out
    check(out[D : D + q.shape[0]], ref, torch.float32, "prefill rows")
    assert out[:D].isnan().all() and out[D + q.shape[0] :].isnan().all()  # untouched


def test_prefill_out_and_row_range_are_checked():
    q, k, v, t, lens, cu = make_prefill([1, 5], [1, 9], 4, 2, 16, torch.float32, seed=1)
    with pytest.raises(ValueError, match="out must be a tensor of q's shape"):
        paged_attention_prefill(q, k, v, t, lens, cu, impl="torch", out=q[:-1])
    with pytest.raises(ValueError, match="must start at 0 and end at num_q_tokens"):
        paged_attention_prefill(torch.cat([q, q]), k, v, t, lens, cu, impl="torch")  # rows no chunk owns, no out
    with pytest.raises(ValueError, match="must lie within q's"):
        paged_attention_prefill(q, k, v, t, lens, cu + 1, impl="torch", out=torch.empty_like(q))
    both = torch.cat([q, q])
    out = paged_attention_prefill(both, k, v, t, lens, cu + q.shape[0], impl="torch", out=torch.zeros_like(both))
    assert torch.equal(out[q.shape[0] :], paged_attention_prefill(q, k, v, t, lens, cu, impl="torch"))
    assert not out[: q.shape[0]].any()


@needs_triton
@needs_interp
@pytest.mark.parametrize(
    "q_lens,seq_lens,block_size,config",
    [
        # No prefix, one long chunk: many query blocks, full tiles below the diagonal, reversed grid.
        ([70], [70], 16, dict(ROWS=16, TILE=16)),
        # Cached prefixes that are not tile-aligned; a 1-token chunk (decode) next to longer ones.
        ([1, 5, 20, 33], [1, 37, 53, 33], 16, dict(ROWS=8, TILE=32)),
        # Tiles smaller than a block, and blocks of one token (every key its own block).
        ([9, 17], [40, 17], 16, dict(ROWS=16, TILE=8)),
        ([6, 11], [29, 11], 1, dict(ROWS=32, TILE=16)),
        # Blocks larger than a tile, query blocks larger than every chunk.
        ([3, 40], [70, 45], 32, dict(ROWS=64, TILE=16)),
    ],
)
def test_triton_prefill_tiles_and_diagonal(q_lens, seq_lens, block_size, config):
    """Every split of the key range (full tiles, diagonal tiles, none) against the per-token oracle."""
    from paged_edu.kernels.triton_prefill import paged_prefill_triton

    q1, k, v, t, lens = make_case(len(seq_lens), 8, 2, 32, block_size, seq_lens, torch.float32, seed=len(q_lens))
    g = torch.Generator().manual_seed(7)
    q = torch.randn(sum(q_lens), 8, 32, generator=g)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    ref = prefill_via_decode(q, k, v, t, lens, cu)
    out = paged_prefill_triton(q, k, v, t, lens, cu, scale=32**-0.5, config=config)
    check(out, ref, torch.float32, f"prefill {config}")


@needs_triton
@needs_interp
@pytest.mark.parametrize(
    "num_q_heads,num_kv_heads,head_dim,dtype",
    [(4, 4, 64, torch.float16), (6, 2, 96, torch.bfloat16), (8, 1, 16, torch.float32)],
)
def test_triton_prefill_head_layouts(num_q_heads, num_kv_heads, head_dim, dtype):
    """MHA, a non-power-of-two GQA group with a padded head_dim, and MQA."""
    q, k, v, t, lens, cu = make_prefill([4, 19], [30, 19], num_q_heads, num_kv_heads, head_dim, dtype, seed=11)
    ref = prefill_via_decode(q.float(), k.float(), v.float(), t, lens, cu)
    check(paged_attention_prefill(q, k, v, t, lens, cu, impl="triton"), ref, dtype, "prefill heads")


@needs_triton
@needs_interp
def test_triton_prefill_stale_nan_past_the_end():
    """NaN in unused slots never leaks."""
    from paged_edu.kernels.triton_prefill import paged_prefill_triton

    q, k, v, t, lens, cu = make_prefill([3, 12], [21, 12], 4, 2, 16, torch.float32, seed=2)
    ref = prefill_via_decode(q, k, v, t, lens, cu)
    for i, s in enumerate(lens.tolist()):
        last = int(t[i, (s - 1) // B])
        k[last, s % B or B :] = float("nan")
        v[last, s % B or B :] = float("nan")
    out = paged_prefill_triton(q, k, v, t, lens, cu, scale=0.25, config=dict(ROWS=8, TILE=16))
    check(out, ref, torch.float32, "prefill nan slots")


# ----------------------------------------------------------------------------------------------
# Errors: every bad input named, nothing computed
# ----------------------------------------------------------------------------------------------


def _good():
    return make_case(2, 4, 2, 16, 4, [3, 9], torch.float32)


@pytest.mark.parametrize(
    "mutate,exc,words",
    [
        (lambda a: a.update(q=a["q"][0]), ValueError, "q must have rank 3"),
        (lambda a: a.update(k_cache=a["k_cache"][0]), ValueError, "k_cache must have rank 4"),
        (lambda a: a.update(block_tables=a["block_tables"][0]), ValueError, "block_tables must have rank 2"),
        (lambda a: a.update(seq_lens=a["seq_lens"][None]), ValueError, "seq_lens must have rank 1"),
        (lambda a: a.update(v_cache=a["v_cache"][:-1]), ValueError, "differ in shape"),
        (lambda a: a.update(q=a["q"][:, :, :8]), ValueError, "head_dim"),
        (lambda a: a.update(q=torch.zeros(2, 3, 16)), ValueError, "multiple of num_kv_heads"),
        (lambda a: a.update(seq_lens=a["seq_lens"][:1]), ValueError, "one row per sequence"),
        (lambda a: a.update(q=a["q"].double()), TypeError, "float32, float16 or bfloat16"),
        (lambda a: a.update(k_cache=a["k_cache"].half()), TypeError, "differs from q dtype"),
        (lambda a: a.update(block_tables=a["block_tables"].long()), TypeError, "block_tables must be int32"),
        (lambda a: a.update(seq_lens=a["seq_lens"].long()), TypeError, "seq_lens must be int32"),
        (lambda a: a.update(q=a["q"].to("meta")), ValueError, "one device"),
        (lambda a: a.update(q=a["q"].tolist()), TypeError, "q must be a torch.Tensor"),
        (lambda a: a.update(seq_lens=torch.tensor([0, 9], dtype=torch.int32)), ValueError, "at least one token"),
        (
            lambda a: a.update(seq_lens=torch.tensor([3, 13], dtype=torch.int32)),
            ValueError,
            "exceeds what the block table covers",
        ),
        (lambda a: a.update(impl="cuda"), ValueError, "impl must be one of"),
        (lambda a: a.update(scale="0.1"), TypeError, "scale must be a float"),
        (lambda a: a.update(scale=1e38), ValueError, "scale must be .* <= MAX_SCALE"),  # fp32 scores overflow: NaN
        (lambda a: a.update(scale=float("nan")), ValueError, "scale must be a finite number"),
    ],
)
def test_decode_errors(mutate, exc, words):
    q, k, v, t, lens = _good()  # table of 3 blocks of 4: covers 12 tokens
    args = dict(q=q, k_cache=k, v_cache=v, block_tables=t, seq_lens=lens, impl="torch")
    mutate(args)
    with pytest.raises(exc, match=words):
        paged_attention_decode(**args)


@pytest.mark.parametrize("impl", ["loop", "torch", "triton"])
@pytest.mark.parametrize("entry", [-1, 7, 2**31 - 1])
def test_block_table_entry_outside_the_pool_is_named(impl, entry):
    # A block a sequence reads must be one of the pool's 7 blocks (k_cache.shape[0]); only entries
    # past the sequence's last block may hold garbage (make_case puts -1 and huge values there).
    if impl == "triton" and not (triton_available() and (triton_interpreting() or CUDA)):
        pytest.skip("needs Triton (interpreter or GPU)")
    q, k, v, t, lens = _good()  # lens [3, 9]: sequence 0 reads 1 block, sequence 1 reads 3
    assert k.shape[0] == 7
    ref = brute_force(q, k, v, t, lens, 1 / 4)
    if impl == "triton" and CUDA and not triton_interpreting():
        q, k, v, t, lens = (x.cuda() for x in (q, k, v, t, lens))
    tol = 2e-3 if q.is_cuda else 1e-5  # tf32 dots on the GPU
    assert rel_err(paged_attention_decode(q, k, v, t, lens, impl=impl), ref) < tol  # garbage past the end is fine
    bad = t.clone()
    bad[1, 2] = entry  # the block holding tokens 8 of sequence 1
    with pytest.raises(ValueError, match=rf"block_tables\[1, 2\] = {entry} is not a block of the cache \[0, 7\)"):
        paged_attention_decode(q, k, v, bad, lens, impl=impl)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=q.device)
    with pytest.raises(ValueError, match=r"block_tables\[1, 2\]"):
        paged_attention_prefill(q, k, v, bad, lens, cu, impl="torch")


def test_prefill_errors():
    q, k, v, t, lens, cu = make_prefill([2, 3], [4, 3], 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="q_len 3 must be in"):
        paged_attention_prefill(q, k, v, t, torch.tensor([4, 2], dtype=torch.int32), cu)
    with pytest.raises(ValueError, match="end at num_q_tokens"):
        paged_attention_prefill(q[:4], k, v, t, lens, cu)
    with pytest.raises(TypeError, match="cu_seqlens_q must be a 1-D int32"):
        paged_attention_prefill(q, k, v, t, lens, cu.long())
    with pytest.raises(ValueError, match="impl must be one of"):
        paged_attention_prefill(q, k, v, t, lens, cu, impl="loop")


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": ROOT, **env}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=HANG_GUARD_S
    )


# For the scripts below (decode imported as f): one sequence of s = 1, q (1, 2, 16) over a cache of
# 2 blocks of B = 4 with one KV head (k serves as K and V), and a call that asks for Triton and
# prints the RuntimeError's message.
_TINY_DECODE = (
    "q=torch.randn(1,2,16); k=torch.randn(2,4,1,16); t=torch.zeros(1,1,dtype=torch.int32)\n"
    "n=torch.ones(1,dtype=torch.int32)\n"
)
_ASK_FOR_TRITON = "try:\n    f(q,k,k,t,n,impl='triton')\nexcept RuntimeError as e:\n    print('MSG', e)\n"


@pytest.mark.skipif(CUDA, reason="checks the message given on a machine without a GPU")
def test_triton_without_gpu_or_interpreter_says_what_to_do():
    code = (
        "import torch\n"
        "from paged_edu.kernels import paged_attention_decode as f\n"
        + _TINY_DECODE
        + "assert f(q,k,k,t,n).shape == q.shape  # auto falls back to torch\n"
        + _ASK_FOR_TRITON
    )
    r = _run(code, TRITON_INTERPRET="0")
    assert r.returncode == 0, r.stderr
    assert "TRITON_INTERPRET=1" in r.stdout and "impl='torch'" in r.stdout


def test_package_imports_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None  # as on macOS / Windows\n"
        "import torch\n"
        "from paged_edu.kernels import paged_attention_decode as f, triton_available\n"
        "from paged_edu.cache.kv_cache import PagedKVCache\n"
        "assert not triton_available()\n"
        + _TINY_DECODE
        + "assert f(q,k,k,t,n).shape == q.shape\n"
        + "c = PagedKVCache(1, 2, 4, 1, 16, dtype=torch.float32); c.store(0, k[0], k[0], [0, 1, 2, 3])\n"
        + _ASK_FOR_TRITON
    )
    r = _run(code, TRITON_INTERPRET="1")
    assert r.returncode == 0, r.stderr
    assert "needs the triton package" in r.stdout


# ----------------------------------------------------------------------------------------------
# The same on a GPU (compiled kernels, tf32 and tensor-core paths, CUDA graphs)
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ratio", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gpu_triton_matches_oracle(dtype, ratio, head_dim):
    H_kv = 3 if ratio == 3 else 2
    lens = LENS + [1000, 4097]
    q, k, v, t, lens = make_case(len(lens), H_kv * ratio, H_kv, head_dim, B, lens, dtype, device="cuda", seed=ratio)
    ref = paged_attention_decode(q.float(), k.float(), v.float(), t, lens, impl="torch")
    check(paged_attention_decode(q, k, v, t, lens, impl="triton"), ref, dtype, "gpu triton")
    check(paged_attention_decode(q, k, v, t, lens), ref, dtype, "gpu auto")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [None, 1, 2, 7])
def test_gpu_packed_kernel(dtype, num_splits):
    from paged_edu.labs.triton_decode_packed import paged_attention_packed

    lens = LENS + [512, 1000]
    q, k, v, t, lens = make_case(len(lens), 9, 3, 64, B, lens, dtype, device="cuda", seed=3)
    ref = paged_attention_decode(q.float(), k.float(), v.float(), t, lens, impl="torch")
    check(paged_attention_packed(q, k, v, t, lens, scale=0.125, num_splits=num_splits), ref, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 2, 5, 16, 64])
def test_gpu_split_kv(num_splits):
    from paged_edu.kernels.triton_decode import paged_attention_triton

    q, k, v, t, lens = make_case(4, 32, 8, 128, B, [1, 200, 3000, 8192], torch.bfloat16, device="cuda", seed=num_splits)
    ref = paged_attention_decode(q.float(), k.float(), v.float(), t, lens, impl="torch")
    check(paged_attention_triton(q, k, v, t, lens, scale=128**-0.5, num_splits=num_splits), ref, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_loop_matches_oracle():
    q, k, v, t, lens = make_case(len(LENS), 8, 2, 128, B, LENS, torch.bfloat16, device="cuda")
    ref = paged_attention_decode(q.float(), k.float(), v.float(), t, lens, impl="torch")
    check(paged_attention_decode(q, k, v, t, lens, impl="loop"), ref, torch.bfloat16, "gpu loop")


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs,max_len", [(1, 8192), (64, 512)])
def test_gpu_cuda_graph_capture_and_replay(num_seqs, max_len):
    """Capture once, change lengths and tables in place, replay: the graph follows the new data."""
    q, k, v, t, lens = make_case(num_seqs, 32, 8, 128, B, [max_len] * num_seqs, torch.bfloat16, device="cuda")
    args = (q, k, v, t, lens)
    paged_attention_decode(*args, impl="triton")  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention_decode(*args, impl="triton")
    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(seed)
        lens.copy_(torch.randint(1, max_len + 1, (num_seqs,), device="cuda", generator=g, dtype=torch.int32))
        # Every table entry is in use (all sequences had max_len): remap them to other blocks.
        pool_perm = torch.randperm(k.shape[0], device="cuda", generator=g)
        t.copy_(pool_perm[t.long()].to(torch.int32))
        q.copy_(torch.randn(q.shape, device="cuda", generator=g).to(q.dtype))
        graph.replay()
        ref = paged_attention_decode(q.float(), k.float(), v.float(), t, lens, impl="torch")
        check(out, ref, torch.bfloat16, "graph replay")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_triton_prefill(dtype):
    q, k, v, t, lens, cu = make_prefill([1, 7, 300, 64], [1, 1000, 300, 64], 32, 8, 128, dtype, device="cuda")
    ref = paged_attention_prefill(q.float(), k.float(), v.float(), t, lens, cu, impl="torch")
    check(paged_attention_prefill(q, k, v, t, lens, cu, impl="triton"), ref, dtype, "gpu prefill")
    check(paged_attention_prefill(q, k, v, t, lens, cu), ref, dtype, "gpu prefill auto")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [None, dict(ROWS=64, TILE=32, num_warps=4, num_stages=2), dict(ROWS=128, TILE=128, num_warps=8, num_stages=2)],
)
def test_gpu_triton_prefill_long_causal_and_prefix(config):
    from paged_edu.kernels.triton_prefill import paged_prefill_triton

    q, k, v, t, lens, cu = make_prefill(
        [2048, 129, 1, 700], [2048, 1153, 3000, 701], 32, 8, 128, torch.bfloat16, device="cuda", seed=4
    )
    ref = paged_attention_prefill(q.float(), k.float(), v.float(), t, lens, cu, impl="torch")
    check(paged_prefill_triton(q, k, v, t, lens, cu, scale=128**-0.5, config=config), ref, torch.bfloat16, "gpu")


@pytest.mark.parametrize("impl", ["loop", "torch", "triton"])
def test_stale_nan_slots_past_the_end_do_not_leak(impl):
    """Unused slots of a last block hold whatever an earlier owner left: NaN must not reach the output."""
    q, k, v, t, lens = make_case(3, 4, 2, 16, 4, [1, 3, 6], torch.float32, seed=5)
    ref = brute_force(q, k, v, t, lens, 0.25)
    for i, s in enumerate(lens.tolist()):
        last = int(t[i, (s - 1) // 4])
        k[last, s % 4 or 4 :] = float("nan")
        v[last, s % 4 or 4 :] = float("nan")
    if impl == "triton" and CUDA:
        q, k, v, t, lens = (x.cuda() for x in (q, k, v, t, lens))
    elif impl == "triton" and not triton_interpreting():
        pytest.skip("needs a GPU or TRITON_INTERPRET=1")
    out = paged_attention_decode(q, k, v, t, lens, scale=0.25, impl=impl)
    assert rel_err(out, ref) < (2e-3 if out.is_cuda else 1e-5)  # tf32 dots on the GPU


def test_validate_false_runs_no_python_check(monkeypatch):
    """``validate=False`` (an engine that built its inputs) runs not one Python input check, not even
    the shape and dtype checks; ``validate=True`` runs them all. int64 lengths are refused by the
    checks but computed right by the torch path, so the answer shows which ran."""
    from paged_edu.kernels import attention

    q, k, v, t, lens = make_case(2, 4, 2, 16, 4, [5, 9], torch.float32)
    ref = paged_attention_decode(q, k, v, t, lens, impl="torch")
    with pytest.raises(TypeError, match="seq_lens must be int32"):
        paged_attention_decode(q, k, v, t, lens.long(), impl="torch")
    calls = []
    for name in ("check_decode_inputs", "check_prefill_inputs", "check_scale"):
        real = getattr(attention, name)
        monkeypatch.setattr(
            attention, name, lambda *a, _real=real, _name=name, **kw: (calls.append(_name), _real(*a, **kw))[1]
        )
    out = paged_attention_decode(q, k, v, t, lens.long(), impl="torch", validate=False)
    torch.testing.assert_close(out, ref)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    paged_attention_prefill(q, k, v, t, lens, cu, impl="torch", validate=False)
    assert calls == []
    paged_attention_prefill(q, k, v, t, lens, cu, impl="torch")
    assert calls == ["check_prefill_inputs", "check_scale"]


@pytest.mark.parametrize("impl", ["torch", "auto"])
def test_validate_false_calls_no_check_even_of_impl(monkeypatch, impl):
    """Every check the kernel path has raises here; ``validate=False`` must still compute the
    answer (the PyTorch reference, on the CPU), ``validate=True`` must hit the first check."""
    from paged_edu.kernels import attention

    q, k, v, t, lens = make_case(2, 4, 2, 16, 4, [5, 9], torch.float32)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    ref_decode = paged_attention_decode(q, k, v, t, lens, impl="torch")
    ref_prefill = paged_attention_prefill(q, k, v, t, lens, cu, impl="torch")

    def refuse(*args, **kwargs):
        raise AssertionError("a Python check ran with validate=False")

    for name in ("check_impl", "check_decode_inputs", "check_prefill_inputs", "check_scale"):
        monkeypatch.setattr(attention, name, refuse)
    monkeypatch.setattr(attention, "kernel_support", lambda device: SimpleNamespace(use_triton=lambda kind: False))
    torch.testing.assert_close(paged_attention_decode(q, k, v, t, lens, impl=impl, validate=False), ref_decode)
    torch.testing.assert_close(paged_attention_prefill(q, k, v, t, lens, cu, impl=impl, validate=False), ref_prefill)
    with pytest.raises(AssertionError, match="validate=False"):
        paged_attention_decode(q, k, v, t, lens, impl=impl)
    with pytest.raises(AssertionError, match="validate=False"):
        paged_attention_prefill(q, k, v, t, lens, cu, impl=impl)

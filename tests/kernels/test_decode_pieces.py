"""The decode kernels' pieces (``paged_edu/kernels/decode/pieces.py``), each against the plain-PyTorch
reference of :mod:`paged_edu.kernels.online_softmax`, and the two kernels built from them against the
oracle -- the pieces lesson 4 reads are the ones checked here.

On the CPU the small kernels below run under the interpreter (``tests/conftest.py``); their shapes
(16 query rows, 16 columns, tiles of 16) are what a GPU's ``tl.dot`` accepts, so they run there too.
"""

from __future__ import annotations

import math

import pytest
import torch

from paged_edu.kernels import triton_available, triton_interpreting
from paged_edu.kernels.online_softmax import block_update, empty_state, merge_states
from paged_edu.kernels.reference import paged_attention_torch

pytestmark = pytest.mark.skipif(
    not (triton_available() and (triton_interpreting() or torch.cuda.is_available())),
    reason="needs Triton: a GPU, or the interpreter (TRITON_INTERPRET=1)",
)
DEVICE = "cpu" if triton_interpreting() else "cuda"
G, D, TILE = 16, 16, 16
LN2 = math.log(2.0)

if triton_available():
    import triton
    import triton.language as tl

    from paged_edu.kernels.decode.pieces import merge_splits, online_softmax_update, tile_range

    @triton.jit
    def _fold_tiles(
        q_ptr, k_ptr, v_ptr,  # (G, D), (NUM_TILES * TILE, D) each
        m_ptr, l_ptr, o_ptr,  # out: the state after each tile, (NUM_TILES, G), (NUM_TILES, G), (NUM_TILES, G, D)
        seq_len, qk_scale,  # tokens (the last tile may be partial); scale * log2(e)
        NUM_TILES: tl.constexpr, G: tl.constexpr, D: tl.constexpr, TILE: tl.constexpr,
    ):  # fmt: skip
        offs_g = tl.arange(0, G)
        offs_d = tl.arange(0, D)
        offs_t = tl.arange(0, TILE)
        q = tl.load(q_ptr + offs_g[:, None] * D + offs_d[None, :])
        m_i = tl.full([G], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([G], dtype=tl.float32)
        acc = tl.zeros([G, D], dtype=tl.float32)
        for tile in tl.static_range(NUM_TILES):
            rows = (tile * TILE + offs_t)[:, None] * D + offs_d[None, :]
            k = tl.load(k_ptr + rows)
            v = tl.load(v_ptr + rows)
            m_i, l_i, acc = online_softmax_update(
                q, m_i, l_i, acc, k, v, tile, seq_len, offs_t, qk_scale, TILE, True, "ieee"
            )
            tl.store(m_ptr + tile * G + offs_g, m_i)
            tl.store(l_ptr + tile * G + offs_g, l_i)
            tl.store(o_ptr + tile * G * D + offs_g[:, None] * D + offs_d[None, :], acc)

    @triton.jit
    def _merge(lse_ptr, o_ptr, out_ptr, SPLITS: tl.constexpr, D: tl.constexpr):
        offs_s = tl.arange(0, SPLITS)
        offs_d = tl.arange(0, D)
        lse = tl.load(lse_ptr + offs_s)
        o = tl.load(o_ptr + offs_s[:, None] * D + offs_d[None, :])
        tl.store(out_ptr + offs_d, merge_splits(lse, o))

    @triton.jit
    def _ranges(seq_lens_ptr, out_ptr, num_splits, TILE: tl.constexpr):
        seq = tl.program_id(0)
        split = tl.program_id(1)
        tile_lo, tile_hi, num_full = tile_range(tl.load(seq_lens_ptr + seq), split, num_splits, TILE)
        row = out_ptr + (seq * num_splits + split) * 3
        tl.store(row, tile_lo)
        tl.store(row + 1, tile_hi)
        tl.store(row + 2, num_full)


@pytest.mark.parametrize("seq_len", [TILE, 3 * TILE, 3 * TILE - 5])
def test_online_softmax_update_is_the_seeds_block_update(seq_len):
    """Tile by tile, the kernel's state (in log2 units) is ``block_update``'s (natural units): ``m``
    scaled by ln 2, ``l`` and ``o`` the same; the mask on the partial tile included."""
    num_tiles = -(-seq_len // TILE)
    g = torch.Generator().manual_seed(seq_len)
    q = torch.randn(G, D, generator=g)
    k = torch.randn(num_tiles * TILE, D, generator=g)
    v = torch.randn(num_tiles * TILE, D, generator=g)
    scale = D**-0.5
    m, l, o = (torch.empty(num_tiles, G), torch.empty(num_tiles, G), torch.empty(num_tiles, G, D))
    args = [t.to(DEVICE) for t in (q, k, v, m, l, o)]
    _fold_tiles[(1,)](*args, seq_len, scale * math.log2(math.e), NUM_TILES=num_tiles, G=G, D=D, TILE=TILE)
    m, l, o = (t.cpu() for t in args[3:])
    state = empty_state(G, D)
    for b in range(num_tiles):
        rows = slice(b * TILE, (b + 1) * TILE)
        valid = torch.arange(b * TILE, (b + 1) * TILE) < seq_len
        values = v[rows].expand(G, TILE, D)  # every query head sees the same V: one KV head
        state = block_update(*state, q @ k[rows].T * scale, values, valid)
        torch.testing.assert_close(m[b] * LN2, state[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(l[b], state[1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(o[b], state[2], rtol=1e-5, atol=1e-5)


def test_merge_splits_is_merge_states_with_an_empty_split():
    """Four splits' ``(lse_j, o_j / l_j)`` -- the last one empty (``lse = -inf``, ``o = 0``) -- merge to
    ``o / l`` of the states folded with ``merge_states``."""
    g = torch.Generator().manual_seed(7)
    m = torch.randn(4, generator=g)
    l = torch.rand(4, generator=g) + 1
    o = torch.randn(4, D, generator=g)
    m[3], l[3], o[3] = float("-inf"), 0.0, 0.0
    state = (m[0], l[0], o[0])
    for j in range(1, 4):
        state = merge_states(*state, m[j], l[j], o[j])
    lse = torch.where(l > 0, (m + torch.log(l.clamp_min(1e-30))) / LN2, torch.tensor(float("-inf")))  # log2 units
    normalised = torch.where(l[:, None] > 0, o / l.clamp_min(1e-30)[:, None], torch.zeros(()))
    out = torch.empty(D, device=DEVICE)
    _merge[(1,)](lse.to(DEVICE), normalised.to(DEVICE), out, SPLITS=4, D=D)
    torch.testing.assert_close(out.cpu(), state[2] / state[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 5, 8])
def test_tile_ranges_cover_every_tile_once(num_splits):
    """For each sequence the splits' ranges partition its tiles ``0 .. ceil(s / TILE) - 1`` in order,
    and ``num_full`` marks the first partial tile (none when ``TILE`` divides ``s``)."""
    lens = torch.tensor([1, 15, 16, 17, 100, 160], dtype=torch.int32)
    out = torch.empty(len(lens), num_splits, 3, dtype=torch.int32)
    args = [t.to(DEVICE) for t in (lens, out)]
    _ranges[(len(lens), num_splits)](*args, num_splits, TILE=TILE)
    ranges = args[1].cpu()
    for i, s in enumerate(lens.tolist()):
        tiles = [t for lo, hi, _ in ranges[i].tolist() for t in range(lo, hi)]
        assert tiles == list(range(-(-s // TILE))), (s, ranges[i])
        for lo, hi, num_full in ranges[i].tolist():
            assert num_full == min(hi, s // TILE)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_the_tutorial_kernel_matches_the_reference(num_splits):
    """``paged_decode_kernel`` -- what lesson 4 reads, launched by ``paged_attention_triton`` -- against the
    vectorised PyTorch oracle: GQA groups of 3, ragged lengths, a partial last tile, split or not."""
    from paged_edu.kernels.decode.tutorial import paged_attention_triton
    from paged_edu.labs.timing import random_paged_case

    q, k, v, tables, _ = random_paged_case(3, 80, 6, 2, 32, 16, dtype=torch.float32, device=DEVICE, seed=1)
    lens = torch.tensor([80, 1, 37], dtype=torch.int32, device=DEVICE)
    ref = paged_attention_torch(q, k, v, tables, lens, scale=32**-0.5)
    out = paged_attention_triton(q, k, v, tables, lens, scale=32**-0.5, num_splits=num_splits)
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)

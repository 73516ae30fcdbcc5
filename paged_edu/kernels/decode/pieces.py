"""
The pieces the decode kernels are built from
============================================

Both decode kernels -- the one lesson 4 reads (:mod:`~paged_edu.kernels.decode.tutorial`) and the
engine's pure-decode kernel (:mod:`~paged_edu.kernels.decode.fast`) -- are these ``@triton.jit``
functions put together. Triton inlines a helper into its caller, so a piece costs nothing at run time:
the compiled kernel is the same instructions as if its body were written out in place.

For one program -- the ``G`` query heads of one KV head of sequence ``n``, one split of its tiles --
with ``TILE`` tokens per tile, scores in log2 units (``c = scale * log2(e)``, so ``exp(x * scale) =
exp2(x * c)``), and the state ``(m, l, o)`` starting at ``(-inf, 0, 0)``:

* :func:`tile_range` -- which tiles: the sequence's ``ceil(s / TILE)`` tiles cut into ``num_splits``
  equal ranges; the tiles below ``num_full`` are whole, the one after may be partial;
* :func:`group_offsets` -- GQA packing: the ``G`` query heads that share a KV head are the rows of one
  ``(GROUP_PAD, HEAD_DIM_PAD)`` query tile, so every K/V byte is loaded once for all of them;
* :func:`load_tile` -- a tile's keys and values, gathered through the block table: token ``t`` lives
  in physical block ``B(t // B)`` at offset ``t % B``;
* :func:`online_softmax_update` -- the seed's update for one tile::

      S = q K^T * c                       (G, TILE), -inf past the last token
      m' = max(m, rowmax(S))
      P = exp2(S - m')
      l' = l * exp2(m - m') + rowsum(P)
      o' = o * exp2(m - m') + P V

* :func:`attend_tile` -- the two above, one tile;
* :func:`attend_tiles` -- a split's tiles in two loops: the whole tiles without any mask (the hot loop),
  then the partial last tile, masked;
* :func:`write_result` -- ``o / l`` to the output, or, with split-KV, this split's ``o_j / l_j`` and
  ``lse_j = m_j + log2(l_j)`` to fp32 scratch for the merge;
* :func:`merge_splits` -- the merge: ``O = sum_j 2^(lse_j - M) o_j / sum_j 2^(lse_j - M)``,
  ``M = max_j lse_j``.

Under the Triton interpreter bf16 arithmetic is wrong (the values are handled as raw bits), so every
tile is converted to fp32 right after its load there (``UPCAST``, a constant of the process).
"""

from __future__ import annotations

import triton
import triton.language as tl

from paged_edu.kernels.triton_fused import INTERPRETING

__all__ = [
    "UPCAST",
    "attend_tile",
    "attend_tiles",
    "group_offsets",
    "load_tile",
    "merge_splits",
    "online_softmax_update",
    "tile_range",
    "write_result",
]

# The kernels were decorated under the interpreter: compute in fp32 right after every load (bf16 is wrong there).
UPCAST: tl.constexpr = tl.constexpr(INTERPRETING)


@triton.jit
def tile_range(seq_len, split, num_splits, TILE: tl.constexpr):
    """This split's tiles ``tile_lo .. tile_hi - 1``, and ``num_full``: tiles below it need no mask."""
    num_tiles = tl.cdiv(seq_len, TILE)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)  # a split past the end has tile_lo >= tile_hi
    num_full = tl.minimum(tile_hi, seq_len // TILE)
    return tile_lo, tile_hi, num_full


@triton.jit
def group_offsets(
    kv_head,  # this program's KV head h
    GROUP: tl.constexpr,  # G, query heads per KV head
    GROUP_PAD: tl.constexpr,  # G rounded up to a power of two (>= 16 on a GPU, for tl.dot)
    HEAD_DIM: tl.constexpr,  # D
    HEAD_DIM_PAD: tl.constexpr,  # D rounded up to a power of two
    TILE: tl.constexpr,  # tokens per tile
):  # fmt: skip
    """The group's query heads ``h*G .. h*G+G-1`` as the rows of one tile, padded with masked rows to
    ``GROUP_PAD``: ``(q_heads, g_mask)`` ``(GROUP_PAD,)``, the columns ``(offs_d, d_mask)`` ``(HEAD_DIM_PAD,)``,
    and a tile's token offsets ``offs_t`` ``(TILE,)``."""
    offs_g = tl.arange(0, GROUP_PAD)  # (GROUP_PAD,) query heads of the group
    offs_d = tl.arange(0, HEAD_DIM_PAD)  # (HEAD_DIM_PAD,)
    offs_t = tl.arange(0, TILE)  # (TILE,)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    q_heads = kv_head * GROUP + offs_g  # (GROUP_PAD,)
    return q_heads, g_mask, offs_d, d_mask, offs_t


@triton.jit
def load_tile(
    tile, seq_len,  # which tile of TILE tokens (positions tile*TILE ...); tokens in the sequence
    bt_row_ptr,  # this sequence's row of the block table
    k_head_ptr, stride_k_block, stride_k_tok,  # k_cache advanced to this KV head, and its strides
    v_head_ptr, stride_v_block, stride_v_tok,  # v_cache advanced to this KV head, and its strides
    offs_t, offs_d, d_mask,  # aranges (TILE,), (HEAD_DIM_PAD,) and the head_dim mask
    BLOCK_SIZE: tl.constexpr,  # B, tokens per KV block
    TILE: tl.constexpr,  # tokens per tile
    EVEN_D: tl.constexpr,  # head_dim is a power of two: no mask along it (keeps 16-byte loads)
    MASKED: tl.constexpr,  # rows at or past seq_len read as 0 (the last, partial tile)
):  # fmt: skip
    """The tile's keys and values, ``(TILE, HEAD_DIM_PAD)`` each, gathered through the block table."""
    pos = tile * TILE + offs_t  # (TILE,) logical token positions
    if MASKED:
        valid = pos < seq_len
        # Entries past the sequence's last block may be garbage: never dereference them.
        block_ids = tl.load(bt_row_ptr + pos // BLOCK_SIZE, mask=valid, other=0)
    else:
        block_ids = tl.load(bt_row_ptr + pos // BLOCK_SIZE)
    # int64 before the multiply: block_id * stride_block overflows int32 on big pools.
    row_k = block_ids.to(tl.int64) * stride_k_block + (pos % BLOCK_SIZE) * stride_k_tok  # (TILE,)
    row_v = block_ids.to(tl.int64) * stride_v_block + (pos % BLOCK_SIZE) * stride_v_tok  # (TILE,)
    k_ptrs = k_head_ptr + row_k[:, None] + offs_d[None, :]  # (TILE, HEAD_DIM_PAD)
    v_ptrs = v_head_ptr + row_v[:, None] + offs_d[None, :]  # (TILE, HEAD_DIM_PAD)
    # Masks only where needed: a mask that varies along head_dim would split the 16-byte loads (how much
    # that costs was not measured on its own; the whole kernel's figures are in the tutorial's docstring).
    if MASKED:
        if EVEN_D:
            k = tl.load(k_ptrs, mask=valid[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=valid[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs, mask=valid[:, None] & d_mask[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=valid[:, None] & d_mask[None, :], other=0.0)
    elif EVEN_D:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=d_mask[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def online_softmax_update(
    q,  # (GROUP_PAD, HEAD_DIM_PAD) the group's queries, in the dot's dtype
    m_i, l_i, acc,  # running max (GROUP_PAD,), normaliser (GROUP_PAD,), output (GROUP_PAD, HEAD_DIM_PAD)
    k, v,  # (TILE, HEAD_DIM_PAD) the tile's keys and values (load_tile)
    tile, seq_len, offs_t,  # which tile; tokens in the sequence; arange (TILE,)
    qk_scale,  # scale * log2(e): scores in base 2, so exp2 can be used
    TILE: tl.constexpr,  # tokens per tile
    MASKED: tl.constexpr,  # positions at or past seq_len get no weight
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (exact), "tf32" otherwise (ignored for 16-bit)
):  # fmt: skip
    """One step of the online softmax over a loaded tile: the updated ``(m_i, l_i, acc)``."""
    # S = q K^T * scale, in log2 units: (GROUP_PAD, TILE), accumulated in fp32.
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        s = tl.where((tile * TILE + offs_t < seq_len)[None, :], s, float("-inf"))  # M_b: past the last token
    # Online softmax, the seed's equations with exp2 instead of exp.
    m_new = tl.maximum(m_i, tl.max(s, 1))  # (GROUP_PAD,)
    alpha = tl.exp2(m_i - m_new)  # rescales what came before; 0 on the first tile
    p = tl.exp2(s - m_new[:, None])  # (GROUP_PAD, TILE)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def attend_tile(
    q, m_i, l_i, acc,  # the group's queries and the running (m, l, o), as online_softmax_update takes them
    tile, seq_len,  # which tile of TILE tokens (positions tile*TILE ...); tokens in the sequence
    bt_row_ptr,  # this sequence's row of the block table
    k_head_ptr, stride_k_block, stride_k_tok,  # k_cache advanced to this KV head, and its strides
    v_head_ptr, stride_v_block, stride_v_tok,  # v_cache advanced to this KV head, and its strides
    offs_t, offs_d, d_mask,  # aranges (TILE,), (HEAD_DIM_PAD,) and the head_dim mask
    qk_scale,  # scale * log2(e)
    BLOCK_SIZE: tl.constexpr,  # B, tokens per KV block
    TILE: tl.constexpr,  # tokens per tile
    EVEN_D: tl.constexpr,  # head_dim is a power of two: no mask along it
    MASKED: tl.constexpr,  # True only for the last, partial tile
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, "tf32" otherwise
):  # fmt: skip
    """Load one tile (:func:`load_tile`) and fold it into the online softmax (:func:`online_softmax_update`)."""
    k, v = load_tile(
        tile, seq_len, bt_row_ptr,
        k_head_ptr, stride_k_block, stride_k_tok,
        v_head_ptr, stride_v_block, stride_v_tok,
        offs_t, offs_d, d_mask, BLOCK_SIZE, TILE, EVEN_D, MASKED,
    )  # fmt: skip
    return online_softmax_update(q, m_i, l_i, acc, k, v, tile, seq_len, offs_t, qk_scale, TILE, MASKED, DOT_PRECISION)


@triton.jit
def attend_tiles(
    q, m_i, l_i, acc,  # the group's queries and the running (m, l, o), as online_softmax_update takes them
    first, num_full, tile_hi, seq_len,  # tiles first .. tile_hi - 1, whole below num_full; tokens in the sequence
    bt_row_ptr,  # this sequence's row of the block table
    k_head_ptr, stride_k_block, stride_k_tok,  # k_cache advanced to this KV head, and its strides
    v_head_ptr, stride_v_block, stride_v_tok,  # v_cache advanced to this KV head, and its strides
    offs_t, offs_d, d_mask,  # aranges (TILE,), (HEAD_DIM_PAD,) and the head_dim mask
    qk_scale,  # scale * log2(e)
    BLOCK_SIZE: tl.constexpr,  # B, tokens per KV block
    TILE: tl.constexpr,  # tokens per tile
    EVEN_D: tl.constexpr,  # head_dim is a power of two: no mask along it
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, "tf32" otherwise
):  # fmt: skip
    """The online softmax over tiles ``first .. tile_hi - 1`` (:func:`attend_tile` each): the updated ``(m, l, o)``."""
    # Whole tiles, no masks: the hot loop. Triton software-pipelines it (num_stages), prefetching
    # the block ids and then the K/V rows of the next tiles while this one is computed (what the
    # pipeline depth buys, measured: decode_config, split_plan).
    for tile in range(first, num_full):
        m_i, l_i, acc = attend_tile(
            q, m_i, l_i, acc, tile, seq_len, bt_row_ptr,
            k_head_ptr, stride_k_block, stride_k_tok, v_head_ptr, stride_v_block, stride_v_tok,
            offs_t, offs_d, d_mask, qk_scale, BLOCK_SIZE, TILE, EVEN_D, False, DOT_PRECISION,
        )  # fmt: skip
    # At most one partial tile: the sequence's last, and only in the last non-empty split.
    for tile in range(tl.maximum(num_full, first), tile_hi):
        m_i, l_i, acc = attend_tile(
            q, m_i, l_i, acc, tile, seq_len, bt_row_ptr,
            k_head_ptr, stride_k_block, stride_k_tok, v_head_ptr, stride_v_block, stride_v_tok,
            offs_t, offs_d, d_mask, qk_scale, BLOCK_SIZE, TILE, EVEN_D, True, DOT_PRECISION,
        )  # fmt: skip
    return m_i, l_i, acc


@triton.jit
def write_result(
    m_i, l_i, acc,  # the program's final (m, l, o), o unnormalised
    seq, split, num_splits,  # this program's sequence and split; splits per sequence
    q_heads, g_mask, offs_d, d_mask,  # (GROUP_PAD,) the group's query heads and their mask; (HEAD_DIM_PAD,) columns
    out_ptr, stride_o_seq, stride_o_head,  # (num_seqs, H, D): written when not SPLIT
    part_o_ptr, part_lse_ptr, num_q_heads,  # SPLIT: fp32 scratch (see the kernels); H
    HEAD_DIM_PAD: tl.constexpr,  # D rounded up to a power of two: the scratch's row width
    SPLIT: tl.constexpr,  # write o_j / l_j and lse_j for the merge instead of o / l
):  # fmt: skip
    """``o / l`` into ``out``; with ``SPLIT`` this split's ``o_j / l_j`` and ``lse_j = m_j + log2(l_j)``."""
    if SPLIT:
        # A split past the sequence's end saw no token (l = 0): record o = 0, lse = -inf so the
        # merge gives it weight exp(-inf) = 0.
        empty = l_i == 0.0
        o = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        row = (seq * num_q_heads + q_heads) * num_splits + split  # (GROUP_PAD,)
        tl.store(part_lse_ptr + row, lse, mask=g_mask)
        tl.store(part_o_ptr + row[:, None] * HEAD_DIM_PAD + offs_d[None, :], o, mask=g_mask[:, None])
    else:
        o = acc / l_i[:, None]  # l >= 1: every sequence has a token
        out_ptrs = out_ptr + seq * stride_o_seq + q_heads[:, None] * stride_o_head + offs_d[None, :]
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


@triton.jit
def merge_splits(lse, o):
    """The output over all splits from each split's ``lse_j`` ``(SPLITS_PAD,)`` and ``o_j / l_j``
    ``(SPLITS_PAD, HEAD_DIM_PAD)``: ``sum_j 2^(lse_j - M) o_j / sum_j 2^(lse_j - M)``, ``M = max_j lse_j``."""
    m = tl.max(lse, 0)  # finite: split 0 always holds the sequence's first token
    w = tl.exp2(lse - m)  # (SPLITS_PAD,) weight of each split, 0 for empty ones
    return tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)  # (HEAD_DIM_PAD,)

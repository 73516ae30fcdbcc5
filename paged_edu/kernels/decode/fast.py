"""
The engine's decode kernel: the new token's rotary embedding and K/V store in the same launch
=============================================================================================

:func:`rotary_store_decode_kernel` is :func:`~paged_edu.kernels.decode.tutorial.paged_decode_kernel` -- the same
pieces (:mod:`~paged_edu.kernels.decode.pieces`: the tile range, the tile load, the online-softmax update,
the result and the split merge), the same tiles and loads -- with two speed mechanisms added, each
measured below. A pure-decode step of the engine runs it (``Kernels.fuse_decode_store``, on by default);
a step with prompt chunks runs the tutorial kernel after a separate store.

Storing the new token on the way in
-----------------------------------
A decode step of a small model is bound by the *number* of kernels: SmolLM2-135M's 30 layers run
about 300 launches per step even with the per-token ops fused (:mod:`~paged_edu.kernels.triton_fused`),
each a few microseconds of mostly fixed cost. On an H200 at batch 1 the step took 940 us against a
roofline of 53 us of weight reads (``benchmarks/records/h200/layer_bench_8ecf92c.json``): the launches are the
floor. Per layer the new token's rotary embedding and K/V store
(:func:`~paged_edu.kernels.triton_store.rotary_store_kv_triton`) is its own launch, only to hand
the rotated q and the stored k to the attention kernel. So in a pure-decode step this kernel does it:
:func:`rotary_store_decode_triton` takes the *unrotated* q, k, v of the qkv projection; every
program rotates its group's q rows (the same :func:`~paged_edu.kernels.triton_store.rope`, so the
same bits as the two launches), and the one program per (sequence, KV head) whose split holds
position ``s - 1`` rotates k and stores k and v at the slot, then ``tl.debug_barrier()`` -- a
barrier of the program's threads that orders their global stores before the tile loads -- before
it reads. No other program reads that token: other splits end before its tile, other KV heads read
other columns of the row. One launch fewer per layer: 30 per SmolLM2 step. Steps with prompt
chunks keep the separate store (the prefill kernel reads the chunk's tokens from many programs).

The rounding we write must survive the compiler. ``rope`` rounds each product to bf16 before the
sum, as PyTorch does; with Triton's default ``enable_fp_fusion=True`` the compiled kernel did not
keep that rounding on the H200 (``python benchmarks/probe_fp_fusion.py``: 2,119 of the 12,288 keys a
64-sequence SmolLM2 step stores differed from PyTorch's), and after 30 random layers the logits had
moved 4.0e-2 (relative) where the two-launch path stays within 2e-3. Launched with
``enable_fp_fusion=False`` -- as the store kernel always was -- no key differs, and the outputs of the
one- and two-launch paths differ in 13 of 36,864 values, by at most 2**-8 (the two kernels are
different code). ``tests/kernels/test_fused.py`` holds both on the GPU; under the interpreter the paths agree
bit for bit either way (numpy never contracts ``a * b + c``).

Measured on the H200 (``python benchmarks/bench_layer.py --batches 1,16,256 --swiglu-gemm``,
``benchmarks/records/h200/layer_bench_store_swiglu.json``): at batch 256 a decode step of 244 kernels (274 with the
separate store) in 1,732 us (1,812), its logits 9.4e-3 from the PyTorch path's.

Before the wait (``PRELOAD``)
-----------------------------
Launched as a programmatic dependent (:mod:`~paged_edu.kernels.pdl`), the kernel may run everything
that reads no earlier kernel's output before ``gdc_wait``. Only q and the new token's k, v come from
the previous kernel (the qkv projection); the sequence's length, its block table row, its position,
slot and rotary row were written before the step, and the cache rows of its past by earlier steps. So
with ``PRELOAD`` each program computes its range and gathers its *first tile* -- block ids, then keys and
values, two round trips to HBM -- before the wait. That tile may hold the new token's row, which this
very kernel stores after the wait (the holder split, above): loaded stale, it is replaced in registers
by the values the program stores (``tl.where`` on that row), the same bits the store-then-load path
reads. Later tiles are loaded in the loop, after the barrier, as before. ``PRELOAD`` follows ``USE_PDL``
unless a config says otherwise (tests run both under the interpreter, where there is no wait).

Measured on the H200 (script ``benchmarks/records/h200/preload2_ab_script.txt``, log ``benchmarks/records/h200/preload2_ab_log.txt``: a whole
SmolLM2 decode step in a CUDA graph, context 512, L2 flushed, three interleaved rounds, us), with the
skinny GEMM's own ``PRELOAD`` (:mod:`~paged_edu.kernels.triton_gemm`, "The weight before the wait") on
in both columns: 671 -> **627** at batch 1, 779 -> 753 at 16, 921 -> 896 at 32, 1,089 -> 1,060 at 48,
1,177 -> **1,116** at 64, the logits bit for bit the same. At 256 rows, where the step launches nothing
as a dependent, loading early only cost registers (1,730 -> 1,749): there it stays off.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from paged_edu.kernels.checks import check_rotary_store_inputs
from paged_edu.kernels.decode.pieces import (
    UPCAST,
    attend_tiles,
    group_offsets,
    load_tile,
    online_softmax_update,
    tile_range,
    write_result,
)
from paged_edu.kernels.decode.tutorial import merge, plan_launch
from paged_edu.kernels.pdl import launch_options, wait_for_previous_kernel
from paged_edu.kernels.triton_store import rotary_cos_sin, rotate_rows

__all__ = ["NewTokens", "rotary_store_decode_kernel", "rotary_store_decode_triton"]


class NewTokens(NamedTuple):
    """Each sequence's new key and value as the qkv projection left them, with where the token goes: one
    kernel argument (Triton passes a named tuple's fields as the kernel's own arguments, each specialised
    as usual -- the kernel compiles as if they were listed one by one, in this order)."""

    key: torch.Tensor  # (num_seqs, H_kv, D), not yet rotated
    value: torch.Tensor  # (num_seqs, H_kv, D)
    slot_mapping: torch.Tensor  # int (num_seqs,): the token's slot; -1 = padding, store nothing
    positions: torch.Tensor  # int (num_seqs,): its position p = s - 1
    cos_table: torch.Tensor  # (max_positions, D): the rotary tables
    sin_table: torch.Tensor
    stride_key_seq: int
    stride_key_head: int  # key strides (head_dim stride is 1)
    stride_value_seq: int
    stride_value_head: int  # value strides (head_dim stride is 1)
    stride_table: int  # the tables' row stride


@triton.jit
def store_new_token(
    new, seq, kv_head,  # NewTokens; this program's sequence and KV head
    slot, c, s, store, offs_d,  # the token's slot; its rotary row (rotary_cos_sin); where to store; arange (HEAD_DIM_PAD,)
    k_cache_ptr, stride_k_block, stride_k_tok, stride_k_head,  # (num_blocks, B, H_kv, D)
    v_cache_ptr, stride_v_block, stride_v_tok, stride_v_head,  # (num_blocks, B, H_kv, D)
    HEAD_DIM: tl.constexpr,  # D
    BLOCK_SIZE: tl.constexpr,  # B
    dtype: tl.constexpr,  # the model's dtype: the rotation rounds to it
    BY_HAND: tl.constexpr,  # round_to rounds by hand (the interpreter, bf16)
):  # fmt: skip
    """Rotate the token's key and store key and value at its slot, where ``store`` (the holder split of
    a real token); then a barrier of the program's threads, so that its tile loads see the stores.
    Returns the rotated key (fp32, rounded to ``dtype``) and the value, ``(HEAD_DIM_PAD,)`` each."""
    key_row = new.key + seq * new.stride_key_seq + kv_head * new.stride_key_head
    k_new = rotate_rows(key_row, offs_d, store, c, s, HEAD_DIM, dtype, BY_HAND)  # (HEAD_DIM_PAD,) fp32, rounded
    v_new = tl.load(new.value + seq * new.stride_value_seq + kv_head * new.stride_value_head + offs_d, mask=store)
    block = slot // BLOCK_SIZE  # physical block B(t // B) of the new token
    offset = slot % BLOCK_SIZE  # t mod B
    tl.store(
        k_cache_ptr + block * stride_k_block + offset * stride_k_tok + kv_head * stride_k_head + offs_d,
        k_new.to(dtype),
        mask=store,
    )
    tl.store(
        v_cache_ptr + block * stride_v_block + offset * stride_v_tok + kv_head * stride_v_head + offs_d,
        v_new,
        mask=store,
    )
    # A CTA-wide barrier orders global memory too: every thread of this program now sees the token.
    # No other program reads it (other splits stop before its tile; other heads read other columns).
    tl.debug_barrier()
    return k_new, v_new


@triton.jit(do_not_specialize=["num_splits", "stride_bt_seq"])  # as paged_decode_kernel: no recompiles mid-run
def rotary_store_decode_kernel(
    q_ptr,  # (num_seqs, H, D): the new tokens' queries, not yet rotated
    k_cache_ptr, v_cache_ptr,  # (num_blocks, B, H_kv, D) each
    block_tables_ptr,  # int32 (num_seqs, max_blocks)
    seq_lens_ptr,  # int32 (num_seqs,): s, the new token included
    out_ptr,  # (num_seqs, H, D): written when not SPLIT
    part_o_ptr, part_lse_ptr,  # SPLIT: fp32 partial results, as paged_decode_kernel's
    qk_scale,  # softmax scale * log2(e)
    num_splits,  # splits per sequence (runtime)
    num_q_heads,  # H
    stride_q_seq, stride_q_head,  # q's strides
    stride_k, stride_v,  # k_cache's and v_cache's strides (block, token, head): a tuple each
    stride_bt_seq,  # block_tables' row stride
    stride_o_seq, stride_o_head,  # out's strides
    new,  # NewTokens: each sequence's new key and value (unrotated), its slot, position and rotary tables
    GROUP: tl.constexpr,  # G = H / H_kv
    GROUP_PAD: tl.constexpr,  # G rounded up to a power of two (>= 16 on a GPU, for tl.dot)
    HEAD_DIM: tl.constexpr,  # D
    HEAD_DIM_PAD: tl.constexpr,  # D rounded up to a power of two
    BLOCK_SIZE: tl.constexpr,  # B, tokens per KV block
    TILE: tl.constexpr,  # tokens per loop step
    SPLIT: tl.constexpr,  # num_splits > 1: write partial results for the merge
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent (paged_edu.kernels.pdl)
    PRELOAD: tl.constexpr,  # the first tile loaded before the wait (module docstring, "Before the wait")
):  # fmt: skip
    """``paged_decode_kernel``'s attention for a pure-decode step, after rotating q and the new key by
    position ``s - 1`` and storing the new key and value at their slot (module docstring)."""
    if not PRELOAD:
        wait_for_previous_kernel(USE_PDL)  # q (and the new key, value) are the previous kernel's output
    kv_head = tl.program_id(0)  # KV heads fastest, as in paged_decode_kernel
    seq = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    tile_lo, tile_hi, num_full = tile_range(seq_len, split, num_splits, TILE)

    q_heads, g_mask, offs_d, d_mask, offs_t = group_offsets(kv_head, GROUP, GROUP_PAD, HEAD_DIM, HEAD_DIM_PAD, TILE)
    q_ptrs = q_ptr + seq * stride_q_seq + q_heads[:, None] * stride_q_head  # (GROUP_PAD, 1) row starts
    q_mask = g_mask[:, None] & d_mask[None, :]
    stride_k_block, stride_k_tok, stride_k_head = stride_k
    stride_v_block, stride_v_tok, stride_v_head = stride_v
    bt_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    k_head_ptr = k_cache_ptr + kv_head * stride_k_head
    v_head_ptr = v_cache_ptr + kv_head * stride_v_head
    # Every program rotates its group's queries itself (the same rope as triton_store's kernel, so the
    # same bits); the program whose split holds the new token, position seq_len - 1, rotates its k,
    # stores k and v at the slot, and waits for its threads' stores before reading tiles. One launch a
    # layer fewer (H200, batch 256: 244 kernels a step instead of 274, 1,732 us instead of 1,812).
    dtype: tl.constexpr = q_ptr.dtype.element_ty
    BY_HAND: tl.constexpr = UPCAST and dtype == tl.bfloat16  # round_to rounds by hand: interpreted bf16
    DOT_PRECISION: tl.constexpr = "ieee" if dtype == tl.float32 else "tf32"
    table_row = tl.load(new.positions + seq).to(tl.int64) * new.stride_table
    c, s = rotary_cos_sin(new.cos_table, new.sin_table, table_row, offs_d, HEAD_DIM, dtype, BY_HAND)  # (HEAD_DIM_PAD,)
    slot = tl.load(new.slot_mapping + seq).to(tl.int64)
    num_tiles = tl.cdiv(seq_len, TILE)
    holder = (num_tiles - 1) // tl.cdiv(num_tiles, num_splits)  # the split whose tiles hold position seq_len - 1
    # (HEAD_DIM_PAD,); the scalar tests broadcast as tensors (the interpreter refuses a scalar bool).
    store = d_mask & ((offs_d * 0 + slot) >= 0) & ((offs_d * 0 + split) == holder)
    if PRELOAD:
        # Nothing above reads an earlier kernel's output, nor does the first tile: the cache rows of the
        # past were written by earlier steps. Its loads overlap the previous kernel (H200, a whole step:
        # 671 -> 627 us at batch 1, 1,177 -> 1,116 at 64). The new token's row, which this kernel itself
        # stores below, is read stale here and replaced in registers.
        k_first, v_first = load_tile(
            tile_lo, seq_len, bt_row_ptr, k_head_ptr, stride_k_block, stride_k_tok, v_head_ptr, stride_v_block,
            stride_v_tok, offs_t, offs_d, d_mask, BLOCK_SIZE, TILE, HEAD_DIM == HEAD_DIM_PAD, True,
        )  # fmt: skip
        wait_for_previous_kernel(USE_PDL)  # q and the new key, value are the previous kernel's output
    q = rotate_rows(q_ptrs, offs_d[None, :], q_mask, c, s, HEAD_DIM, dtype, BY_HAND)  # fp32, rounded
    if not UPCAST:
        q = q.to(dtype)  # exact: already rounded to dtype
    k_new, v_new = store_new_token(
        new, seq, kv_head, slot, c, s, store, offs_d,
        k_cache_ptr, stride_k_block, stride_k_tok, stride_k_head,
        v_cache_ptr, stride_v_block, stride_v_tok, stride_v_head, HEAD_DIM, BLOCK_SIZE, dtype, BY_HAND,
    )  # fmt: skip

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)  # running max (log2 units)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)  # running normaliser
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)  # unnormalised output
    first = tile_lo  # the loops' first tile
    if PRELOAD:
        if tile_lo < tile_hi:  # a split past the sequence's end has no first tile
            # The new token's row, where this program stored it: the values just stored, not the stale ones.
            new_row = ((tile_lo * TILE + offs_t) == seq_len - 1)[:, None] & store[None, :]  # (TILE, HEAD_DIM_PAD)
            k_first = tl.where(new_row, k_new.to(k_first.dtype)[None, :], k_first)
            v_first = tl.where(new_row, v_new.to(v_first.dtype)[None, :], v_first)
            m_i, l_i, acc = online_softmax_update(
                q, m_i, l_i, acc, k_first, v_first, tile_lo, seq_len, offs_t, qk_scale, TILE, True, DOT_PRECISION
            )
        first = tile_lo + 1
    m_i, l_i, acc = attend_tiles(  # the rest of the split's tiles, as in paged_decode_kernel
        q, m_i, l_i, acc, first, num_full, tile_hi, seq_len, bt_row_ptr,
        k_head_ptr, stride_k_block, stride_k_tok, v_head_ptr, stride_v_block, stride_v_tok,
        offs_t, offs_d, d_mask, qk_scale, BLOCK_SIZE, TILE, HEAD_DIM == HEAD_DIM_PAD, DOT_PRECISION,
    )  # fmt: skip
    write_result(
        m_i, l_i, acc, seq, split, num_splits, q_heads, g_mask, offs_d, d_mask,
        out_ptr, stride_o_seq, stride_o_head, part_o_ptr, part_lse_ptr, num_q_heads, HEAD_DIM_PAD, SPLIT,
    )  # fmt: skip


def rotary_store_decode_triton(
    q: torch.Tensor,  # (num_seqs, num_q_heads, head_dim), not yet rotated
    key: torch.Tensor,  # (num_seqs, num_kv_heads, head_dim), not yet rotated
    value: torch.Tensor,  # (num_seqs, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # int32 (num_seqs, max_blocks)
    seq_lens: torch.Tensor,  # int32 (num_seqs,): s, the new token included
    slot_mapping: torch.Tensor,  # int (num_seqs,): the new token's slot, -1 = store nothing
    positions: torch.Tensor,  # int (num_seqs,): the new token's position, s - 1
    cos_table: torch.Tensor,  # (max_positions, head_dim), fp32 or the model's dtype
    sin_table: torch.Tensor,  # (max_positions, head_dim), fp32 or the model's dtype
    *,
    scale: float,
    num_splits: int | None = None,  # None: choose_num_splits; tests force values
    config: dict | None = None,  # overrides of decode_config
    pdl: bool = False,  # launch both kernels as programmatic dependents where the GPU can (kernels.pdl)
) -> torch.Tensor:  # (num_seqs, num_q_heads, head_dim)
    """A pure-decode step's attention with its rotary embedding and K/V store in the same launch.

    For each sequence ``n`` with one new token at position ``p = s_n - 1`` and slot ``slot_n``::

        q'  = RoPE(q_n, p)                                  (triton_store's rope and rounding)
        K[slot_n], V[slot_n] = RoPE(key_n, p), value_n      (skipped where slot_n = -1)
        o_n = softmax(q' K_{0..p}^T * scale) V_{0..p}       (the new token included)

    -- what :func:`~paged_edu.kernels.triton_store.rotary_store_kv_triton` followed by
    :func:`~paged_edu.kernels.decode.tutorial.paged_attention_triton` compute, in one kernel (two with the
    split merge) instead of two (three). ``q``, ``key`` and ``value`` may be strided views of one qkv
    projection. The caller guarantees what the model's runner does: inputs as
    :func:`paged_edu.kernels.paged_attention_decode` validates them, ``slot_n`` the slot that ``block_tables``
    gives position ``p``, and ``p`` inside the tables; only the shapes are checked here (no device sync:
    capturable in a CUDA graph).
    """
    check_rotary_store_inputs(q, key, value, k_cache)
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    num_kv_heads = k_cache.shape[2]
    cfg, q, block_tables, seq_lens, out, num_splits, part_o, part_lse = plan_launch(
        q, k_cache, block_tables, seq_lens, num_splits, config
    )
    num_seqs, num_q_heads, head_dim = q.shape
    new = NewTokens(
        key, value, slot_mapping.contiguous(), positions.contiguous(), cos_table, sin_table,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1), cos_table.stride(0),
    )  # fmt: skip
    launch = launch_options(pdl, q.device)  # USE_PDL (and launch_pdl where it is on)
    rotary_store_decode_kernel[(num_kv_heads, num_seqs, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_o, part_lse,
        scale * math.log2(math.e), num_splits, num_q_heads,
        q.stride(0), q.stride(1), k_cache.stride()[:3], v_cache.stride()[:3],
        block_tables.stride(0), out.stride(0), out.stride(1),
        new,
        GROUP=num_q_heads // num_kv_heads, GROUP_PAD=cfg["GROUP_PAD"],
        HEAD_DIM=head_dim, HEAD_DIM_PAD=cfg["HEAD_DIM_PAD"],
        BLOCK_SIZE=k_cache.shape[1], TILE=cfg["TILE"], SPLIT=num_splits > 1,
        # The first tile before the wait where the kernel is launched as a programmatic dependent
        # (module docstring, "Before the wait"); a config may force it either way (tests, sweeps).
        PRELOAD=cfg.get("PRELOAD", launch["USE_PDL"]),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        # The rotation rounds each product before the sum, as PyTorch does: no a * b + c contracted into
        # one FMA, which on the H200 changed 2,119 of 12,288 rotated bf16 keys (module docstring).
        enable_fp_fusion=False,
        **launch,
    )  # fmt: skip
    merge(part_o, part_lse, out, num_splits, cfg, launch)
    return out

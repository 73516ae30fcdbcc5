"""
Paged decode attention in Triton: flash-decoding over a block table
====================================================================

In this tutorial-style module you will learn

* how a kernel follows a *block table*: the tokens of one sequence live in blocks scattered over
  the KV pool, and every tile of keys is gathered through ``B(t // B)`` before it is used;
* the *online softmax* of the seed's equations (running max ``m``, normaliser ``l``, output
  ``o``), now over tiles of several blocks at once;
* why all query heads of a GQA group are handled by one program: they read the same K/V, so the
  bytes -- the only thing decode is short of -- are loaded once;
* *split-KV* (flash-decoding): when there are too few (sequence, KV head) pairs to fill the GPU,
  each sequence is cut into ``num_splits`` ranges processed in parallel, and a second small kernel
  merges the partial results with their log-sum-exp;
* how the decode step's rotary embedding and K/V store ride along in the same launch (``FUSED_STORE``),
  and how its first tile is read while the previous kernel still runs (``PRELOAD``);
* what it takes to run under CUDA-graph capture (no host sync, no data-dependent launch shape) and
  under the Triton interpreter on a CPU (bf16 is wrong there: upcast after every load).

Motivation
----------
At decode time each sequence contributes one query token, so attention does ~2 FLOPs per byte of
K/V it reads: the kernel is bound by memory bandwidth, and its speed is how close it streams the
paged K/V to the bandwidth of a plain copy. Three things decide that: every byte read once (GQA
packing), enough bytes in flight (wide tiles, software pipelining, enough programs), and no
wasted launches (one kernel, or two with a cheap merge).

Layout (the seed's, also vLLM's)::

    k_cache, v_cache: (num_blocks, B, num_kv_heads, head_dim)
    address of K[t] for KV head h = base + B(t // B) * stride_block + (t % B) * stride_tok
                                         + h * stride_head + d

Grid: one program per (sequence, KV head, split). Program ``(n, h, j)`` computes, for the ``G``
query heads ``h*G .. h*G+G-1``, attention over its range of tiles, and writes either the final
output (``num_splits == 1``) or a partial output ``o_j`` with its log-sum-exp ``lse_j``. The merge
is ``O = sum_j exp(lse_j - M) o_j / sum_j exp(lse_j - M)`` with ``M = max_j lse_j``.

Why the merge is a second kernel (measured, not assumed): the merge could run inside the same
launch, by whichever split of a (sequence, KV head) finishes last -- each adds 1 to a counter with
an atomic after writing its part, and the one that reads back ``num_splits - 1`` merges, as
:mod:`~paged_edu.kernels.triton_gemm`'s split-K does. That saves 30 launches of a SmolLM2 decode
step. On the H200 it lost (``benchmarks/bench_layer.py --batches 1,16,64,256``, context 512,
64 splits at batch 1): attention per step at batch 1 took 173 us with the second kernel
(``benchmarks/records/h200/layer_bench_merge_two_launches.json``), 753 us with a merge reading one split
after another (``..._in_kernel_serial.json``: one memory latency per split, on the critical path
of the last program) and 254 us reading 16 splits at once (``..._in_kernel_chunked.json``); the
whole step 883 / 1,449 / 954 us. Inside a CUDA graph the second launch costs about 1.4 us; the
last program's wait-then-merge costs more, because nothing else runs beside it.

Storing the new token on the way in (``FUSED_STORE``)
-----------------------------------------------------
A decode step of a small model is bound by the *number* of kernels: SmolLM2-135M's 30 layers run
about 300 launches per step even with the per-token ops fused (:mod:`~paged_edu.kernels.triton_fused`),
each a few microseconds of mostly fixed cost. On an H200 at batch 1 the step took 940 us against a
roofline of 53 us of weight reads (``benchmarks/records/h200/layer_bench_8ecf92c.json``): the launches are the
floor. Per layer the new token's rotary embedding and K/V store
(:func:`~paged_edu.kernels.triton_store.rotary_store_kv_triton`) is its own launch, only to hand
the rotated q and the stored k to this kernel. So in a pure-decode step this kernel does it:
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

Benchmark
---------
``python benchmarks/bench_kernels.py`` on an H200 (bf16, B=16, 32/8 heads, head_dim 128, random
block tables; CUDA-graph replays, L2 flushed; the copy ceiling measured in the same run) writes
``paged_edu/data/kernel_bench.json``; docs/benchmarks.md's decode table gives every case: 51-100 % of the copy
bandwidth, faster than the best vLLM / SGLang Triton kernel at every shape.

The small cases are latency-bound: 8192 tokens of one sequence are only 33 MB, which a copy
streams in ~10 us; two launches and a few memory round trips are the rest.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from paged_edu.core.validation import integer
from paged_edu.kernels.checks import check_rotary_store_inputs
from paged_edu.kernels.pdl import launch_options, wait_for_previous_kernel
from paged_edu.kernels.triton_fused import INTERPRETING, by_hand  # INTERPRETING: the kernels were interpreted?
from paged_edu.kernels.triton_store import rotary_cos_sin, rotate_rows

__all__ = ["paged_attention_triton", "rotary_store_decode_triton", "choose_num_splits", "decode_config", "INTERPRETING"]


# ----------------------------------------------------------------------------------------------
# The kernel: one tile of keys at a time
# ----------------------------------------------------------------------------------------------


@triton.jit
def _load_tile(
    tile,  # which tile of TILE tokens (logical positions tile*TILE ...)
    seq_len,  # tokens in this sequence
    bt_row_ptr,  # this sequence's row of the block table
    k_head_ptr,
    v_head_ptr,  # k_cache / v_cache advanced to this KV head
    stride_k_block,
    stride_k_tok,
    stride_v_block,
    stride_v_tok,
    offs_t,
    offs_d,
    d_mask,  # aranges (TILE,), (HEAD_DIM_PAD,) and the head_dim mask
    BLOCK_SIZE: tl.constexpr,  # B, tokens per KV block
    TILE: tl.constexpr,  # tokens per step
    EVEN_D: tl.constexpr,  # head_dim is a power of two: no mask along it (keeps 16-byte loads)
    MASKED: tl.constexpr,  # rows at or past seq_len read as 0 (the last, partial tile)
    UPCAST: tl.constexpr,  # interpreter: compute in fp32 (bf16 is wrong there)
):
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
    # Masks only where needed: a mask that varies along head_dim would split the 16-byte loads.
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
def _attend_kv(
    q,  # (GROUP_PAD, HEAD_DIM_PAD) the group's queries, already in the dot dtype
    m_i,
    l_i,
    acc,  # running max (GROUP_PAD,), normaliser (GROUP_PAD,), output (GROUP_PAD, HEAD_DIM_PAD)
    k,
    v,  # (TILE, HEAD_DIM_PAD) the tile's keys and values (:func:`_load_tile`)
    tile,
    seq_len,
    offs_t,
    qk_scale,  # scale * log2(e): scores in base 2, so exp2 can be used
    TILE: tl.constexpr,
    MASKED: tl.constexpr,  # positions at or past seq_len get no weight
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (exact), "tf32" otherwise (ignored for 16-bit)
):
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
def _attend_tile(
    q,  # (GROUP_PAD, HEAD_DIM_PAD) the group's queries, already in the dot dtype
    m_i,
    l_i,
    acc,  # running max (GROUP_PAD,), normaliser (GROUP_PAD,), output (GROUP_PAD, HEAD_DIM_PAD)
    tile,  # which tile of TILE tokens (logical positions tile*TILE ...)
    seq_len,  # tokens in this sequence
    bt_row_ptr,  # this sequence's row of the block table
    k_head_ptr,
    v_head_ptr,  # k_cache / v_cache advanced to this KV head
    stride_k_block,
    stride_k_tok,
    stride_v_block,
    stride_v_tok,
    offs_t,
    offs_d,
    d_mask,  # aranges (TILE,), (HEAD_DIM_PAD,) and the head_dim mask
    qk_scale,  # scale * log2(e): scores in base 2, so exp2 can be used
    BLOCK_SIZE: tl.constexpr,  # B, tokens per KV block
    TILE: tl.constexpr,  # tokens per step
    EVEN_D: tl.constexpr,  # head_dim is a power of two: no mask along it (keeps 16-byte loads)
    MASKED: tl.constexpr,  # True only for the last, partial tile
    UPCAST: tl.constexpr,  # interpreter: compute in fp32 (bf16 is wrong there)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (exact), "tf32" otherwise (ignored for 16-bit)
):
    """Load one tile (:func:`_load_tile`) and fold it into the online softmax (:func:`_attend_kv`)."""
    k, v = _load_tile(
        tile,
        seq_len,
        bt_row_ptr,
        k_head_ptr,
        v_head_ptr,
        stride_k_block,
        stride_k_tok,
        stride_v_block,
        stride_v_tok,
        offs_t,
        offs_d,
        d_mask,
        BLOCK_SIZE,
        TILE,
        EVEN_D,
        MASKED,
        UPCAST,
    )
    return _attend_kv(q, m_i, l_i, acc, k, v, tile, seq_len, offs_t, qk_scale, TILE, MASKED, DOT_PRECISION)


# The table width and the split count change from one eager (mixed prefill/decode) step to the next;
# Triton would compile a variant for every value class of an int argument (== 1, divisible by 16,
# other), a compile in the middle of a step. They only index memory here, so no specialisation.
@triton.jit(do_not_specialize=["num_splits", "stride_bt_seq"])
def _paged_decode_kernel(
    q_ptr,  # (num_seqs, num_q_heads, head_dim)
    k_cache_ptr,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache_ptr,  # (num_blocks, B, num_kv_heads, head_dim)
    block_tables_ptr,  # int32 (num_seqs, max_blocks)
    seq_lens_ptr,  # int32 (num_seqs,)
    out_ptr,  # (num_seqs, num_q_heads, head_dim): written when NUM_SPLITS == 1
    part_o_ptr,  # fp32 (num_seqs, num_q_heads, NUM_SPLITS, HEAD_DIM_PAD): split outputs o_j / l_j
    part_lse_ptr,  # fp32 (num_seqs, num_q_heads, NUM_SPLITS): split log2-sum-exp m_j + log2(l_j)
    qk_scale,  # softmax scale * log2(e)
    num_splits,  # splits per sequence (runtime: changing it does not recompile)
    num_q_heads,  # H
    stride_q_seq,
    stride_q_head,  # q strides (head_dim stride is 1)
    stride_k_block,
    stride_k_tok,
    stride_k_head,  # k_cache strides
    stride_v_block,
    stride_v_tok,
    stride_v_head,  # v_cache strides
    stride_bt_seq,  # block_tables row stride
    stride_o_seq,
    stride_o_head,  # out strides
    GROUP: tl.constexpr,  # G = num_q_heads // num_kv_heads
    GROUP_PAD: tl.constexpr,  # G rounded up to a power of two (>= 16 on a GPU, for tl.dot)
    HEAD_DIM: tl.constexpr,  # D
    HEAD_DIM_PAD: tl.constexpr,  # D rounded up to a power of two
    BLOCK_SIZE: tl.constexpr,  # B, tokens per KV block
    TILE: tl.constexpr,  # tokens per loop step: several blocks, gathered through the table
    SPLIT: tl.constexpr,  # False: write the output directly (num_splits == 1)
    UPCAST: tl.constexpr,  # interpreter: fp32 right after every load
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, "tf32" otherwise
    HEADS_FASTEST: tl.constexpr,  # grid (H_kv, num_seqs, splits) instead of (num_seqs, H_kv, splits)
    key_ptr,  # FUSED_STORE: (num_seqs, num_kv_heads, head_dim) the new tokens' keys, not yet rotated
    value_ptr,  # FUSED_STORE: (num_seqs, num_kv_heads, head_dim) the new tokens' values
    slot_mapping_ptr,  # FUSED_STORE: int (num_seqs,) each new token's slot; -1 = padding, store nothing
    positions_ptr,  # FUSED_STORE: int (num_seqs,) each new token's position p (= seq_len - 1)
    cos_ptr,
    sin_ptr,  # FUSED_STORE: (max_positions, head_dim) the rotary tables
    stride_key_seq,
    stride_key_head,  # FUSED_STORE: key strides (head_dim stride is 1)
    stride_value_seq,
    stride_value_head,  # FUSED_STORE: value strides
    stride_table,  # FUSED_STORE: cos/sin row stride
    FUSED_STORE: tl.constexpr,  # q arrives unrotated; rotate it, and store the new token's k, v first
    BY_HAND: tl.constexpr,  # FUSED_STORE: round_to rounds by hand (the interpreter, bf16)
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent (paged_edu.kernels.pdl)
    PRELOAD: tl.constexpr,  # FUSED_STORE only: the first tile loaded before the wait ("Before the wait")
):
    if not PRELOAD:
        wait_for_previous_kernel(USE_PDL)  # q (and the new key, value) are the previous kernel's output
    # The KV heads of one sequence are neighbours in the launch order: the programs running side
    # by side then read neighbouring rows of the same blocks (a token's row holds all KV heads).
    if HEADS_FASTEST:
        kv_head = tl.program_id(0)
        seq = tl.program_id(1)
    else:
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
    split = tl.program_id(2)

    # This program's range of tiles: the sequence's tiles cut into num_splits equal parts.
    seq_len = tl.load(seq_lens_ptr + seq)
    num_tiles = tl.cdiv(seq_len, TILE)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)
    num_full = tl.minimum(tile_hi, seq_len // TILE)  # tiles below this need no mask

    offs_g = tl.arange(0, GROUP_PAD)  # (GROUP_PAD,) query heads of the group
    offs_d = tl.arange(0, HEAD_DIM_PAD)  # (HEAD_DIM_PAD,)
    offs_t = tl.arange(0, TILE)  # (TILE,)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    q_heads = kv_head * GROUP + offs_g  # (GROUP_PAD,)

    # The G queries that share this KV head, padded with zero rows: (GROUP_PAD, HEAD_DIM_PAD).
    q_ptrs = q_ptr + seq * stride_q_seq + q_heads[:, None] * stride_q_head  # (GROUP_PAD, 1) row starts
    q_mask = g_mask[:, None] & d_mask[None, :]
    bt_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    k_head_ptr = k_cache_ptr + kv_head * stride_k_head
    v_head_ptr = v_cache_ptr + kv_head * stride_v_head
    if FUSED_STORE:
        # Every program rotates its group's queries itself (the same rope as triton_store's kernel, so
        # the same bits); the program whose split holds the new token, position seq_len - 1, rotates
        # its k, stores k and v at the slot, and waits for its threads' stores before reading tiles.
        dtype = q_ptr.dtype.element_ty
        table_row = tl.load(positions_ptr + seq).to(tl.int64) * stride_table
        c, s = rotary_cos_sin(cos_ptr, sin_ptr, table_row, offs_d, HEAD_DIM, dtype, BY_HAND)  # (HEAD_DIM_PAD,)
        slot = tl.load(slot_mapping_ptr + seq).to(tl.int64)
        holder = (num_tiles - 1) // tiles_per_split  # the split whose tiles hold position seq_len - 1
        # (HEAD_DIM_PAD,); the scalar tests broadcast as tensors (the interpreter refuses a scalar bool).
        store = d_mask & ((offs_d * 0 + slot) >= 0) & ((offs_d * 0 + split) == holder)
    if PRELOAD:
        # Nothing above reads an earlier kernel's output, nor does the first tile: the cache rows of the
        # past were written by earlier steps. Its loads overlap the previous kernel. The new token's row,
        # which this kernel itself stores below, is read stale here and replaced in registers.
        k_first, v_first = _load_tile(
            tile_lo,
            seq_len,
            bt_row_ptr,
            k_head_ptr,
            v_head_ptr,
            stride_k_block,
            stride_k_tok,
            stride_v_block,
            stride_v_tok,
            offs_t,
            offs_d,
            d_mask,
            BLOCK_SIZE,
            TILE,
            HEAD_DIM == HEAD_DIM_PAD,
            True,
            UPCAST,
        )  # (TILE, HEAD_DIM_PAD) each
        wait_for_previous_kernel(USE_PDL)  # q and the new key, value are the previous kernel's output
    if FUSED_STORE:
        q = rotate_rows(q_ptrs, offs_d[None, :], q_mask, c, s, HEAD_DIM, dtype, BY_HAND)  # fp32, rounded
        if not UPCAST:
            q = q.to(dtype)  # exact: already rounded to dtype
        k_new = rotate_rows(
            key_ptr + seq * stride_key_seq + kv_head * stride_key_head, offs_d, store, c, s, HEAD_DIM, dtype, BY_HAND
        )
        v_new = tl.load(value_ptr + seq * stride_value_seq + kv_head * stride_value_head + offs_d, mask=store)
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
    else:
        q = tl.load(q_ptrs + offs_d[None, :], mask=q_mask, other=0.0)
        if UPCAST:
            q = q.to(tl.float32)

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
            m_i, l_i, acc = _attend_kv(
                q, m_i, l_i, acc, k_first, v_first, tile_lo, seq_len, offs_t, qk_scale, TILE, True, DOT_PRECISION
            )
        first = tile_lo + 1

    # Full tiles, no masks: the hot loop. Triton software-pipelines it (num_stages), prefetching
    # the block ids and then the K/V rows of the next tiles while this one is computed.
    for tile in range(first, num_full):
        m_i, l_i, acc = _attend_tile(
            q,
            m_i,
            l_i,
            acc,
            tile,
            seq_len,
            bt_row_ptr,
            k_head_ptr,
            v_head_ptr,
            stride_k_block,
            stride_k_tok,
            stride_v_block,
            stride_v_tok,
            offs_t,
            offs_d,
            d_mask,
            qk_scale,
            BLOCK_SIZE,
            TILE,
            HEAD_DIM == HEAD_DIM_PAD,
            False,
            UPCAST,
            DOT_PRECISION,
        )
    # At most one partial tile: the sequence's last, and only in the last non-empty split.
    for tile in range(tl.maximum(num_full, first), tile_hi):
        m_i, l_i, acc = _attend_tile(
            q,
            m_i,
            l_i,
            acc,
            tile,
            seq_len,
            bt_row_ptr,
            k_head_ptr,
            v_head_ptr,
            stride_k_block,
            stride_k_tok,
            stride_v_block,
            stride_v_tok,
            offs_t,
            offs_d,
            d_mask,
            qk_scale,
            BLOCK_SIZE,
            TILE,
            HEAD_DIM == HEAD_DIM_PAD,
            True,
            UPCAST,
            DOT_PRECISION,
        )

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


# ----------------------------------------------------------------------------------------------
# The second stage: merge the splits of each (sequence, query head)
# ----------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["num_splits"])
def _merge_splits_kernel(
    part_o_ptr,  # fp32 (num_seqs, num_q_heads, num_splits, HEAD_DIM_PAD)
    part_lse_ptr,  # fp32 (num_seqs, num_q_heads, num_splits)
    out_ptr,  # (num_seqs, num_q_heads, head_dim)
    num_splits,  # splits per sequence
    stride_o_seq,
    stride_o_head,  # out strides
    HEAD_DIM: tl.constexpr,  # D
    HEAD_DIM_PAD: tl.constexpr,  # D rounded up to a power of two
    SPLITS_PAD: tl.constexpr,  # num_splits rounded up to a power of two
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent (paged_edu.kernels.pdl)
):
    wait_for_previous_kernel(USE_PDL)  # the splits' partial results
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = seq * tl.num_programs(1) + head  # (sequence, head) pair
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    s_mask = offs_s < num_splits
    lse = tl.load(part_lse_ptr + row * num_splits + offs_s, mask=s_mask, other=float("-inf"))  # (SPLITS_PAD,)
    o = tl.load(
        part_o_ptr + (row * num_splits + offs_s)[:, None] * HEAD_DIM_PAD + offs_d[None, :],
        mask=s_mask[:, None],
        other=0.0,
    )  # (SPLITS_PAD, HEAD_DIM_PAD)
    m = tl.max(lse, 0)  # finite: split 0 always holds the sequence's first token
    w = tl.exp2(lse - m)  # (SPLITS_PAD,) weight of each split, 0 for empty ones
    merged = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)  # (HEAD_DIM_PAD,)
    tl.store(
        out_ptr + seq * stride_o_seq + head * stride_o_head + offs_d,
        merged.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


# ----------------------------------------------------------------------------------------------
# The Python wrapper: configuration, split count, launch
# ----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def decode_config(head_dim: int, group: int, on_gpu: bool) -> dict:
    """Tile length, warps and pipeline depth.

    We do not autotune (a decode kernel is captured in CUDA graphs and must launch the same way
    every time). The fixed choice: 64 tokens per tile, at most 16 KiB of K and 16 KiB of V (fewer
    tokens for heads wider than 128), with the loads of the next tile in flight while this one is
    used (``num_stages=2``). A sweep on an H200 (``benchmarks/bench_kernels.py --sweep``) found this
    the best or within 3% of the best for every anchor case (32/8 heads of 128); three stages were
    up to 15% slower on long sequences. At head_dim 64 (SmolLM2, ``bench_layer.py --sweep-decode``)
    64-token tiles beat 128: 38.8 against 43.9 us at 256 x 512, within 1% of the best of 72 configs.
    """
    head_dim_pad = triton.next_power_of_2(head_dim)
    group_pad = triton.next_power_of_2(group)
    if on_gpu:
        group_pad = max(16, group_pad)  # a 16-bit tl.dot needs M >= 16 on the tensor cores
    tile = max(16, min(64, 8192 // head_dim_pad))
    return dict(
        TILE=tile, GROUP_PAD=group_pad, HEAD_DIM_PAD=head_dim_pad, HEADS_FASTEST=True, num_warps=4, num_stages=2
    )


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_len: int, tile: int, num_sms: int) -> int:
    """How many parts to cut each sequence into so that the GPU has enough programs.

    Without splits there are ``num_seqs * num_kv_heads`` programs, each streaming one sequence's
    K/V for one head. About ``4 * num_sms`` of them fit on the GPU at once (registers and shared
    memory allow 4-5 per SM), and several per SM are what hide the memory latency. So we cut each
    sequence into ``floor(4 * num_sms / programs)`` parts -- rounding *down*, so that all programs
    still run in one wave: 512 programs on 132 SMs run in one wave, 768 in one and a half, and
    the half wave costs more than the extra parallelism gains -- with no part shorter than two
    tiles, whose fixed costs (loading q, the pipeline's prologue, writing a partial result) would
    dominate. Only host-side numbers are used -- ``max_len`` is the width of the block table times
    B, not the actual lengths -- so the choice needs no device sync and is valid under CUDA-graph
    capture.
    """
    base = num_seqs * num_kv_heads
    max_tiles = -(-max_len // tile)
    return max(1, min((4 * num_sms) // base, max_tiles // 2, 128))


def launch_inputs(q, block_tables, seq_lens, block_size: int):
    """The layouts the decode kernels index (unit stride along head_dim, a table row and ``seq_lens``),
    the output buffer, and ``max_len`` = table width x B (host-side, so capture-safe)."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    block_tables = block_tables if block_tables.stride(1) == 1 else block_tables.contiguous()
    seq_lens = seq_lens if seq_lens.stride(0) == 1 else seq_lens.contiguous()
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return q, block_tables, seq_lens, out, block_tables.shape[1] * block_size


def split_plan(cfg: dict, config: dict | None, num_programs: int, max_len: int, device) -> int:
    """:func:`choose_num_splits` for ``num_programs`` (sequence, head-group) pairs; sets
    ``cfg["num_stages"] = 1`` for short splits unless ``config`` fixed it."""
    sms = (
        _num_sms(device.index if device.index is not None else torch.cuda.current_device())
        if device.type == "cuda"
        else 8
    )
    num_splits = choose_num_splits(num_programs, 1, max_len, cfg["TILE"], sms)
    if "num_stages" not in (config or {}) and -(-max_len // num_splits) <= 4 * cfg["TILE"]:
        # Short splits (four tiles or fewer) run without software pipelining: filling the
        # pipeline costs more than it hides over so few steps, and the many programs keep the
        # memory busy instead (H200: 1 x 8192, 64 splits: 21.0 us vs 22.5; 8 x 2048: 31.4 vs 32.8).
        cfg["num_stages"] = 1
    return num_splits


def paged_attention_triton(
    q: torch.Tensor,  # (num_seqs, num_q_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # int32 (num_seqs, max_blocks)
    seq_lens: torch.Tensor,  # int32 (num_seqs,)
    *,
    scale: float,
    num_splits: int | None = None,  # None: choose_num_splits; tests force values
    config: dict | None = None,  # overrides of decode_config (benchmark sweeps)
) -> torch.Tensor:  # (num_seqs, num_q_heads, head_dim)
    """Launch the kernel on validated inputs (see :func:`paged_edu.kernels.paged_attention_decode`)."""
    return _launch(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, config)


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
    :func:`paged_attention_triton` compute, in one kernel (two with the split merge) instead of two
    (three). ``q``, ``key`` and ``value`` may be strided views of one qkv projection. The caller
    guarantees what the model's runner does: inputs as :func:`paged_edu.kernels.paged_attention_decode`
    validates them, ``slot_n`` the slot that ``block_tables`` gives position ``p``, and ``p`` inside
    the tables; only the shapes are checked here (no device sync: capturable in a CUDA graph).
    """
    check_rotary_store_inputs(q, key, value, k_cache)
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    store = (key, value, slot_mapping.contiguous(), positions.contiguous(), cos_table, sin_table)
    return _launch(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, config, store, pdl)


def _launch(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, config, store=None, pdl=False):
    """Configure and launch the decode kernel (and the merge); ``store``: the fused path's
    ``(key, value, slot_mapping, positions, cos_table, sin_table)``, or None; ``pdl``: both launched
    as programmatic dependents where the GPU can (:mod:`~paged_edu.kernels.pdl`)."""
    if not INTERPRETING and not q.is_cuda:
        raise RuntimeError(
            "the Triton kernel needs a CUDA GPU, or the Triton interpreter for CPU tensors: set "
            "TRITON_INTERPRET=1 before importing paged_edu (slow, for learning and tests), "
            "or use impl='torch'"
        )
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    cfg = decode_config(head_dim, group, on_gpu=not INTERPRETING)
    cfg.update(config or {})
    q, block_tables, seq_lens, out, max_len = launch_inputs(q, block_tables, seq_lens, block_size)
    if num_splits is None:  # the plan's own choice: nothing to check (validate=False runs no Python check)
        num_splits = split_plan(cfg, config, num_seqs * num_kv_heads, max_len, q.device)
    else:
        num_splits = integer("num_splits", num_splits, low=1)
    split = num_splits > 1
    if split:
        part_o = torch.empty(
            num_seqs, num_q_heads, num_splits, cfg["HEAD_DIM_PAD"], device=q.device, dtype=torch.float32
        )
        part_lse = torch.empty(num_seqs, num_q_heads, num_splits, device=q.device, dtype=torch.float32)
    else:
        part_o = part_lse = out  # unused
    fused = store is not None
    # Without the store, placeholders for its unused arguments.
    key, value, slot_mapping, positions, cos_table, sin_table = store if fused else (q, q, seq_lens, seq_lens, q, q)

    launch = launch_options(pdl, q.device)  # USE_PDL (and launch_pdl where it is on)
    grid = (num_kv_heads, num_seqs, num_splits) if cfg["HEADS_FASTEST"] else (num_seqs, num_kv_heads, num_splits)
    _paged_decode_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_o,
        part_lse,
        scale * math.log2(math.e),
        num_splits,
        num_q_heads,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        GROUP_PAD=cfg["GROUP_PAD"],
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=cfg["HEAD_DIM_PAD"],
        BLOCK_SIZE=block_size,
        TILE=cfg["TILE"],
        SPLIT=split,
        UPCAST=INTERPRETING,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        HEADS_FASTEST=cfg["HEADS_FASTEST"],
        key_ptr=key,
        value_ptr=value,
        slot_mapping_ptr=slot_mapping,
        positions_ptr=positions,
        cos_ptr=cos_table,
        sin_ptr=sin_table,
        stride_key_seq=key.stride(0),
        stride_key_head=key.stride(1),
        stride_value_seq=value.stride(0),
        stride_value_head=value.stride(1),
        stride_table=cos_table.stride(0),
        FUSED_STORE=fused,
        BY_HAND=fused and by_hand(q.dtype),
        # The first tile before the wait: where the kernel is launched as a programmatic dependent (module
        # docstring, "Before the wait"); a config may force it either way (tests, sweeps).
        PRELOAD=fused and cfg.get("PRELOAD", launch["USE_PDL"]),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
        # The rotation rounds each product before the sum, as PyTorch does: no a * b + c contracted into
        # one FMA, which on the H200 changed 2,119 of 12,288 rotated bf16 keys (module docstring).
        enable_fp_fusion=not fused,
        **launch,
    )
    if split:
        _merge_splits_kernel[(num_seqs, num_q_heads)](
            part_o,
            part_lse,
            out,
            num_splits,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=cfg["HEAD_DIM_PAD"],
            SPLITS_PAD=triton.next_power_of_2(num_splits),
            num_warps=4,
            **launch,
        )
    return out

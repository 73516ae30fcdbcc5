"""Lesson 10's exercises: the kernels a paged engine needs besides decode attention, written by the learner
and checked against the library's own -- the K/V store (a scatter through ``slot_mapping``) and the paged
prefill's tile loop (a causal chunk over a cached prefix, read through the block table). On a CPU each runs
in Triton's interpreter; on a GPU :func:`time_kernels` times it against the library's kernel."""

from __future__ import annotations

import torch

from paged_edu.lessons.exercises.framework import Verdict, describe, raised, register

__all__ = [
    "kernel_device",
    "paged_prefill",
    "prefill_cases",
    "store_cases",
    "store_kv",
    "time_kernels",
]


def kernel_device() -> torch.device:
    """Where the exercises' kernels run: the CPU under Triton's interpreter, else the GPU."""
    from paged_edu.kernels.triton_fused import INTERPRETING

    return torch.device("cpu" if INTERPRETING or not torch.cuda.is_available() else "cuda")


# ----------------------------------------------------------------------------------------------
# 10.1: the K/V store
# ----------------------------------------------------------------------------------------------


def store_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """10.1's reference: the library's store kernel (:func:`paged_edu.kernels.triton_store.store_kv_triton`)."""
    from paged_edu.kernels.triton_store import store_kv_triton

    store_kv_triton(key, value, k_cache, v_cache, slot_mapping)


def store_cases() -> list[tuple]:
    """``(key, value, k_cache, v_cache, slot_mapping)`` cases: scattered slots, a padding row (slot -1),
    three KV heads (not a power of two), a block size of 4 and of 16."""
    g = torch.Generator().manual_seed(101)
    dev = kernel_device()
    cases = []
    for num_tokens, heads, dim, block, blocks, pad in (
        (5, 2, 16, 4, 6, (3,)),
        (7, 3, 8, 16, 2, (0, 6)),
        (1, 1, 32, 4, 3, ()),
    ):
        key = torch.randn(num_tokens, heads, dim, generator=g)
        value = torch.randn(num_tokens, heads, dim, generator=g)
        k_cache = torch.randn(blocks, block, heads, dim, generator=g)
        v_cache = torch.randn(blocks, block, heads, dim, generator=g)
        slots = torch.randperm(blocks * block, generator=g)[:num_tokens]
        for row in pad:
            slots[row] = -1
        cases.append(tuple(t.to(dev) for t in (key, value, k_cache, v_cache, slots.to(torch.int64))))
    return cases


def _guarded(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(buffer, view)``: a copy of ``cache`` with one guard block before and after it in the same buffer, so
    that a store outside the cache (the padding row's slot -1, say) lands in the guard, where it is seen."""
    buffer = torch.full((cache.shape[0] + 2, *cache.shape[1:]), 7.0, dtype=cache.dtype, device=cache.device)
    buffer[1:-1] = cache
    return buffer, buffer[1:-1]


def _store_by_hand(key, value, k_cache, v_cache, slots, *, swap=False, kv_swapped=False, heads=None):
    """The store in PyTorch, and its tempting variants: returns new (k_cache, v_cache), or None for a variant
    that would write outside the caches."""
    k, v = k_cache.clone(), v_cache.clone()
    B = k.shape[1]
    for i, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        block, offset = (s % B, s // B) if swap else (s // B, s % B)
        if not (0 <= block < k.shape[0] and 0 <= offset < B):
            return None
        h = slice(None) if heads is None else slice(0, heads)
        k[block, offset, h] = (value if kv_swapped else key)[i, h]
        v[block, offset, h] = (key if kv_swapped else value)[i, h]
    return k, v


_STORE_MISTAKES = (
    (dict(swap=True), "block and offset swapped: token t's slot s goes to block s // B, offset s % B"),
    (dict(kv_swapped=True), "K and V swapped: the keys go to k_cache"),
    (dict(heads=1), "only the first KV head stored: a token's row is num_kv_heads x head_dim values"),
)


@register(
    "10.1",
    "Write a Triton kernel that stores each new token's K and V (num_tokens, num_kv_heads, head_dim) into "
    "k_cache / v_cache (num_blocks, B, num_kv_heads, head_dim) at its slot (block slot // B, offset slot % B), "
    "skipping slot -1, and my_store_kv(key, value, k_cache, v_cache, slot_mapping) that launches it (in place).",
    store_kv,
    kind="function",
    needs_triton=True,
)
def _check_10_1(fn) -> Verdict:
    for case in store_cases():
        key, value, k_cache, v_cache, slots = case
        want_k, want_v = k_cache.clone(), v_cache.clone()
        store_kv(key, value, want_k, want_v, slots)
        (k_buf, got_k), (v_buf, got_v) = _guarded(k_cache), _guarded(v_cache)
        shape = f"{key.shape[0]} tokens of {key.shape[1]} heads x {key.shape[2]}, B = {k_cache.shape[1]}"
        try:
            returned = fn(key.clone(), value.clone(), got_k, got_v, slots.clone())
        except NotImplementedError as exc:
            return raised("my_store_kv", exc, "your function")
        except Exception as exc:
            return Verdict(False, [f"[ ] my_store_kv: raised {type(exc).__name__}: {str(exc)[:300]} ({shape})"])
        guards = torch.cat([k_buf[0], k_buf[-1], v_buf[0], v_buf[-1]])
        if not bool((guards == 7.0).all()):
            pad = " -- slot -1 means 'store nothing' (a padding row): skip it" if bool((slots < 0).any()) else ""
            return Verdict(False, [f"[ ] my_store_kv: wrote outside the caches ({shape}){pad}"])
        if torch.equal(got_k, want_k) and torch.equal(got_v, want_v):
            continue
        if torch.equal(got_k, k_cache) and torch.equal(got_v, v_cache):
            what = f"; it returned {describe(returned)}" if returned is not None else ""
            return Verdict(
                False,
                [
                    f"[ ] my_store_kv: the caches are unchanged ({shape}){what} -- store into "
                    "k_cache and v_cache in place"
                ],
            )
        for variant, meaning in _STORE_MISTAKES:
            wrong = _store_by_hand(*case, **variant)
            if wrong is not None and torch.equal(got_k, wrong[0]) and torch.equal(got_v, wrong[1]):
                return Verdict(False, [f"[ ] my_store_kv: for {shape} that is {meaning}"])
        bad = int(((got_k != want_k) | (got_v != want_v)).flatten(2).any(-1).sum())
        return Verdict(
            False,
            [
                f"[ ] my_store_kv: for {shape}, {bad} token row(s) of the caches differ from the "
                "library's store (wrong slots written, or values not copied exactly)"
            ],
        )
    return Verdict(
        True,
        [
            f"[x] my_store_kv: all {len(store_cases())} cases match the library's store exactly, "
            "padding rows and three KV heads among them"
        ],
    )


# ----------------------------------------------------------------------------------------------
# 10.2: the paged prefill's tile loop
# ----------------------------------------------------------------------------------------------


def paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale):
    """10.2's reference: the library's prefill kernel (:func:`paged_edu.kernels.triton_prefill.paged_prefill_triton`)."""
    from paged_edu.kernels.triton_prefill import paged_prefill_triton

    return paged_prefill_triton(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale=scale)


def prefill_cases() -> list[tuple]:
    """``(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale)``: chunks over cached prefixes
    (5 tokens cached then 3 new; a fresh prompt of 6; 9 cached then 1 new), GQA groups of 2 and of 1, block
    size 4, tables in a shuffled order. Every token's K/V is already in the cache (stored before attention)."""
    g = torch.Generator().manual_seed(102)
    dev = kernel_device()
    cases = []
    for chunks, heads, kv_heads, dim in ((((5, 3), (0, 6)), 4, 2, 16), (((9, 1), (2, 2)), 2, 2, 16)):
        B = 4
        lens = [c + n for c, n in chunks]
        per_seq = [-(-s // B) for s in lens]
        width = max(per_seq)
        num_blocks = sum(per_seq) + 2
        order = torch.randperm(num_blocks, generator=g)
        tables = torch.zeros(len(lens), width, dtype=torch.int32)
        used = 0
        for i, n in enumerate(per_seq):
            tables[i, :n] = order[used : used + n].to(torch.int32)
            used += n
        k_cache = torch.randn(num_blocks, B, kv_heads, dim, generator=g)
        v_cache = torch.randn(num_blocks, B, kv_heads, dim, generator=g)
        q_lens = [n for _, n in chunks]
        q = torch.randn(sum(q_lens), heads, dim, generator=g)
        cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        seq_lens = torch.tensor(lens, dtype=torch.int32)
        cases.append((*(t.to(dev) for t in (q, k_cache, v_cache, tables, seq_lens, cu)), dim**-0.5))
    return cases


def _prefill_by_hand(
    q, k_cache, v_cache, tables, seq_lens, cu, scale, *, causal=True, prefix=True, table=True, own_token=True, gqa=True
):
    """The prefill in PyTorch, one query row at a time, and its tempting variants."""
    out = torch.zeros_like(q, dtype=torch.float32)
    B, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // kv_heads
    cu, lens = cu.tolist(), seq_lens.tolist()
    for i, s in enumerate(lens):
        q_len = cu[i + 1] - cu[i]
        ctx = s - q_len
        for j in range(q_len):
            p = ctx + j
            last = (p if own_token else p - 1) if causal else s - 1
            first = 0 if prefix else ctx
            pos = torch.arange(first, last + 1)
            if len(pos) == 0:
                continue
            slots = (tables[i, pos // B].long().cpu() * B + pos % B) if table else pos
            for h in range(q.shape[1]):
                kvh = h // group if gqa else h % kv_heads
                k = k_cache.reshape(-1, kv_heads, k_cache.shape[3])[slots.to(k_cache.device), kvh].float()
                v = v_cache.reshape(-1, kv_heads, v_cache.shape[3])[slots.to(v_cache.device), kvh].float()
                w = torch.softmax(k @ q[cu[i] + j, h].float() * scale, 0)
                out[cu[i] + j, h] = w @ v
    return out


_PREFILL_MISTAKES = (
    (
        dict(causal=False),
        "no causal mask inside the chunk: new token j sees keys up to its own position "
        "ctx + j only, not the chunk's later tokens",
    ),
    (
        dict(prefix=False),
        "the cached prefix is missing: token j also attends to the ctx cached tokens before the "
        "chunk (read through the block table like the rest)",
    ),
    (
        dict(table=False),
        "K/V read at slot = position, as if the cache were contiguous: go through the block table -- "
        "the key at position t lives in block block_table[t // B], offset t % B",
    ),
    (dict(own_token=False), "the mask keeps keys < p: a token attends to itself too (keys <= p)"),
    (dict(gqa=False), "query head h read KV head h % num_kv_heads: with GQA it is h // group"),
)


@register(
    "10.2",
    "Complete the paged prefill kernel's tile loop: new token j of a sequence (position p = ctx + j) attends to "
    "keys 0..p -- the cached prefix and the chunk up to itself -- gathered tile by tile through the block table "
    "with an online softmax; my_paged_prefill(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale) "
    "returns the (num_q_tokens, num_q_heads, head_dim) output.",
    paged_prefill,
    kind="function",
    needs_triton=True,
)
def _check_10_2(fn) -> Verdict:
    worst = 0.0
    for case in prefill_cases():
        q = case[0]
        want = paged_prefill(*case[:6], case[6]).float()
        shape = f"cu_seqlens_q {case[5].tolist()}, seq_lens {case[4].tolist()}, {q.shape[1]} query / {case[1].shape[2]} KV heads"
        try:
            got = fn(*(t.clone() if isinstance(t, torch.Tensor) else t for t in case))
        except NotImplementedError as exc:
            return raised("my_paged_prefill", exc, "your function")
        except Exception as exc:
            return Verdict(False, [f"[ ] my_paged_prefill: raised {type(exc).__name__}: {str(exc)[:300]}"])
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(q.shape):
            return Verdict(
                False,
                [f"[ ] my_paged_prefill: returned {describe(got)}; return the output, shaped like q {tuple(q.shape)}"],
            )
        got = got.float()
        if not torch.isfinite(got).all():
            return Verdict(
                False,
                [
                    f"[ ] my_paged_prefill: NaN or inf in the output ({shape}) -- a tile whose keys "
                    "are all masked gives exp(-inf - -inf); the first tile always holds key 0"
                ],
            )
        err = float((got - want).abs().max())
        if err <= 1e-4:
            worst = max(worst, err)
            continue
        for variant, meaning in _PREFILL_MISTAKES:
            if float((got.cpu() - _prefill_by_hand(*case, **variant).cpu()).abs().max()) <= 1e-4:
                return Verdict(False, [f"[ ] my_paged_prefill: for {shape} that is {meaning}"])
        return Verdict(
            False,
            [f"[ ] my_paged_prefill: for {shape} the output differs from the library's kernel by up to {err:.3g}"],
        )
    return Verdict(
        True,
        [
            f"[x] my_paged_prefill: all {len(prefill_cases())} cases match the library's prefill kernel "
            f"(max |difference| {worst:.1e}): cached prefixes, a fresh prompt, GQA"
        ],
    )


# ----------------------------------------------------------------------------------------------
# On a GPU: the learner's kernels against the library's
# ----------------------------------------------------------------------------------------------


def time_kernels(my_store=None, my_prefill=None, dtype=torch.bfloat16) -> dict:
    """Median microseconds (``triton.testing.do_bench``) on a GPU of the learner's and the library's store (a
    decode step's 256 tokens of 8 KV heads x 128, B = 16) and prefill (4 sequences of 256 new tokens over 256
    cached, 32 query / 8 KV heads of 128), each output checked against the library's first; an answer that still
    raises ``NotImplementedError`` gets ``note: "not written yet"`` and the library is timed alone."""
    from triton.testing import do_bench

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    out: dict = {}
    if my_store is not None:
        n, heads, dim, B, blocks = 256, 8, 128, 16, 4096
        key, value = (torch.randn(n, heads, dim, device=dev, dtype=dtype, generator=g) for _ in range(2))
        kc, vc = (torch.zeros(blocks, B, heads, dim, device=dev, dtype=dtype) for _ in range(2))
        slots = torch.randperm(blocks * B, device=dev, generator=g)[:n]
        ref_k, ref_v = kc.clone(), vc.clone()
        store_kv(key, value, ref_k, ref_v, slots)
        row = {}
        for name, f in (("yours", my_store), ("library", store_kv)):
            kk, vv = kc.clone(), vc.clone()
            try:
                f(key, value, kk, vv, slots)
            except NotImplementedError:
                row[name] = dict(us=None, exact=None, note="not written yet")
                continue
            row[name] = dict(
                us=1e3 * do_bench(lambda f=f: f(key, value, kc, vc, slots)),
                exact=bool(torch.equal(kk, ref_k) and torch.equal(vv, ref_v)),
            )
        out["store"] = row
    if my_prefill is not None:
        seqs, new, cached, heads, kv_heads, dim, B = 4, 256, 256, 32, 8, 128, 16
        s = new + cached
        per_seq = s // B
        tables = torch.randperm(seqs * per_seq, device=dev, generator=g).to(torch.int32).view(seqs, per_seq)
        kc, vc = (torch.randn(seqs * per_seq, B, kv_heads, dim, device=dev, dtype=dtype, generator=g) for _ in range(2))
        q = torch.randn(seqs * new, heads, dim, device=dev, dtype=dtype, generator=g)
        lens = torch.full((seqs,), s, dtype=torch.int32, device=dev)
        cu = torch.arange(0, seqs * new + 1, new, dtype=torch.int32, device=dev)
        args = (q, kc, vc, tables, lens, cu, dim**-0.5)
        ref = paged_prefill(*args).float()
        row = {}
        flops = 4 * seqs * heads * dim * sum(cached + j + 1 for j in range(new))  # QK^T and PV over the keys seen
        for name, f in (("yours", my_prefill), ("library", paged_prefill)):
            try:
                err = float((f(*args).float() - ref).abs().max())
            except NotImplementedError:
                row[name] = dict(us=None, max_abs_diff=None, TFLOP_s=None, note="not written yet")
                continue
            us = 1e3 * do_bench(lambda f=f: f(*args))
            row[name] = dict(us=us, max_abs_diff=err, TFLOP_s=flops / us / 1e6)
        out["prefill"] = row
    return out


def peer_figures(card: str) -> dict | None:
    """The stored side-by-side figures of the decode kernel on ``card`` (``paged_edu/data/peer_kernels.json``):
    vLLM's and SGLang's kernels and ours on the same tensors, with their source; None for another card."""
    from paged_edu import data

    peers = data.load_json("peer_kernels.json")
    return next((t for t in peers["decode"] if t["card"] == card), None)


def peer_prefill_figures() -> list[str]:
    """The stored prefill figures (``paged_edu/data/peer_kernels.json``), one line per case, with their source."""
    from paged_edu import data

    lines = []
    for table in data.load_json("peer_kernels.json")["prefill"]:
        lines.append(f"stored, {table['device_name']} ({table['date']}; {table['source']}; {table['note']}):")
        for case, row in table["cases"].items():
            lines.append(f"  {case}: " + ", ".join(f"{k} {v:,} us" for k, v in row.items()))
    return lines


# ----------------------------------------------------------------------------------------------
# 10.3: reading the decode kernel -- its split plan
# ----------------------------------------------------------------------------------------------

# 10.3's launch: one sequence of SEQ_LEN tokens whose block table is TABLE_BLOCKS blocks of BLOCK wide, 8 KV
# heads, tiles of 64 keys (decode_config at head_dim 128), on a GPU of 132 SMs (an H100 or an H200).
SPLIT_CASE = dict(num_seqs=1, num_kv_heads=8, seq_len=5000, table_blocks=1024, block_size=16, tile=64, num_sms=132)


def split_plan_of(num_seqs, num_kv_heads, seq_len, table_blocks, block_size, tile, num_sms) -> dict:
    """The decode kernel's split plan for one launch: ``splits`` (:func:`~paged_edu.kernels.decode.tuning.choose_num_splits`
    from the host-side table width), ``holder`` (the split whose tiles hold the last token, position
    ``seq_len - 1``: the one that stores the new token in ``rotary_store_decode_kernel``) and ``empty`` (splits
    whose tile range is empty, ``tile_lo >= tile_hi`` in :func:`~paged_edu.kernels.decode.pieces.tile_range`)."""
    from paged_edu.kernels.decode.tuning import choose_num_splits

    splits = choose_num_splits(num_seqs, num_kv_heads, table_blocks * block_size, tile, num_sms)
    num_tiles = -(-seq_len // tile)
    per_split = -(-num_tiles // splits)
    holder = (num_tiles - 1) // per_split
    return dict(splits=splits, holder=holder, empty=sum(1 for j in range(splits) if j * per_split >= num_tiles))


def split_plan_reference() -> dict:
    """10.3's reference: :func:`split_plan_of` on :data:`SPLIT_CASE`."""
    return split_plan_of(**SPLIT_CASE)


@register(
    "10.3",
    "One sequence of 5,000 tokens, its block table 1,024 blocks of 16 wide, 8 KV heads, tiles of 64 keys, a GPU "
    "of 132 SMs: into how many splits does the decode kernel cut the sequence, which split stores the new token, "
    "and how many splits get no tile? Answer {'splits': n, 'holder': j, 'empty': k}.",
    split_plan_reference,
    needs_triton=True,
)
def _check_10_3(answer) -> Verdict:
    right = split_plan_reference()
    if not isinstance(answer, dict) or set(answer) != set(right):
        return Verdict(False, [f"[ ] 10.3: give a dict with the keys {sorted(right)}, got {describe(answer)}"])
    if any(isinstance(v, bool) or not isinstance(v, int) for v in answer.values()):
        return Verdict(False, [f"[ ] 10.3: each value is a whole number, got {describe(answer)}"])
    if answer == right:
        return Verdict(
            True,
            [
                f"[x] 10.3: {right['splits']} splits of the sequence; split {right['holder']} holds "
                f"its last token and stores the new one; {right['empty']} splits see no tile and write "
                "lse = -inf, weight 0 in the merge"
            ],
        )
    c = SPLIT_CASE
    from_len = split_plan_of(**{**c, "table_blocks": -(-c["seq_len"] // c["block_size"])})
    lines = [f"[ ] 10.3: got {answer}, expected {right}"]
    if answer["splits"] == from_len["splits"] and from_len["splits"] != right["splits"]:
        lines.append(
            "    -- the split count from the sequence's length: choose_num_splits sees only host-side numbers, "
            "max_len = the table's width x B, so the launch needs no device sync and can be captured in a "
            "CUDA graph"
        )
    elif answer["splits"] == c["num_sms"]:
        lines.append("    -- one split per SM: about four programs fit on an SM, and there are 8 KV heads a sequence")
    elif answer["splits"] != right["splits"]:
        lines.append("    -- the splits: read choose_num_splits in paged_edu/kernels/decode/tuning.py")
    elif answer["holder"] == right["holder"] + 1:
        lines.append("    -- the holder counted from 1: splits are numbered from 0")
    elif answer["holder"] == right["splits"] - 1 and right["holder"] != right["splits"] - 1:
        lines.append(
            "    -- the last split is not the holder: the tiles are cut into equal ranges of ceil(tiles / splits), "
            "and the splits past the sequence's last tile hold nothing"
        )
    elif answer["holder"] != right["holder"]:
        lines.append(
            "    -- the holder: read tile_range in paged_edu/kernels/decode/pieces.py and the `holder` line of "
            "rotary_store_decode_kernel"
        )
    else:
        lines.append(
            "    -- the empty splits: those whose tile_lo = split * ceil(tiles / splits) is past the last tile"
        )
    return Verdict(False, lines)


def piece_source(name: str) -> str:
    """The source of a decode piece or tuning rule (:mod:`paged_edu.kernels.decode`), to read."""
    import inspect

    from paged_edu.labs.kernel_ladder import source_of  # without Triton: read from the files

    for module in ("pieces", "tuning", "fast"):
        obj = getattr(source_of(f"paged_edu.kernels.decode.{module}"), name, None)
        if obj is not None:
            return obj if isinstance(obj, str) else inspect.getsource(getattr(obj, "fn", obj))
    raise KeyError(f"no decode piece {name!r}")


def time_decode_against_peers(card: str, reps: int = 100) -> list[dict] | None:
    """On a GPU: the library's decode kernel timed now (``triton.testing.do_bench``, L2 cleared between runs)
    on the stored side-by-side cases of ``card`` (32 query / 8 KV heads of 128, bf16, B = 16), beside the stored
    figures of that card: ours then, the best vLLM / SGLang kernel, the copy ceiling. None without a table."""
    from triton.testing import do_bench

    from paged_edu.kernels.decode.tutorial import paged_attention_triton
    from paged_edu.labs.timing import random_paged_case

    table = peer_figures(card)
    if table is None:
        return None
    g = table["geometry"]
    rows = []
    for case, stored in table["cases"].items():
        n, s = (int(x) for x in case.split("x"))
        q, k, v, tables, lens = random_paged_case(
            n, s, g["num_q_heads"], g["num_kv_heads"], g["head_dim"], g["block_size"], dtype=torch.bfloat16,
            device="cuda", seed=n,
        )  # fmt: skip
        us = 1e3 * do_bench(
            lambda: paged_attention_triton(q, k, v, tables, lens, scale=g["head_dim"] ** -0.5), rep=reps
        )
        peers = {k: v for k, v in stored.items() if k not in ("copy ceiling", "paged_edu Triton")}
        best = min(peers, key=peers.get)
        rows.append(
            dict(
                case=case,
                ours_now_us=us,
                ours_stored_us=stored["paged_edu Triton"],
                best_peer=best,
                best_peer_us=peers[best],
                copy_ceiling_us=stored["copy ceiling"],
            )
        )
    return rows

"""Paged prefill on a GPU: our Triton kernel against SDPA's flash path and FlexAttention's paged path.

    python benchmarks/bench_prefill.py            # the four cases: table + benchmarks/records/<card>/prefill_bench.json
    python benchmarks/bench_prefill.py --sweep    # also time a grid of kernel configurations per case

The cases are chunks with and without cached prefixes (``seqs x new over cached``): 8 x 1,024 over
1,024; 1 x 8,192; 64 x 128 over 2,048; 4 x 2,048. bf16, block size 16, 32 query / 8 KV heads of
head_dim 128, random non-contiguous block tables. New token ``j`` of a sequence with ``ctx`` cached
tokens sits at ``ctx + j`` and sees keys ``0 .. ctx + j`` (causal, aligned at the bottom right).

What runs, on the same data:

* **paged_edu Triton** -- :func:`paged_edu.kernels.triton_prefill.paged_prefill_triton` on the
  paged cache (its grid is sized from the number of tokens and chunks: no host sync).
* **SDPA, contiguous** -- ``torch.nn.functional.scaled_dot_product_attention`` on the same K/V
  gathered into ``(seqs, heads, tokens, head_dim)`` beforehand (untimed), in every formulation
  that reaches a fused kernel: forced onto the flash backend (FA2, ``sdpa_kernel(FLASH_ATTENTION)``)
  and onto cuDNN's (``CUDNN_ATTENTION``, on Hopper the fastest), and SDPA's own choice. With no
  prefix the mask is ``is_causal=True``; with a prefix it is ``causal_lower_right(q_len, kv_len)``,
  which SDPA hands to the flash kernel as a causal mask aligned at the bottom right (cuDNN gets
  that mask only as a boolean tensor, which is slow). GQA through ``enable_gqa=True`` and with K/V
  repeated to 32 heads (untimed). A plain boolean mask on SDPA's default choice is timed too, for
  reference. The yardstick is the fastest correct fused formulation of each case, named in the JSON.
* **FlexAttention, paged** -- ``flex_attention`` compiled, over the pool in its own head-major page
  layout ``(1, kv_heads, num_blocks * 16, head_dim)`` (copied beforehand, untimed), with the block
  mask of a bottom-right causal ``mask_mod`` converted to physical pages by
  ``torch.nn.attention.experimental._paged_attention.PagedAttention`` (its KV block size must equal
  the page size, 16, so its kernel runs with ``BLOCK_N=16``).

Timing: CUDA-graph replay, the L2 cache flushed before every replay, median (``Timer`` of
``bench_kernels.py``). TFLOP/s counts ``4 * head_dim * num_q_heads`` per (query, visible key) pair.
Every output is checked against the fp32 oracle
(:func:`paged_edu.kernels.reference.paged_prefill_reference` on fp32 copies) in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from paged_edu.labs.timing import Timer, rel_err  # noqa: E402
from record import record_path  # noqa: E402

from paged_edu.kernels.reference import gather_kv, paged_prefill_reference  # noqa: E402

CASES = [(8, 1024, 1024), (1, 8192, 0), (64, 128, 2048), (4, 2048, 0)]  # (seqs, new tokens, cached)
H_Q, H_KV, D, B = 32, 8, 128, 16
DEVICE = os.environ.get("BENCH_DEVICE", "cuda")  # "cpu" only for a smoke test of this script
TOL = 2e-2  # relative error allowed against the fp32 oracle (bf16 inputs and outputs)


def make_case(num_seqs, q_len, ctx, seed=0):
    """Pools of exactly the blocks the sequences use, shuffled; q packed varlen-style."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    s = ctx + q_len
    blocks_per_seq = -(-s // B)
    num_blocks = num_seqs * blocks_per_seq
    k_cache = torch.randn(num_blocks, B, H_KV, D, device=DEVICE, dtype=torch.bfloat16, generator=g)
    v_cache = torch.randn(num_blocks, B, H_KV, D, device=DEVICE, dtype=torch.bfloat16, generator=g)
    q = torch.randn(num_seqs * q_len, H_Q, D, device=DEVICE, dtype=torch.bfloat16, generator=g)
    tables = torch.randperm(num_blocks, device=DEVICE, generator=g).to(torch.int32).view(num_seqs, blocks_per_seq)
    lens = torch.full((num_seqs,), s, dtype=torch.int32, device=DEVICE)
    cu = torch.arange(0, num_seqs + 1, device=DEVICE, dtype=torch.int32) * q_len
    return q, k_cache, v_cache, tables, lens, cu


def flops(num_seqs, q_len, ctx):
    """4 * D * H_q FLOPs (QK^T and PV) per query per key it sees: ctx + j + 1 keys for token j."""
    pairs = num_seqs * (q_len * ctx + q_len * (q_len + 1) // 2)
    return 4 * D * H_Q * pairs


def oracle(q, k, v, t, lens, cu, scale):
    return paged_prefill_reference(q.float(), k.float(), v.float(), t, lens, cu, scale=scale)


# ----------------------------------------------------------------------------------------------
# The contenders
# ----------------------------------------------------------------------------------------------


def triton_fn(q, k, v, t, lens, cu, q_len, scale, config=None):
    from paged_edu.kernels.triton_prefill import paged_prefill_triton

    return lambda: paged_prefill_triton(q, k, v, t, lens, cu, scale=scale, config=config)


def sdpa_variants(q, k, v, t, lens, num_seqs, q_len, ctx, scale):
    """(name, uses_flash, fn) for every SDPA formulation; outputs come back packed like q."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    s = ctx + q_len
    kc, _ = gather_kv(k, t, lens)  # (N, L, H_kv, D)
    vc, _ = gather_kv(v, t, lens)
    kc = kc[:, :s].transpose(1, 2).contiguous()  # (N, H_kv, s, D)
    vc = vc[:, :s].transpose(1, 2).contiguous()
    qc = q.view(num_seqs, q_len, H_Q, D).transpose(1, 2).contiguous()  # (N, H_q, q_len, D)
    rep = H_Q // H_KV
    kr, vr = kc.repeat_interleave(rep, 1), vc.repeat_interleave(rep, 1)  # (N, H_q, s, D)

    def packed(o):  # (N, H_q, q_len, D) -> (N * q_len, H_q, D)
        return o.transpose(1, 2).reshape(num_seqs * q_len, H_Q, D)

    def forced(backend, fn):
        def run():
            with sdpa_kernel([backend]):
                return packed(fn())

        return run

    flash = lambda fn: forced(SDPBackend.FLASH_ATTENTION, fn)  # noqa: E731
    cudnn = lambda fn: forced(SDPBackend.CUDNN_ATTENTION, fn)  # noqa: E731

    if ctx == 0:
        mask_name, kw = "is_causal=True", dict(is_causal=True)
    else:
        mask_name, kw = f"causal_lower_right({q_len}, {s})", dict(attn_mask=causal_lower_right(q_len, s))
    pos_q = ctx + torch.arange(q_len, device=DEVICE)
    bool_mask = torch.arange(s, device=DEVICE)[None, :] <= pos_q[:, None]  # (q_len, s)
    sdpa = F.scaled_dot_product_attention
    out = [
        (
            f"flash (FA2), {mask_name}, enable_gqa",
            "sdpa_flash",
            flash(lambda: sdpa(qc, kc, vc, scale=scale, enable_gqa=True, **kw)),
        ),
        (
            f"flash (FA2), {mask_name}, K/V repeated to {H_Q} heads",
            "sdpa_flash",
            flash(lambda: sdpa(qc, kr, vr, scale=scale, **kw)),
        ),
    ]
    if ctx == 0:  # cuDNN's fused attention (Hopper: an FA3-class kernel); is_causal is top-left aligned
        out += [
            (
                "cuDNN, is_causal=True, enable_gqa",
                "sdpa_cudnn",
                cudnn(lambda: sdpa(qc, kc, vc, scale=scale, enable_gqa=True, is_causal=True)),
            ),
            (
                f"cuDNN, is_causal=True, K/V repeated to {H_Q} heads",
                "sdpa_cudnn",
                cudnn(lambda: sdpa(qc, kr, vr, scale=scale, is_causal=True)),
            ),
        ]
    # cuDNN with the bottom-right causal mask as an explicit boolean mask (if this build takes one)
    out.append(
        (
            f"cuDNN, boolean mask, K/V repeated to {H_Q} heads",
            "sdpa_cudnn",
            cudnn(lambda: sdpa(qc, kr, vr, attn_mask=bool_mask, scale=scale)),
        )
    )
    out.append(
        (
            f"default backend choice, {mask_name}, enable_gqa",
            "sdpa_default",
            lambda: packed(sdpa(qc, kc, vc, scale=scale, enable_gqa=True, **kw)),
        )
    )
    out.append(
        (
            "default backend choice, boolean mask, K/V repeated",
            "sdpa_other",
            lambda: packed(sdpa(qc, kr, vr, attn_mask=bool_mask, scale=scale)),
        )
    )
    return out


def flex_paged_fn(q, k, v, t, lens, num_seqs, q_len, ctx, scale, block_m):
    """FlexAttention over the pool in its head-major page layout, block mask converted to pages."""
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    num_blocks = k.shape[0]
    s = ctx + q_len
    pa = PagedAttention(num_blocks, B, num_seqs, device=DEVICE)
    n_used = t.shape[1]
    pa.page_table[:, :n_used] = t.long()
    rows = torch.arange(num_seqs, device=DEVICE)[:, None].expand(-1, n_used)
    pa.physical_to_logical[rows, t.long()] = torch.arange(n_used, device=DEVICE)[None, :].expand(num_seqs, -1)
    pa.capacity[:] = n_used * B
    kf = k.permute(2, 0, 1, 3).reshape(1, H_KV, num_blocks * B, D).contiguous()  # head-major pages
    vf = v.permute(2, 0, 1, 3).reshape(1, H_KV, num_blocks * B, D).contiguous()
    qc = q.view(num_seqs, q_len, H_Q, D).transpose(1, 2).contiguous()

    def causal_lower_right(b, h, q_idx, kv_idx):
        return q_idx + ctx >= kv_idx

    logical = create_block_mask(causal_lower_right, num_seqs, None, q_len, s, device=DEVICE, BLOCK_SIZE=(128, B))
    physical = pa.convert_logical_block_mask(logical, kv_len=lens.long())
    compiled = torch.compile(flex_attention, dynamic=False)
    opts = dict(BLOCK_M=block_m, BLOCK_N=B)

    kv = {"k": kf, "v": vf}

    def run():
        o = compiled(qc, kv["k"], kv["v"], block_mask=physical, scale=scale, enable_gqa=True, kernel_options=opts)
        return o.transpose(1, 2).reshape(num_seqs * q_len, H_Q, D)

    try:
        run()  # compile now; a FlexAttention that refuses K/V batch 1 gets K/V expanded over the batch
    except Exception:  # noqa: BLE001
        kv["k"], kv["v"] = kf.expand(num_seqs, -1, -1, -1), vf.expand(num_seqs, -1, -1, -1)
        run()
    return run


# ----------------------------------------------------------------------------------------------
# One case
# ----------------------------------------------------------------------------------------------


def timed(timer, fn, ref):
    """(median us, rel_err) under CUDA-graph replay; falls back to eager events if capture fails."""
    try:
        us, _, out = timer.graph(fn)
        how = "graph"
    except Exception:  # noqa: BLE001 -- e.g. a backend that syncs; time it eagerly instead
        torch.cuda.synchronize()
        out = fn()
        us, how = timer.events(fn), "events"
    return us, rel_err(out, ref), how


def measure_case(timer, case, sweep=None, flex_block_m=(128,), skip_flex=False):
    num_seqs, q_len, ctx = case
    scale = D**-0.5
    q, k, v, t, lens, cu = make_case(num_seqs, q_len, ctx)
    ref = oracle(q, k, v, t, lens, cu, scale)
    fl = flops(num_seqs, q_len, ctx)
    row = {
        "case": f"{num_seqs}x{q_len}" + (f" over {ctx}" if ctx else ""),
        "num_seqs": num_seqs,
        "q_len": q_len,
        "ctx": ctx,
        "tflop": fl / 1e12,
        "impls": {},
    }

    def record(name, fn, **extra):
        try:
            us, err, how = timed(timer, fn, ref)
        except Exception as exc:  # noqa: BLE001 -- a formulation the backend refuses
            row["impls"][name] = {"error": repr(exc)[:300], **extra}
            return
        row["impls"][name] = {
            "us": us,
            "TFLOPs": fl / us / 1e6,
            "rel_err": err,
            "correct": err < TOL,
            "timing": how,
            **extra,
        }
        torch.cuda.empty_cache()

    from paged_edu.kernels.triton_prefill import prefill_config

    row["triton_config"] = prefill_config(D, H_Q // H_KV, on_gpu=True)
    record("paged_edu Triton", triton_fn(q, k, v, t, lens, cu, q_len, scale), kind="triton")
    for name, kind, fn in sdpa_variants(q, k, v, t, lens, num_seqs, q_len, ctx, scale):
        record("SDPA " + name, fn, kind=kind)
    if not skip_flex:
        for bm in flex_block_m:
            record(
                f"FlexAttention paged, BLOCK_M={bm}, BLOCK_N={B}",
                flex_paged_fn(q, k, v, t, lens, num_seqs, q_len, ctx, scale, bm),
                kind="flex_paged",
            )

    if sweep:
        results = []
        for cfg in sweep:
            try:
                us, err, _ = timed(timer, triton_fn(q, k, v, t, lens, cu, q_len, scale, cfg), ref)
            except Exception as exc:  # noqa: BLE001 -- a config that does not compile (shared memory)
                results.append({"config": cfg, "error": repr(exc)[:200]})
                continue
            results.append({"config": cfg, "us": us, "TFLOPs": fl / us / 1e6, "rel_err": err})
        ok = sorted((r for r in results if "us" in r and r["rel_err"] < TOL), key=lambda r: r["us"])
        row["sweep"] = ok[:10]
        row["sweep_failed"] = [r for r in results if "us" not in r or r["rel_err"] >= TOL][:6]
    summarise(row)
    q = k = v = t = lens = cu = ref = None  # free the case's tensors (the lambdas above hold the names)
    torch.cuda.empty_cache()
    return row


def best(row, *kinds):
    cands = [(m["us"], n) for n, m in row["impls"].items() if m.get("kind") in kinds and m.get("correct")]
    return min(cands) if cands else (None, None)


def summarise(row):
    """The yardstick is the fastest correct fused SDPA kernel (FA2 or cuDNN), named."""
    tri = row["impls"]["paged_edu Triton"].get("us")
    f_us, f_name = best(row, "sdpa_flash", "sdpa_cudnn", "sdpa_default")
    fa2_us, fa2_name = best(row, "sdpa_flash")
    x_us, x_name = best(row, "flex_paged")
    row["summary"] = {
        "triton_us": tri,
        "best_sdpa_flash": f_name,
        "sdpa_flash_us": f_us,
        "best_sdpa_fa2": fa2_name,
        "sdpa_fa2_us": fa2_us,
        "best_flex_paged": x_name,
        "flex_paged_us": x_us,
        "vs_sdpa_flash": (f_us / tri) if tri and f_us else None,  # >= 0.8 is the target
        "vs_sdpa_fa2": (fa2_us / tri) if tri and fa2_us else None,
        "vs_flex_paged": (x_us / tri) if tri and x_us else None,  # > 1 is the target
        "triton_correct": row["impls"]["paged_edu Triton"].get("correct"),
    }


def sweep_grid():
    """Around the default (256 rows x 64 keys, 8 warps, 3 stages): depth, tile length, warps."""
    grid = [
        (256, 64, 8, 3),
        (256, 64, 8, 4),
        (256, 32, 8, 4),
        (256, 64, 16, 3),
        (256, 128, 16, 2),
        (256, 128, 16, 3),
        (512, 64, 16, 2),
        (128, 128, 8, 3),
        (128, 32, 4, 3),
    ]
    return [dict(ROWS=r, TILE=t, num_warps=w, num_stages=st) for r, t, w, st in grid]


def markdown(rows):
    lines = [
        "| case (seqs x new over cached) | paged_edu Triton | SDPA fused kernel, contiguous (best) | ratio | "
        "FlexAttention paged (best) | speed-up over Flex |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        s = r["summary"]
        tri = r["impls"]["paged_edu Triton"]
        f = r["impls"].get(s["best_sdpa_flash"] or "", {})
        x = r["impls"].get(s["best_flex_paged"] or "", {})
        cell = lambda m: f"{m['us']:.0f} µs, {m['TFLOPs']:.0f} TFLOP/s" if "us" in m else "–"  # noqa: E731
        ratio = f"{s['vs_sdpa_flash']:.2f}" if s["vs_sdpa_flash"] else "–"
        up = f"{s['vs_flex_paged']:.2f}×" if s["vs_flex_paged"] else "–"
        lines.append(f"| {r['case']} | {cell(tri)} | {cell(f)} | {ratio} | {cell(x)} | {up} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder of prefill_bench.json (default: benchmarks/records/<card>/)")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--sweep", action="store_true", help="also time a grid of kernel configurations per case")
    p.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compiles take a while)")
    p.add_argument("--flex-block-m", default="128", help="BLOCK_M values tried for FlexAttention (64 was 1.6x slower)")
    p.add_argument("--cases", default="", help="subset, e.g. 1x8192x0,64x128x2048")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_prefill.py needs a CUDA GPU (the interpreter is far too slow to benchmark)")
    cases = CASES if not args.cases else [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",")]
    timer = Timer(args.reps, args.warmup)
    rows = []
    for case in cases:
        t0 = time.time()
        rows.append(
            measure_case(
                timer,
                case,
                sweep_grid() if args.sweep else None,
                [int(b) for b in args.flex_block_m.split(",")],
                args.no_flex,
            )
        )
        print(f"{rows[-1]['case']}: {json.dumps(rows[-1]['summary'])} ({time.time() - t0:.0f}s)", flush=True)
        for name, m in rows[-1]["impls"].items():
            print(
                f"   {name}: "
                + (
                    f"{m['us']:.1f} us {m['TFLOPs']:.0f} TFLOP/s err {m['rel_err']:.1e} ({m['timing']})"
                    if "us" in m
                    else m["error"][:160]
                ),
                flush=True,
            )
        for r in rows[-1].get("sweep", [])[:4]:
            print(f"   sweep: {r['us']:.1f} us {r['TFLOPs']:.0f} TFLOP/s {r['config']}", flush=True)
    result = {
        "command": "python benchmarks/bench_prefill.py" + (" --sweep" if args.sweep else ""),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "geometry": {"dtype": "bf16", "block_size": B, "num_q_heads": H_Q, "num_kv_heads": H_KV, "head_dim": D},
        "timing": f"CUDA-graph replay, L2 flushed (256 MiB write) before each, median of {args.reps}",
        "targets": "faster than FlexAttention's paged path in every case; >= 0.8x SDPA's contiguous flash path",
        "cases": rows,
    }
    out = os.path.join(args.out, "prefill_bench.json") if args.out else str(record_path("prefill_bench.json"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print()
    print(markdown(rows))


if __name__ == "__main__":
    main()

"""One decode step of the SmolLM2-135M geometry on a GPU: plain PyTorch ops against the fused kernels.

    python benchmarks/bench_layer.py --out paged_edu/data/layer_bench.json               # table + JSON
    python benchmarks/bench_layer.py --sweep-decode --out paged_edu/data/layer_bench.json  # + decode configs
    python benchmarks/bench_layer.py --ab swiglu_gemm,pdl --batches 1,64  # A/B of Kernels switches
    python benchmarks/bench_layer.py --ab pdl --smoke                    # the A/B on a CPU, to check the script

What a decode step of the engine computes on the GPU, measured alone: the 30-layer model (random
bf16 weights, 9 query / 3 KV heads of 64, hidden 576) over a paged pool, one new token for each of
``batch`` sequences that already hold ``context - 1`` tokens, then the LM head for every row.
The step is captured in a CUDA graph as the engine's runner captures it (block tables as wide as
``--max-model-len``, so the decode kernel sizes its splits as it does in the engine) and replayed
with the L2 cache flushed before each replay; the median of CUDA-event times is reported.

For each batch, both paths (``fused_impl="torch"`` and ``"triton"``) run on the same weights, pool
and inputs and their logits are compared in the same run (the fused path as the engine runs it by
default, the decode kernel's own store included, :func:`paged_edu.kernels.triton_decode.rotary_store_decode_triton`;
``--no-fuse-decode-store``: the separate store; ``--no-swiglu-gemm``: gate_up by cuBLAS and the SiLU kernel
where the engine runs them as one skinny GEMM at <= 64 rows); ``torch.profiler`` over replays counts
the kernels per step and books their GPU time to GEMMs, attention, the fused kernels and the rest.
The oracle is the same step in fp32 by plain PyTorch (same weights and pool, upcast): 30 random bf16
layers amplify any change in the order of a sum (two bf16 paths whose GEMMs differ land 2-3e-2 apart), so
a row is ``ok`` when the fused step's logits are at most 1.5x (+ 5e-3) as far from fp32 as the bf16
PyTorch step's (``logits_rel_err_vs_fp32``); ``logits_rel_err`` is the two bf16 paths' distance.
The roofline is :meth:`paged_edu.sim.costmodel.CostModel.roofline` for the same batch: at full bandwidth
and peak FLOP/s with no overhead, the tied LM head's weight read counted (``roofline_us``, named
``ROOFLINE_NAME`` in the table), and with the model's default assumptions
(85 % of the bandwidth, 1 ms of overhead per step: ``cost_model_us``).

``--ab SWITCH[,SWITCH...]`` times only the fused step, in one process on one card: the step as the other flags
set it (``base``) and, for each switch (a boolean field of :class:`~paged_edu.models.llama.Kernels`:
``fuse_decode_store``, ``swiglu_gemm``, ``pdl``), the same step with that field flipped.
Every variant is captured once; ``--rounds`` rounds then replay each in turn (``--reps`` replays a round, L2
flushed before each), so a drift of the card's clock falls on all of them alike; the median of the rounds'
medians is reported, with the kernels per step (``torch.profiler``) and whether the logits are the base's bit
for bit. It writes ``benchmarks/records/<card>/layer_ab_<switches>.json`` (``record.provenance()`` at the
top) unless ``--out`` says otherwise. ``--smoke``: a 2-layer model on the CPU under the Triton interpreter,
eager calls timed by the wall clock (no graphs, no profile) -- a check of the script, not a measurement.

``--sweep-decode`` also times the paged decode kernel alone at SmolLM2's shape: the default
(one program per KV head) and the whole-row kernel of :mod:`paged_edu.labs.triton_decode_packed`
over a grid of tiles, warps, pipeline stages and splits.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import statistics
import sys
import time
from dataclasses import fields, replace

if "--smoke" in sys.argv:  # the kernels are decorated at import: the interpreter is chosen before
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from paged_edu.kernels import paged_attention_decode  # noqa: E402
from paged_edu.kernels.support import SKINNY_MAX_ROWS  # noqa: E402
from paged_edu.labs.timing import profile_replays, random_paged_case, rel_err  # noqa: E402
from paged_edu.models.config import smollm2_config  # noqa: E402
from paged_edu.models.llama import ForwardBatch, Kernels  # noqa: E402
from paged_edu.models.loaders import random_llama  # noqa: E402
from paged_edu.core.hardware import MODELS  # noqa: E402
from paged_edu.labs.card import this_card  # noqa: E402
from paged_edu.sim.costmodel import ROOFLINE_NAME, CostModel  # noqa: E402
from record import provenance, record_path  # noqa: E402

BATCHES = (1, 16, 64, 256)
BLOCK = 16
# The switches --ab may flip: the boolean fields of Kernels, each a speed choice that keeps the tokens.
AB_SWITCHES = tuple(f.name for f in fields(Kernels) if isinstance(f.default, bool))


# ----------------------------------------------------------------------------------------------
# Timing a captured step
# ----------------------------------------------------------------------------------------------


def capture(fn):
    """``fn`` captured in a CUDA graph after two warm-up calls (compiles, allocations): (graph, output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


def time_replays(graph, reps: int, flush: torch.Tensor) -> float:
    """Median microseconds of ``reps`` replays, L2 flushed (a 256 MiB write) before each."""
    for _ in range(5):
        graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.zero_()
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


# ----------------------------------------------------------------------------------------------
# The step
# ----------------------------------------------------------------------------------------------


def model_and_pool(config, batches, context: int, dtype, device) -> tuple:
    """``(model, kv_pairs)``: random weights of ``config`` and a pool of random K/V, one ``(k_cache, v_cache)``
    pair per layer of ``(num_blocks, BLOCK, num_kv_heads, head_dim)``, blocks enough for the largest batch."""
    model = random_llama(config, seed=0, dtype=dtype, device=device)
    num_blocks = max(batches) * -(-context // BLOCK) + 16
    g = torch.Generator(device=device).manual_seed(1)
    shape = (num_blocks, BLOCK, config.num_kv_heads, config.head_dim)
    kv_pairs = [tuple(torch.randn(shape, device=device, generator=g).to(dtype) for _ in range(2)) for _ in model.layers]
    return model, kv_pairs


def decode_batch(
    batch: int, context: int, width: int, num_blocks: int, device, seed: int, vocab_size: int = 49152
) -> ForwardBatch:
    """``batch`` sequences of ``context`` tokens, the last one new; shuffled, non-shared blocks."""
    g = torch.Generator().manual_seed(seed)
    per_seq = -(-context // BLOCK)
    blocks = torch.randperm(num_blocks, generator=g)[: batch * per_seq].view(batch, per_seq)
    tables = torch.zeros(batch, width, dtype=torch.int32)
    tables[:, :per_seq] = blocks.to(torch.int32)
    pos = context - 1
    slots = blocks[:, pos // BLOCK] * BLOCK + pos % BLOCK  # (batch,)
    return ForwardBatch(
        input_ids=torch.randint(0, vocab_size, (batch,), generator=g).to(device),
        positions=torch.full((batch,), pos, dtype=torch.long, device=device),
        slot_mapping=slots.to(device),
        num_decodes=batch,
        decode_block_tables=tables.to(device),
        decode_seq_lens=torch.full((batch,), context, dtype=torch.int32, device=device),
        prefill_block_tables=None,
        prefill_seq_lens=None,
        prefill_cu_seqlens_q=None,
        logits_rows=torch.arange(batch, device=device),
    )


def measure_step(
    model,
    kv_pairs,
    batch,
    context,
    width,
    reps,
    flush,
    roofline,
    cost,
    fp32,
    fuse_decode_store=True,
    swiglu_gemm=True,
    gemm="auto",
    pdl=True,
) -> dict:
    """The step's time, kernels and logits, unfused (``fused="torch"``) and fused (``"triton"``, with
    ``fuse_decode_store`` and ``swiglu_gemm`` as asked); ``fp32``: the same model and pool in fp32
    ``(model, kv_pairs)``, whose plain PyTorch step is the oracle both bf16 paths are held to (module
    docstring)."""
    num_blocks = kv_pairs[0][0].shape[0]
    fb = decode_batch(batch, context, width, num_blocks, model.device, seed=batch, vocab_size=model.config.vocab_size)
    row = {
        "batch": batch,
        "context": context,
        "roofline_us": roofline.decode_step_time(batch, context - 1) * 1e6,
        "cost_model_us": cost.decode_step_time(batch, context - 1) * 1e6,
    }
    logits = {}
    for impl in ("torch", "triton"):
        fused = impl == "triton"
        kernels = Kernels(
            fused=impl,
            fuse_decode_store=fuse_decode_store,
            swiglu_gemm=swiglu_gemm and fused,
            gemm=gemm if fused else "torch",
            pdl=pdl and fused,  # on where it applies (Kernels.resolve / for_step), as in the engine
        )
        step = lambda: model.compute_logits(model(fb, kv_pairs, kernels))  # noqa: E731  (batch, vocab) fp32
        graph, out = capture(step)
        graph.replay()
        torch.cuda.synchronize()
        logits[impl] = out.clone()
        name = "unfused" if impl == "torch" else "fused"
        row[f"{name}_us"] = time_replays(graph, reps, flush)
        row[f"{name}_profile"] = profile_replays(graph, step)
        del graph
    ref, got = logits["torch"], logits["triton"]
    row["logits_rel_err"] = rel_err(got, ref)
    row["argmax_agree"] = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
    model32, kv32 = fp32
    plain = Kernels(decode="torch", prefill="torch", fused="torch")
    truth = model32.compute_logits(model32(fb, kv32, plain), plain).float()
    err = row["logits_rel_err_vs_fp32"] = {"unfused": rel_err(ref.float(), truth), "fused": rel_err(got.float(), truth)}
    row["ok"] = err["fused"] <= 1.5 * err["unfused"] + 5e-3  # the fused path no further from fp32, within 1.5x
    row["speedup"] = row["unfused_us"] / row["fused_us"]
    row["fused_over_roofline"] = row["fused_us"] / row["roofline_us"]
    return row


# ----------------------------------------------------------------------------------------------
# A/B of Kernels switches: the fused step, each switch flipped, in one process
# ----------------------------------------------------------------------------------------------


def ab_step(model, kv_pairs, batch, context, width, base: Kernels, switches, reps, rounds, flush) -> dict:
    """One batch's fused step with ``base`` and with each of ``switches`` flipped (module docstring, ``--ab``):
    per variant the median microseconds, each round's median, kernels per step and the logits against base's.
    ``flush`` None: the smoke run (CPU, eager, wall clock)."""
    num_blocks = kv_pairs[0][0].shape[0]
    fb = decode_batch(batch, context, width, num_blocks, model.device, seed=batch, vocab_size=model.config.vocab_size)
    variants = {"base": base, **{name: replace(base, **{name: not getattr(base, name)}) for name in switches}}
    runs, steps, logits = {}, {}, {}
    for key, kernels in variants.items():
        step = steps[key] = lambda k=kernels: model.compute_logits(model(fb, kv_pairs, k))  # noqa: E731
        if flush is None:
            runs[key], out = step, step()
        else:
            runs[key], out = capture(step)
            runs[key].replay()
            torch.cuda.synchronize()
        logits[key] = out.clone()
    rounds_us = {key: [] for key in variants}
    for _ in range(rounds):  # interleaved: each round times every variant once
        for key, run in runs.items():
            if flush is None:
                t0 = time.perf_counter()
                run()
                rounds_us[key].append((time.perf_counter() - t0) * 1e6)
            else:
                rounds_us[key].append(time_replays(run, reps, flush))
    row = {"batch": batch, "context": context, "variants": {}}
    for key, kernels in variants.items():
        resolved = kernels.resolve(model.device).for_step(batch)
        got, ref = logits[key], logits["base"]
        row["variants"][key] = {
            "kernels": {name: getattr(resolved, name) for name in ("decode", "fused", "gemm", *AB_SWITCHES)},
            "us": statistics.median(rounds_us[key]),
            "us_rounds": rounds_us[key],
            "kernels_per_step": None if flush is None else profile_replays(runs[key], steps[key])["kernels_per_step"],
            "logits_equal_base": bool(torch.equal(got, ref)),
            "logits_rel_err_base": rel_err(got, ref),
            "argmax_agree_base": float((got.argmax(-1) == ref.argmax(-1)).float().mean()),
        }
    return row


def ab_markdown(rows) -> str:
    lines = [
        "| batch | variant | us | vs base | kernels/step | logits = base |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        base = r["variants"]["base"]["us"]
        for key, v in r["variants"].items():
            k = "-" if v["kernels_per_step"] is None else f"{v['kernels_per_step']:.0f}"
            same = "bit for bit" if v["logits_equal_base"] else f"rel err {v['logits_rel_err_base']:.1e}"
            name = key if key == "base" else f"{key} -> {v['kernels'][key]}"
            lines.append(f"| {r['batch']} | {name} | {v['us']:.1f} | {v['us'] / base - 1:+.1%} | {k} | {same} |")
    return "\n".join(lines)


def run_ab(args, argv) -> int:
    """``--ab``: build the model and pool (SmolLM2's geometry on the GPU; ``--smoke``: 2 small layers on the
    CPU), A/B every batch, print the table and write the record."""
    switches = [s for s in args.ab.split(",") if s]
    unknown = [s for s in switches if s not in AB_SWITCHES]
    if unknown or not switches:
        print(f"--ab takes a comma-separated list of {', '.join(AB_SWITCHES)}; got {args.ab!r}")
        return 1
    if args.smoke:
        device = torch.device("cpu")
        small = dict(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)
        config = replace(smollm2_config(), vocab_size=512, **small)
        dtype, flush = torch.float32, None
        batches, context, reps, rounds = [1, 3], 20, 1, 2
    elif not torch.cuda.is_available():
        print("bench_layer needs a CUDA GPU (--smoke: a CPU check of --ab)")
        return 1
    else:
        device, config, dtype = torch.device("cuda"), smollm2_config(), torch.bfloat16
        flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
        batches, context, reps, rounds = [int(b) for b in args.batches.split(",")], args.context, args.reps, args.rounds
    width = -(-args.max_model_len // BLOCK)
    model, kv_pairs = model_and_pool(config, batches, context, dtype, device)
    base = Kernels(
        fuse_decode_store=args.fuse_decode_store,
        swiglu_gemm=args.swiglu_gemm,
        gemm=args.gemm,
        pdl=args.pdl,
        **({"decode": "triton", "prefill": "torch", "fused": "triton"} if args.smoke else {}),
    )
    rows = []
    for b in batches:
        rows.append(ab_step(model, kv_pairs, b, context, width, base, switches, reps, rounds, flush))
        print(", ".join(f"batch {b} {k}: {v['us']:.1f} us" for k, v in rows[-1]["variants"].items()), flush=True)
    table = ab_markdown(rows)
    print(table)
    name = f"layer_ab_{'_'.join(switches)}{'_smoke' if args.smoke else ''}.json"
    out = args.out or str(record_path(name))
    record = {
        **provenance("bench_layer.py", argv),
        "what": "the fused decode step (CUDA graph, L2 flushed) with the base Kernels and each switch flipped",
        "model": f"{'2 small layers, fp32, interpreter (smoke)' if args.smoke else 'SmolLM2-135M geometry'}, "
        "random weights",
        "base": {name: getattr(base, name) for name in ("decode", "fused", "gemm", *AB_SWITCHES)},
        "switches": switches,
        "block_size": BLOCK,
        "max_model_len": args.max_model_len,
        "reps": reps,
        "rounds": rounds,
        "rows": rows,
        "table": table,
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    print(f"wrote {out}")
    return 0


# ----------------------------------------------------------------------------------------------
# The decode kernel alone at SmolLM2's shape: a configuration sweep
# ----------------------------------------------------------------------------------------------


def sweep_decode(batch, context, width, flush, reps=30) -> dict:
    from paged_edu.kernels.support import num_sms
    from paged_edu.kernels.triton_decode import choose_num_splits, decode_config, paged_attention_triton
    from paged_edu.labs.triton_decode_packed import paged_attention_packed

    c = smollm2_config()
    q, k, v, tables, lens = random_paged_case(
        batch, context, c.num_heads, c.num_kv_heads, c.head_dim, BLOCK, dtype=torch.bfloat16, device="cuda", seed=batch
    )
    wide = torch.zeros(batch, width, dtype=torch.int32, device="cuda")
    wide[:, : tables.shape[1]] = tables
    scale = c.head_dim**-0.5
    ref = paged_attention_decode(q.float(), k.float(), v.float(), wide, lens, impl="torch")

    def run(config=None, splits=None, packed=False):
        attend = paged_attention_packed if packed else paged_attention_triton
        graph, out = capture(lambda: attend(q, k, v, wide, lens, scale=scale, num_splits=splits, config=config))
        us = time_replays(graph, reps, flush)
        return us, rel_err(out, ref)

    default_us, default_err = run()  # what the model runs: one program per KV head, decode_config
    per_head_us, per_head_err = run(packed=False)  # the same (kept apart: it was not always the default)
    cfg = decode_config(c.head_dim, c.num_heads // c.num_kv_heads, on_gpu=True)
    per_head_splits = choose_num_splits(batch, c.num_kv_heads, width * BLOCK, cfg["TILE"], num_sms(0))
    results = []
    for tile, warps, stages, splits in itertools.product((16, 32, 64), (2, 4), (1, 2, 3), (1, 2, 4, 8)):
        try:  # the packed kernel's grid
            us, err = run(dict(TILE=tile, num_warps=warps, num_stages=stages), splits, packed=True)
        except Exception as exc:  # a config that does not compile (shared memory): recorded, skipped
            results.append({"tile": tile, "warps": warps, "stages": stages, "splits": splits, "error": repr(exc)[:120]})
            continue
        results.append({"tile": tile, "warps": warps, "stages": stages, "splits": splits, "us": us, "rel_err": err})
    ok = sorted((r for r in results if "us" in r and r["rel_err"] < 2e-2), key=lambda r: r["us"])
    kv_bytes = 2 * batch * context * c.num_kv_heads * c.head_dim * 2
    return {
        "batch": batch,
        "context": context,
        "default_us": default_us,
        "default_rel_err": default_err,
        "per_head_us": per_head_us,
        "per_head_rel_err": per_head_err,
        "per_head_config": {**cfg, "splits": per_head_splits},
        "kv_bytes": kv_bytes,
        "default_TBps": kv_bytes / default_us / 1e6,
        "packed_best": ok[:8],
        "errors": [r for r in results if "error" in r][:4],
    }


def sweep_splits(batches, contexts, width, reps=30, splits=(1, 2, 4, 8, 16)) -> list[dict]:
    """The decode kernel's split count at small batches, as a step meets it: one graph of 30 calls
    (one per layer, each over its own K/V, so the L2 cache holds none of it), block tables
    ``width`` wide as in the engine; per-layer microseconds for each forced split count and for
    the default (:func:`~paged_edu.kernels.triton_decode.choose_num_splits`, from the width)."""
    from paged_edu.kernels.triton_decode import paged_attention_triton

    c = smollm2_config()
    scale = c.head_dim**-0.5
    rows = []
    for batch, context in itertools.product(batches, contexts):
        layers = []
        for layer in range(c.num_layers):
            q, k, v, tables, lens = random_paged_case(
                batch,
                context,
                c.num_heads,
                c.num_kv_heads,
                c.head_dim,
                BLOCK,
                dtype=torch.bfloat16,
                device="cuda",
                seed=layer,
            )
            wide = torch.zeros(batch, width, dtype=torch.int32, device="cuda")
            wide[:, : tables.shape[1]] = tables
            layers.append((q, k, v, wide, lens))
        ref = paged_attention_decode(*(t.float() if t.is_floating_point() else t for t in layers[0]), impl="torch")
        row = {"batch": batch, "context": context, "us_per_layer": {}, "rel_err": {}}
        for n in (None, *splits):
            graph, out = capture(lambda n=n: [paged_attention_triton(*t, scale=scale, num_splits=n) for t in layers][0])
            for _ in range(3):
                graph.replay()
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
            for i in range(reps):
                starts[i].record()
                graph.replay()
                ends[i].record()
            torch.cuda.synchronize()
            key = "default" if n is None else str(n)
            row["us_per_layer"][key] = statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)) / len(
                layers
            )
            row["rel_err"][key] = rel_err(out, ref)
            del graph
        best = min(row["us_per_layer"], key=row["us_per_layer"].get)
        print(
            f"splits {batch} x {context}: default {row['us_per_layer']['default']:.2f} us/layer, best {best} "
            f"{row['us_per_layer'][best]:.2f}; " + ", ".join(f"{k}: {v:.2f}" for k, v in row["us_per_layer"].items()),
            flush=True,
        )
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------


def markdown(rows) -> str:
    lines = [
        f"| batch | unfused us | fused us | speedup | kernels/step unfused -> fused | {ROOFLINE_NAME} us | fused / roofline "
        "| cost model us | logits rel err |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['unfused_us']:.0f} | {r['fused_us']:.0f} | {r['speedup']:.2f}x "
            f"| {r['unfused_profile']['kernels_per_step']:.0f} -> {r['fused_profile']['kernels_per_step']:.0f} "
            f"| {r['roofline_us']:.0f} | {r['fused_over_roofline']:.2f}x | {r['cost_model_us']:.0f} "
            f"| {r['logits_rel_err']:.1e} |"
        )
    lines += [
        "",
        "GPU time per step by kind of kernel, unfused -> fused (us, kernels):",
        "",
        "| batch | GEMM | attention | fused kernels | other elementwise |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = []
        for kind in ("gemm", "attention", "fused", "other"):
            a, b = (r[f"{n}_profile"]["by_kind"].get(kind, {"us": 0, "kernels": 0}) for n in ("unfused", "fused"))
            cells.append(f"{a['us']:.0f} ({a['kernels']:.0f}) -> {b['us']:.0f} ({b['kernels']:.0f})")
        lines.append(f"| {r['batch']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", default=None, help="the JSON (default: paged_edu/data/layer_bench.json; with --ab the record)"
    )
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--context", type=int, default=512, help="tokens per sequence, the new one included")
    p.add_argument(
        "--max-model-len", type=int, default=8192, help="block-table width x 16 (the engine's default for SmolLM2)"
    )
    p.add_argument("--reps", type=int, default=50)
    p.add_argument(
        "--fuse-decode-store",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the fused path's decode kernel rotates and stores the new token itself (the engine's default)",
    )
    p.add_argument("--sweep-decode", action="store_true")
    p.add_argument(
        "--swiglu-gemm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the fused side's Kernels(swiglu_gemm=...) (default on, as the engine): gate_up and silu*mul in "
        f"one skinny GEMM at <= {SKINNY_MAX_ROWS} rows",
    )
    p.add_argument(
        "--ab",
        default="",
        help=f"SWITCH[,SWITCH...] of {', '.join(AB_SWITCHES)}: only the fused step, base and each switch flipped",
    )
    p.add_argument("--rounds", type=int, default=3, help="--ab: interleaved rounds of --reps replays per variant")
    p.add_argument("--smoke", action="store_true", help="--ab on the CPU with 2 small layers (a check of the script)")
    p.add_argument(
        "--gemm",
        choices=("auto", "torch", "triton"),
        default="auto",
        help="the fused side's Kernels(gemm=...): 'auto' (the engine's default: the skinny Triton GEMM where PDL is "
        f"on), cuBLAS, or the skinny GEMM at <= {SKINNY_MAX_ROWS} rows",
    )
    p.add_argument(
        "--pdl",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"the fused side's Kernels(pdl=...) (default on, as the engine): a step of <= {SKINNY_MAX_ROWS} rows "
        "launches its Triton kernels as programmatic dependents (Hopper)",
    )
    p.add_argument(
        "--sweep-splits",
        default="",
        help="BATCHES/CONTEXTS, e.g. 1,4,16/256,1024: only the decode kernel's split counts",
    )
    args = p.parse_args(argv)
    if args.ab:
        return run_ab(args, argv if argv is not None else sys.argv[1:])
    if args.smoke:
        print("--smoke checks --ab only")
        return 1
    args.out = args.out or "paged_edu/data/layer_bench.json"
    if not torch.cuda.is_available():
        print("bench_layer needs a CUDA GPU")
        return 1
    batches = [int(b) for b in args.batches.split(",")]
    width = -(-args.max_model_len // BLOCK)
    if args.sweep_splits:
        bs, ctxs = ([int(x) for x in part.split(",")] for part in args.sweep_splits.split("/"))
        rows = sweep_splits(bs, ctxs, width)
        with open(args.out, "w") as f:
            json.dump(
                {
                    "command": "python benchmarks/bench_layer.py " + " ".join(argv or sys.argv[1:]),
                    "device": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "max_model_len": args.max_model_len,
                    "splits": rows,
                },
                f,
                indent=1,
            )
        print(f"wrote {args.out}")
        return 0
    model, kv_pairs = model_and_pool(smollm2_config(), batches, args.context, torch.bfloat16, "cuda")
    # The oracle: the same weights and pool in fp32, stepped by plain PyTorch (measure_step)
    fp32 = (copy.deepcopy(model).float(), [(k.float(), v.float()) for k, v in kv_pairs])
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    card = this_card("cuda")  # the roofline's spec: this card's row of the GPU table
    spec = MODELS["smollm2-135m"]
    cost = CostModel(model=spec, gpu=card.gpu)
    roofline = cost.roofline()
    rows = []
    for b in batches:
        rows.append(
            measure_step(
                model,
                kv_pairs,
                b,
                args.context,
                width,
                args.reps,
                flush,
                roofline,
                cost,
                fp32,
                args.fuse_decode_store,
                args.swiglu_gemm,
                args.gemm,
                args.pdl,
            )
        )
        r = rows[-1]
        err = r["logits_rel_err_vs_fp32"]
        print(
            f"batch {b}: unfused {r['unfused_us']:.0f} us ({r['unfused_profile']['kernels_per_step']:.0f} kernels), "
            f"fused {r['fused_us']:.0f} us ({r['fused_profile']['kernels_per_step']:.0f} kernels), "
            f"roofline {r['roofline_us']:.0f} us, logits rel err {r['logits_rel_err']:.1e} (from fp32: unfused "
            f"{err['unfused']:.1e}, fused {err['fused']:.1e}){'' if r['ok'] else '  FUSED TOO FAR FROM FP32'}",
            flush=True,
        )
    result = {
        "command": " ".join(["python benchmarks/bench_layer.py", *(argv if argv is not None else sys.argv[1:])]),
        "device": torch.cuda.get_device_name(),
        **card.record(),  # and the GPU spec that priced roofline_us
        "torch": torch.__version__,
        "model": "SmolLM2-135M geometry, random bf16 weights",
        "fuse_decode_store": args.fuse_decode_store,
        "block_size": BLOCK,
        "max_model_len": args.max_model_len,
        "swiglu_gemm": args.swiglu_gemm,  # the fused side's Kernels(swiglu_gemm=...)
        "skinny_max_rows": SKINNY_MAX_ROWS,  # the batches the skinny GEMM (and so swiglu_gemm) applies to
        "gemm": args.gemm,  # the fused side's Kernels(gemm=...)
        "pdl": args.pdl,  # the fused side's Kernels(pdl=...)
        "rows": rows,
    }
    print(f"roofline priced on the {card.label}")
    print(markdown(rows))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def save():  # after the steps, and again after each sweep: a run cut short keeps what it measured
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    save()
    if args.sweep_decode:
        result["decode_sweep"] = []
        for b in sorted(batches, reverse=True):
            s = sweep_decode(b, args.context, width, flush)
            result["decode_sweep"].append(s)
            save()
            best = s["packed_best"][0] if s["packed_best"] else {}
            print(
                f"decode {b} x {args.context}: default {s['default_us']:.1f} us ({s['default_TBps']:.2f} TB/s, "
                f"err {s['default_rel_err']:.1e}); per-head kernel {s['per_head_us']:.1f} us "
                f"({s['per_head_config']}); packed best {best}",
                flush=True,
            )
    print(f"wrote {args.out}")
    return 0 if all(r["ok"] for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())

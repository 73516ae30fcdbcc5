"""The skinny GEMM against cuBLAS at SmolLM2-135M's decode shapes, inside CUDA graphs.

    python benchmarks/bench_gemm.py   # table + sweep + benchmarks/records/<card>/gemm_bench.json (~90 s)
    python benchmarks/bench_gemm.py --smoke --out /tmp/gemm_smoke.json   # CPU, interpreter, tiny

For each of SmolLM2's five projections (qkv, o_proj, gate_up, down, the tied LM head) and each
batch ``M``, ``y = x @ W^T`` runs ``--calls`` times back to back on *distinct* weight tensors, as
a layer stack does, captured in one CUDA graph: once with ``F.linear`` (cuBLAS), once with
:func:`paged_edu.kernels.triton_gemm.skinny_matmul` at its default config. Each replay follows a
256 MiB write that flushes the L2 cache (``bench_layer.time_replays``), so every weight comes from
HBM; the median of ``--reps`` replays, divided by the calls, is the time per GEMM (kernel plus the
graph's gap to the next one). ``floor_us`` is the weight read at the H200's 4.8 TB/s.

Then whole decode steps (``--step-batches``): the 30-layer model with the fused per-token
kernels, its projections and LM head by cuBLAS and by the skinny GEMM (``Kernels(gemm=...)``), each
step captured in a CUDA graph as ``bench_layer.py`` captures it (context 512, block tables 8,192
tokens wide, L2 flushed): the end-to-end effect, with the two paths' logits compared.

Then a sweep: variations of the default config (one knob at a time: SPLIT_K, BLOCK_N, BLOCK_K,
num_warps, num_stages) per shape at the ``--sweep-ms`` batches, until ``--budget-s`` has passed
since the start (Triton compiles each config once, ~1 s: the compiles are the run's time). Every
measured output is checked against an fp32 matmul (``rel_err``); ``best`` lists per shape and M
the fastest config whose error is small. A config that does not compile is recorded with its error.

``--smoke`` runs the same code on the CPU in Triton's interpreter (set here before the kernels
are imported) at shapes 8-16x smaller, timing with ``perf_counter``: a check that the script runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

if "--smoke" in sys.argv[1:]:  # read when the kernels are decorated, so before any paged_edu import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_layer import capture, time_replays  # noqa: E402
from record import provenance, record_path  # noqa: E402

from paged_edu.labs.card import this_card  # noqa: E402
from paged_edu.kernels.support import SKINNY_MAX_ROWS  # noqa: E402
from paged_edu.labs.timing import rel_err  # noqa: E402
from paged_edu.models.config import smollm2_config  # noqa: E402

C = smollm2_config()
# name -> (N, K) of nn.Linear's weight: qkv (960, 576), o_proj (576, 576), gate_up (3072, 576),
# down (576, 1536), lm_head (49152, 576)
SHAPES = C.linear_shapes()
SMOKE_SHAPES = {name: (N // 16, K // 8) for name, (N, K) in SHAPES.items()}  # K = 72 or 192: masked tails
MS = (1, 4, 8, 16, 32)
OK_ERR = 1e-2  # bf16 output: ~3e-3 relative (one rounding); a broken config gives ~1


def sweep_configs(M: int, N: int, K: int, num_sms: int) -> list[dict]:
    """The default config and its one-knob neighbours (valid ones only: tl.dot's 16, splits <= K steps)."""
    from paged_edu.kernels.triton_gemm import skinny_config

    d = skinny_config(M, N, K, num_sms)
    k_steps = -(-K // d["BLOCK_K"])
    variants = [
        {},
        {"SPLIT_K": 1},
        {"SPLIT_K": 2 * d["SPLIT_K"]},
        {"BLOCK_N": 2 * d["BLOCK_N"]},
        {"BLOCK_N": d["BLOCK_N"] // 2},
        {"BLOCK_K": 2 * d["BLOCK_K"]},
        {"BLOCK_K": d["BLOCK_K"] // 2, "SPLIT_K": min(2 * d["SPLIT_K"], 2 * k_steps) if d["SPLIT_K"] > 1 else 1},
        {"num_warps": 2},
        {"num_warps": 8},
        {"num_stages": 2},
        {"num_stages": 3},
        {"num_stages": 5},
    ]
    out = []
    for v in variants:
        c = {**d, **v}
        steps = -(-K // c["BLOCK_K"])
        if c["BLOCK_N"] < 16 or c["BLOCK_K"] < 16 or c["SPLIT_K"] > steps or c in out:
            continue
        out.append(c)
    return out


class Timer:
    """Per-call microseconds of ``fn`` (``calls`` GEMMs): a CUDA graph replayed ``reps`` times after an
    L2 flush on a GPU; plain calls timed with ``perf_counter`` on the CPU (``--smoke``)."""

    def __init__(self, device: torch.device, reps: int) -> None:
        self.device, self.reps = device, reps
        self.flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device) if device.type == "cuda" else None

    def __call__(self, fn, calls: int) -> tuple[float, list[torch.Tensor]]:
        if self.device.type != "cuda":
            outs, times = fn(), []
            for _ in range(self.reps):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            return statistics.median(times) * 1e6 / calls, outs
        graph, outs = capture(fn)
        us = time_replays(graph, self.reps, self.flush) / calls
        outs = [o.clone() for o in outs]  # the last replay's results, kept past the graph
        del graph
        return us, outs


def measure(timer, impl, x, weights, config=None) -> dict:
    """One impl over the stack of weights: per-call us and the error of the first and last outputs."""
    from paged_edu.kernels.triton_gemm import skinny_matmul

    if impl == "cublas":
        fn = lambda: [F.linear(x, w) for w in weights]  # noqa: E731
    else:
        fn = lambda: [skinny_matmul(x, w, config=config) for w in weights]  # noqa: E731
    us, outs = timer(fn, len(weights))
    err = max(rel_err(outs[i].float(), x.float() @ weights[i].float().T) for i in (0, len(weights) - 1))
    return {"us": us, "rel_err": err, "ok": err < OK_ERR}


def step_times(timer, batches, device, dtype, tiny: bool) -> list[dict]:
    """A decode step of SmolLM2's geometry (``tiny``: a 2-layer toy, for --smoke), gemm "torch" vs "triton"."""
    from bench_layer import BLOCK, decode_batch

    from paged_edu.models.config import LlamaConfig
    from paged_edu.models.llama import Kernels
    from paged_edu.models.loaders import random_llama

    cfg = C
    context, max_model_len = 512, 8192
    if tiny:
        cfg = LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            max_position_embeddings=64,
        )
        context, max_model_len = 8, 32
    model = random_llama(cfg, seed=0, dtype=dtype, device=device)
    width, per_seq = -(-max_model_len // BLOCK), -(-context // BLOCK)
    num_blocks = max(batches) * per_seq + 16
    g = torch.Generator(device=device).manual_seed(1)
    kv_pairs = [
        tuple(
            torch.randn(num_blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim, device=device, generator=g).to(dtype)
            for _ in range(2)
        )
        for _ in range(cfg.num_layers)
    ]
    rows = []
    for b in batches:
        fb = decode_batch(b, context, width, num_blocks, device, seed=b)
        fb.input_ids = fb.input_ids % cfg.vocab_size
        row, logits = {"batch": b, "context": context, "num_layers": cfg.num_layers}, {}
        for gemm in ("torch", "triton"):
            kernels = Kernels(fused="triton", gemm=gemm)
            step = lambda: [model.compute_logits(model(fb, kv_pairs, kernels), kernels)]  # noqa: E731,B023
            row[f"{gemm}_gemm_us"], (logits[gemm],) = timer(step, 1)
        row["logits_rel_err"] = rel_err(logits["triton"], logits["torch"])
        row["argmax_agree"] = float((logits["triton"].argmax(-1) == logits["torch"].argmax(-1)).float().mean())
        row["speedup"] = row["torch_gemm_us"] / row["triton_gemm_us"]
        row["ok"] = row["logits_rel_err"] < 2e-2
        rows.append(row)
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="the JSON record (default: benchmarks/records/<card>/gemm_bench.json)")
    p.add_argument(
        "--ms",
        default=",".join(map(str, MS)),
        help=f"batches (rows of x), each <= {SKINNY_MAX_ROWS} (the skinny GEMM's MAX_ROWS)",
    )
    p.add_argument("--sweep-ms", default="1,16,32", help="batches the config sweep runs at (in this order)")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--calls", type=int, default=30, help="GEMMs per graph, each on its own weight")
    p.add_argument("--reps", type=int, default=50, help="graph replays; the median is reported")
    p.add_argument("--step-batches", default="1,16", help="decode steps of the whole model ('' to skip)")
    p.add_argument("--budget-s", type=float, default=75.0, help="the sweep stops after this many seconds")
    p.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes and reps")
    args = p.parse_args(argv)
    args.out = args.out or str(record_path("gemm_bench.json"))
    t0 = time.perf_counter()
    from paged_edu.kernels.support import num_sms as _num_sms
    from paged_edu.kernels.triton_fused import INTERPRETING

    if args.smoke:
        if not INTERPRETING:
            raise SystemExit("--smoke needs TRITON_INTERPRET=1 before paged_edu is imported (run it as a script)")
        device, dtype, shapes = torch.device("cpu"), torch.bfloat16, SMOKE_SHAPES
        args.calls, args.reps, args.ms, args.sweep_ms, args.step_batches = 2, 2, "1,3", "1", "1,3"
    elif torch.cuda.is_available():
        device, dtype, shapes = torch.device("cuda"), torch.bfloat16, SHAPES
    else:
        raise SystemExit("bench_gemm needs a CUDA GPU (or --smoke on a CPU)")
    num_sms = _num_sms(torch.cuda.current_device()) if device.type == "cuda" else 132
    names = args.shapes.split(",")
    ms = [int(m) for m in args.ms.split(",")]
    timer = Timer(device, args.reps)
    card = this_card(device)  # floor_us: the weights at this card's datasheet bandwidth (the H200's in --smoke)
    bandwidth = card.gpu.datasheet_bandwidth
    result = {
        **provenance("bench_gemm.py", argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (Triton interpreter)",
        **card.record(),  # which card's bandwidth prices floor_us
        "num_sms": num_sms,
        "dtype": str(dtype),
        "calls_per_graph": args.calls,
        "reps": args.reps,
        "shapes": {n: shapes[n] for n in names},
        "rows": [],
        "sweep": [],
    }

    def save():  # after the table and after each shape's sweep: a run cut short keeps what it measured
        result["elapsed_s"] = time.perf_counter() - t0
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    from paged_edu.kernels.triton_gemm import skinny_config

    g = torch.Generator(device=device).manual_seed(0)

    def stack(N, K):  # `calls` distinct (N, K) weights, each contiguous: no call finds its weight in L2
        return list((torch.randn(args.calls, N, K, device=device, dtype=dtype, generator=g) * 0.05).unbind(0))

    print(
        f"{'shape':>8} {'N':>6} {'K':>5} {'M':>3} {'floor us':>8} {'cuBLAS us':>9} {'triton us':>9} {'speedup':>7}  config"
    )
    for name in names:
        N, K = shapes[name]
        weights = stack(N, K)
        for M in ms:
            x = torch.randn(M, K, device=device, dtype=dtype, generator=g)
            cfg = skinny_config(M, N, K, num_sms)
            row = dict(shape=name, N=N, K=K, M=M, weight_bytes=N * K * 2, floor_us=N * K * 2 / bandwidth * 1e6)
            cublas = measure(timer, "cublas", x, weights)
            row.update(cublas_us=cublas["us"], cublas_rel_err=cublas["rel_err"], config=cfg)
            try:
                triton_ = measure(timer, "triton", x, weights)
                row.update(triton_us=triton_["us"], triton_rel_err=triton_["rel_err"], ok=triton_["ok"])
                row["speedup"] = row["cublas_us"] / row["triton_us"]
            except Exception as exc:  # the default config does not compile here: the table says so
                row.update(triton_us=float("nan"), triton_rel_err=float("nan"), ok=False, speedup=float("nan"))
                row["error"] = repr(exc)[:300]
            result["rows"].append(row)
            print(
                f"{name:>8} {N:>6} {K:>5} {M:>3} {row['floor_us']:8.2f} {row['cublas_us']:9.2f} "
                f"{row['triton_us']:9.2f} {row['speedup']:6.2f}x  {cfg}"
                + ("" if row["ok"] else f"  WRONG {row.get('error', row['triton_rel_err'])}"),
                flush=True,
            )
        del weights
    save()

    if args.step_batches:
        rows = step_times(timer, [int(b) for b in args.step_batches.split(",")], device, dtype, tiny=args.smoke)
        result["steps"] = rows
        for r in rows:
            print(
                f"decode step, batch {r['batch']}, context {r['context']}: cuBLAS {r['torch_gemm_us']:.0f} us, "
                f"skinny GEMM {r['triton_gemm_us']:.0f} us ({r['speedup']:.2f}x), logits rel err "
                f"{r['logits_rel_err']:.1e}, argmax agree {r['argmax_agree']:.2f}",
                flush=True,
            )
        save()

    # The sweep: one knob at a time around the default, most important batches first.
    for M in [int(m) for m in args.sweep_ms.split(",")]:
        for name in names:
            if time.perf_counter() - t0 > args.budget_s:
                result["sweep_stopped"] = f"budget of {args.budget_s:g} s reached before M={M} {name}"
                break
            N, K = shapes[name]
            weights = stack(N, K)
            x = torch.randn(M, K, device=device, dtype=dtype, generator=g)
            configs = sweep_configs(M, N, K, num_sms)[: 3 if args.smoke else None]
            for cfg in configs:
                entry = dict(shape=name, M=M, config=cfg)
                try:
                    entry.update(measure(timer, "triton", x, weights, config=cfg))
                except Exception as exc:  # does not compile (shared memory, registers): recorded, skipped
                    entry["error"] = repr(exc)[:200]
                result["sweep"].append(entry)
            done = [e for e in result["sweep"] if e["shape"] == name and e["M"] == M and e.get("ok")]
            best = min(done, key=lambda e: e["us"]) if done else None
            print(
                f"sweep {name} M={M}: {len(configs)} configs, best {best and round(best['us'], 2)} us {best and best['config']}",
                flush=True,
            )
            del weights
            save()
    best = {}
    for e in result["sweep"]:
        if e.get("ok"):
            key = f"{e['shape']}/M={e['M']}"
            if key not in best or e["us"] < best[key]["us"]:
                best[key] = {"us": e["us"], "config": e["config"]}
    result["best"] = best
    save()
    total_c = sum(r["cublas_us"] for r in result["rows"] if r["M"] == 1)
    total_t = sum(r["triton_us"] for r in result["rows"] if r["M"] == 1)
    print(f"M=1, one GEMM of each shape: cuBLAS {total_c:.1f} us, triton {total_t:.1f} us")
    print(f"wrote {args.out} in {result['elapsed_s']:.0f} s; all outputs ok: {all(r['ok'] for r in result['rows'])}")
    return result


if __name__ == "__main__":
    res = main()
    sys.exit(0 if all(r["ok"] for r in res["rows"]) else 2)

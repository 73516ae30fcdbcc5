"""What serving over HTTP costs: ``Engine.run`` offline against ``paged-edu serve`` driven by
``paged-edu bench-serve``, on the same requests, engine settings and weights, in one run.

    python benchmarks/bench_serve_vs_offline.py            # on a GPU: SmolLM2-135M geometry (a few minutes)
    python benchmarks/bench_serve_vs_offline.py --smoke    # the tiny model on a CPU, to check the script
    python benchmarks/bench_serve_vs_offline.py --smoke --num-prompts 256 --length-scale 0.25  # 256 streams, CPU

Three measurements, one after the other on the same GPU:

1. **offline** -- the 512 ShareGPT-like requests of ``bench-serve --workload sharegpt`` (the very
   token ids it sends) served by ``Engine.run`` on the server's own engine settings
   (:func:`paged_edu.serve.launch.engine_config` on the same flags) and weights (the server's
   ``--load-format dummy``: seeded random weights of SmolLM2-135M's geometry), through
   :func:`paged_edu.labs.timed_run.timed_run` (an untimed warm-up run, then the timed one);
   every request generates exactly its output length (no stop token: ``--ignore-eos``);
2. **served at an infinite rate** -- ``paged-edu serve`` started as a child process on a free port
   (:class:`paged_edu.serve.process.ServerProcess`; its engine core a process of its own,
   :mod:`paged_edu.serve.core`), the same 512 requests sent at once by the bench client, streamed;
   once untimed (the server meets every shape), then, after ``POST /reset_prefix_cache`` (so the
   timed pass recomputes every prompt, as the offline one does), timed. Output tokens per second
   of the timed pass over the offline run's: issue 46's target is >= 0.9;
3. **TTFT at 1 req/s** -- ``--ttft-requests`` other ShareGPT-like requests (seed + 1) at a Poisson
   rate of 1/s: the median time to first token, in the run's own median inter-token latency (a
   decode step at that load, as the client sees it): the target is <= 3 steps. The server's own mean
   TTFT (arrival in the API process to the first token's time in the engine) is split at the start of
   the ``engine.step()`` call that first ran the request (``vllm:request_queue_time_seconds`` and
   ``vllm:request_prefill_time_seconds``); the client's TTFT less the server's is the HTTP trips and
   the API process.

The server's engine core reports, when it stops, its steps and where its time went: in
``engine.step()`` and in its own work around it (inputs, tokens gathered, the message encoded and
sent) -- what serving costs the engine, per step, over the server's life (both passes of 2 and 3).

The server runs with its defaults but for the flags above; ``--no-sleep-on-idle`` passes that flag on (the
engine core spins on its input socket while idle rather than sleeping: what it buys is in 3, the TTFT at
1 req/s). The record (``benchmarks/records/<card>/serve_vs_offline.json``) keeps the provenance, the
settings (the server's flags), the three runs' figures (the bench's JSON without per-request lists) and
the two ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
from dataclasses import asdict
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from paged_edu.cli import SERVE_PACKAGES  # noqa: E402

NEEDED = (*SERVE_PACKAGES, "anyio", "h11")  # and what starlette and uvicorn bring


def missing_packages() -> list[str]:
    import importlib.util

    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def _record_path(name: str) -> Path:
    try:  # benchmarks/records/<card>/ (record.record_path, once the records layout is in)
        from record import record_path

        return record_path(name)
    except ImportError:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        folder = "cpu" if gpu is None else gpu.removeprefix("NVIDIA").split()[0].lower()
        return ROOT / "benchmarks" / "records" / folder / name


def serve_argv(args) -> list[str]:
    """The server's flags: the engine benchmark's settings (bench_engine.py: a 64 x L_max-token pool of
    blocks of 16, 512 sequences, 4,096 tokens a step), async scheduling (the server's default) unless turned off,
    the engine core asleep while idle (the server's default) unless ``sleep_on_idle`` is False."""
    model = ["--model", "tiny-random"] if args.smoke else ["--model", "smollm2", "--load-format", "dummy"]
    return [
        *model, "--seed", str(args.seed), "--num-gpu-blocks-override", str(args.num_blocks),
        "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_num_batched_tokens),
        "--uvicorn-log-level", "warning", *([] if args.async_scheduling else ["--no-async-scheduling"]),
        "--api-server-count", str(args.api_server_count),
        *([] if args.sleep_on_idle else ["--no-sleep-on-idle"]),
    ]  # fmt: skip


def default_num_blocks(smoke: bool) -> int:
    """The KV pool when ``--num-blocks`` is not given: 64 x 2,048 tokens in blocks of 16 (2,048 blocks with --smoke)."""
    return 2048 if smoke else 64 * 2048 // 16


def default_server_argv(
    smoke: bool, async_scheduling: bool = True, seed: int = 0, sleep_on_idle: bool = True
) -> list[str]:
    """:func:`serve_argv` at this benchmark's defaults, one API server: the server other benchmarks
    (``bench_ttft.py``, ``bench_lone_request.py``) measure, so their figures and this one's are of one server."""
    settings = argparse.Namespace(
        smoke=smoke, seed=seed, num_blocks=default_num_blocks(smoke), max_num_seqs=512, max_num_batched_tokens=4096,
        async_scheduling=async_scheduling, api_server_count=1, sleep_on_idle=sleep_on_idle,
    )  # fmt: skip
    return serve_argv(settings)


def bench(url: str, argv: list[str]) -> dict:
    from paged_edu.serve.bench import run_bench
    from paged_edu.serve.flags import parse_bench_args

    args = parse_bench_args(["--base-url", url, "--no-progress", *argv])
    return run_bench(args, log=lambda m: print(m, flush=True))


def offline(args, sends) -> dict:
    """``Engine.run`` on the requests, the server's weights and settings (timed_run: warm-up, then timed)."""
    import torch

    from paged_edu.labs.timed_run import timed_run
    from paged_edu.serve.flags import parse_serve_args
    from paged_edu.serve.launch import engine_config, load_model

    flags = parse_serve_args(serve_argv(args))
    device = torch.device("cpu" if args.smoke else "cuda")
    from paged_edu.kernels.support import default_dtype

    model, _, name = load_model(flags.model, flags.load_format, device, default_dtype(device), flags.seed)
    config = engine_config(flags, model)
    run = timed_run(model, [s.prompt for s in sends], [s.max_tokens for s in sends], {"config": config})
    out = {
        "model": name,
        "engine_config": asdict(config),
        "seconds": run.seconds,
        "output_tokens": run.useful_tokens,
        "output_throughput": run.tokens_per_s,
        "num_steps": len(run.steps),
        "warmup_seconds": run.warmup_seconds,
    }
    del run, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def slim(result: dict) -> dict:
    return {k: v for k, v in result.items() if not isinstance(v, list) or k == "errors"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="the tiny model on a CPU, small sizes")
    ap.add_argument("--num-prompts", type=int, default=None, help="default 512 (smoke: 48)")
    ap.add_argument("--ttft-requests", type=int, default=None, help="requests at 1 req/s (default 32; smoke: 6)")
    ap.add_argument("--num-blocks", type=int, default=None, help="the KV pool (default 8192 = 64 x 2048 / 16)")
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the server's and the offline engine's (default on, as the server's)",
    )
    ap.add_argument(
        "--api-server-count",
        type=int,
        default=1,
        help="the server's API server processes (paged-edu serve's flag); the record's default name says N > 1",
    )
    ap.add_argument(
        "--sleep-on-idle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the server's flag: its engine core sleeps while idle (default) or spins (the TTFT at 1 req/s)",
    )
    ap.add_argument("--length-scale", type=float, default=None, help="workload lengths times this (smoke: 0.05)")
    ap.add_argument("--out", default=None, help="the record (default benchmarks/records/<card>/serve_vs_offline.json)")
    args = ap.parse_args(argv)
    missing = missing_packages()
    if missing:
        print(
            f"bench_serve_vs_offline: the server stack is missing here: {', '.join(missing)} "
            '(pip install "paged_edu[serve]", or wheels carried to the machine); nothing was measured',
            file=sys.stderr,
        )
        return 2
    if args.smoke:  # as the server does on a CPU: Triton's interpreter, one torch thread (launch.build_server)
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if args.smoke:
        torch.set_num_threads(1)
    if not args.smoke and not torch.cuda.is_available():
        print("bench_serve_vs_offline: no CUDA device: run with --smoke for a CPU check", file=sys.stderr)
        return 2
    args.num_prompts = args.num_prompts or (48 if args.smoke else 512)
    args.ttft_requests = args.ttft_requests or (6 if args.smoke else 32)
    args.num_blocks = args.num_blocks or default_num_blocks(args.smoke)
    scale = args.length_scale or (0.05 if args.smoke else 1.0)

    from paged_edu.serve.process import ServerProcess
    from paged_edu.serve.traffic import build_traffic
    from record import provenance

    vocab = 259 if args.smoke else 49152
    sends = build_traffic("sharegpt", args.num_prompts, math.inf, args.seed, vocab, scale=scale, max_model_len=2048)
    print(f"offline: Engine.run on {len(sends)} requests ...", flush=True)
    off = offline(args, sends)
    print(f"offline: {off['output_throughput']:,.0f} output tok/s ({off['seconds']:.2f} s)", flush=True)

    common = ["--workload", "sharegpt", "--seed", str(args.seed), "--ignore-eos", "--length-scale", str(scale)]
    server_argv = serve_argv(args)
    with ServerProcess(server_argv) as server:
        import httpx

        print(f"server: {server.url}", flush=True)
        full = [*common, "--num-prompts", str(args.num_prompts), "--request-rate", "inf"]
        bench(server.url, [*full, "--num-warmups", "2"])  # untimed: every shape met once
        httpx.post(f"{server.url}/reset_prefix_cache", timeout=60).raise_for_status()
        served = bench(server.url, [*full, "--num-warmups", "0"])
        rate1 = bench(
            server.url,
            ["--workload", "sharegpt", "--seed", str(args.seed + 1), "--ignore-eos", "--length-scale", str(scale),
             "--num-prompts", str(args.ttft_requests), "--request-rate", "1", "--num-warmups", "0"],
        )  # fmt: skip
    core = server.engine_core_report()
    per_api_server = server.api_server_requests()
    ratio = served["output_throughput"] / off["output_throughput"]
    steps = rate1["median_ttft_ms"] / rate1["median_itl_ms"] if rate1["median_itl_ms"] else None
    print(f"served / offline throughput {ratio:.3f} (target >= 0.9)", flush=True)
    own = rate1.get("server") or {}
    print(
        f"at 1 req/s: TTFT p50 {rate1['median_ttft_ms']:.1f} ms, ITL p50 {rate1['median_itl_ms']:.2f} ms: "
        f"{steps:.2f} steps (target <= 3); the server's own means (arrival to first token, no HTTP): "
        f"TTFT {own.get('mean_ttft_ms') or float('nan'):.2f} ms = {own.get('mean_queue_ms') or float('nan'):.2f} "
        f"before the request's first engine.step() call + {own.get('mean_prefill_ms') or float('nan'):.2f} from its "
        f"start, ITL {own.get('mean_itl_ms') or float('nan'):.2f} ms",
        flush=True,
    )
    if per_api_server:
        print(f"requests per API server (all passes): {per_api_server}", flush=True)
    if core:
        print(
            f"engine core: {core['steps']} steps; engine.step {core['step_ms']:.3f} ms/step (CPU "
            f"{core['step_cpu_ms']:.3f}); its own work around it {core['loop_ms']:.3f} ms/step (CPU "
            f"{core['loop_cpu_ms']:.3f}): {core['loop_ms'] / (core['step_ms'] + core['loop_ms']):.1%} of a turn",
            flush=True,
        )
    record = {
        **provenance("bench_serve_vs_offline.py", argv),
        "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.smoke else "cpu",
        "smoke": args.smoke,
        "length_scale": scale,
        "offline": off,
        "served_inf": slim(served),
        "served_rate_1": slim(rate1),
        "served_over_offline_throughput": ratio,
        "ttft_p50_in_itl_p50": steps,
        "engine_core": core,
        "api_server_count": args.api_server_count,
        "settings": {"server_argv": server_argv, "sleep_on_idle": args.sleep_on_idle},
        "requests_per_api_server": per_api_server,
        "server_exit_status": server.proc.returncode,
        "targets": {"served_over_offline_throughput": ">= 0.9", "ttft_p50_in_itl_p50": "<= 3"},
    }
    name = (
        "serve_vs_offline.json" if args.api_server_count == 1 else f"serve_vs_offline_api{args.api_server_count}.json"
    )
    out = Path(args.out) if args.out else _record_path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    print()
    print(f"{'':34}{'output tok/s':>14}{'seconds':>10}")
    print(f"{'offline (Engine.run)':34}{off['output_throughput']:>14,.0f}{off['seconds']:>10.2f}")
    print(f"{'served (paged-edu serve)':34}{served['output_throughput']:>14,.0f}{served['duration']:>10.2f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

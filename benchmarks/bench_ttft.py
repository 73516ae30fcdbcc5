"""Where a lone request's time to first token goes, inside the engine: the server's engine, idle, one
request at a time, every step on the engine's timeline.

    python benchmarks/bench_ttft.py            # on a GPU: SmolLM2-135M geometry, the server's settings
    python benchmarks/bench_ttft.py --smoke    # the tiny model on a CPU, to check the script

Issue 46's target is a median TTFT at 1 req/s of at most 3 decode steps. At that rate the engine is
idle when a request arrives, so its first token costs what one prompt step and its read-back cost.
This benchmark builds the engine exactly as ``paged-edu serve`` does (the same flags as
``bench_serve_vs_offline.py``'s server, :func:`paged_edu.serve.launch.engine_config`), adds one request
of ``L`` prompt tokens to the idle engine, calls ``engine.step()`` until the request's first token is
in its sequence (where the server's engine core finds it, :mod:`paged_edu.serve.core`), then runs
it to its end; ``--repeat`` requests per length, each with fresh token ids (no prefix-cache hit).

Per length it reports the median of:

* ``ttft`` -- ``add_request`` to the first token readable on the host, wall time;
* ``calls`` -- the ``engine.step()`` calls that took (async scheduling: the prompt step is read by the
  call after the one that launched it);
* from the timeline (:mod:`paged_edu.engine.timeline`): the prompt step's host time
  (``host_busy_s``: schedule, prepare, launch; the wait for the device excluded) and its device time
  (forward pass and sampling), and how it ran (``graph`` / ``mixed graph`` / ``eager``);
* ``decode`` -- a decode step's device time at batch 1 (the unit of the target: one step of the
  request's own decode, measured in the same runs).

``--modes`` picks the engines: ``async`` (the server's), ``sync`` (``--no-async-scheduling``), and
``eager-prompt`` (async, no graphs for steps with prompt chunks).

``--profile L`` (a GPU): then ``torch.profiler`` over replays of the first engine's own graphs -- the
mixed-step graph a lone ``L``-token prompt runs, and the decode graph of batch 1 -- their kernels per
replay and GPU time by kind and by name (:func:`paged_edu.labs.timing.profile_replays`): where the
prompt step's time goes beside a decode step's. (The replays rerun the last staged step's inputs.)
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

MODES = ("async", "sync", "eager-prompt")


def build(smoke: bool, mode: str):
    import torch

    from bench_serve_vs_offline import default_server_argv
    from paged_edu.engine import Engine
    from paged_edu.kernels.support import default_dtype
    from paged_edu.serve.flags import parse_serve_args
    from paged_edu.serve.launch import engine_config, load_model, warm_up

    flags = parse_serve_args(default_server_argv(smoke, async_scheduling=mode != "sync"))
    device = torch.device("cpu" if smoke else "cuda")
    model, _, _ = load_model(flags.model, flags.load_format, device, default_dtype(device), flags.seed)
    config = engine_config(flags, model)
    if mode == "eager-prompt":
        config = dataclasses.replace(config, kernels=dataclasses.replace(config.kernels, mixed_graphs=False))
    engine = Engine(model, dataclasses.replace(config, record_timeline=True))
    warm_up(engine)
    return engine


def first_token(engine, prompt: list[int], params) -> tuple[float, int, int]:
    """``(seconds, step calls, first step)``: ``add_request`` to the request's first token on the host."""
    first_step = len(engine.timeline)
    t0 = time.perf_counter()
    rid = engine.add_request(prompt, params)
    calls, done = 0, False
    while not done:
        outputs = engine.step()
        calls += 1
        done = any(o.request_id == rid for o in outputs) or any(
            q.request_id == rid and q.output_token_ids for q in engine.scheduler.running
        )
    seconds = time.perf_counter() - t0
    while engine.has_unfinished():
        engine.step()
    return seconds, calls, first_step


def measure(engine, lengths: list[int], repeat: int, seed: int) -> list[dict]:
    import random

    from paged_edu.engine.sampling import SamplingParams

    rng = random.Random(seed)
    vocab = engine.model.config.vocab_size
    params = SamplingParams(max_tokens=8)  # greedy, as bench-serve sends
    rows = []
    for L in lengths:
        runs = []
        for _ in range(repeat + 1):  # the first, untimed: this length's shapes met once
            prompt = [rng.randrange(vocab) for _ in range(L)]
            runs.append(first_token(engine, prompt, params))
        runs = runs[1:]
        engine.allocator.reset_prefix_cache()
        steps = engine.timeline
        prompt_steps = [steps[s] for _, _, s in runs]
        decodes = [r for _, _, s in runs for r in steps[s + 1 : s + 6] if r.is_decode and r.num_decodes == 1]
        ms = lambda xs: 1e3 * statistics.median(xs)  # noqa: E731
        rows.append(
            {
                "prompt_tokens": L,
                "ttft_ms": ms([t for t, _, _ in runs]),
                "calls": statistics.median([c for _, c, _ in runs]),
                "prompt_host_ms": ms([r.host_busy_s for r in prompt_steps]),
                "prompt_device_ms": ms([r.device_end_s - r.device_start_s for r in prompt_steps]),
                "prompt_launch_to_device_end_ms": ms([r.device_end_s - r.host_start_s for r in prompt_steps]),
                "prompt_forward": prompt_steps[0].forward,
                "decode_device_ms": ms([r.device_end_s - r.device_start_s for r in decodes]) if decodes else None,
                "decode_host_ms": ms([r.host_busy_s for r in decodes]) if decodes else None,
            }
        )
    return rows


def profile_graphs(engine, L: int) -> dict:
    """Kernels and GPU time per replay of the mixed-step graph of an idle ``L``-token prompt and of
    the decode graph of batch 1 (printed, and returned for the record)."""
    from paged_edu.engine.sampling import SamplingParams
    from paged_edu.labs.timing import profile_replays

    first_token(engine, list(range(1, L + 1)), SamplingParams(max_tokens=2))  # stages both graphs' inputs
    engine.allocator.reset_prefix_cache()
    r = engine.runner
    Tb = next(t for t in r.mixed_graphs.sizes if t >= L)
    out = {}
    for name, graph in (
        (f"prompt of {L}: mixed graph {(Tb, 0)}", r.mixed_graphs.graphs[(Tb, 0)]),
        ("decode, batch 1: decode graph", r.graphs.graphs[1]),
    ):
        table = profile_replays(graph)
        out[name] = table
        print(
            f"{name}: {table['kernels_per_step']:.0f} kernels, {table['gpu_busy_us']:.0f} us busy ({table['source']})"
        )
        for kind, v in table["by_kind"].items():
            print(f"    {kind:>8}: {v['kernels']:5.0f} kernels {v['us']:8.1f} us")
        for kname, v in table["top"].items():
            print(f"    {v['kernels']:5.0f} x {v['us'] / max(v['kernels'], 1):6.1f} us  {kname}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="the tiny model on a CPU, small sizes")
    ap.add_argument("--lengths", default=None, help="prompt lengths, comma-separated (default 16,96,256,1024)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--profile", type=int, default=None, metavar="L", help="profile the graphs of an L-token prompt")
    ap.add_argument("--out", default=None, help="the record (default benchmarks/records/<card>/ttft.json)")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            ap.error(f"--modes: {m!r} is not one of {', '.join(MODES)}")
    if args.smoke:
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if args.smoke:
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        print("bench_ttft: no CUDA device: run with --smoke for a CPU check", file=sys.stderr)
        return 2
    lengths = [int(x) for x in (args.lengths or ("16,40" if args.smoke else "16,96,256,1024")).split(",")]
    from record import provenance, write_record

    record = {**provenance("bench_ttft.py"), "modes": {}}
    head = f"{'mode':>13} {'L':>5} {'ttft ms':>8} {'calls':>5} {'prompt host':>11} {'prompt dev':>10} {'forward':>11} {'decode dev':>10} {'ttft/decode':>11}"
    print(head)
    for mode in modes:
        engine = build(args.smoke, mode)
        rows = measure(engine, lengths, args.repeat, seed=1)
        record["modes"][mode] = rows
        for r in rows:
            d = r["decode_device_ms"]
            print(
                f"{mode:>13} {r['prompt_tokens']:>5} {r['ttft_ms']:>8.3f} {r['calls']:>5} {r['prompt_host_ms']:>11.3f} "
                f"{r['prompt_device_ms']:>10.3f} {r['prompt_forward']:>11} {d or float('nan'):>10.3f} "
                f"{(r['ttft_ms'] / d) if d else float('nan'):>11.2f}",
                flush=True,
            )
        if args.profile and torch.cuda.is_available() and "profile" not in record:
            record["profile"] = {"mode": mode, **profile_graphs(engine, args.profile)}
        engine.close()
        del engine
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    write_record(record, args.out, "ttft.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

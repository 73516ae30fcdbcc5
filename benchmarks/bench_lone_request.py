"""Where a lone request's time to first token goes in ``paged-edu serve``: the client's clock against the
server's own split of it, one request at a time on an idle server.

    python benchmarks/bench_lone_request.py            # on a GPU: SmolLM2-135M geometry, dummy weights
    python benchmarks/bench_lone_request.py --smoke    # the tiny model on a CPU
    python benchmarks/bench_lone_request.py --no-sleep-on-idle  # the engine core spins while idle

Issue 46's target is a median TTFT at 1 req/s of at most 3 decode steps. At that rate every request
finds the server idle, so its TTFT is one trip through the API process, the engine core's channel and
the engine, with nothing to share them with. This script starts the server as
``bench_serve_vs_offline.py`` does (its flags, :func:`bench_serve_vs_offline.default_server_argv`; with
``--no-sleep-on-idle``, that flag too: the engine core spins on its input socket while idle), sends
``--requests`` ShareGPT-like requests (``bench-serve --workload sharegpt``'s: token ids, streamed,
``--ignore-eos``) one after the other, ``--gap`` seconds apart (each gap of ``--gap`` in turn, on
the same server), with ``bench-serve``'s own client
(:func:`paged_edu.serve.bench._one`, aiohttp), and reads ``/metrics`` before and after each one
(nothing else runs meanwhile, so the histograms' sums grow by that request's figures alone):

* ``client`` -- the client's TTFT: sending the request to the first chunk with a token;
* ``server`` -- ``vllm:time_to_first_token_seconds``: arrival in the API process (once its body is
  parsed and its prompt known) to the first token's time in the engine;
* ``queue`` -- ``vllm:request_queue_time_seconds``: arrival to the start of the ``engine.step()`` call
  that first ran it (the channel to the core, its wakeup, ``add_request``);
* ``prefill`` -- ``vllm:request_prefill_time_seconds``: from that start to the first token's time
  (the engine's part: the prompt step and, with async scheduling, the call that reads it back);
* ``outside`` -- ``client - server``: the HTTP trips, the body's parsing, the way back from the engine
  core to the client (its message, the API process's wakeup, the server-sent event);
* ``itl`` -- the request's mean inter-token latency on the server (``vllm:inter_token_latency_seconds``):
  a decode step at batch 1, the target's unit.

It prints a row per request and the medians per gap, and writes
``benchmarks/records/<card>/lone_request.json`` (``--out`` elsewhere).

Why several gaps: an idle process runs its next request's code cold. On the course's 2-core CPU (a
virtual machine), the API process's parsing and checking of one request took 51 us right after
another and 1,157 us after 200 ms of sleep (265 us after 5 ms), with no page fault and no context
switch: its code and data had left the caches. A lone request at 1 req/s pays that price in every
process it crosses; ``--gap 1 0.02`` shows how much of it there is on the machine at hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

HISTOGRAMS = {  # column -> the server's histogram (vLLM's names)
    "server": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "itl": "vllm:inter_token_latency_seconds",
}
COLUMNS = ("client", "server", "queue", "prefill", "outside", "itl")


async def _send_all(url: str, model: str, sends, gap: float, warmups: int) -> list[dict]:
    """Each request alone (``gap`` seconds of idle server before each); their rows of milliseconds."""
    import aiohttp
    import httpx

    from paged_edu.serve.bench import Outcome, _body, _one, scrape

    args = SimpleNamespace(ignore_eos=True)
    rows = []
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0, sock_read=600.0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        with httpx.Client() as scraper:
            for k, s in enumerate(sends):
                before = scrape(scraper, url)
                await asyncio.sleep(gap)
                outcome = Outcome("request", len(s.prompt))
                await _one(session, f"{url}/v1/completions", _body(model, s.prompt, s, args), outcome, {})
                if not outcome.ok:
                    raise RuntimeError(f"request {k}: {outcome.error}")
                after = scrape(scraper, url)
                if k < warmups:
                    continue
                row = {"prompt_len": len(s.prompt), "output_len": outcome.output_tokens, "client": 1e3 * outcome.ttft}
                for column, name in HISTOGRAMS.items():
                    count = after[f"{name}_count"] - before[f"{name}_count"]
                    total = after[f"{name}_sum"] - before[f"{name}_sum"]
                    row[column] = 1e3 * total / count if count else math.nan
                row["outside"] = row["client"] - row["server"]
                rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="the tiny model on a CPU")
    ap.add_argument("--requests", type=int, default=None, help="timed requests (default 32; smoke: 16)")
    ap.add_argument("--warmups", type=int, default=3, help="requests sent first and left out")
    ap.add_argument("--gap", type=float, nargs="+", default=[1.0], help="seconds of idle server before each request")
    ap.add_argument("--max-tokens", type=int, default=8, help="each request's output length (ignore EOS)")
    ap.add_argument("--length-scale", type=float, default=None, help="prompt lengths times this (smoke: 0.05)")
    ap.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false")
    ap.add_argument(
        "--no-sleep-on-idle",
        dest="sleep_on_idle",
        action="store_false",
        help="the server's flag: its engine core spins on its input socket while idle (default: it sleeps)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from bench_serve_vs_offline import default_server_argv
    from paged_edu.serve.process import ServerProcess
    from paged_edu.serve.traffic import build_traffic
    from record import provenance, record_path

    args.requests = args.requests or (16 if args.smoke else 32)
    scale = args.length_scale or (0.05 if args.smoke else 1.0)
    server_argv = default_server_argv(args.smoke, args.async_scheduling, args.seed, args.sleep_on_idle)
    vocab = 259 if args.smoke else 49152
    total = args.warmups + args.requests
    runs = {}
    with ServerProcess(server_argv) as server:
        model = json.loads(__import__("httpx").get(f"{server.url}/v1/models").text)["data"][0]["id"]
        t0 = time.perf_counter()
        for k, gap in enumerate(args.gap):  # fresh prompts for each gap (no prefix-cache hit)
            sends = build_traffic(
                "sharegpt", total, math.inf, args.seed + 2 + k, vocab, scale=scale, max_model_len=2048
            )
            for s in sends:
                s.max_tokens = args.max_tokens
            runs[gap] = asyncio.run(_send_all(server.url, model, sends, gap, args.warmups))
        seconds = time.perf_counter() - t0
    results = []
    for gap, rows in runs.items():
        print(f"gap {gap} s\n{'#':>3} {'prompt':>6} " + " ".join(f"{c:>8}" for c in COLUMNS) + "   (ms)")
        for k, row in enumerate(rows):
            print(f"{k:>3} {row['prompt_len']:>6} " + " ".join(f"{row[c]:8.3f}" for c in COLUMNS))
        medians = {c: statistics.median(r[c] for r in rows) for c in COLUMNS}
        print("median     " + " ".join(f"{medians[c]:8.3f}" for c in COLUMNS))
        steps = medians["client"] / medians["itl"]
        print(f"client TTFT p50 in decode steps (server ITL p50): {steps:.2f} (target <= 3)")
        results.append({"gap_s": gap, "median_ms": medians, "ttft_in_steps": steps, "requests": rows})
    record = {
        **provenance("bench_lone_request.py", argv),
        "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.smoke else "cpu",
        "server_argv": server_argv,
        "length_scale": scale,
        "seconds": seconds,
        "runs": results,
    }
    out = args.out or record_path("lone_request.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The prefix cache's timing side channel, live: the probe's wall-clock TTFT with and without another
user's prefix in the cache, and with salts (lesson 3, section 6; issue 23).

    python benchmarks/bench_side_channel.py                              # tiny model, the lesson's sizes
    python benchmarks/bench_side_channel.py --model smollm2 --secret-len 1024 --chunk 256 --json ttft.json

Each repeat runs :func:`paged_edu.labs.side_channel.side_channel` (three fresh engines: no victim;
victim unsalted; victim and probe salted apart) and records the probe's wall-clock TTFT; the table
gives the median over the repeats (after one warm-up) next to the scheduler's accounting, which is
the same in every repeat. On a CPU the wall clock is mostly interpreter noise; on a GPU it is the
attack.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from paged_edu.labs.engine_lab import lesson_model, tiny_model
from paged_edu.labs.side_channel import side_channel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--secret-len", type=int, default=256)
    p.add_argument("--chunk", type=int, default=64, help="max_num_batched_tokens: prompt tokens a step")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", dest="json_path")
    args = p.parse_args()

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    if args.model == "tiny":
        model = tiny_model(args.device, dtype, seed=0, max_position_embeddings=max(512, 2 * args.secret_len))
    else:
        model = lesson_model(args.device, dtype).model
    vocab = model.config.vocab_size
    secret = [100 + (37 * i) % (vocab - 200) for i in range(args.secret_len)]
    kwargs = {"probe_tail": [7, 8], "block_size": args.block_size, "chunk": args.chunk}
    side_channel(model, secret, **kwargs)  # warm-up
    runs = [side_channel(model, secret, **kwargs) for _ in range(args.repeats)]
    rows = []
    for i, first in enumerate(runs[0]):
        walls = [run[i].wall_ttft_s for run in runs]
        rows.append(
            {
                "case": first.case,
                "cached": first.num_cached_tokens,
                "computed": first.num_computed_tokens,
                "steps": first.num_steps,
                "modeled_ttft_ms": 1e3 * first.modeled_ttft_s,
                "wall_ttft_ms_median": 1e3 * statistics.median(walls),
                "wall_ttft_ms_min": 1e3 * min(walls),
                "wall_ttft_ms_max": 1e3 * max(walls),
            }
        )
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(
        f"{args.model} on {name}, secret {args.secret_len} tokens, chunk {args.chunk}, B={args.block_size}, "
        f"{args.repeats} repeats"
    )
    print(f"{'case':33s} {'cached':>6s} {'computed':>8s} {'steps':>5s} {'model ms':>9s} {'wall ms (median)':>17s}")
    for r in rows:
        print(
            f"{r['case']:33s} {r['cached']:6d} {r['computed']:8d} {r['steps']:5d} {r['modeled_ttft_ms']:9.2f} "
            f"{r['wall_ttft_ms_median']:17.3f}"
        )
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"device": name, **vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

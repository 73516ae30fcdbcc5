"""The ``paged-edu`` command line.

``paged-edu simulate``     serve a workload with every memory manager; print the table, write JSON.
``paged-edu figures-sim``  the simulator's figures (memory breakdown, latency vs rate, ...) under figures/.

Examples::

    paged-edu simulate --workload sharegpt --num-requests 1000 --rate 10 --seed 0 --json build/sim.json
    paged-edu simulate --workload parallel --n 4 --fork beam --num-requests 300 --rate 4
    paged-edu simulate --trace my_trace.jsonl --managers paged,contiguous-max
    paged-edu figures-sim --out figures
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

__all__ = ["main"]


def _csv(kind):
    def parse(text: str):
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None
    return parse


def _add_server_args(p: argparse.ArgumentParser) -> None:
    from paged_edu.sim.costmodel import GPUS, MODELS

    p.add_argument("--model", default="opt-13b", choices=sorted(MODELS), help="model geometry for the cost model (default: the paper's OPT-13B)")
    p.add_argument("--gpu", default="h200", choices=sorted(GPUS), help="GPU roofline (default: h200)")
    p.add_argument("--kv-slots", type=int, default=None, help="KV pool in token slots (default: what the GPU holds after the weights)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="share of GPU memory for weights + KV (default 0.9)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--preemption", choices=("recompute", "swap", "auto"), default="recompute")
    p.add_argument("--cpu-blocks", type=int, default=0, help="CPU swap space in blocks (for --preemption swap)")


def _cost_model(args):
    from paged_edu.sim.costmodel import GPUS, MODELS, CostModel

    return CostModel(model=MODELS[args.model], gpu=GPUS[args.gpu])


def _build_parser() -> argparse.ArgumentParser:
    from paged_edu.sim.simulator import BLOCK_SIZES, MANAGERS

    parser = argparse.ArgumentParser(prog="paged-edu", description="PagedAttention you can see, poke and measure.")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="simulate serving a workload with every memory manager")
    sim.add_argument("--workload", choices=("sharegpt", "alpaca", "chat", "parallel"), default="sharegpt")
    sim.add_argument("--trace", help="a JSONL trace to serve instead of a generated workload")
    sim.add_argument("--num-requests", type=int, default=1000)
    sim.add_argument("--rate", type=float, default=10.0, help="Poisson arrivals per second (inf: all at t=0)")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--json", dest="json_path", help="write the records here (.jsonl: one per line; else a JSON list)")
    sim.add_argument("--save-trace", help="also write the generated workload as a JSONL trace")
    sim.add_argument("--managers", type=_csv(str), default=list(MANAGERS), help=f"comma-separated subset of {','.join(MANAGERS)}")
    sim.add_argument("--block-sizes", type=_csv(int), default=list(BLOCK_SIZES), help="paged block sizes (default 8,16,32,64,128)")
    sim.add_argument("--n", type=int, default=4, help="samples per request (parallel workload)")
    sim.add_argument("--fork", choices=("parallel", "beam"), default="parallel", help="parallel workload: independent samples or a beam-style tree")
    sim.add_argument("--dataset", choices=("sharegpt", "alpaca"), default="sharegpt", help="lengths for the parallel workload")
    sim.add_argument("--system-prompt-len", type=int, default=512, help="chat workload: shared system prompt tokens")
    sim.add_argument("--num-groups", type=int, default=1, help="chat workload: distinct system prompts")
    sim.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_server_args(sim)

    fig = sub.add_parser("figures-sim", help="write the simulator's figures under figures/")
    fig.add_argument("--out", default="figures", help="output folder (default figures/)")
    fig.add_argument("--num-requests", type=int, default=1000)
    fig.add_argument("--seed", type=int, default=0)
    fig.add_argument("--format", choices=("png", "html", "both"), default="both")
    fig.add_argument("--no-progress", action="store_true")
    _add_server_args(fig)
    return parser


def _workload(args):
    from paged_edu.sim import workloads

    if args.trace:
        return workloads.load_trace(args.trace)
    kwargs = {}
    if args.workload == "parallel":
        kwargs = {"n": args.n, "fork": args.fork, "dataset": args.dataset}
    elif args.workload == "chat":
        kwargs = {"system_prompt_len": args.system_prompt_len, "num_groups": args.num_groups}
    return workloads.make_workload(args.workload, args.num_requests, args.rate, args.seed, **kwargs)


def _server_kwargs(args) -> dict:
    return {
        "num_kv_slots": args.kv_slots,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "preemption_mode": args.preemption,
        "num_cpu_blocks": args.cpu_blocks,
    }


def cmd_simulate(args) -> int:
    from paged_edu.sim import workloads
    from paged_edu.sim.simulator import compare, default_configs, format_table

    cost = _cost_model(args)
    requests = _workload(args)
    if args.save_trace:
        workloads.save_trace(requests, args.save_trace)
    configs = default_configs(block_sizes=args.block_sizes, managers=args.managers, **_server_kwargs(args))
    summary = workloads.summarize(requests)
    name = args.trace or args.workload
    print(cost.describe())
    if not args.trace and args.workload in workloads.DATASETS:
        print("  workload: " + workloads.DATASETS[args.workload].describe())
    print(
        f"  {name}: {summary['num_requests']} requests ({summary['num_sequences']} sequences), "
        f"mean prompt {summary['mean_prompt_len']:.1f}, mean output {summary['mean_output_len']:.1f} tokens, "
        f"rate {args.rate:g}/s, seed {args.seed}"
    )
    results = compare(requests, configs, cost, progress=not args.no_progress)
    print(f"  KV pool: {results[0].num_kv_slots:,} token slots; max_num_seqs {args.max_num_seqs}, "
          f"max_num_batched_tokens {args.max_num_batched_tokens}, preemption {args.preemption}")
    print()
    print(format_table(results))
    print()
    print("KV util: time-averaged token slots holding K/V / slots allocated; util@end: the same for each sequence as it finishes;")
    print("tokens/reserved/int.frag/ext.frag/other: the paper's Fig. 2 breakdown of memory allocated or wanted by waiting requests;")
    print("saved: blocks saved by sharing / blocks without sharing; s/tok: end-to-end latency / output tokens.")
    if args.json_path:
        records = []
        for res in results:
            rec = res.record()
            rec.update({"workload": name, "rate": args.rate if math.isfinite(args.rate) else "inf", "seed": args.seed,
                        "num_requests": summary["num_requests"]})
            records.append(rec)
        os.makedirs(os.path.dirname(os.path.abspath(args.json_path)), exist_ok=True)
        with open(args.json_path, "w", encoding="utf-8") as f:
            if args.json_path.endswith(".jsonl"):
                f.writelines(json.dumps(r) + "\n" for r in records)
            else:
                json.dump(records, f, indent=1)
        print(f"wrote {len(records)} records to {args.json_path}")
    return 0


def cmd_figures(args) -> int:
    from paged_edu.viz import sim_figures

    cost = _cost_model(args)
    written = sim_figures.write_all(
        args.out, cost, num_requests=args.num_requests, seed=args.seed, fmt=args.format,
        server=_server_kwargs(args), progress=not args.no_progress,
    )
    for path in written:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "simulate":
            return cmd_simulate(args)
        if args.command == "figures-sim":
            return cmd_figures(args)
    except (ValueError, TypeError, KeyError, OSError) as exc:
        print(f"paged-edu {args.command}: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``paged-edu`` command line.

``paged-edu simulate``     serve a workload with every memory manager; print the table, write JSON.
``paged-edu figures-sim``  the simulator's figures (memory breakdown, latency vs rate, ...) under figures/
                           (needs plotly: ``pip install "paged_edu[figures]"``).
``paged-edu serve``        an OpenAI-compatible server on the engine, with vLLM's metrics and KV events
                           (needs the server stack: ``pip install "paged_edu[serve]"``; :mod:`paged_edu.serve`).
``paged-edu bench-serve``  measure any OpenAI-compatible server on the course's workloads, like
                           ``vllm bench serve``.

Examples::

    paged-edu simulate --workload sharegpt --num-requests 1000 --rate 10 --seed 0 --json sim.json
    paged-edu simulate --workload parallel --n 4 --fork beam --num-requests 300 --rate 4
    paged-edu simulate --trace my_trace.jsonl --managers paged,contiguous-max
    paged-edu simulate --workload multiturn --managers paged-prefix,paged-radix --policy lpm
    paged-edu figures-sim --out figures
    paged-edu serve --model tiny-random --port 8000
    paged-edu bench-serve --base-url http://127.0.0.1:8000 --workload sharegpt --num-prompts 100 --request-rate 4
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import sys

from paged_edu.core.validation import MAX_NUM_REQUESTS

__all__ = ["main"]


class UserError(Exception):
    """A problem with what the user asked for (a flag, a trace, a path): one line, exit 2."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every flag's default in its help (but "None" and a switch's "False"); the epilog's examples kept as written."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Bad values end in one line naming the flag (``paged-edu simulate: error: argument --seed: ...``), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int(low: int, high: int | None = None):
    """An argparse type: an integer in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, got {value}")
        return value

    return parse


def _float(low: float, high: float, *, low_open: bool = True):
    """An argparse type: a number in ``(low, high]`` (``[low, high]`` when not ``low_open``); inf allowed if high is."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if math.isnan(value) or value > high or value < low or (low_open and value == low):
            raise argparse.ArgumentTypeError(f"must be in {'(' if low_open else '['}{low:g}, {high:g}], got {text!r}")
        return value

    return parse


def _csv(item, what: str):
    """An argparse type: a non-empty comma-separated list, each item parsed by ``item``."""

    def parse(text: str) -> list:
        parts = [x.strip() for x in text.split(",")]
        if not any(parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}, got {text!r}")
        if not all(parts):
            raise argparse.ArgumentTypeError(f"empty item in {text!r}; expected a comma-separated list of {what}")
        return [item(x) for x in parts]

    return parse


def _choice(choices):
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"unknown {text!r}; choose from {','.join(choices)}")
        return text

    return parse


POSITIVE = _int(1)
SEED = _int(0, 2**64 - 1)
NUM_REQUESTS = _int(1, MAX_NUM_REQUESTS)  # generated up front: a bound, not a MemoryError


def _add_server_args(p: argparse.ArgumentParser) -> None:
    from paged_edu.core.hardware import GPUS, MODELS
    from paged_edu.sched.policy import POLICIES
    from paged_edu.sched.scheduler import PREEMPTION_MODES

    p.add_argument(
        "--model",
        default="opt-13b",
        choices=sorted(key for key, g in MODELS.items() if not g.is_mla),  # the cost model's
        help="model geometry for the cost model (opt-13b: the paper's)",
    )
    p.add_argument("--gpu", default="h200", choices=sorted(GPUS), help="GPU for the roofline and the memory")
    p.add_argument(
        "--kv-slots",
        type=POSITIVE,
        default=None,
        help="KV pool in token slots (None: what --gpu-memory-utilization leaves after the weights)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=_float(0.0, 1.0),
        default=0.9,
        help="share of GPU memory for weights + KV, as vLLM's flag",
    )
    p.add_argument("--max-num-seqs", type=POSITIVE, default=256, help="most sequences running in one step")
    p.add_argument(
        "--max-num-batched-tokens", type=POSITIVE, default=2048, help="most tokens (prefill + decode) in one step"
    )
    p.add_argument(
        "--preemption",
        choices=PREEMPTION_MODES,
        default="recompute",
        help="what happens to a preempted sequence's blocks: freed and recomputed, swapped to the CPU, or the cheaper",
    )
    p.add_argument("--cpu-blocks", type=_int(0), default=0, help="CPU swap space in blocks (for --preemption swap)")
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default="fcfs",
        help="admission order: first come first served, or longest cached prefix first",
    )


def _check_server_args(args, cost) -> None:
    """Limits that involve several flags, checked before anything is built or allocated (the
    messages name the model and GPU as the flags gave them)."""

    def error(message: str):
        raise UserError(message)

    model, gpu = f"--model {args.model}", f"--gpu {args.gpu} ({cost.gpu.name}, {cost.gpu.memory_bytes / 1e9:.1f} GB)"
    most = cost.gpu.memory_bytes // cost.model.kv_bytes_per_token
    if args.kv_slots is not None and args.kv_slots > most:
        error(
            f"argument --kv-slots: {args.kv_slots:,} slots of {cost.model.kv_bytes_per_token:,} bytes ({model}) "
            f"are more than the whole of {gpu} holds ({most:,} slots)"
        )
    if args.kv_slots is None:
        weights, total = cost.model.matmul_weight_bytes, cost.gpu.memory_bytes
        if weights >= total:
            error(
                f"argument --model: the weights of {model} ({weights / 1e9:.1f} GB) do not fit in the whole of {gpu}; "
                "choose a smaller --model or a larger --gpu"
            )
        try:
            cost.kv_capacity_tokens(args.gpu_memory_utilization)
        except ValueError:
            error(
                f"argument --gpu-memory-utilization: {args.gpu_memory_utilization:g} of {gpu} leaves no room for a KV "
                f"cache after the weights of {model} ({weights / 1e9:.1f} GB); it needs more than {weights / total:.3f}"
            )


def _check_output_paths(args) -> None:
    """Every output goes into a folder that exists (a typo must not scatter new folders): checked
    before anything runs. ``--out`` itself may be new, its parent may not."""
    paths = [
        (flag, getattr(args, dest, None))
        for flag, dest in (("--json", "json_path"), ("--save-trace", "save_trace"), ("--data", "data_path"))
    ]
    for flag, path in paths:
        if path is not None:
            folder = os.path.dirname(os.path.abspath(path))
            if os.path.isdir(path):
                raise UserError(f"argument {flag}: {path!r} is a folder; give a file name")
            if not os.path.isdir(folder):
                raise UserError(f"argument {flag}: the folder {folder!r} does not exist; create it first")
    out = getattr(args, "out", None)
    if out is not None and not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise UserError(
            f"argument --out: the folder {os.path.dirname(os.path.abspath(out))!r} does not exist; create it first"
        )


def _cost_model(args):
    from paged_edu.core.hardware import GPUS, MODELS
    from paged_edu.sim.costmodel import CostModel

    return CostModel(model=MODELS[args.model], gpu=GPUS[args.gpu])


def _build_parser() -> argparse.ArgumentParser:
    from paged_edu.sim.managers import BLOCK_SIZES, DEFAULT_MANAGERS, MANAGERS
    from paged_edu.sim.arrivals import L_MAX

    parser = _Parser(
        prog="paged-edu",
        description="PagedAttention you can see, poke and measure.",
        formatter_class=_HelpFormatter,
        epilog=EXAMPLES["paged-edu"],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser(
        "simulate",
        help="simulate serving a workload with every memory manager",
        description="Serve one workload with every memory manager; print the table, write JSON.",
        formatter_class=_HelpFormatter,
        epilog=EXAMPLES["simulate"],
    )
    sim.add_argument(
        "--workload",
        choices=("sharegpt", "alpaca", "chat", "parallel", "multiturn", "fewshot", "agents"),
        default="sharegpt",
        help="generated workload: request lengths (sharegpt, alpaca) or a sharing pattern",
    )
    sim.add_argument("--trace", help="a JSONL trace to serve instead of a generated workload")
    sim.add_argument("--num-requests", type=NUM_REQUESTS, default=1000, help="requests generated")
    sim.add_argument(
        "--rate", type=_float(0.0, math.inf), default=10.0, help="Poisson arrivals per second (inf: all at t=0)"
    )
    sim.add_argument("--seed", type=SEED, default=0, help="random seed of the workload")
    sim.add_argument(
        "--json",
        dest="json_path",
        help="write the records here (.jsonl: one per line; else a JSON list); the folder must exist",
    )
    sim.add_argument("--save-trace", help="also write the generated workload as a JSONL trace; the folder must exist")
    sim.add_argument(
        "--managers",
        type=_csv(_choice(MANAGERS), "managers"),
        default=",".join(DEFAULT_MANAGERS),
        help=f"comma-separated subset of {','.join(MANAGERS)}",
    )
    sim.add_argument(
        "--block-sizes",
        type=_csv(POSITIVE, "positive integers"),
        default=",".join(map(str, BLOCK_SIZES)),
        help="paged block sizes, comma-separated",
    )
    sim.add_argument("--n", type=POSITIVE, default=4, help="samples per request (parallel workload)")
    sim.add_argument(
        "--fork",
        choices=("parallel", "beam"),
        default="parallel",
        help="parallel workload: independent samples or a beam-style tree",
    )
    sim.add_argument(
        "--dataset", choices=("sharegpt", "alpaca"), default="sharegpt", help="lengths for the parallel workload"
    )
    sim.add_argument(
        "--system-prompt-len", type=_int(1, L_MAX - 2), default=512, help="chat workload: shared system prompt tokens"
    )
    sim.add_argument("--num-groups", type=POSITIVE, default=1, help="chat workload: distinct system prompts")
    sim.add_argument(
        "--tenants",
        type=_int(0, 100_000),
        default=0,
        help="spread the requests over N tenants, each with its own cache salt (0: none); "
        "with --workload chat: N tenants sending the same system prompt",
    )
    sim.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_server_args(sim)

    fig = sub.add_parser(
        "figures-sim",
        help="write the simulator's figures under figures/ (needs plotly)",
        description=f"Run the simulations behind the simulator's figures and save them. {NEEDS_PLOTLY}",
        formatter_class=_HelpFormatter,
        epilog=EXAMPLES["figures-sim"],
    )
    fig.add_argument("--out", default="figures", help="output folder (created if its parent exists)")
    fig.add_argument(
        "--data",
        dest="data_path",
        help="the JSON of the runs behind the figures (default: sim_figures_data.json in --out)",
    )
    fig.add_argument("--num-requests", type=NUM_REQUESTS, default=1000, help="requests per simulation")
    fig.add_argument("--seed", type=SEED, default=0, help="random seed of the workloads")
    fig.add_argument(
        "--format",
        choices=("png", "html", "both"),
        default="both",
        help="file format (PNG needs kaleido and a Chromium; HTML is the fallback)",
    )
    fig.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_server_args(fig)

    from paged_edu.serve.flags import add_bench_args, add_serve_args

    serve = sub.add_parser(
        "serve",
        help="an OpenAI-compatible server on the engine (needs paged_edu[serve])",
        description=f"Serve a model over HTTP with OpenAI's API, vLLM's /metrics and KV events. {NEEDS_SERVE}",
        formatter_class=_HelpFormatter,
        epilog=EXAMPLES["serve"],
    )
    add_serve_args(serve, POSITIVE, _float(0.0, 1.0))
    bench = sub.add_parser(
        "bench-serve",
        help="measure an OpenAI-compatible server on the course's workloads (needs paged_edu[serve])",
        description=f"Send a workload to a server and report TTFT, TPOT, ITL, latency and throughput. {NEEDS_SERVE}",
        formatter_class=_HelpFormatter,
        epilog=EXAMPLES["bench-serve"],
    )
    add_bench_args(bench, POSITIVE, _float(0.0, math.inf), SEED)
    return parser


NEEDS_PLOTLY = 'It needs plotly (and kaleido for PNG): pip install "paged_edu[figures]".'
NEEDS_SERVE = 'It needs the server stack (FastAPI, uvicorn, prometheus_client, ...): pip install "paged_edu[serve]".'
EXAMPLES = {
    "paged-edu": """examples:
  paged-edu simulate --workload sharegpt --num-requests 1000 --rate 10 --json sim.json
  paged-edu figures-sim --out figures
  paged-edu simulate --help""",
    "simulate": """examples:
  paged-edu simulate --workload sharegpt --num-requests 1000 --rate 10 --seed 0 --json sim.json
  paged-edu simulate --workload parallel --n 4 --fork beam --num-requests 300 --rate 4
  paged-edu simulate --trace my_trace.jsonl --managers paged,contiguous-max
  paged-edu simulate --workload multiturn --managers paged-prefix,paged-radix --policy lpm
  paged-edu simulate --model llama-3-8b --gpu h200 --gpu-memory-utilization 0.9""",
    "figures-sim": """examples:
  paged-edu figures-sim --out figures
  paged-edu figures-sim --out figs --format html --num-requests 300
  paged-edu figures-sim --out figures --data benchmarks/records/cpu/sim_figures_data.json""",
    "serve": """examples:
  paged-edu serve --model tiny-random --port 8000
  paged-edu serve --model smollm2 --max-num-seqs 64 --swap-space 1 --kv-events-endpoint tcp://127.0.0.1:5557
  paged-edu serve --model smollm2 --load-format dummy --num-gpu-blocks-override 8192""",
    "bench-serve": """examples:
  paged-edu bench-serve --base-url http://127.0.0.1:8000 --num-prompts 200 --request-rate 4
  paged-edu bench-serve --base-url http://127.0.0.1:8000 --workload multiturn --max-concurrency 16 --json run.json
  paged-edu bench-serve --base-url http://127.0.0.1:8000 --workload sharegpt --length-scale 0.05 --ignore-eos""",
}


def _version() -> str:
    try:
        return importlib.metadata.version("paged_edu")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def _workload(args):
    from paged_edu.sim import workloads

    kwargs = {}
    if args.workload == "parallel":
        kwargs = {"n": args.n, "fork": args.fork, "dataset": args.dataset}
    elif args.workload == "chat":
        kwargs = {"system_prompt_len": args.system_prompt_len, "num_groups": args.num_groups}
    return workloads.make_workload(args.workload, args.num_requests, args.rate, args.seed, **kwargs)


# The simulator setting (a SimConfig field) each server flag sets.
SERVER_FLAGS = {
    "num_kv_slots": "--kv-slots",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "preemption_mode": "--preemption",
    "num_cpu_blocks": "--cpu-blocks",
    "policy": "--policy",
}
# The flag to blame for a refused setting: an error's ``.field`` (core.validation) -> the flag that sets it.
FLAG_OF_FIELD = {
    **SERVER_FLAGS,
    "manager": "--managers",
    "block_size": "--block-sizes",
    "num_blocks": "--kv-slots",  # the pool in blocks: as many as the slots make
    "max_seq_len": "--workload",  # a request too long for the servers: the workload made it
}


def _server_kwargs(args) -> dict:
    return {field: getattr(args, _dest(flag)) for field, flag in SERVER_FLAGS.items()}


def _refused(exc, args) -> UserError:
    """The one-line error for a setting the simulator refused (a ``FieldTypeError`` / ``FieldValueError``),
    blaming the flag that sets its ``.field``. A field no flag of this command sets is a bug: ``exc`` is
    raised again, with its traceback."""
    flag = FLAG_OF_FIELD.get(exc.field)
    if flag is None or not hasattr(args, _dest(flag)):
        raise exc
    if flag == "--kv-slots" and args.kv_slots is None:  # the pool is what --gpu-memory-utilization left
        flag = "--gpu-memory-utilization"
    if flag == "--workload" and args.trace:
        flag = "--trace"
    return UserError(f"argument {flag}: {exc}")


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def cmd_simulate(args, cost) -> int:
    from paged_edu.core.validation import FieldTypeError, FieldValueError
    from paged_edu.sim import workloads
    from paged_edu.sim.request import load_trace, save_trace
    from paged_edu.sim.compare import compare, default_configs, format_table, prepare_all

    if args.trace:
        try:
            requests = load_trace(args.trace)
        except (ValueError, TypeError, KeyError, OSError) as exc:  # the message names the file and line
            raise UserError(f"--trace: {exc}") from None
    else:
        requests = _workload(args)
    if args.tenants:
        workloads.assign_tenants(requests, args.tenants)
    try:  # every server built once, and a request one could never serve refused, before anything runs
        configs = default_configs(block_sizes=args.block_sizes, managers=args.managers, **_server_kwargs(args))
        servers = prepare_all(requests, configs, cost)
    except (FieldTypeError, FieldValueError) as exc:
        raise _refused(exc, args) from None
    if args.save_trace:
        _write(args.save_trace, lambda path: save_trace(requests, path), "--save-trace")
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
    results = compare(requests, progress=not args.no_progress, servers=servers)
    print(
        f"  KV pool: {results[0].num_kv_slots:,} token slots; max_num_seqs {args.max_num_seqs}, "
        f"max_num_batched_tokens {args.max_num_batched_tokens}, preemption {args.preemption}"
    )
    print()
    print(format_table(results))
    print()
    print(
        "KV util: time-averaged token slots holding K/V / slots allocated; util@end: the same for each sequence as it finishes;"
    )
    print(
        "tokens/reserved/int.frag/ext.frag/other: the paper's Fig. 2 breakdown of memory allocated or wanted by waiting requests;"
    )
    print("saved: blocks saved by sharing / blocks without sharing; s/tok: end-to-end latency / output tokens.")
    if args.tenants:
        print()
        print(f"prefix hits per tenant ({args.tenants} tenants, one cache salt each):")
        for res in results:
            rates = res.prefix_hit_rate_per_salt
            if rates:
                print(
                    f"  {res.config.label}: " + ", ".join(f"{salt} {rate:.1%}" for salt, rate in sorted(rates.items()))
                )
    if args.json_path:
        records = []
        for res in results:
            rec = res.record()
            rec.update(
                {
                    "workload": name,
                    "rate": args.rate if math.isfinite(args.rate) else "inf",
                    "seed": args.seed,
                    "num_requests": summary["num_requests"],
                }
            )
            records.append(rec)
        _write(args.json_path, lambda path: _write_records(path, records), "--json")
        print(f"wrote {len(records)} records to {args.json_path}")
    return 0


def _write_records(path: str, records: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        if path.endswith(".jsonl"):
            f.writelines(json.dumps(r) + "\n" for r in records)
        else:
            json.dump(records, f, indent=1)


def _write(path: str, write, flag: str) -> None:
    try:
        write(path)
    except OSError as exc:
        raise UserError(f"{flag}: cannot write {path!r}: {exc.strerror or exc}") from None


def cmd_figures(args, cost) -> int:
    from paged_edu.core.validation import FieldTypeError, FieldValueError

    try:
        from paged_edu.viz import sim_figures
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "plotly":
            raise
        raise UserError(f"no module {exc.name!r}. {NEEDS_PLOTLY}") from None

    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out: cannot create {args.out!r}: {exc.strerror or exc}") from None
    try:  # each run builds and checks its servers before it simulates (sim.compare.prepare_all)
        written = sim_figures.write_all(
            args.out,
            cost,
            data_path=args.data_path,
            num_requests=args.num_requests,
            seed=args.seed,
            fmt=args.format,
            server=_server_kwargs(args),
            progress=not args.no_progress,
        )
    except (FieldTypeError, FieldValueError) as exc:
        raise _refused(exc, args) from None
    for path in written:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command in ("serve", "bench-serve"):
        return _serving(args)
    try:
        _check_output_paths(args)
        cost = _cost_model(args)
        _check_server_args(args, cost)
        if args.command == "simulate":
            return cmd_simulate(args, cost)
        if args.command == "figures-sim":
            return cmd_figures(args, cost)
    except UserError as exc:  # anything else is a bug, and keeps its traceback
        print(f"paged-edu {args.command}: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


def _serving(args) -> int:
    """``serve`` and ``bench-serve``: their bodies live in :mod:`paged_edu.serve`."""
    try:
        if args.command == "serve":
            from paged_edu.serve.launch import main as serve_main

            return serve_main(args)
        from paged_edu.serve.bench import main as bench_main

        return bench_main(args)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in SERVE_PACKAGES:
            raise
        print(f"paged-edu {args.command}: error: no module {exc.name!r}. {NEEDS_SERVE}", file=sys.stderr)
        return 2


# What the `serve` extra must bring, by import name: one list for this error, bench_serve_vs_offline's check and
# tests/serve's collection (this module imports no torch and no server stack, so any of them can read it). The
# extra's httptools and uvloop are not here: uvicorn runs without them (h11 and asyncio's loop), only slower.
SERVE_PACKAGES = (
    "fastapi",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "zmq",
    "msgpack",
    "httpx",
    "aiohttp",
    "pydantic",
)


if __name__ == "__main__":
    sys.exit(main())

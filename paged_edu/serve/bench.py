"""``paged-edu bench-serve``: measure any OpenAI-compatible server on the course's workloads.

Like ``vllm bench serve`` (``vllm/benchmarks/serve.py``): requests are sent at their workload's
Poisson arrival times (``--request-rate``; inf: all at once) and/or capped at ``--max-concurrency`` in
flight, each streamed (``stream: true``, ``stream_options.include_usage``) so the client sees every
token arrive. Per request, from the client's clock:

* **TTFT** -- from sending to the first chunk that carries a token (queueing included);
* **ITL** -- the gaps between consecutive token-carrying chunks (a chunk may carry several tokens
  when the server batches them: then it is one gap, as vLLM counts it);
* **TPOT** -- ``(latency - TTFT) / (output tokens - 1)``: the mean time per token after the first;
* **E2EL** -- from sending to the last chunk.

The run reports each one's mean, median, standard deviation and ``--metric-percentiles`` (p50, p90,
p99), the request throughput, the output and total token throughputs (tokens counted by the
server's ``usage``), and -- from ``/metrics`` scraped before and after the run -- what the server
itself counted meanwhile: prefix-cache queries and hits (so its hit rate over the run, which no
server exports as a metric), preemptions, prompt and generation tokens. ``--num-warmups`` requests go
first and are left out (vLLM's "initial test run"). The JSON record uses ``vllm bench serve``'s
keys (``mean_ttft_ms``, ``p99_itl_ms``, ``output_throughput``, ...).

The streams are sent by aiohttp's client, as ``vllm bench serve`` and SGLang's ``bench_serving`` send
theirs: one process, one event loop, one session, a connection per stream (:func:`_drive`). The
scrapes of ``/metrics`` and ``/v1/models``, outside the timed loop, use httpx.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field

import aiohttp
import httpx

from paged_edu.serve.traffic import Send, build_traffic, describe

__all__ = ["Outcome", "run_bench", "scrape", "summarize"]

SERVER_COUNTERS = {  # report key -> the Prometheus sample (vLLM's names)
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "num_preemptions": "vllm:num_preemptions_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
}
METRICS = ("ttft", "tpot", "itl", "e2el")
# Why aiohttp for the streams: httpx's async client cost this client 6.3 ms of CPU per request at 256
# streams in flight (its connection pool scans every connection of the client as a request starts or
# ends), and then ~80 us per streamed chunk; on an H100 the server streams ~45k tokens/s at 512
# streams, and one httpx event loop read them at half that pace (22,609 tok/s, d06468f,
# benchmarks/records/h100/serve_vs_offline_d06468f.json): the client, not the server, set the pace.
NAMES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
         "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}  # fmt: skip


@dataclass(slots=True)
class Outcome:
    """One request as the client saw it (seconds on the client's clock)."""

    role: str
    prompt_len: int
    ok: bool = False
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    cached_tokens: int | None = None
    reply_ids: list[int] | None = None

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def scrape(client: httpx.Client, base_url: str) -> dict[str, float]:
    """The server's counters now (every sample of /metrics, by name); {} if it has no /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        r = client.get(f"{base_url}/metrics", timeout=30)
    except httpx.HTTPError:
        return {}
    if r.status_code != 200:
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value  # summed over label sets (engines)
    return out


async def _one(session: aiohttp.ClientSession, url: str, body: dict, outcome: Outcome, headers: dict) -> None:
    """Send one streamed completion and time its chunks into ``outcome``."""
    start = time.perf_counter()
    last = start
    chunks, ids = 0, []
    try:
        async with session.post(url, json=body, headers=headers) as r:
            if r.status != 200:
                outcome.error = f"HTTP {r.status}: {(await r.read())[:300].decode(errors='replace')}"
                return
            async for raw in r.content:  # one line at a time: "data: {...}", then a blank one
                if not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    outcome.error = str(chunk["error"].get("message", chunk["error"]))[:300]
                    return
                usage = chunk.get("usage")
                if usage:
                    outcome.output_tokens = usage.get("completion_tokens", 0)
                    details = usage.get("prompt_tokens_details") or {}
                    outcome.cached_tokens = details.get("cached_tokens")
                choices = chunk.get("choices") or []
                if not choices:
                    continue
                c = choices[0]
                new_ids = c.get("token_ids")
                if not (c.get("text") or new_ids):
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    outcome.ttft = now - start
                else:
                    outcome.itl.append(now - last)
                last = now
                chunks += 1
                if new_ids:
                    ids += new_ids
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, ValueError, OSError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"[:300]
        return
    outcome.latency = last - start
    outcome.output_tokens = outcome.output_tokens or chunks
    outcome.reply_ids = ids or None
    outcome.ok = chunks > 0
    if not outcome.ok:
        outcome.error = "no token came back"


async def _drive(base_url, model, sends: list[Send], args, headers, bar) -> tuple[list[Outcome], float]:
    """Send every request at its time (after the one it follows), at most ``max_concurrency`` at once."""
    url = f"{base_url}/v1/completions"
    outcomes = [Outcome(s.role, len(s.prompt)) for s in sends]
    done = [asyncio.Event() for _ in sends]
    sent_prompts: list[list[int] | None] = [None] * len(sends)
    gate = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    # No cap on connections (aiohttp's default is 100: the 101st stream would wait for a free one);
    # a read may wait args.timeout, a connection 30 s.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0, sock_read=args.timeout)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=2**20) as session:
        t0 = time.perf_counter()

        async def run(i: int, s: Send) -> None:
            try:
                delay = s.at - (time.perf_counter() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                prompt = s.prompt
                if s.after is not None:  # the next turn: after the reply it carries
                    await done[s.after].wait()
                    prev = outcomes[s.after]
                    reply = prev.reply_ids if prev.reply_ids is not None else sends[s.after].workload_reply
                    if s.carries and sent_prompts[s.after] is not None:
                        prompt = sent_prompts[s.after] + list(reply) + s.prompt[s.carries :]
                sent_prompts[i] = prompt
                body = _body(model, prompt, s, args)
                if gate is None:
                    await _one(session, url, body, outcomes[i], headers)
                else:
                    async with gate:
                        await _one(session, url, body, outcomes[i], headers)
            finally:
                done[i].set()
                if bar is not None:
                    bar.update(1)

        await asyncio.gather(*(run(i, s) for i, s in enumerate(sends)))
        return outcomes, time.perf_counter() - t0


def _body(model: str, prompt: list[int], s: Send, args) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": s.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,  # vLLM's; the next turn of a chat carries the reply's ids
    }
    if args.ignore_eos:
        body["ignore_eos"] = True
    if s.cache_salt is not None:
        body["cache_salt"] = s.cache_salt
    return body


def _stats(values: list[float], percentiles: list[float]) -> dict:
    if not values:
        return {"mean": None, "median": None, "std": None, **{f"p{_pname(p)}": None for p in percentiles}}
    import numpy as np

    ms = np.asarray(values) * 1e3
    out = {"mean": float(ms.mean()), "median": float(np.median(ms)), "std": float(ms.std())}
    for p in percentiles:
        out[f"p{_pname(p)}"] = float(np.percentile(ms, p))
    return out


def _pname(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def summarize(outcomes: list[Outcome], duration: float, percentiles: list[float], metrics=METRICS) -> dict:
    """``vllm bench serve``'s figures from the outcomes of a run of ``duration`` seconds."""
    good = [o for o in outcomes if o.ok]
    out_tokens = sum(o.output_tokens for o in good)
    in_tokens = sum(o.prompt_len for o in good)
    result = {
        "duration": duration,
        "completed": len(good),
        "failed": len(outcomes) - len(good),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(good) / duration if duration > 0 else None,
        "output_throughput": out_tokens / duration if duration > 0 else None,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else None,
        "cached_tokens": sum(o.cached_tokens or 0 for o in good),
        "errors": sorted({o.error for o in outcomes if o.error})[:10],
    }
    series = {
        "ttft": [o.ttft for o in good],
        "tpot": [t for o in good if (t := o.tpot) is not None],
        "itl": [x for o in good for x in o.itl],
        "e2el": [o.latency for o in good],
    }
    for name in metrics:
        for key, value in _stats(series[name], percentiles).items():
            result[f"{key}_{name}_ms"] = value
    roles = sorted({o.role for o in outcomes})
    if roles != ["request"]:  # probe traffic: each role apart
        result["by_role"] = {
            role: {
                "count": len(rs := [o for o in good if o.role == role]),
                "median_ttft_ms": 1e3 * statistics.median([o.ttft for o in rs]) if rs else None,
                "mean_cached_tokens": statistics.mean([o.cached_tokens or 0 for o in rs]) if rs else None,
            }
            for role in roles
        }
    return result


SERVER_MEANS = {  # report key -> the histogram whose _sum / _count over the run is the server's own mean
    "mean_ttft_ms": "vllm:time_to_first_token_seconds",
    "mean_itl_ms": "vllm:inter_token_latency_seconds",
    "mean_queue_ms": "vllm:request_queue_time_seconds",  # the TTFT in two: before the request's first step ...
    "mean_prefill_ms": "vllm:request_prefill_time_seconds",  # ... and from its start to the first token
}


def server_delta(before: dict, after: dict) -> dict:
    """What the server's own counters say happened during the run (None where it exports no such metric),
    and its own mean TTFT and ITL over the run: from its arrival to its first token, without the HTTP
    trips the client's figures include -- the TTFT in two, before the request's first engine step and from
    its start (queue and prefill)."""
    out = {k: (after[m] - before.get(m, 0.0)) if m in after else None for k, m in SERVER_COUNTERS.items()}
    q, h = out["prefix_cache_queries"], out["prefix_cache_hits"]
    out["prefix_cache_hit_rate"] = h / q if q else None
    for key, name in SERVER_MEANS.items():
        n = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        out[key] = 1e3 * total / n if n else None
    return out


def format_report(result: dict, percentiles: list[float], metrics=METRICS) -> str:
    """The table ``vllm bench serve`` prints, with the server's own counters below."""
    w = 50
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=w, c="=")]

    def row(label, value, fmt="{:<10}"):
        lines.append("{:<40}".format(label) + (fmt.format(value) if value is not None else "n/a"))

    row("Successful requests:", result["completed"])
    row("Failed requests:", result["failed"])
    if result.get("max_concurrency"):
        row("Maximum request concurrency:", result["max_concurrency"])
    row("Request rate configured (RPS):", result.get("request_rate"))
    row("Benchmark duration (s):", result["duration"], "{:<10.2f}")
    row("Total input tokens:", result["total_input_tokens"])
    row("Total generated tokens:", result["total_output_tokens"])
    row("Request throughput (req/s):", result["request_throughput"], "{:<10.2f}")
    row("Output token throughput (tok/s):", result["output_throughput"], "{:<10.2f}")
    row("Total Token throughput (tok/s):", result["total_token_throughput"], "{:<10.2f}")
    for name in metrics:
        lines.append("{s:{c}^{n}}".format(s=NAMES[name], n=w, c="-"))
        label = name.upper()
        row(f"Mean {label} (ms):", result[f"mean_{name}_ms"], "{:<10.2f}")
        row(f"Median {label} (ms):", result[f"median_{name}_ms"], "{:<10.2f}")
        for p in percentiles:
            row(f"P{_pname(p)} {label} (ms):", result[f"p{_pname(p)}_{name}_ms"], "{:<10.2f}")
    server = result.get("server") or {}
    if any(v is not None for v in server.values()):
        lines.append("{s:{c}^{n}}".format(s="The server's own counters (/metrics)", n=w, c="-"))
        for key in (*SERVER_COUNTERS, "prefix_cache_hit_rate", *SERVER_MEANS):
            v = server.get(key)
            fmt = "{:<10.4f}" if key.endswith("rate") else "{:<10.2f}" if key.endswith("_ms") else "{:<10,.0f}"
            row(f"{key}:", v, fmt)
    for role, r in (result.get("by_role") or {}).items():
        row(
            f"{role}: median TTFT (ms), cached tokens:",
            f"{r['median_ttft_ms'] or 0:.2f}, {r['mean_cached_tokens'] or 0:.1f}",
        )
    lines.append("=" * w)
    return "\n".join(lines)


def run_bench(args, log=print) -> dict:
    """Run the benchmark ``args`` describe (the CLI's flags) and return its result."""
    base_url = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    percentiles = [float(p) for p in str(args.metric_percentiles).split(",") if p.strip()]
    metrics = tuple(m.strip() for m in str(args.percentile_metrics).split(",") if m.strip())
    unknown = set(metrics) - set(METRICS)
    if unknown:
        raise ValueError(f"--percentile-metrics: unknown {sorted(unknown)}; choose from {','.join(METRICS)}")
    with httpx.Client(headers=headers) as client:
        card = _model_card(client, base_url, args.model)
        model = args.model or card.get("id")
        vocab = args.vocab_size or card.get("vocab_size") or 32000
        sends = build_traffic(
            args.workload,
            args.num_prompts,
            args.request_rate,
            args.seed,
            vocab,
            scale=args.length_scale,
            max_model_len=card.get("max_model_len"),
            tenants=args.tenants,
        )
        log(f"bench-serve: {args.workload} against {base_url} ({model}): " + json.dumps(describe(sends)))
        if args.num_warmups:
            warm = [Send(0.0, [(97 * i + k) % vocab for i in range(16)], 4) for k in range(args.num_warmups)]
            wargs = _Plain(max_concurrency=None, timeout=args.timeout, ignore_eos=True)
            w, _ = _run(_drive(base_url, model, warm, wargs, headers, None))
            failed = [o.error for o in w if not o.ok]
            if failed:
                raise RuntimeError(f"the warm-up request failed: {failed[0]}")
        before = scrape(client, base_url)
        bar = None
        if not args.no_progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(sends), desc="requests", unit="req", file=sys.stderr)
        try:
            outcomes, duration = _run(_drive(base_url, model, sends, args, headers, bar))
        finally:
            if bar is not None:
                bar.close()
        after = scrape(client, base_url)
    result = summarize(outcomes, duration, percentiles, metrics)
    result.update(
        label=args.label,
        base_url=base_url,
        model=model,
        workload=args.workload,
        num_prompts=len(sends),
        request_rate=args.request_rate if math.isfinite(args.request_rate) else "inf",
        max_concurrency=args.max_concurrency,
        seed=args.seed,
        length_scale=args.length_scale,
        vocab_size=vocab,
        traffic=describe(sends),
        server=server_delta(before, after) if before or after else {},
        date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    return result


def _run(coroutine):
    """Run ``coroutine`` to its end: here, or -- where an event loop already runs in this thread, as in a
    notebook -- on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    import threading

    out: dict = {}

    def run() -> None:
        try:
            out["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # noqa: BLE001 -- raised again in the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=run, name="bench-serve")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


@dataclass
class _Plain:
    max_concurrency: int | None
    timeout: float
    ignore_eos: bool


def _model_card(client: httpx.Client, base_url: str, wanted: str | None) -> dict:
    try:
        r = client.get(f"{base_url}/v1/models", timeout=30)
    except httpx.HTTPError as exc:
        raise RuntimeError(f"--base-url {base_url}: no answer ({type(exc).__name__}: {exc})") from None
    if r.status_code != 200:
        raise RuntimeError(f"--base-url {base_url}: GET /v1/models answered HTTP {r.status_code}: {r.text[:200]}")
    cards = r.json().get("data") or []
    for card in cards:
        if wanted is None or card.get("id") == wanted:
            return card
    if wanted is not None:
        return {"id": wanted}
    raise RuntimeError(f"--base-url {base_url}: /v1/models lists no model")


def main(args) -> int:
    """``paged-edu bench-serve``: run, print the table, write the JSON; 0 if every request succeeded."""
    try:
        result = run_bench(args)
    except (RuntimeError, ValueError) as exc:
        print(f"paged-edu bench-serve: error: {exc}", file=sys.stderr)
        return 2
    percentiles = [float(p) for p in str(args.metric_percentiles).split(",") if p.strip()]
    metrics = tuple(m.strip() for m in str(args.percentile_metrics).split(",") if m.strip())
    print(format_report(result, percentiles, metrics))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json_path}")
    return 0 if result["failed"] == 0 else 1

"""``GET /metrics``: the engine's state and events under vLLM's Prometheus names and meanings.

Every metric is defined in vLLM's ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger.__init__``;
the name, the documentation string and, for histograms, the buckets below are its), and is read
from what paged_edu's engine already keeps -- no second bookkeeping. The engine runs in the engine
core's process (:mod:`~paged_edu.serve.core`): the core reads the gauges and the counters below (every
few milliseconds, and whenever a request ends) and ships them with the steps' tokens and their
times; the API server's output task (:mod:`~paged_edu.serve.client`) hands each message to
:meth:`ServerMetrics.record`:

========================================  =========  ============================================
metric (counters end in ``_total``)        kind       read from
========================================  =========  ============================================
``vllm:num_requests_running``              gauge      requests with a sequence in ``scheduler.running``
``vllm:num_requests_waiting``              gauge      requests waiting (queued, preempted, swapped)
``vllm:kv_cache_usage_perc``               gauge      ``allocator.usage``: blocks held by live sequences, 0-1
``vllm:prefix_cache_queries_total``        counter    ``allocator.stats.queried_tokens``: prompt tokens looked up
``vllm:prefix_cache_hits_total``           counter    ``allocator.stats.hit_tokens``: ... found cached
``vllm:num_preemptions_total``             counter    ``scheduler.num_preemptions``
``vllm:prompt_tokens_total``               counter    a request's prompt length, when its first token comes
``vllm:generation_tokens_total``           counter    tokens appended to the sequences (``output_token_ids``)
``vllm:time_to_first_token_seconds``       histogram  first token's time (``token_times``) - arrival at the server
``vllm:inter_token_latency_seconds``       histogram  time between a sample's consecutive tokens (``token_times``)
``vllm:e2e_request_latency_seconds``       histogram  finish (``finish_time``) - arrival at the server
``vllm:request_queue_time_seconds``        histogram  the start of the step that first ran it - arrival
``vllm:request_prefill_time_seconds``      histogram  first token's time - the start of that step
========================================  =========  ============================================

The prefix-cache counters count first admissions only, as vLLM's ``PrefixCacheStats.record`` does
(``vllm/v1/metrics/stats.py``): a recomputed preempted sequence finding its own blocks again is no
prefix reuse. ``vllm:prompt_tokens_total`` and the token times follow ``IterationStats.update_from_output``
there (a prompt counts when its first token is produced; an inter-token latency per new token).

A hit *rate* is no served metric -- not in vLLM either (the seed's ``vllm:prefix_cache_hit_rate`` is not
one of its names): it is ``rate(vllm:prefix_cache_hits_total) / rate(vllm:prefix_cache_queries_total)``
over a window, computed by whoever reads the counters (``paged-edu bench-serve`` does, from a scrape
before and after its run). Every series carries the labels ``model_name`` and ``engine`` ("0"), as vLLM's do.

Two histograms add buckets below vLLM's first -- inter-token latency 1, 2.5 and 5 ms, end-to-end
latency 10, 25, 50 and 100 ms: a tiny model's steps on a CPU take milliseconds, and would all land
in vLLM's lowest bucket. The names, meanings and every vLLM bucket are unchanged.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily

__all__ = ["ServerMetrics", "StepHistogram", "Tally"]

# vllm/v1/metrics/loggers.py: histogram_time_to_first_token's buckets
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
# ... histogram_inter_token_latency's (with 1, 2.5 and 5 ms in front: see the module docstring)
ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]  # fmt: skip
# ... request_latency_buckets (e2e), with 10, 25, 50 and 100 ms in front
E2E_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip


@dataclass(slots=True)
class Tally:
    """What one message of the engine core carried, for :meth:`ServerMetrics.record`."""

    prompt_tokens: int = 0  # prompts of the requests whose first token came
    generated: int = 0  # new tokens handed out
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    queue: list[float] = field(default_factory=list)  # a request's TTFT in two (at its end): before its first step
    prefill: list[float] = field(default_factory=list)  # ... and from it to its first token


class StepHistogram:
    """A Prometheus histogram filled a step at a time: one ``numpy.searchsorted`` over the step's
    values instead of one ``Histogram.observe`` per token (prometheus_client's takes a lock and
    searches the buckets in Python). What it buys, measured on our loaded 2-core CPU at 256 running
    sequences, when this ran on the engine's own thread: the work after a step (tokens handed out,
    metrics) fell from 17.3 to 2.9 ms. Exposed as the same text
    (``_bucket{le=...}``, ``_count``, ``_sum``) through a collector of the registry."""

    def __init__(self, name: str, documentation: str, buckets: list[float], labels: dict[str, str]) -> None:
        self.name, self.documentation, self.labels = name, documentation, labels
        self.bounds = np.array([*buckets, math.inf])
        self.counts = np.zeros(len(self.bounds), dtype=np.int64)  # per bucket (not cumulative)
        self.sum = 0.0
        self._lock = threading.Lock()  # a scrape reads counts and sum of the same step

    def observe_many(self, values: list[float]) -> None:
        if not values:
            return
        v = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
        counts = np.bincount(np.searchsorted(self.bounds, v, side="left"), minlength=len(self.bounds))
        with self._lock:
            self.counts += counts  # a value v falls in the first bucket whose bound is >= v (``le``)
            self.sum += float(v.sum())

    def collect(self):
        with self._lock:
            cumulative, total = np.cumsum(self.counts).tolist(), self.sum
        family = HistogramMetricFamily(self.name, self.documentation, labels=list(self.labels))
        les = [("+Inf" if math.isinf(b) else repr(float(b))) for b in self.bounds]
        family.add_metric(list(self.labels.values()), list(zip(les, cumulative)), total)
        yield family


class ServerMetrics:
    """The server's metrics in a registry of their own (two servers in one process do not collide).

    :meth:`record` is called once per message of the engine core with the engine's gauges and
    counters as the core read them (``stats``, :mod:`~paged_edu.serve.core` lists them) and what
    the message's tokens and endings add (a :class:`Tally`: first tokens, the gaps before every
    later token, the requests that ended). ``stats``: the core's counters when the server starts
    (what ran before -- the warm-up -- is not served traffic).
    """

    def __init__(self, model_name: str, stats: list | None = None) -> None:
        self.registry = r = CollectorRegistry()
        labels = {"model_name": model_name, "engine": "0"}

        def make(kind, name, doc):
            return kind(name, doc, labelnames=list(labels), registry=r).labels(*labels.values())

        def histogram(name, doc, buckets):
            h = StepHistogram(name, doc, buckets, labels)
            r.register(h)
            return h

        self.running = make(Gauge, "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = make(Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = make(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = make(
            Counter, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = make(
            Counter, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = make(Counter, "vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = make(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = make(Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", E2E_BUCKETS
        )
        # vLLM's queue time runs from the engine core's queueing of a request to its first scheduling, its prefill
        # time from there to the first token (RequestStateStats, vllm/v1/metrics/stats.py); here the queue starts
        # at the arrival in the API server (the hand-off to the core inside it) and "scheduled" is the start of
        # the engine.step() call that first ran the request, so the two add up to the request's TTFT.
        self.queue = histogram(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", E2E_BUCKETS
        )
        self.prefill = histogram(
            "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", E2E_BUCKETS
        )
        self._seen = [0, 0, 0]  # the engine's counters at the last read: queried, hit tokens, preemptions
        if stats is not None:
            self._seen = list(stats[3:6])

    def record(self, stats: list | None, tally: Tally) -> None:
        """The gauges now and the engine's counters' growth since they were last read (if the message
        carried them), and the tally."""
        if stats is not None:
            num_running, num_waiting, kv_usage, *counts = stats
            self.running.set(num_running)
            self.waiting.set(num_waiting)
            self.kv_usage.set(kv_usage)
            for k, counter in enumerate((self.prefix_queries, self.prefix_hits, self.preemptions)):
                if counts[k] > self._seen[k]:
                    counter.inc(counts[k] - self._seen[k])
                self._seen[k] = counts[k]
        if tally.prompt_tokens:
            self.prompt_tokens.inc(tally.prompt_tokens)
        if tally.generated:
            self.generation_tokens.inc(tally.generated)
        self.ttft.observe_many(tally.ttft)
        self.itl.observe_many(tally.itl)
        self.e2e.observe_many(tally.e2e)
        self.queue.observe_many(tally.queue)
        self.prefill.observe_many(tally.prefill)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)

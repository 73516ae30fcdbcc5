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

Several API servers (``--api-server-count N``)
-----------------------------------------------
Each API server process sees only its own requests' tokens, and any of them may answer a scrape. Every
number above therefore lives in a *slot*: one row of float64s per process (:func:`slot_size` of them),
which that process alone writes; a scrape sums the rows -- the counters and the histograms' buckets and
sums -- and takes the gauges and the engine's counters from the row holding the core's latest reading
(the core stamps each reading with its ``time.perf_counter()``, one clock for every process of the host;
the core's numbers are totals already: summing them would count them N times). With one API server the
rows are one, in the process's memory; with N they are a file in the server's private folder mapped by
every process (``numpy.memmap``: shared pages), created by the supervising process
(:mod:`~paged_edu.serve.api_servers`).

Why not prometheus_client's multiprocess mode, which vLLM uses (``setup_multiprocess_prometheus``,
``vllm/v1/metrics/prometheus.py``: ``PROMETHEUS_MULTIPROC_DIR``, a ``MultiProcessCollector`` summing the
processes' files at each scrape)? It is the same idea -- a memory-mapped file of doubles per process,
summed when scraped, read without locks across processes -- but it only covers prometheus_client's
own metric classes, written one value at a time, while our histograms are filled a step at a time
(:class:`StepHistogram`, what that buys is measured there) and the engine's counters and gauges come
from the core as totals. A row of our own keeps both. As in multiprocess mode, a scrape may read a
process's row in the middle of one of its updates (a histogram's buckets before its sum): the next
scrape sees it whole.

Two histograms add buckets below vLLM's first -- inter-token latency 1, 2.5 and 5 ms, end-to-end
latency 10, 25, 50 and 100 ms: a tiny model's steps on a CPU take milliseconds, and would all land
in vLLM's lowest bucket. The names, meanings and every vLLM bucket are unchanged.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

__all__ = ["ServerMetrics", "StepHistogram", "Tally", "shared_slots", "slot_size"]

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


# A slot's layout (see the module docstring): the core's stats as last heard, then this process's own numbers.
READ = 0  # when the core read the stats this slot holds (the core's time.perf_counter(); 0: at the start)
STATS = slice(1, 7)  # running, waiting, KV usage, prefix-cache queried tokens, hit tokens, preemptions
PROMPT_TOKENS, GENERATION_TOKENS = 7, 8
HISTOGRAMS = 9  # where the histograms start: per histogram, its buckets' counts, then its sum


def slot_size() -> int:
    """The float64s in one process's slot."""
    return HISTOGRAMS + sum(len(b) + 2 for b in (TTFT_BUCKETS, ITL_BUCKETS, E2E_BUCKETS, E2E_BUCKETS, E2E_BUCKETS))


def shared_slots(path: str, num_slots: int, create: bool = False) -> np.ndarray:
    """``num_slots`` slots in the file at ``path``, mapped into this process (``create``: a new file of
    zeros, for the supervising process; the API servers map it)."""
    return np.memmap(path, dtype=np.float64, mode="w+" if create else "r+", shape=(num_slots, slot_size()))


class StepHistogram:
    """A Prometheus histogram filled a step at a time: one ``numpy.searchsorted`` over the step's
    values instead of one ``Histogram.observe`` per token (prometheus_client's takes a lock and
    searches the buckets in Python). What it buys, measured on our loaded 2-core CPU at 256 running
    sequences, when this ran on the engine's own thread: the work after a step (tokens handed out,
    metrics) fell from 17.3 to 2.9 ms. Exposed as the same text
    (``_bucket{le=...}``, ``_count``, ``_sum``) through a collector of the registry.

    ``rows``: each process's ``[count per bucket (not cumulative)..., sum]`` (float64 views into the
    slots: exact counts up to 2**53); this process fills ``rows[index]``, a scrape sums them all."""

    def __init__(
        self, name: str, documentation: str, buckets: list[float], labels: dict[str, str], rows=None, index: int = 0
    ) -> None:
        self.name, self.documentation, self.labels = name, documentation, labels
        self.bounds = np.array([*buckets, math.inf])
        self.rows = [np.zeros(len(self.bounds) + 1)] if rows is None else rows
        self.counts, self._sum = self.rows[index][:-1], self.rows[index][-1:]  # this process's (views)
        self._lock = threading.Lock()  # a scrape reads counts and sum of the same step

    @property
    def sum(self) -> float:
        return float(self._sum[0])

    def observe_many(self, values: list[float]) -> None:
        if not values:
            return
        v = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
        counts = np.bincount(np.searchsorted(self.bounds, v, side="left"), minlength=len(self.bounds))
        with self._lock:
            self.counts += counts  # a value v falls in the first bucket whose bound is >= v (``le``)
            self._sum += float(v.sum())

    def collect(self):
        with self._lock:
            row = np.sum(self.rows, axis=0)
        cumulative, total = np.cumsum(row[:-1]).astype(np.int64).tolist(), float(row[-1])
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
    (what ran before -- the warm-up -- is not served traffic). ``slots`` (:func:`shared_slots`) and
    ``index``: every API server's slot and this one's (default: one slot of this process's own).
    """

    def __init__(self, model_name: str, stats: list | None = None, slots=None, index: int = 0) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model_name, "engine": "0"}
        self.slots = np.zeros((1, slot_size())) if slots is None else slots
        self.slot = self.slots[index]
        self.baseline = np.zeros(6) if stats is None else np.asarray(stats[:6], dtype=np.float64)
        if stats is not None and not self.slot[READ]:
            self.slot[STATS] = stats[:6]
        start = HISTOGRAMS
        histograms = []
        # vLLM's queue time runs from the engine core's queueing of a request to its first scheduling, its prefill
        # time from there to the first token (RequestStateStats, vllm/v1/metrics/stats.py); here the queue starts
        # at the arrival in the API server (the hand-off to the core inside it) and "scheduled" is the start of
        # the engine.step() call that first ran the request, so the two add up to the request's TTFT.
        for name, doc, buckets in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", E2E_BUCKETS),
            ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", E2E_BUCKETS),
            ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", E2E_BUCKETS),
        ):
            end = start + len(buckets) + 2
            rows = [self.slots[k][start:end] for k in range(len(self.slots))]
            histograms.append(StepHistogram(name, doc, buckets, self.labels, rows, index))
            start = end
        self.ttft, self.itl, self.e2e, self.queue, self.prefill = histograms
        self.registry.register(self)

    def record(self, stats: list | None, tally: Tally) -> None:
        """The core's gauges and counters as it read them (if the message carried them), and the tally."""
        slot = self.slot
        if stats is not None:
            slot[STATS] = stats[:6]
            slot[READ] = stats[6]
        slot[PROMPT_TOKENS] += tally.prompt_tokens
        slot[GENERATION_TOKENS] += tally.generated
        self.ttft.observe_many(tally.ttft)
        self.itl.observe_many(tally.itl)
        self.e2e.observe_many(tally.e2e)
        self.queue.observe_many(tally.queue)
        self.prefill.observe_many(tally.prefill)

    def collect(self):
        """Every metric, over every API server's slot (the registry's collector: see the module docstring)."""
        labels, values = list(self.labels), list(self.labels.values())
        latest = self.slots[int(np.argmax(self.slots[:, READ]))]  # the core's latest reading, whoever got it
        stats = np.array(latest[STATS])
        for k, (name, doc) in enumerate((
            ("vllm:num_requests_running", "Number of requests in model execution batches."),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
        )):  # fmt: skip
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(values, float(stats[k]))
            yield family
        totals = self.slots[:, PROMPT_TOKENS : GENERATION_TOKENS + 1].sum(axis=0)
        for name, doc, value in (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", stats[3] - self.baseline[3]),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", stats[4] - self.baseline[4]),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", stats[5] - self.baseline[5]),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", totals[0]),
            ("vllm:generation_tokens", "Number of generation tokens processed.", totals[1]),
        ):  # fmt: skip
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(values, max(0.0, float(value)))
            yield family
        for h in (self.ttft, self.itl, self.e2e, self.queue, self.prefill):
            yield from h.collect()

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)

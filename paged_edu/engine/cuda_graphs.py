"""CUDA graphs for the runner: one replay instead of hundreds of launches.

What you will learn
-------------------
A forward pass of a small model is hundreds of small kernels; launched one by one from Python, each
costs the host 5-40 us, and on a 135M-parameter model the GPU finishes each kernel faster than the
host launches the next. A CUDA graph records the launches once and replays them with one call.
The price: a graph replays the *same* kernels on the *same* addresses with the *same* shapes, so

* every input lives in a static buffer that each step overwrites (a
  :class:`~paged_edu.engine.batch.StaticStaging`: numpy writes, one host-to-device copy);
* a step runs the graph captured for the smallest size that holds it, its extra rows padded (slot
  -1, which the K/V store skips);
* nothing inside may sync with the host or size a launch from data.

Two kinds of steps, two sets of graphs, both *full* graphs (attention included):

* :class:`DecodeCudaGraphs` -- one graph per batch size for pure-decode steps (one token per
  sequence): the decode kernel's launch depends only on the batch size and the block table's width,
  both fixed per graph; the graph ends with the LM head and the argmax;
* :class:`MixedCudaGraphs` -- one graph per *token bucket* for steps with prompt chunks (with or
  without decodes beside them). The per-token layers depend only on the number of tokens; attention
  is made to depend on it too: the prefill kernel's grid is a flat list of query blocks sized from
  the bucket and the most chunks a step can have, each program finding its chunk by binary search
  (:mod:`paged_edu.kernels.triton_prefill`), and the chunks a step does not use are padding of
  length 0. The decode rows go to the decode kernel over a fixed ``min(max_num_seqs, bucket)``
  rows, the spare ones attending to one token of block 0 (their output is overwritten by the
  prompt chunks' rows or dropped) -- and a step with no decode at all (a lone request's prompt)
  runs a graph of its bucket captured without them.

vLLM's default, ``FULL_AND_PIECEWISE`` (``CUDAGraphMode`` in ``vllm/config/compilation.py``), keeps
attention out of the graphs of mixed batches (piecewise graphs around an eager attention call);
its full graphs for mixed batches need a backend that declares ``AttentionCGSupport.ALWAYS``, as its
Triton backend does (``TritonAttentionMetadataBuilder`` in ``vllm/v1/attention/backends/triton_attn.py``,
over the unified attention kernel's flat grid). On the H200 a piecewise version of ours spent 11.4 ms
a mixed step, mostly launching the eager attention kernels from Python, the full graph 5.5 ms
(``benchmarks/records/h200/engine_bench_piecewise_probe.json``, ``benchmarks/records/h200/profile_engine_mixed_graphs.txt``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from paged_edu.engine.batch import StaticStaging, StepBatch
from paged_edu.engine.sampling import SamplingBatch
from paged_edu.models.llama import ForwardBatch, Kernels, PagedLlama

__all__ = ["DecodeCudaGraphs", "MixedCudaGraphs", "capture"]


# One warm-up stream per device for every capture of every engine. torch keeps a cuBLAS workspace for
# each stream a GEMM ever ran on, for the life of the process (torch._C._cuda_clearCublasWorkspaces frees
# them). With a new side stream per capture (torch hands them out round-robin from a pool of 32), a
# dropped engine with mixed-step graphs -- whose captures run cuBLAS's GEMMs -- left 64 MiB (synchronous)
# to 192 MiB (async) allocated, the engine itself freed, none without them (H100, 263ba8e,
# benchmarks/records/h100/memdiag_263ba8e.txt); new streams' workspaces are the reading of that record,
# not yet checked on a GPU with this change.
_WARMUP_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _warmup_stream(device: torch.device) -> torch.cuda.Stream:
    device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    if device not in _WARMUP_STREAMS:
        _WARMUP_STREAMS[device] = torch.cuda.Stream(device)
    return _WARMUP_STREAMS[device]


def capture(run: Callable, device: torch.device, pool=None):
    """``(graph, outputs)``: ``run()`` warmed up twice on a side stream (lazy inits, Triton's first
    compile), then recorded into a new graph that allocates from ``pool`` (shared by graphs that
    never run at the same time)."""
    stream = _warmup_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = run()
    return graph, outputs


def capture_sizes(sizes: list, step_for: Callable, device: torch.device) -> tuple[dict, dict]:
    """``({size: graph}, {size: outputs})``: for every size (ascending; a size may be a tuple, a
    graph's key), the call ``step_for(size)`` returns -- made before capture, so that building its
    inputs is not recorded -- captured, largest size first so that the others reuse its memory pool
    (the graphs never run at the same time)."""
    graphs, outputs, pool = {}, {}, None
    for size in reversed(sizes):
        graphs[size], outputs[size] = capture(step_for(size), device, pool)
        pool = graphs[size].pool()
    torch.cuda.synchronize(device)
    return graphs, outputs


def stage_sampling(staging: StaticStaging, sample_rows: np.ndarray, params, in_order: bool = False) -> SamplingBatch:
    """Write a step's sampled rows ``(N,)`` and, unless every row is greedy (``params`` None), the plan's
    ``(temperatures, top_ps, uniforms)`` into a graph's static buffers (fields of those names, ``N`` at
    most their length); returns them as the device views the runner's draw reads -- filled by the
    ``staging.upload`` that follows, with the rest of the step."""
    h, v, N = staging.np, staging.views, len(sample_rows)
    h["sample_rows"][:N] = sample_rows
    if params is None:
        return SamplingBatch(v["sample_rows"][:N], None, None, None, in_order)
    names = ("temperatures", "top_ps", "uniforms")
    for name, values in zip(names, params):
        h[name][:N] = values
    return SamplingBatch(v["sample_rows"][:N], *(v[name][:N] for name in names), in_order)


def smallest_size(sizes: list[int], n: int) -> int | None:
    """The smallest captured size that holds ``n`` (``sizes`` ascending), or None."""
    i = bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


class DecodeCudaGraphs:
    """Replay a captured forward pass for pure-decode steps (one token per sequence).

    Eagerly, a decode step of a 30-layer model launches about a thousand small kernels; at batch
    256 the GPU then waits on Python most of the time. A CUDA graph records the launches once per
    batch size and replays them with one call. Everything a replay reads sits in static buffers
    that each step overwrites: token ids, positions, slots, block tables and lengths -- and they are
    views of one :class:`~paged_edu.engine.batch.StaticStaging`, so :meth:`stage` fills them with
    numpy and one host-to-device copy (no device-side copies, no tensors made per step). A step of
    ``D`` sequences runs the graph of the smallest captured size ``bs >= D``; the padding rows store
    to slot -1 (skipped by the store kernel) and attend to one token of block 0 (harmless; their
    output is dropped). The graph ends with the LM head and the argmax, so a greedy step needs no
    further launch. The kernels must not sync with the host or size launches from data -- the
    decode kernel picks its split count from the table *width*, which is fixed here.

    ``capture_graphs=False`` replays by running the same padded batch eagerly: what a CPU can check.
    """

    def __init__(
        self,
        model: PagedLlama,
        kv_caches,
        max_batch_size: int,
        max_blocks_per_seq: int,
        kernels: Kernels | None = None,
        capture_graphs: bool = True,
    ) -> None:
        device = model.device
        if capture_graphs and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, got {device}")
        self.model = model
        self.kv_caches = kv_caches
        self.kernels = (kernels or Kernels()).resolve(device)  # what the captured passes run
        self.max_blocks_per_seq = max_blocks_per_seq
        sizes = [1, 2, 4, 8] + list(range(16, 129, 16)) + list(range(160, 1025, 32))
        self.sizes = [b for b in sizes if b < max_batch_size] + [max_batch_size]
        n, W = max_batch_size, max_blocks_per_seq
        i64, i32, f32 = np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.float32)
        self.staging = StaticStaging(
            device,
            dict(
                input_ids=(i64, (n,)),
                positions=(i64, (n,)),
                slot_mapping=(i64, (n,)),
                seq_lens=(i32, (n,)),
                sample_rows=(i64, (n,)),
                temperatures=(f32, (n,)),
                top_ps=(f32, (n,)),
                uniforms=(f32, (n,)),
                block_tables=(i32, (n, W)),  # last: only the rows of the step travel
            ),
        )
        self.staging.np["seq_lens"][:] = 1
        self.staging.np["slot_mapping"][:] = -1
        self.staging.upload(n)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # bs -> (hidden (bs, H), greedy (bs,))
        if capture_graphs:
            self.graphs, self.outputs = capture_sizes(
                self.sizes, lambda bs: partial(self._forward, self._batch(bs)), device
            )

    def _forward(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.model(batch, self.kv_caches, self.kernels)  # (bs, hidden)
        return hidden, self.model.greedy_tokens(hidden, self.kernels)  # (bs,) greedy tokens

    def _batch(self, bs: int) -> ForwardBatch:
        v = self.staging.views
        return ForwardBatch(
            input_ids=v["input_ids"][:bs],
            positions=v["positions"][:bs],
            slot_mapping=v["slot_mapping"][:bs],
            num_decodes=bs,
            decode_block_tables=v["block_tables"][:bs],
            decode_seq_lens=v["seq_lens"][:bs],
            prefill_block_tables=None,
            prefill_seq_lens=None,
            prefill_cu_seqlens_q=None,
            logits_rows=torch.arange(bs, device=v["input_ids"].device),
        )

    def size_for(self, num_decodes: int, width: int) -> int | None:
        """The captured batch size that runs ``num_decodes`` decodes with tables ``width`` wide, or None."""
        if width > self.max_blocks_per_seq:
            return None
        return smallest_size(self.sizes, num_decodes)

    def stage(
        self, batch: StepBatch, bs: int, sample_rows: np.ndarray, params, in_order: bool | None = None
    ) -> SamplingBatch:
        """Write a pure-decode batch and its sampled rows (``params``: the plan's ``(temperatures,
        top_ps, uniforms)`` or None) into the graph's inputs, padded to ``bs`` rows, in one copy;
        returns the sampled rows as device views. ``in_order``: whether ``sample_rows`` are ``0 ..
        N-1`` (None: looked at here)."""
        self.staging.wait()
        h = self.staging.np
        D, N = batch.input_ids.shape[0], len(sample_rows)
        tables = batch.decode_block_tables
        for name, values, pad in (
            ("input_ids", batch.input_ids, 0),
            ("positions", batch.positions, 0),
            ("slot_mapping", batch.slot_mapping, -1),
            ("seq_lens", batch.decode_seq_lens, 1),
        ):
            h[name][:D] = values
            if D < bs:  # (a batch of a captured size, 256 of 256, pads nothing)
                h[name][D:bs] = pad
        h["block_tables"][:D, : tables.shape[1]] = tables  # columns past the width: stale, unread
        if D < bs:
            h["block_tables"][D:bs, 0] = 0
        if in_order is None:  # every row samples, in order: the usual decode step
            in_order = np.array_equal(sample_rows, np.arange(N))
        sampling = stage_sampling(self.staging, sample_rows, params, in_order)
        self.staging.upload(bs)
        return sampling

    def replay(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states ``(bs, hidden)`` and greedy tokens ``(bs,)`` of the staged batch."""
        if not self.graphs:  # capture_graphs=False
            return self._forward(self._batch(bs))
        self.graphs[bs].replay()
        return self.outputs[bs]


class MixedCudaGraphs:
    """Steps with prompt chunks, two full graphs per token bucket: with decode rows, and without.

    Buckets: powers of two from 16 to 512, then every 512 up to ``max_num_tokens`` (the scheduler's
    ``max_num_batched_tokens``). Static inputs, for ``T <= Tb`` rows and ``C <= max_num_seqs``
    chunks (``D`` decodes first, then ``P`` prompt chunks): ids, positions and slots per row; the
    decode rows' lengths and tables over ``Dcap = min(max_num_seqs, Tb)`` rows; the prompt chunks'
    lengths, ``cu_seqlens_q`` (rows of q, from ``D``) and tables over ``max_num_seqs`` chunks.
    Padding: rows past ``T`` store to slot -1; decode rows past ``D`` have length 1 (one token of
    block 0); chunks past ``P`` have length 0 and ``cu`` stays at ``T``. The graph computes the hidden
    states of all ``Tb`` rows; the runner samples the real ones.

    The prefill kernel's grid has a program per query block plus one per chunk it is given
    (:mod:`paged_edu.kernels.triton_prefill`), and each program first finds its chunk by a binary
    search over them. A step of ``Tb`` tokens has at most ``C = min(max_num_seqs, Tb)`` chunks (each
    holds a token at least), so the graph of bucket ``Tb`` gives the kernel the first ``C`` chunks'
    slots, not all ``max_num_seqs``: at ``max_num_seqs = 512`` a bucket of 16 launched 3 x 512
    programs a layer, nearly all of them padding that searched 512 entries before returning.
    What it buys, measured on an H100 (``python benchmarks/bench_ttft.py --modes async --profile 96``
    at 3237c64 and with 99b8dd3's ``cuda_graphs.py``, in one lease): the prefill kernel of a 96-token
    prompt's graph 21.3 -> 10.4 us a layer, the graph's kernels 1,342 -> 1,012 us of GPU time under the
    profiler, the prompt step's device time 1.50 -> 1.18 ms (a decode step of batch 1: 0.65 ms) and
    its time to first token 2.34 -> 2.08 ms (``benchmarks/records/h100/ttft_ab_3237c64_log.txt``,
    ``ttft_3237c64.json``).

    A graph is found by its *key* ``(Tb, Dcap)``. A step with no decodes -- every step of a request that
    finds the server idle -- runs the bucket's graph captured with ``Dcap = 0``: the decode kernel over
    ``Dcap`` spare rows, its split merge and the copy of its rows into the output (3 launches a layer,
    90 of a SmolLM2 step) are not in it. What it buys, measured on an H100 (``benchmarks/bench_ttft.py``,
    a 96-token prompt on the server's idle engine, against the one graph per bucket in the same
    lease): the prompt step's device time 1.65 -> 1.49 ms, its time to first token 2.13 -> 1.96 ms
    (``benchmarks/records/h100/ttft_ab_99b8dd3_log.txt``; the journal of ``docs/benchmarks.md``). The
    price: twice the captures at start.

    ``capture_graphs=False`` replays by running the same padded batch eagerly: what a CPU can check.
    """

    def __init__(
        self,
        model: PagedLlama,
        kv_caches,
        max_num_tokens: int,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        kernels: Kernels | None = None,
        capture_graphs: bool = True,
    ) -> None:
        device = model.device
        if capture_graphs and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, got {device}")
        self.model = model
        self.kv_caches = kv_caches
        self.kernels = (kernels or Kernels()).resolve(device)
        self.max_num_seqs, self.max_blocks_per_seq = max_num_seqs, max_blocks_per_seq
        sizes = [2**k for k in range(4, 10)] + list(range(1024, max_num_tokens + 1, 512))
        self.sizes = [t for t in sizes if t < max_num_tokens] + [max_num_tokens]
        n, S, W = max_num_tokens, max_num_seqs, max_blocks_per_seq
        i64, i32, f32 = np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.float32)
        self.staging = StaticStaging(
            device,
            dict(
                input_ids=(i64, (n,)),
                positions=(i64, (n,)),
                slot_mapping=(i64, (n,)),
                decode_seq_lens=(i32, (S,)),
                prefill_seq_lens=(i32, (S,)),
                cu_seqlens_q=(i32, (S + 1,)),
                # the rows to sample, read by the runner's draw after the replay (not by the graph): in the
                # same copy, not a second one (what it buys: see stage)
                sample_rows=(i64, (S,)),
                temperatures=(f32, (S,)),
                top_ps=(f32, (S,)),
                uniforms=(f32, (S,)),
                decode_block_tables=(i32, (S, W)),
                prefill_block_tables=(i32, (S, W)),  # last: only the rows of the step's chunks travel
            ),
        )
        h = self.staging.np
        h["slot_mapping"][:] = -1  # warm-up and capture run the model: store nothing
        h["decode_seq_lens"][:] = 1
        self.staging.upload(S)
        self.keys = sorted((Tb, D) for Tb in self.sizes for D in (0, self.max_chunks(Tb)))  # (Tb, Dcap), smallest first
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}  # (Tb, Dcap) -> hidden (Tb, hidden)
        if capture_graphs:
            self.graphs, self.outputs = capture_sizes(
                self.keys, lambda key: partial(self.model, self._batch(key), kv_caches, self.kernels), device
            )

    def _batch(self, key: tuple[int, int]) -> ForwardBatch:
        v = self.staging.views
        Tb, Dcap = key
        C = self.max_chunks(Tb)  # prompt chunk slots
        return ForwardBatch(
            input_ids=v["input_ids"][:Tb],
            positions=v["positions"][:Tb],
            slot_mapping=v["slot_mapping"][:Tb],
            num_decodes=Dcap,
            decode_block_tables=v["decode_block_tables"][:Dcap],
            decode_seq_lens=v["decode_seq_lens"][:Dcap],
            prefill_block_tables=v["prefill_block_tables"][:C],
            prefill_seq_lens=v["prefill_seq_lens"][:C],
            prefill_cu_seqlens_q=v["cu_seqlens_q"][: C + 1],
            logits_rows=v["input_ids"][:0],  # unused: the runner samples
        )

    def max_chunks(self, Tb: int) -> int:
        """The most chunks a step of ``Tb`` tokens can have (each holds a token at least, and a step at
        most ``max_num_seqs``): the decode rows of a graph with decodes, and every graph's prompt chunk slots."""
        return min(self.max_num_seqs, Tb)

    def size_for(self, batch: StepBatch) -> tuple[int, int] | None:
        """The key ``(Tb, Dcap)`` of the graph that runs this step, or None (eager)."""
        tables = [t for t in (batch.decode_block_tables, batch.prefill_block_tables) if t is not None]
        if len(batch.logits_rows) > self.max_num_seqs or max(t.shape[1] for t in tables) > self.max_blocks_per_seq:
            return None
        Tb = smallest_size(self.sizes, batch.input_ids.shape[0])
        if Tb is None:
            return None
        return Tb, self.max_chunks(Tb) if batch.num_decodes else 0

    def stage(self, batch: StepBatch, key: tuple[int, int], sample_rows: np.ndarray, params) -> SamplingBatch | None:
        """Write the step into the inputs of graph ``key``, padded as the class says, and its sampled rows
        (``params``: the plan's ``(temperatures, top_ps, uniforms)`` or None), in one copy; returns the
        sampled rows as device views -- or None, writing nothing, when they outnumber the
        ``max_num_seqs`` slots (a parallel-sampling prompt's forks): the caller uploads the step itself.

        What is written is what graph ``key`` reads: its ``C = max_chunks(Tb)`` chunk slots, not all
        ``max_num_seqs`` (a larger bucket's step writes its own); with the sampled rows in the same copy,
        the lone prompt's runner ``_stage`` 31 -> 12 us on this project's CPU (``bench_host.py --workload
        lone``, perf_counter around it; on a GPU also one host-to-device copy and its event fewer a step).
        ``tests/engine/test_cuda_graphs.py`` checks the staged buffers against the unpadded batch's
        padded definition."""
        N = len(sample_rows)
        if N > self.max_num_seqs:
            return None
        self.staging.wait()
        h = self.staging.np
        (Tb, Dcap), T, D = key, batch.input_ids.shape[0], batch.num_decodes
        C = self.max_chunks(Tb)
        for name, values, pad in (
            ("input_ids", batch.input_ids, 0),
            ("positions", batch.positions, 0),
            ("slot_mapping", batch.slot_mapping, -1),
        ):
            h[name][:T] = values
            h[name][T:Tb] = pad
        if D:
            h["decode_seq_lens"][:D] = batch.decode_seq_lens
            tables = batch.decode_block_tables
            h["decode_block_tables"][:D, : tables.shape[1]] = tables  # columns past the width: stale, unread
        h["decode_seq_lens"][D:Dcap] = 1
        h["decode_block_tables"][D:Dcap, 0] = 0
        cu = batch.prefill_cu_seqlens_q  # (P + 1,) from D to T, or None (decodes only)
        P = 0 if cu is None else len(cu) - 1
        if P:
            h["prefill_seq_lens"][:P] = batch.prefill_seq_lens
            tables = batch.prefill_block_tables
            h["prefill_block_tables"][:P, : tables.shape[1]] = tables
            h["cu_seqlens_q"][:P] = cu[:-1]  # E.g. cu [2, 5, 9] (P = 2), T = 9, C = 4 -> [2, 5, 9, 9, 9]
        h["prefill_seq_lens"][P:C] = 0
        h["cu_seqlens_q"][P : C + 1] = T  # the last chunk's end, and every padding chunk's (length 0)
        sampling = stage_sampling(self.staging, sample_rows, params)
        self.staging.upload(max(P, 1))
        return sampling

    def input_ids(self, key: tuple[int, int]) -> torch.Tensor:
        """The staged token ids ``(Tb,)`` (async scheduling fills placeholders in there)."""
        return self.staging.views["input_ids"][: key[0]]

    def replay(self, key: tuple[int, int]) -> torch.Tensor:
        """Hidden states ``(Tb, hidden)`` of the staged step, by graph ``key``."""
        if not self.graphs:  # capture_graphs=False
            return self.model(self._batch(key), self.kv_caches, self.kernels)
        self.graphs[key].replay()
        return self.outputs[key]

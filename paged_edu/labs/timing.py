"""Timing decode kernels the way ``benchmarks/bench_kernels.py`` does, for the benchmark and lesson 4 alike.

On a GPU (:class:`Timer`): CUDA-graph replays (or eager calls timed with CUDA events) after
warm-up, with the L2 cache flushed before every replay by a 256 MiB write, median of ``reps``.
The *copy ceiling* (:func:`copy_ceiling_us`) is an eager ``dst.copy_(src)`` over as many bytes as
the case's K and V, timed the same way; it moves ``2 x`` those bytes (read + write), so
``bandwidth = 2 * kv_bytes / time`` is what the memory really sustains in this run. A kernel's
bandwidth is ``(K and V bytes read + q + output) / time`` and its "% of ceiling" that over the
copy's (:func:`decode_bytes` counts the bytes).

On a CPU (:func:`wall_us`): the median wall-clock time of a few calls -- enough to compare a Python
loop, a vectorised PyTorch version and the Triton interpreter side by side at a small size.

A profile of a step (``torch.profiler``): :func:`kernel_table` books each device kernel to its kind
(:func:`kernel_kind`: GEMMs, attention, our fused per-token kernels, PyTorch's other small kernels) and
to its name -- ``benchmarks/bench_layer.py``'s graph replays and the speed ladder's decode probes alike.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time

import torch

__all__ = [
    "Timer",
    "compiled_variant_counter",
    "copy_ceiling_us",
    "graph_capture_counter",
    "decode_bytes",
    "kernel_kind",
    "kernel_table",
    "percentile",
    "random_decode_step",
    "random_paged_case",
    "rel_err",
    "wall_us",
]


class Timer:
    def __init__(self, reps: int, warmup: int):
        self.reps, self.warmup = reps, warmup
        self.flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # > 4x the 60 MiB L2

    def _warm(self, fn):
        """At least ``warmup`` calls and 50 ms of them: clocks and caches settle before timing."""
        torch.cuda.synchronize()
        t0, n = time.perf_counter(), 0
        while n < self.warmup or time.perf_counter() - t0 < 0.05:
            fn()
            n += 1
            if n % 10 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()

    def graph(self, fn):
        """Capture ``fn`` in a CUDA graph; return (median microseconds, all samples, output)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()  # compile and allocate outside the capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        self._warm(graph.replay)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        for i in range(self.reps):
            self.flush.zero_()  # evicts K/V from L2; also keeps the GPU busy while we enqueue
            starts[i].record()
            graph.replay()
            ends[i].record()
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
        del graph
        return statistics.median(samples), samples, out

    def events(self, fn):
        """Median microseconds of eager calls, timed with CUDA events, L2 flushed before each."""
        self._warm(fn)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        for i in range(self.reps):
            self.flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))

    def eager(self, fn, reps: int = 3):
        """Wall-clock of an eager call (the loop is not capturable: it reads lengths on the host)."""
        fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(reps):
            self.flush.zero_()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples), samples, out


def copy_ceiling_us(timer: Timer, kv_bytes: int, dtype=torch.bfloat16) -> float:
    """Median microseconds of an eager ``dst.copy_(src)`` of ``kv_bytes`` bytes (it moves 2 x that).

    Eager, not in a graph: captured, a device-to-device copy becomes a memcpy node that the H200 ran
    at only ~2.8 TB/s on large tensors, against ~4.2 TB/s for the copy kernel eager ``copy_`` runs.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    src = torch.randn(kv_bytes // itemsize, device="cuda", dtype=dtype)
    dst = torch.empty_like(src)
    us = timer.events(lambda: dst.copy_(src))
    src = dst = None  # free the buffers (the lambda above holds the names)
    return us


def decode_bytes(num_seqs: int, seq_len: int, num_q_heads: int, num_kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Bytes one decode call must move at least: K and V of every token once per *KV* head (the query
    heads of a GQA group share them), the queries read and the outputs written."""
    kv = 2 * num_seqs * seq_len * num_kv_heads * head_dim * itemsize
    q_and_out = 2 * num_seqs * num_q_heads * head_dim * itemsize
    return kv + q_and_out


def random_paged_case(
    num_seqs: int,
    seq_len: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    *,
    dtype=torch.bfloat16,
    device="cuda",
    seed: int = 0,
):
    """``(q, k_cache, v_cache, block_tables, seq_lens)``: every sequence ``seq_len`` tokens (a multiple of
    ``block_size``), the pool exactly full, blocks handed out in a random order (non-contiguous tables)."""
    g = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = seq_len // block_size
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, device=device, dtype=dtype, generator=g)
    v_cache = torch.randn(shape, device=device, dtype=dtype, generator=g)
    q = torch.randn(num_seqs, num_q_heads, head_dim, device=device, dtype=dtype, generator=g)
    tables = torch.randperm(num_blocks, device=device, generator=g).to(torch.int32).view(num_seqs, blocks_per_seq)
    lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, tables, lens


def random_decode_step(
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    num_seqs: int = 64,
    max_len: int = 600,
    block_size: int = 16,
    width: int = 38,
    device="cuda",
    seed: int = 3,
):
    """One pure-decode step before its rotary embedding and store, bf16: ``(q, k, v, pool, block_tables,
    seq_lens, positions, slot_mapping)`` -- q ``(num_seqs, H, D)`` and k ``(num_seqs, H_kv, D)`` scaled by 3,
    v ``(num_seqs, H_kv, D)``, a pool of random "stale" values ``(num_seqs * 40, B, H_kv, D)``, lengths in
    ``[1, max_len)``, each sequence ``width`` distinct random blocks (``width * B >= max_len``), the new
    token at ``s - 1`` and its slot through the table. The case of ``benchmarks/probe_fp_fusion.py`` and
    of the GPU test that holds its finding (``tests/kernels/test_fused.py``)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device=device, generator=g) * scale).to(torch.bfloat16)

    num_blocks = num_seqs * 40
    q = randn(num_seqs, num_q_heads, head_dim, scale=3.0)
    k = randn(num_seqs, num_kv_heads, head_dim, scale=3.0)
    v = randn(num_seqs, num_kv_heads, head_dim)
    pool = randn(num_blocks, block_size, num_kv_heads, head_dim)
    lens = torch.randint(1, max_len, (num_seqs,), device=device, generator=g).to(torch.int32)
    tables = torch.randperm(num_blocks, device=device, generator=g)[: num_seqs * width].view(num_seqs, width)
    tables = tables.to(torch.int32)
    pos = (lens - 1).long()
    slots = tables[torch.arange(num_seqs, device=device), pos // block_size].long() * block_size + pos % block_size
    return q, k, v, pool, tables, lens, pos, slots


def kernel_kind(name: str) -> str:
    """A device kernel's kind from its name: ``"attention"`` (the paged decode and prefill kernels and the split
    merge), ``"fused"`` (our Triton per-token ops), ``"gemm"`` (cuBLAS / the skinny GEMM) or ``"other"``
    (PyTorch's elementwise, reduction and copy kernels)."""
    n = name.lower()
    if any(w in n for w in ("_decode_kernel", "merge_splits", "prefill_kernel", "attention")):
        return "attention"
    if any(w in n for w in ("add_rms_norm", "silu_and_mul", "store_kv")):
        return "fused"
    if any(w in n for w in ("gemm", "gemv", "cutlass", "nvjet", "sm90", "cublas", "splitk", "skinny_matmul")):
        return "gemm"
    return "other"


def kernel_table(kernels, n: int, top: int = 12) -> dict:
    """``n`` steps' device kernels (``torch.profiler`` events) per step: ``kernels_per_step``, ``gpu_busy_us``,
    and ``{"kernels", "us"}`` per kind (``by_kind``, :func:`kernel_kind`) and for the ``top`` longest names."""
    us = lambda e: getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)  # noqa: E731
    by_kind: dict[str, list] = {}
    by_name: dict[str, list] = {}
    for e in kernels:
        for table, key in ((by_kind, kernel_kind(e.name)), (by_name, e.name[:60])):
            entry = table.setdefault(key, [0, 0.0])
            entry[0] += 1
            entry[1] += us(e)

    def per(d):
        return {k: {"kernels": c / n, "us": t / n} for k, (c, t) in sorted(d.items(), key=lambda kv: -kv[1][1])}

    return {
        "kernels_per_step": len(kernels) / n,
        "gpu_busy_us": sum(us(e) for e in kernels) / n,
        "by_kind": per(by_kind),
        "top": dict(list(per(by_name).items())[:top]),
    }


def profile_replays(graph, fn=None, n: int = 10) -> dict:
    """Kernels per replay and their GPU microseconds per replay, by kind and the top names.

    If the profiler sees no kernels inside graph replays (older CUPTI), eager calls of ``fn`` (if
    given) -- the same kernels, launched one by one -- are profiled instead (``"source"`` says which)."""
    from torch.profiler import ProfilerActivity, profile

    def kernels_of(step):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                step()
            torch.cuda.synchronize()
        return [
            e
            for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
        ]

    source = "graph replay"
    kernels = kernels_of(graph.replay)
    if not kernels and fn is not None:
        source, kernels = "eager", kernels_of(fn)
    return {"source": source, **kernel_table(kernels, n)}


def percentile(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q / 100))]


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm()).item()


def wall_us(fn, reps: int = 3) -> tuple[float, object]:
    """Median wall-clock microseconds of ``reps`` calls after one warm-up call; and the last output."""
    out = fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        if isinstance(out, torch.Tensor) and out.is_cuda:
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples), out


def compiled_variant_counter():
    """A function returning how many kernel variants paged_edu's Triton kernels have compiled so far
    (each ``@triton.jit`` function keeps one compiled kernel per specialisation, per device)."""
    import importlib

    fns = []
    for name in (
        "kernels.decode.tutorial",
        "kernels.decode.fast",
        "kernels.triton_prefill",
        "kernels.triton_store",
        "kernels.triton_fused",
        "labs.triton_decode_packed",
    ):
        try:
            mod = importlib.import_module(f"paged_edu.{name}")
        except ImportError:  # no triton here (the --smoke run on a bare CPU)
            continue
        fns += [f for f in vars(mod).values() if hasattr(f, "device_caches")]
    return lambda: sum(len(c[0]) for f in fns for c in f.device_caches.values())


_graph_captures = [0]  # CUDA graphs captured in this process since graph_capture_counter was first called


def graph_capture_counter():
    """A function returning how many CUDA graphs this process has captured since the first call.

    Counts every ``torch.cuda.CUDAGraph.capture_begin`` -- what ``torch.cuda.graph(...)`` calls -- so
    it sees paged_edu's decode graphs and transformers' continuous batching capturing one for a
    shape it meets for the first time alike. Installs the count once, on the class.
    """
    cls = torch.cuda.CUDAGraph
    if not getattr(cls.capture_begin, "_paged_edu_counted", False):
        begin = cls.capture_begin

        def capture_begin(self, *args, **kwargs):
            _graph_captures[0] += 1
            return begin(self, *args, **kwargs)

        capture_begin._paged_edu_counted = True
        cls.capture_begin = capture_begin
    return lambda: _graph_captures[0]


@contextlib.contextmanager
def frozen_heap():
    """Around a timed serving window: ``gc.collect()`` then ``gc.freeze()`` -- every object alive now
    (the model, its modules, the imports) moves to a generation the garbage collector never scans
    again -- and ``gc.unfreeze()`` after. Without it, a run that keeps one record per step pays for
    collections that rescan the whole startup heap: on this repository's 2-core CPU the engine's host
    time for the 512-request benchmark (stub model) fell 13 % with it. vLLM freezes its heap the same
    way after start-up and warm-up (``freeze_gc_heap`` in ``vllm/utils/gc_utils.py``). Every system a
    benchmark compares is timed inside it."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()

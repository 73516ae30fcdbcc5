"""The model runner: from the scheduler's chunks to sampled tokens, as fast as the device allows.

The engine's :meth:`~paged_edu.engine.engine.Engine.step` says *what* runs in a step (which tokens
of which sequences); the runner makes it run. Per step the host does three things and waits once:

1. :meth:`ModelRunner.prepare` -- the step's :class:`~paged_edu.engine.batch.StepBatch`, from the
   decode batch kept across steps (:class:`~paged_edu.engine.input_batch.InputBatch`) or built with
   numpy from the chunks and their block tables (:mod:`paged_edu.engine.batch`), plus the rows to
   sample (:class:`~paged_edu.engine.sampling.SamplingPlan`), in **one** host-to-device copy from a
   reused, pinned buffer: a :class:`StagedBatch`; token ids still on the device (placeholders
   ``-1 - j``) gathered there;
2. :meth:`ModelRunner.forward` -- launches the forward pass: one CUDA-graph replay for a pure-decode
   step (:class:`~paged_edu.engine.cuda_graphs.DecodeCudaGraphs`; the graph also computes the greedy
   tokens), one replay of :class:`~paged_edu.engine.cuda_graphs.MixedCudaGraphs` for a step with
   prompt chunks (``mixed_graphs=True``), else the eager model;
3. :meth:`ModelRunner.draw` -- sampling on the device (:func:`~paged_edu.engine.sampling.draw`:
   argmax, or the seeded inverse CDF of :func:`~paged_edu.engine.sampling.sample_on_device`), the
   tokens left there; the step (:mod:`~paged_edu.engine.step`) copies them back once, the only
   point where the host waits for the GPU.

The runner imports the model, never the reverse: the model only knows its input record and the
cache's one store call (:func:`paged_edu.cache.kv_cache.store_kv`).
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Sequence
from itertools import groupby
from operator import itemgetter

import numpy as np
import torch

from paged_edu.cache.kv_cache import PagedKVCache
from paged_edu.engine.batch import BatchStaging, StepBatch
from paged_edu.engine.config import KernelConfig
from paged_edu.engine.cuda_graphs import DecodeCudaGraphs, MixedCudaGraphs
from paged_edu.engine.input_batch import InputBatch
from paged_edu.engine.sampling import SamplingBatch, SamplingPlan, draw
from paged_edu.models.llama import ForwardBatch, PagedLlama

__all__ = ["BLOCK_SPACES", "ModelRunner", "StagedBatch", "fill_placeholders"]

# A block op's kind -> (where its sources are, where its destinations are)
BLOCK_SPACES = {"swap_out": ("gpu", "cpu"), "copy": ("gpu", "gpu"), "swap_in": ("cpu", "gpu")}


class StagedBatch:
    """What :meth:`ModelRunner.prepare` hands to ``forward`` and ``draw``: the step's batch on the
    device (or in a captured graph's buffers), the rows to sample, and (after ``forward``) where the
    results are."""

    __slots__ = ("forward", "sampling", "num_rows", "graph_size", "mixed_key", "hidden", "greedy", "host")

    def __init__(
        self,
        forward: ForwardBatch | None,
        sampling: SamplingBatch,
        num_rows: int,
        graph_size: int | None,
        mixed_key: tuple[int, int] | None = None,
    ):
        self.forward = forward  # None when a captured graph runs it (its inputs are staged in the graph's buffers)
        self.sampling = sampling
        self.num_rows = num_rows  # real rows; rows past it pad a captured graph's batch size
        self.graph_size = graph_size  # the captured decode batch size that runs it, or None
        self.mixed_key = mixed_key  # (token bucket, decode rows): the mixed-step graph that runs it, or None
        self.hidden: torch.Tensor | None = None  # (rows, hidden), set by forward
        self.greedy: torch.Tensor | None = None  # (rows,) argmax tokens, when the graph computed them
        self.host: StepBatch | None = None  # the batch as packed on the host (placeholders < 0 in its ids)


# ----------------------------------------------------------------------------------------------
# The runner
# ----------------------------------------------------------------------------------------------


class ModelRunner:
    """One model over one paged KV cache: ``apply_block_ops``, ``prepare``, ``forward``, ``draw``,
    in that order each step. Each piece exists for speed, and says why:

    * :meth:`apply_block_ops` -- a run of same-kind block copies is one ``index_copy_`` per layer
      and tensor, not one per block (a preemption can swap hundreds of blocks at once);
    * :meth:`prepare` -- the batch built by numpy array expressions, not a Python loop per token,
      into a reused pinned buffer that reaches the device in one copy (:mod:`~paged_edu.engine.batch`;
      at 256 running sequences this took the host's preparation from 0.84 to about 0.2 ms a step); a
      decode step like the last one from the arrays kept across steps
      (:mod:`~paged_edu.engine.input_batch`), its token ids gathered on the device;
    * ``kernels.cuda_graphs`` -- :class:`~paged_edu.engine.cuda_graphs.DecodeCudaGraphs` for batches of
      up to ``max_num_seqs`` decodes with block tables up to ``max_model_len`` tokens wide: a decode
      step of small kernels is bound by their launches, which a replay removes;
      ``kernels.mixed_graphs`` -- :class:`~paged_edu.engine.cuda_graphs.MixedCudaGraphs` for the
      other steps of up to ``max_num_batched_tokens`` tokens (on the H200 an eager step with prompt
      chunks spent ~17 ms launching ~600 kernels from Python). Capture is an optimisation: if it
      fails the runner warns, records why in ``graph_error`` and runs those steps eagerly;
    * :meth:`draw` -- the LM head only for the rows that sample (one per sequence), not for every
      token of a prompt chunk (a 49,152-wide matmul per row); the tokens drawn on the device (the
      uniforms come from the host with the batch).

    ``kernels`` is the engine's :class:`~paged_edu.engine.config.KernelConfig`, turned here, once, into
    the model's :class:`~paged_edu.models.llama.Kernels` (``self.kernels``), which every forward pass
    gets -- never set on the model, so two runners sharing one model each keep their own.
    """

    def __init__(
        self,
        model: PagedLlama,
        kv_cache: PagedKVCache,
        kernels: KernelConfig = KernelConfig(),
        *,
        max_num_seqs: int = 256,
        max_model_len: int = 2048,
        max_num_batched_tokens: int = 2048,
    ) -> None:
        config = kernels.for_device(model.device)  # None defaults decided, what cannot run here refused
        self.kernels = config.model_kernels().resolve(model.device)
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.device = model.device
        self.kv_pairs = list(zip(kv_cache.k_caches, kv_cache.v_caches))  # (k_cache, v_cache) per layer
        self.staging = BatchStaging(self.device)  # the step's inputs: one pinned buffer, one copy
        self.graphs: DecodeCudaGraphs | None = None
        self.mixed_graphs: MixedCudaGraphs | None = None
        self.graph_error: str | None = None
        self.num_graph_steps = 0  # forward passes served by a decode CUDA-graph replay
        self.num_mixed_graph_steps = 0  # forward passes served by a mixed-step CUDA-graph replay
        self.timeline = None  # the engine's Timeline when it records one: begin() / end() around the device work
        self.num_blocks = {"swap_out": 0, "copy": 0, "swap_in": 0}  # blocks copied by apply_block_ops, ever
        self._pending: deque[tuple[str, list[tuple[int, int]]]] = deque()  # runs a raising copy left, in order
        self.failed_run: tuple[str, list[tuple[int, int]]] | None = None  # the last run whose copy raised
        max_blocks_per_seq = -(-max_model_len // self.block_size)
        try:
            if config.cuda_graphs:
                self.graphs = DecodeCudaGraphs(model, self.kv_pairs, max_num_seqs, max_blocks_per_seq, self.kernels)
            if config.mixed_graphs:
                self.mixed_graphs = MixedCudaGraphs(
                    model, self.kv_pairs, max_num_batched_tokens, max_num_seqs, max_blocks_per_seq, self.kernels
                )
        except Exception as exc:  # fall back to eager steps, and say why
            self.graph_error = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"CUDA-graph capture failed, those steps run eagerly: {self.graph_error}")

    def release(self) -> None:
        """Drop every device buffer this runner holds -- its view of the KV cache, the CUDA graphs and
        their memory pools, the staging buffers -- so that they are freed (``Engine.close``)."""
        self.graphs = self.mixed_graphs = None
        self.kv_cache, self.kv_pairs = None, []
        self.staging = None
        self._pending.clear()

    def apply_block_ops(self, block_ops: Sequence[tuple[str, int, int]]) -> None:
        """Apply the scheduler's ``block_ops`` to the cache in order -- ``("swap_out", gpu, cpu)``,
        ``("copy", src, dst)``, ``("swap_in", cpu, gpu)`` -- each run of one kind as one batched
        copy per layer.

        The scheduler has already moved the blocks in its books, so a copy that raises (a CUDA OOM,
        an injected fault) must still happen: the run that raised and those after it stay queued
        (:attr:`pending_block_ops`), and the next call applies them first, before its own -- the
        failed run one pair at a time, so that a copy that fails again names its one pair
        (:attr:`failed_run`). Re-applying a copy is safe: a run's sources are not written before the
        step's forward pass, which never runs while copies are pending. A copy no live sequence
        needs any more (its owner was aborted or preempted) is dropped with :meth:`keep_block_ops`.
        """
        if block_ops:
            bad = next((op[0] for op in block_ops if op[0] not in BLOCK_SPACES), None)
            if bad is not None:
                raise ValueError(f"unknown block op {bad!r}")
            # runs of one kind, in order (never merged across steps). E.g. [("swap_out", 1, 7),
            # ("swap_out", 2, 8), ("copy", 3, 4)] -> [("swap_out", [(1, 7), (2, 8)]), ("copy", [(3, 4)])]
            for kind, ops in groupby(block_ops, key=itemgetter(0)):
                self._pending.append((kind, [(a, b) for _, a, b in ops]))
        pending = self._pending
        while pending:
            kind, pairs = pending[0]
            try:
                self._apply_run(kind, pairs)
            except BaseException:
                self.failed_run = (kind, pairs)
                if len(pairs) > 1:  # retried pair by pair
                    pending.popleft()
                    pending.extendleft((kind, [pair]) for pair in reversed(pairs))
                raise
            pending.popleft()
            self.num_blocks[kind] += len(pairs)

    def _apply_run(self, kind: str, pairs: list[tuple[int, int]]) -> None:
        if kind == "swap_out":
            self.kv_cache.swap_out(pairs)
        elif kind == "copy":
            self.kv_cache.copy_blocks(pairs)
        else:
            self.kv_cache.swap_in(pairs)

    @property
    def pending_block_ops(self) -> list[tuple[str, list[tuple[int, int]]]]:
        """The runs of block copies not applied yet (after one raised), in order: ``(kind, pairs)``."""
        return list(self._pending)

    @property
    def num_unapplied_block_ops(self) -> int:
        """Block copies the scheduler asked for that have not reached the cache (after one raised)."""
        return sum(len(pairs) for _, pairs in self._pending)

    def keep_block_ops(self, keep: Callable[[str, int, int], bool]) -> int:
        """Keep only the pending copies ``keep(kind, src, dst)`` wants; returns how many were dropped."""
        before = self.num_unapplied_block_ops
        runs = ((kind, [(a, b) for a, b in pairs if keep(kind, a, b)]) for kind, pairs in self._pending)
        self._pending = deque((kind, pairs) for kind, pairs in runs if pairs)
        return before - self.num_unapplied_block_ops

    def prepare(self, sched, inputs: InputBatch, plan: SamplingPlan) -> StagedBatch:
        """The step's inputs on the device, from the scheduler's output ``sched`` (a ``SchedulerOutput``).

        ``inputs`` builds the step's :class:`StepBatch` (row-wise from the sequences' kept state, or
        packed from the chunks); ``plan`` says which rows sample and how
        (:func:`~paged_edu.engine.sampling.plan_sampling`). Token ids still on the device -- the
        placeholders ``-1 - j``, "token ``j`` of the last step's draw", of async scheduling's step in
        flight -- are gathered there from ``inputs.tokens``.
        """
        one_each = len(plan.chunks) == sched.num_chunks and not plan.forks  # every chunk draws one token, in order
        host = inputs.prepare(sched, None if plan.forks else plan.chunks)
        batch = self._stage(host, plan, one_each)
        batch.host = host
        if inputs.tokens is not None and host.input_ids.min() < 0:  # (no device view made when none is there)
            fill_placeholders(self.input_ids(batch), inputs.tokens, host.input_ids)
        return batch

    def _stage(self, host: StepBatch, plan: SamplingPlan, one_each: bool = False) -> StagedBatch:
        """The batch on the device: into a captured graph's buffers, or the staging buffer."""
        rows = host.input_ids.shape[0]
        # (N,) the hidden-state row of each token drawn: its chunk's last row. E.g. logits_rows [0, 4, 1],
        # chunk 1 a prompt that ends drawing n = 3: plan.chunks [0, 1, 1, 1, 2] -> [0, 4, 4, 4, 1];
        # one token per chunk, in order (the usual step): the chunks' last rows themselves
        sample_rows = host.logits_rows if one_each else host.logits_rows[np.asarray(plan.chunks, dtype=np.int64)]
        if self.graphs is not None and host.is_pure_decode:
            bs = self.graphs.size_for(rows, host.decode_block_tables.shape[1])
            if bs is not None:  # straight into the captured graph's inputs
                # one token per chunk of a pure-decode batch: the rows sample in order (pack_decodes' logits_rows)
                sampling = self.graphs.stage(host, bs, sample_rows, plan.params, True if one_each else None)
                return StagedBatch(None, sampling, rows, bs)
        key = self.mixed_graphs.size_for(host) if self.mixed_graphs is not None else None
        if key is not None:  # into the mixed-step graph's inputs, the rows to sample with them
            sampling = self.mixed_graphs.stage(host, key, sample_rows, plan.params)
            if sampling is not None:  # (None: more rows to sample than its buffers hold -- an eager step)
                return StagedBatch(None, sampling, rows, None, key)
        arrays = host.arrays()
        arrays["sample_rows"] = sample_rows
        if plan.params is not None:
            for name, values in zip(("temperatures", "top_ps", "uniforms"), plan.params):
                arrays[name] = np.asarray(values, dtype=np.float32)
        t = self.staging.upload(arrays)
        sampling = SamplingBatch(t["sample_rows"], t.get("temperatures"), t.get("top_ps"), t.get("uniforms"))
        return StagedBatch(host.on_device(t), sampling, rows, None)

    def forward(self, batch: StagedBatch) -> None:
        """Launch the forward pass; the new tokens' K/V land in the cache, the hidden states in ``batch``."""
        if self.timeline is not None:
            self.timeline.begin(batch)
        if batch.graph_size is not None:
            self.num_graph_steps += 1
            batch.hidden, batch.greedy = self.graphs.replay(batch.graph_size)  # one graph replay
        elif batch.mixed_key is not None:
            self.num_mixed_graph_steps += 1
            batch.hidden = self.mixed_graphs.replay(batch.mixed_key)  # one graph replay, (Tb, hidden)
        else:
            batch.hidden = self.model(batch.forward, self.kv_pairs, self.kernels)  # (T, hidden)

    def input_ids(self, batch: StagedBatch) -> torch.Tensor:
        """The step's token ids on the device, ``(rows,)`` (padded to a captured graph's size): what
        async scheduling fills in for tokens still on the device (:mod:`~paged_edu.engine.overlap`)."""
        if batch.graph_size is not None:
            return self.graphs.staging.views["input_ids"][: batch.graph_size]
        if batch.mixed_key is not None:
            return self.mixed_graphs.input_ids(batch.mixed_key)
        return batch.forward.input_ids

    def draw(self, batch: StagedBatch) -> torch.Tensor:
        """One token per sampled row, ``(N,)`` int64, left on the device (no wait)."""
        tokens = draw(self.model, self.kernels, batch.hidden, batch.greedy, batch.sampling)
        self.end_launch()
        return tokens

    def end_launch(self) -> None:
        """The step's device work is all queued (after its tokens are drawn, or its forward pass when
        it draws none): the timeline's end mark."""
        if self.timeline is not None:
            self.timeline.end()


def fill_placeholders(input_ids: torch.Tensor, tokens: torch.Tensor, host_ids: np.ndarray) -> None:
    """``input_ids[i] = tokens[-1 - input_ids[i]]`` where ``input_ids[i] < 0``, on the device.

    ``host_ids`` are the same ids on the host, so the host knows where the placeholders are without
    asking the device. Usually (async scheduling's step where every sequence of the step in flight
    decodes again, in the same order) they are rows ``0 .. k-1`` pointing at tokens ``0 .. k-1``: then
    the fill is one copy; a decode step whose every row is a placeholder (some sequence finished: gaps)
    is one gather (two kernels); otherwise six small kernels compute it. On the H200's host each
    launch costs ~10 us of a decode step's ~1 ms."""
    num = int(np.count_nonzero(host_ids < 0))
    if num == 0:
        return
    # E.g. host_ids [-1, -2, -3, 7]: num 3, the first three are [-1, -2, -3] -> tokens[:3] in one copy
    if num <= tokens.shape[0] and np.array_equal(host_ids[:num], np.arange(-1, -1 - num, -1)):
        input_ids[:num].copy_(tokens[:num])
        return
    if num == len(host_ids):  # E.g. [-1, -3, -4]: every row a placeholder -> tokens[[0, 2, 3]] in place
        ids = input_ids[:num]
        torch.index_select(tokens, 0, -1 - ids, out=ids)
        return
    # E.g. input_ids [-1, -4, 7], 8 tokens: rows [0, 3, 0] (-8 clamped to 0) -> [tokens[0], tokens[3], 7]
    rows = (-1 - input_ids).clamp_(0, tokens.shape[0] - 1)  # (rows,) index into the last step's tokens
    input_ids.copy_(torch.where(input_ids < 0, tokens[rows], input_ids))

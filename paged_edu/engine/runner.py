"""The model runner: from the scheduler's chunks to sampled tokens, as fast as the device allows.

The engine's :meth:`~paged_edu.engine.engine.Engine.step` says *what* runs in a step (which tokens
of which sequences); the runner makes it run. Per step the host does three things and waits once:

1. :meth:`ModelRunner.prepare` -- the flat :class:`~paged_edu.models.llama.ForwardBatch` built with
   numpy from the chunks and their block tables (:mod:`paged_edu.engine.batch`), plus the rows to
   sample, in **one** host-to-device copy from a reused, pinned buffer;
2. :meth:`ModelRunner.forward` -- launches the forward pass: one CUDA-graph replay for a pure-decode
   step (:class:`~paged_edu.engine.cuda_graphs.DecodeCudaGraphs`; the graph also computes the greedy
   tokens), one replay of :class:`~paged_edu.engine.cuda_graphs.MixedCudaGraphs` for a step with
   prompt chunks (``mixed_graphs=True``), else the eager model;
3. :meth:`ModelRunner.sample` -- sampling on the device (argmax, or the seeded inverse CDF of
   :func:`~paged_edu.engine.sampling.sample_on_device`) and **one** device-to-host copy of the
   tokens; the only point where the host waits for the GPU (timed: ``device_wait_s``).

The runner imports the model, never the reverse: the model only knows its input record and the
cache's one store call (:func:`paged_edu.cache.kv_cache.store_kv`).
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from collections.abc import Sequence
from functools import partial

import numpy as np
import torch

from paged_edu.cache.kv_cache import PagedKVCache
from paged_edu.core.validation import flag
from paged_edu.engine.batch import BatchStaging, SamplingBatch, pack_chunks, to_forward_batch, token_slice
from paged_edu.engine.cuda_graphs import DecodeCudaGraphs, MixedCudaGraphs
from paged_edu.engine.decode_tables import DecodeTables
from paged_edu.engine.sampling import sample_on_device
from paged_edu.kernels import kernel_support
from paged_edu.models.llama import ForwardBatch, Kernels, PagedLlama

__all__ = ["ModelRunner", "StepBatch"]


class StepBatch:
    """What :meth:`ModelRunner.prepare` hands to ``forward`` and ``sample``: the model's inputs, the
    rows to sample, and (after ``forward``) where the results are."""

    __slots__ = ("forward", "sampling", "num_rows", "graph_size", "mixed_size", "hidden", "greedy", "host_input_ids")

    def __init__(
        self,
        forward: ForwardBatch | None,
        sampling: SamplingBatch,
        num_rows: int,
        graph_size: int | None,
        mixed_size: int | None = None,
    ):
        self.forward = forward  # None when a captured graph runs it (its inputs are staged in the graph's buffers)
        self.sampling = sampling
        self.num_rows = num_rows  # real rows; rows past it pad a captured graph's batch size
        self.graph_size = graph_size  # the captured decode batch size that runs it, or None
        self.mixed_size = mixed_size  # the token bucket whose mixed-step graph runs it, or None
        self.hidden: torch.Tensor | None = None  # (rows, hidden), set by forward
        self.greedy: torch.Tensor | None = None  # (rows,) argmax tokens, when the graph computed them
        self.host_input_ids = None  # (num_rows,) int64 numpy: the ids as staged, placeholders (< 0) included


# ----------------------------------------------------------------------------------------------
# The runner
# ----------------------------------------------------------------------------------------------


class ModelRunner:
    """One model over one paged KV cache: ``apply_block_ops``, ``prepare``, ``forward``, ``sample``,
    in that order each step. Each piece exists for speed, and says why:

    * :meth:`apply_block_ops` -- a run of same-kind block copies is one ``index_copy_`` per layer
      and tensor, not one per block (a preemption can swap hundreds of blocks at once);
    * :meth:`prepare` -- the batch built by numpy array expressions, not a Python loop per token,
      into a reused pinned buffer that reaches the device in one copy (:mod:`~paged_edu.engine.batch`;
      at 256 running sequences this took the host's preparation from 0.84 to about 0.2 ms a step);
    * ``cuda_graphs=True`` -- :class:`~paged_edu.engine.cuda_graphs.DecodeCudaGraphs` for batches of
      up to ``max_num_seqs`` decodes with block tables up to ``max_model_len`` tokens wide: a decode
      step of small kernels is bound by their launches, which a replay removes;
      ``mixed_graphs=True`` -- :class:`~paged_edu.engine.cuda_graphs.MixedCudaGraphs` for the
      other steps of up to ``max_num_batched_tokens`` tokens (on the H200 an eager step with prompt
      chunks spent ~17 ms launching ~600 kernels from Python). Capture is an optimisation: if it
      fails the runner warns, records why in ``graph_error`` and runs those steps eagerly;
    * :meth:`sample` -- the LM head only for the rows that sample (one per sequence), not for every
      token of a prompt chunk (a 49,152-wide matmul per row); the tokens drawn on the device (the
      uniforms come from the host with the batch) and copied back once, into pinned memory.

    Overlapping the host's work for step N+1 with the GPU's step N (vLLM's async scheduling,
    SGLang's overlap scheduler) is :mod:`~paged_edu.engine.overlap`'s: it uses :meth:`draw` (the
    tokens left on the device) and :meth:`input_ids` (where the next step's ids are filled in from
    them); :meth:`sample` is the synchronous path, whose copy back is the step's only wait.
    """

    def __init__(
        self,
        model: PagedLlama,
        kv_cache: PagedKVCache,
        *,
        attn_impl: str | None = None,
        prefill_impl: str | None = None,
        fused_impl: str = "auto",
        gemm_impl: str = "auto",
        fuse_decode_store: bool = True,
        swiglu_gemm: bool = True,
        pdl: bool = True,
        cuda_graphs: bool = False,
        mixed_graphs: bool = False,
        max_num_seqs: int = 256,
        max_model_len: int = 2048,
        max_num_batched_tokens: int = 2048,
    ) -> None:
        on_gpu = model.device.type == "cuda"
        # The kernels, checked now rather than at the first forward pass, and passed to the model
        # with every batch (two runners sharing one model each keep their own). Default: "auto" on
        # CUDA (Triton where kernel_support says it runs), PyTorch on a CPU, where the Triton
        # interpreter is exact but far too slow for a whole model.
        decode = _check_impl(
            "attn_impl",
            attn_impl or ("auto" if on_gpu else "torch"),
            "decode",
            ("auto", "triton", "torch", "loop"),
            model.device,
        )
        prefill = _check_impl(
            "prefill_impl",
            prefill_impl or ("auto" if on_gpu else "torch"),
            "prefill",
            ("auto", "triton", "torch"),
            model.device,
        )
        fuse_decode_store = flag("fuse_decode_store", fuse_decode_store)
        swiglu_gemm = flag("swiglu_gemm", swiglu_gemm)
        pdl = flag("pdl", pdl)
        self.kernels = Kernels(decode, prefill, fused_impl, gemm_impl, fuse_decode_store, swiglu_gemm, pdl).resolve(
            model.device
        )
        cuda_graphs = flag("cuda_graphs", cuda_graphs)
        mixed_graphs = flag("mixed_graphs", mixed_graphs)
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.device = model.device
        self.kv_pairs = list(zip(kv_cache.k_caches, kv_cache.v_caches))  # (k_cache, v_cache) per layer
        self.staging = BatchStaging(self.device)  # the step's inputs: one pinned buffer, one copy
        self._tokens_host = torch.empty(1024, dtype=torch.long, pin_memory=on_gpu)  # the step's tokens come back here
        self.graphs: DecodeCudaGraphs | None = None
        self.mixed_graphs: MixedCudaGraphs | None = None
        self.graph_error: str | None = None
        self.num_graph_steps = 0  # forward passes served by a decode CUDA-graph replay
        self.num_mixed_graph_steps = 0  # forward passes served by a mixed-step CUDA-graph replay
        self.timeline = None  # the engine's Timeline when it records one: begin() / end() around the device work
        self.device_wait_s = 0.0  # how long the last sample() waited for the device
        self.num_blocks = {"swap_out": 0, "copy": 0, "swap_in": 0}  # blocks copied by apply_block_ops, ever
        self._unapplied: deque[list[tuple[str, int, int]]] = deque()  # per step: ops a raising copy left
        for name, wanted in (("cuda_graphs", cuda_graphs), ("mixed_graphs", mixed_graphs)):
            if wanted and self.device.type != "cuda":
                raise ValueError(f"{name}=True needs the model on a CUDA device")
        try:
            if cuda_graphs:
                self.graphs = DecodeCudaGraphs(
                    model, self.kv_pairs, max_num_seqs, -(-max_model_len // self.block_size), self.kernels
                )
            if mixed_graphs:
                self.mixed_graphs = MixedCudaGraphs(
                    model,
                    self.kv_pairs,
                    max_num_batched_tokens,
                    max_num_seqs,
                    -(-max_model_len // self.block_size),
                    self.kernels,
                )
        except Exception as exc:  # fall back to eager steps, and say why
            self.graph_error = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"CUDA-graph capture failed, those steps run eagerly: {self.graph_error}")

    def apply_block_ops(self, block_ops: Sequence[tuple[str, int, int]]) -> dict[str, int]:
        """Apply the scheduler's ``block_ops`` to the cache in order -- ``("swap_out", gpu, cpu)``,
        ``("copy", src, dst)``, ``("swap_in", cpu, gpu)`` -- each run of one kind as one batched
        copy per layer. Returns the number of blocks of each kind.

        The scheduler has already moved the blocks in its books, so a copy that raises (a CUDA OOM,
        an injected fault) must still happen: the ops from the failed run on are kept, and the next
        call applies them first, before its own. Re-applying a run is safe: a run's sources are not
        written before the step's forward pass, which never runs while ops are pending.
        """
        counts = {"swap_out": 0, "copy": 0, "swap_in": 0}  # this call's
        bad = next((op[0] for op in block_ops if op[0] not in counts), None)
        if bad is not None:
            raise ValueError(f"unknown block op {bad!r}")
        self._unapplied.append(list(block_ops))
        while self._unapplied:  # one step's ops at a time: copy_blocks reads all sources first
            ops = self._unapplied[0]
            while ops:
                kind = ops[0][0]
                j = next((j for j, op in enumerate(ops) if op[0] != kind), len(ops))
                self._apply_run(kind, [(a, b) for _, a, b in ops[:j]])  # may raise: ops stay queued
                del ops[:j]
                counts[kind] += j
                self.num_blocks[kind] += j
            self._unapplied.popleft()
        return counts

    def _apply_run(self, kind: str, pairs: list[tuple[int, int]]) -> None:
        if kind == "swap_out":
            self.kv_cache.swap_out(pairs)
        elif kind == "copy":
            self.kv_cache.copy_blocks(pairs)
        else:
            self.kv_cache.swap_in(pairs)

    @property
    def num_unapplied_block_ops(self) -> int:
        """Block copies the scheduler asked for that have not reached the cache (after one raised)."""
        return sum(map(len, self._unapplied))

    def prepare(
        self,
        scheduled,
        block_tables,
        sample_chunks: Sequence[int],
        sampling: tuple[Sequence[float], Sequence[float], Sequence[float]] | None = None,
        decode_tables: DecodeTables | None = None,
    ) -> StepBatch:
        """The step's inputs on the device, from the scheduler's ``ScheduledSeq`` s.

        ``block_tables(seq_ids)`` gives the sequences' blocks (the allocator's:
        :func:`~paged_edu.sched.memory_manager.block_tables_reader`); ``sample_chunks``
        lists, per token to sample, the index of its chunk; ``sampling`` is ``(temperatures,
        top_ps, uniforms)`` per sampled row, or None when every row is greedy. ``decode_tables``
        keeps a pure-decode step's table matrix across steps (None: packed from the lists).
        """
        self.device_wait_s = 0.0
        token_ids: list[int] = []
        for item in scheduled:  # the only loop over sequences: their new tokens
            seq, s, n = item.seq, item.start, item.num_new_tokens
            p = len(seq.prompt_token_ids)
            if n == 1:
                token_ids.append(seq.output_token_ids[s - p] if s >= p else seq.prompt_token_ids[s])
            else:
                token_ids += token_slice(seq, s, s + n)
        seq_ids = [it.seq.seq_id for it in scheduled]
        fields = pack_chunks(
            token_ids,
            [it.start for it in scheduled],
            [it.num_new_tokens for it in scheduled],
            block_tables(seq_ids),
            self.block_size,
            None if decode_tables is None else partial(decode_tables.matrix, seq_ids),
        )
        batch = self._stage(fields, sample_chunks, sampling)
        batch.host_input_ids = fields["input_ids"]
        return batch

    def _stage(self, fields: dict, sample_chunks, sampling) -> StepBatch:
        """``pack_chunks``' fields on the device: into a captured graph's buffers, or the staging buffer."""
        rows = len(fields["input_ids"])
        sample_rows = fields["logits_rows"][np.asarray(sample_chunks, dtype=np.int64)]  # (N,) rows of the hidden states
        if self.graphs is not None and fields["num_decodes"] == rows:
            bs = self.graphs.size_for(rows, fields["decode_block_tables"].shape[1])
            if bs is not None:  # straight into the captured graph's inputs
                return StepBatch(None, self.graphs.stage(fields, bs, sample_rows, sampling), rows, bs)
        Tb = self.mixed_graphs.size_for(fields) if self.mixed_graphs is not None else None
        if Tb is not None:  # into the mixed-step graph's inputs; only the rows to sample travel below
            self.mixed_graphs.stage(fields, Tb)
        arrays = (
            {}
            if Tb is not None
            else {
                k: fields[k]
                for k in (
                    "input_ids",
                    "positions",
                    "slot_mapping",
                    "logits_rows",
                    "decode_block_tables",
                    "decode_seq_lens",
                    "prefill_block_tables",
                    "prefill_seq_lens",
                    "prefill_cu_seqlens_q",
                )
            }
        )
        arrays["sample_rows"] = sample_rows
        if sampling is not None:
            for name, values in zip(("temperatures", "top_ps", "uniforms"), sampling):
                arrays[name] = np.asarray(values, dtype=np.float32)
        t = self.staging.upload(arrays)
        sampling_batch = SamplingBatch(t["sample_rows"], t.get("temperatures"), t.get("top_ps"), t.get("uniforms"))
        if Tb is not None:
            return StepBatch(None, sampling_batch, rows, None, Tb)
        return StepBatch(to_forward_batch(fields, t), sampling_batch, rows, None)

    def forward(self, batch: StepBatch) -> None:
        """Launch the forward pass; the new tokens' K/V land in the cache, the hidden states in ``batch``."""
        if self.timeline is not None:
            self.timeline.begin(batch)
        if batch.graph_size is not None:
            self.num_graph_steps += 1
            batch.hidden, batch.greedy = self.graphs.replay(batch.graph_size)  # one graph replay
        elif batch.mixed_size is not None:
            self.num_mixed_graph_steps += 1
            batch.hidden = self.mixed_graphs.replay(batch.mixed_size)  # one graph replay, (Tb, hidden)
        else:
            batch.hidden = self.model(batch.forward, self.kv_pairs, self.kernels)  # (T, hidden)

    def input_ids(self, batch: StepBatch) -> torch.Tensor:
        """The step's token ids on the device, ``(rows,)`` (padded to a captured graph's size): what
        async scheduling fills in for tokens still on the device (:mod:`~paged_edu.engine.overlap`)."""
        if batch.graph_size is not None:
            return self.graphs.staging.views["input_ids"][: batch.graph_size]
        if batch.mixed_size is not None:
            return self.mixed_graphs.input_ids(batch.mixed_size)
        return batch.forward.input_ids

    def draw(self, batch: StepBatch) -> torch.Tensor:
        """One token per sampled row, ``(N,)`` int64, left on the device (no wait)."""
        s = batch.sampling
        if s.temperatures is None and batch.greedy is not None:
            tokens = batch.greedy[: s.rows.shape[0]] if s.in_order else batch.greedy[s.rows]  # (N,) from the graph
        else:
            logits = self.model.compute_logits(batch.hidden[s.rows], self.kernels)  # (N, vocab) fp32
            greedy = batch.greedy[s.rows] if batch.greedy is not None else logits.argmax(dim=-1)  # (N,)
            tokens = (
                greedy
                if s.temperatures is None
                else sample_on_device(logits, s.temperatures, s.top_ps, s.uniforms, greedy_tokens=greedy)
            )
        self.end_launch()
        return tokens

    def end_launch(self) -> None:
        """The step's device work is all queued (after its tokens are drawn, or its forward pass when
        it draws none): the timeline's end mark."""
        if self.timeline is not None:
            self.timeline.end()

    def sample(self, batch: StepBatch) -> list[int]:
        """One token per sampled row, drawn on the device, copied back in one go (the step's only wait)."""
        N = batch.sampling.rows.shape[0]
        if N == 0:
            return []
        tokens = self.draw(batch)
        if N > self._tokens_host.numel():
            self._tokens_host = torch.empty(2 * N, dtype=torch.long, pin_memory=self.device.type == "cuda")
        host = self._tokens_host[:N]
        host.copy_(tokens, non_blocking=True)  # the one device-to-host copy
        t0 = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self.device_wait_s = time.perf_counter() - t0
        return host.numpy().tolist()


def _check_impl(name: str, impl, kernel: str, allowed: tuple[str, ...], device: torch.device) -> str:
    if not isinstance(impl, str) or impl not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {impl!r}")
    if impl == "triton" and not getattr(kernel_support(device), kernel):
        raise ValueError(
            f"{name}='triton', but the Triton {kernel} kernel cannot run on {device} here "
            "(see paged_edu.kernels.kernel_support); use 'auto' or 'torch'"
        )
    return impl

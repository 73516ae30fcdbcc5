"""The model runner: from the scheduler's chunks to hidden states, as fast as the device allows.

The engine's :meth:`~paged_edu.engine.engine.Engine.step` says *what* runs in a step (which tokens
of which sequences); the runner makes it run:

* :func:`prepare_batch` packs the step's :class:`BatchChunk` s into the model's flat
  :class:`~paged_edu.models.llama.ForwardBatch` -- token ids, positions, the slot of every new
  token, block tables and lengths -- with one host-to-device copy per field;
* :class:`DecodeCudaGraphs` replays captured CUDA graphs for pure-decode steps, which removes the
  launch cost of a thousand small kernels per step (why: see the class);
* :class:`ModelRunner` ties them to one model and one :class:`~paged_edu.cache.kv_cache.PagedKVCache`.

The runner imports the model, never the reverse: the model only knows its input record and the
cache's one store call (:func:`paged_edu.cache.kv_cache.store_kv`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from paged_edu.cache.kv_cache import PagedKVCache
from paged_edu.kernels import kernel_support
from paged_edu.models.llama import ForwardBatch, PagedLlama

__all__ = ["BatchChunk", "DecodeCudaGraphs", "ModelRunner", "prepare_batch", "token_slice"]


# ----------------------------------------------------------------------------------------------
# Batch preparation
# ----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class BatchChunk:
    """One sequence's share of a step: compute ``token_ids`` at positions ``start, start+1, ...``.

    ``start`` tokens of the sequence already have K/V in the pool; ``block_table`` covers at least
    ``start + len(token_ids)`` tokens (the allocator placed the new ones).
    """

    token_ids: list[int]
    start: int
    block_table: list[int]



def token_slice(seq, start: int, end: int) -> list[int]:
    """``seq.token_ids[start:end]`` without building the whole prompt + output list."""
    p = seq.num_prompt_tokens
    if start >= p:
        return seq.output_token_ids[start - p:end - p]
    if end <= p:
        return seq.prompt_token_ids[start:end]
    return seq.prompt_token_ids[start:] + seq.output_token_ids[:end - p]


def prepare_batch(chunks: Sequence[BatchChunk], block_size: int, device: torch.device | str = "cpu") -> ForwardBatch:
    """Pack the chunks of one step into a :class:`ForwardBatch` (one host-to-device copy per field).

    One-token chunks -- decodes, and a prompt whose every other token hit the prefix cache -- are
    moved to the front so that a single decode-kernel call serves them all.
    """
    if not chunks:
        raise ValueError("a batch needs at least one chunk")
    order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].token_ids) != 1)  # stable: decodes first
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    row_of_last = [0] * len(chunks)
    dec_tables, dec_lens, pre_tables, pre_lens, cu = [], [], [], [], [0]
    B = block_size
    for i in order:
        c = chunks[i]
        n = len(c.token_ids)
        if n == 0:
            raise ValueError(f"chunk {i} has no tokens")
        end = c.start + n
        if len(c.block_table) * B < end:
            raise ValueError(f"chunk {i}: block table of {len(c.block_table)} blocks cannot hold {end} tokens")
        table = c.block_table
        input_ids.extend(c.token_ids)
        positions.extend(range(c.start, end))
        slots.extend(table[t // B] * B + t % B for t in range(c.start, end))
        row_of_last[i] = len(input_ids) - 1
        if n == 1:
            dec_tables.append(table)
            dec_lens.append(end)
        else:
            pre_tables.append(table)
            pre_lens.append(end)
            cu.append(cu[-1] + n)

    def tables_tensor(tables):
        if not tables:
            return None
        width = max(len(t) for t in tables)
        return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)

    def int32(values):
        return torch.tensor(values, dtype=torch.int32, device=device) if values else None

    return ForwardBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        num_decodes=len(dec_lens),
        decode_block_tables=tables_tensor(dec_tables),
        decode_seq_lens=int32(dec_lens),
        prefill_block_tables=tables_tensor(pre_tables),
        prefill_seq_lens=int32(pre_lens),
        prefill_cu_seqlens_q=int32(cu) if pre_lens else None,
        logits_rows=torch.tensor(row_of_last, dtype=torch.long, device=device),
    )



# ----------------------------------------------------------------------------------------------
# CUDA graphs for decode steps
# ----------------------------------------------------------------------------------------------


class DecodeCudaGraphs:
    """Replay a captured forward pass for pure-decode steps (one token per sequence).

    Eagerly, a decode step of a 30-layer model launches about a thousand small kernels; at batch
    256 the GPU then waits on Python most of the time. A CUDA graph records the launches once per
    batch size and replays them with one call. Everything a replay reads sits in static buffers
    that each step overwrites: token ids, positions, slots, block tables and lengths. A step of
    ``D`` sequences runs the graph of the smallest captured size ``>= D``; the padding rows store
    to slot -1 (skipped by the store kernel) and attend to one token of block 0 (harmless; their
    output is dropped). The kernels must not sync with the host or size launches from data --
    the decode kernel picks its split count from the table *width*, which is fixed here.
    """

    def __init__(self, model: PagedLlama, kv_caches, max_batch_size: int, max_blocks_per_seq: int) -> None:
        device = model.device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, got {device}")
        self.model = model
        self.kv_caches = kv_caches
        self.max_blocks_per_seq = max_blocks_per_seq
        sizes = [1, 2, 4, 8] + list(range(16, 129, 16)) + list(range(160, 1025, 32))
        self.sizes = [b for b in sizes if b < max_batch_size] + [max_batch_size]
        n = max_batch_size
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)  # (n,)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)  # (n,)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)  # (n,)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)  # (n, W)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)  # (n,)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        for bs in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory pool
            batch = self._batch(bs)
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up outside the graph (lazy inits, autotuning caches)
                    model(batch, kv_caches)
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = model(batch, kv_caches)  # (bs, hidden)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(device)

    def _batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:bs], positions=self.positions[:bs], slot_mapping=self.slot_mapping[:bs],
            num_decodes=bs, decode_block_tables=self.block_tables[:bs], decode_seq_lens=self.seq_lens[:bs],
            prefill_block_tables=None, prefill_seq_lens=None, prefill_cu_seqlens_q=None,
            logits_rows=torch.arange(bs, device=self.input_ids.device),
        )

    def can_run(self, batch: ForwardBatch) -> bool:
        T = batch.input_ids.shape[0]
        return (batch.num_decodes == T and T <= self.sizes[-1]
                and batch.decode_block_tables.shape[1] <= self.max_blocks_per_seq)

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states ``(D, hidden)`` of a pure-decode batch (check :meth:`can_run` first)."""
        D = batch.input_ids.shape[0]
        bs = next(b for b in self.sizes if b >= D)
        width = batch.decode_block_tables.shape[1]
        self.input_ids[:D].copy_(batch.input_ids)
        self.positions[:D].copy_(batch.positions)
        self.slot_mapping[:D].copy_(batch.slot_mapping)
        self.block_tables[:D, :width].copy_(batch.decode_block_tables)  # columns past width: stale, unread
        self.seq_lens[:D].copy_(batch.decode_seq_lens)
        if bs > D:
            self.slot_mapping[D:bs].fill_(-1)
            self.seq_lens[D:bs].fill_(1)
            self.block_tables[D:bs, 0].fill_(0)
        self.graphs[bs].replay()
        return self.outputs[bs][:D]


# ----------------------------------------------------------------------------------------------
# The runner
# ----------------------------------------------------------------------------------------------


class ModelRunner:
    """One model over one paged KV cache: ``apply_block_ops``, ``prepare(chunks)``, ``forward(batch)``,
    ``logits``, in that order each step. Each piece exists for speed, and says why:

    * :meth:`apply_block_ops` -- a run of same-kind block copies is one ``index_copy_`` per layer
      and tensor, not one per block (a preemption can swap hundreds of blocks at once);
    * :meth:`prepare` -- one host-to-device copy per batch field, not one per token;
    * ``cuda_graphs=True`` -- :class:`DecodeCudaGraphs` for batches of up to ``max_num_seqs``
      decodes with block tables up to ``max_model_len`` tokens wide: a decode step of small
      kernels is bound by their launches, which a replay removes. Capture is an optimisation: if it
      fails the runner warns, records why in ``graph_error`` and runs every step eagerly;
    * :meth:`logits` -- the LM head only for the rows that sample (one per sequence), not for
      every token of a prompt chunk (a 49,152-wide matmul per row).
    """

    def __init__(self, model: PagedLlama, kv_cache: PagedKVCache, *, attn_impl: str | None = None,
                 prefill_impl: str | None = None, cuda_graphs: bool = False, max_num_seqs: int = 256,
                 max_model_len: int = 2048) -> None:
        on_gpu = model.device.type == "cuda"
        # The kernels, checked now rather than at the first forward pass. Default: "auto" on CUDA
        # (Triton where kernel_support says it runs), PyTorch on a CPU, where the Triton
        # interpreter is exact but far too slow for a whole model.
        model.attn_impl = _check_impl("attn_impl", attn_impl or ("auto" if on_gpu else "torch"), "decode",
                                      ("auto", "triton", "torch", "loop"), model.device)
        model.prefill_impl = _check_impl("prefill_impl", prefill_impl or ("auto" if on_gpu else "torch"), "prefill",
                                         ("auto", "triton", "torch"), model.device)
        if not isinstance(cuda_graphs, bool):
            raise TypeError(f"cuda_graphs must be True, False or None, got {cuda_graphs!r}")
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.device = model.device
        self.kv_pairs = list(zip(kv_cache.k_caches, kv_cache.v_caches))  # (k_cache, v_cache) per layer
        self.graphs: DecodeCudaGraphs | None = None
        self.graph_error: str | None = None
        self.num_graph_steps = 0  # forward passes served by a CUDA-graph replay
        self.num_blocks = {"swap_out": 0, "copy": 0, "swap_in": 0}  # blocks copied by apply_block_ops, ever
        if cuda_graphs:
            if self.device.type != "cuda":
                raise ValueError("cuda_graphs=True needs the model on a CUDA device")
            try:
                self.graphs = DecodeCudaGraphs(model, self.kv_pairs, max_num_seqs, -(-max_model_len // self.block_size))
            except Exception as exc:  # fall back to eager steps, and say why
                self.graph_error = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"CUDA-graph capture failed, decode steps run eagerly: {self.graph_error}")

    def apply_block_ops(self, block_ops: Sequence[tuple[str, int, int]]) -> dict[str, int]:
        """Apply the scheduler's ``block_ops`` to the cache in order -- ``("swap_out", gpu, cpu)``,
        ``("copy", src, dst)``, ``("swap_in", cpu, gpu)`` -- each run of one kind as one batched
        copy per layer. Returns the number of blocks of each kind."""
        apply = {"swap_out": self.kv_cache.swap_out, "copy": self.kv_cache.copy_blocks, "swap_in": self.kv_cache.swap_in}
        counts = dict.fromkeys(apply, 0)  # this call's
        i = 0
        while i < len(block_ops):
            kind = block_ops[i][0]
            if kind not in apply:
                raise ValueError(f"unknown block op {kind!r}")
            j = i
            while j < len(block_ops) and block_ops[j][0] == kind:
                j += 1
            apply[kind]([(a, b) for _, a, b in block_ops[i:j]])
            counts[kind] += j - i
            self.num_blocks[kind] += j - i
            i = j
        return counts

    def prepare(self, chunks: Sequence[BatchChunk]) -> ForwardBatch:
        return prepare_batch(chunks, self.block_size, self.device)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states ``(T, hidden)`` of the batch's new tokens; their K/V are now in the cache."""
        if self.graphs is not None and self.graphs.can_run(batch):
            self.num_graph_steps += 1
            return self.graphs.run(batch)  # one graph replay
        return self.model(batch, self.kv_pairs)

    def logits(self, hidden: torch.Tensor, batch: ForwardBatch, chunk_indices: Sequence[int]) -> torch.Tensor:
        """fp32 logits ``(len(chunk_indices), vocab)`` at the last token of each listed chunk."""
        rows = batch.logits_rows[torch.tensor(list(chunk_indices), device=self.device)]
        return self.model.compute_logits(hidden[rows])


def _check_impl(name: str, impl, kernel: str, allowed: tuple[str, ...], device: torch.device) -> str:
    if not isinstance(impl, str) or impl not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {impl!r}")
    if impl == "triton" and not getattr(kernel_support(device), kernel):
        raise ValueError(f"{name}='triton', but the Triton {kernel} kernel cannot run on {device} here "
                         "(see paged_edu.kernels.kernel_support); use 'auto' or 'torch'")
    return impl

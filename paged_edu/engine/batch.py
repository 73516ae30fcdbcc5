"""Batch preparation: from a step's chunks to the model's flat batch, without a Python loop over tokens.

What you will learn
-------------------
A step computes ``T`` new tokens of ``C`` chunks (one per scheduled sequence). Chunk ``i`` computes
``n_i`` tokens at positions ``c_i, c_i + 1, ..., c_i + n_i - 1`` over its block table ``BT_i``. Every
field of the batch is an array expression over three small inputs -- ``n`` (C,), ``c`` (C,) and the
block tables padded into one ``(C, W)`` matrix -- so it is built with numpy, not per token:

* rows are grouped decodes first (``n_i = 1``, :attr:`~paged_edu.sched.scheduler_output.ScheduledSeq.is_decode`:
  one decode-kernel call serves them all), stable -- the one place the step's chunks are reordered;
* ``first_row_i = cumsum(n)_i - n_i``; the position of row ``r`` of chunk ``i`` is
  ``r - first_row_i + c_i``;
* its slot is ``BT_i[pos // B] * B + pos % B`` -- a gather from the table matrix;
* the row of each chunk's last token (``logits_rows``, in input order) is ``cumsum(n)_i - 1``.

The result is a :class:`StepBatch`: the fields of the model's
:class:`~paged_edu.models.llama.ForwardBatch` as numpy arrays on the host -- what one step hands
from the scheduler's output to the model. The worked example beside each array line is one step of
three chunks, block size ``B = 4``: ``A`` decodes at position 5, ``B`` computes a prompt chunk of 3
tokens from position 0, ``C`` decodes at position 9 (``n = [1, 3, 1]``, ``c = [5, 0, 9]``).

All fields then travel in **one** host-to-device copy: :class:`BatchStaging` packs them into one
preallocated byte buffer (page-locked on CUDA, so the copy is a DMA that does not block the host)
and hands out typed views of its device twin. vLLM v1's ``InputBatch``
(``vllm/v1/worker/gpu_input_batch.py``) keeps its batch the same way: CPU torch tensors, pinned where
they travel to the GPU, written through their numpy views; its ``GPUModelRunner._prepare_inputs``
(``vllm/v1/worker/gpu_model_runner.py``) builds the index arrays with numpy and a worked example per
line, as here. The alternative, ``torch.tensor(list, device="cuda")`` per field (ten of them), costs
a conversion, a launch and a pageable copy that blocks the host, each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from paged_edu.models.llama import ForwardBatch

__all__ = [
    "BatchChunk",
    "BatchStaging",
    "StaticStaging",
    "StepBatch",
    "pack_chunks",
    "pack_decodes",
    "pack_one_chunk",
    "padded_tables",
    "prepare_batch",
    "token_slice",
]


@dataclass(slots=True)
class BatchChunk:
    """One sequence's share of a step: compute ``token_ids`` at positions ``start, start+1, ...``.

    ``start`` tokens of the sequence already have K/V in the pool; ``block_table`` covers at least
    ``start + len(token_ids)`` tokens (the allocator placed the new ones).
    """

    token_ids: list[int]
    start: int
    block_table: list[int]


@dataclass(slots=True)
class StepBatch:
    """One step's flat batch on the host: the fields of a
    :class:`~paged_edu.models.llama.ForwardBatch` as numpy arrays, rows in *row order* (the ``D``
    one-token chunks first, then the prompt chunks). :func:`pack_chunks` builds it; the runner
    stages it on the device (:class:`BatchStaging`, or a CUDA graph's static buffers)."""

    input_ids: np.ndarray  # (T,) int64
    positions: np.ndarray  # (T,) int64
    slot_mapping: np.ndarray  # (T,) int64: where each new token's K/V goes in the pool
    logits_rows: np.ndarray  # (C,) int64: the row of each chunk's last token, in *input* order
    num_decodes: int  # D: rows 0 .. D-1 are one-token chunks
    decode_block_tables: np.ndarray | None  # (D, Wd) int32, zero-padded
    decode_seq_lens: np.ndarray | None  # (D,) int32: start + 1
    prefill_block_tables: np.ndarray | None  # (P, Wp) int32, zero-padded
    prefill_seq_lens: np.ndarray | None  # (P,) int32: cached prefix + chunk
    prefill_cu_seqlens_q: np.ndarray | None  # (P + 1,) int32: chunk i owns rows cu[i]:cu[i+1] (cu[0] = D)

    @property
    def is_pure_decode(self) -> bool:
        return self.num_decodes == self.input_ids.shape[0]

    def arrays(self) -> dict[str, np.ndarray | None]:
        """Every array field by name (what :meth:`BatchStaging.upload` copies)."""
        return {name: getattr(self, name) for name in _ARRAYS}

    def on_device(self, tensors: dict[str, torch.Tensor | None]) -> ForwardBatch:
        """The :class:`ForwardBatch` over ``tensors``, this batch's arrays staged on the device by name."""
        return ForwardBatch(
            input_ids=tensors["input_ids"],
            positions=tensors["positions"],
            slot_mapping=tensors["slot_mapping"],
            num_decodes=self.num_decodes,
            decode_block_tables=tensors["decode_block_tables"],
            decode_seq_lens=tensors["decode_seq_lens"],
            prefill_block_tables=tensors["prefill_block_tables"],
            prefill_seq_lens=tensors["prefill_seq_lens"],
            prefill_cu_seqlens_q=tensors["prefill_cu_seqlens_q"],
            logits_rows=tensors["logits_rows"],
        )


_ARRAYS = (
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


def token_slice(seq, start: int, end: int) -> list[int]:
    """``seq.token_ids[start:end]`` without building the whole prompt + output list."""
    p = seq.num_prompt_tokens
    if start >= p:
        return seq.output_token_ids[start - p : end - p]
    if end <= p:
        return seq.prompt_token_ids[start:end]
    return seq.prompt_token_ids[start:] + seq.output_token_ids[: end - p]


def pack_chunks(
    token_ids: Sequence[int],
    starts: Sequence[int],
    counts: Sequence[int],
    tables: Sequence[Sequence[int]],
    block_size: int,
    table_matrix: Callable[[Sequence[Sequence[int]], np.ndarray], np.ndarray] | None = None,
) -> StepBatch:
    """The step's :class:`StepBatch` (see the module docstring, whose example the comments follow).

    ``token_ids`` holds every chunk's tokens back to back in input order; chunk ``i`` has
    ``counts[i]`` of them starting at position ``starts[i]``, over ``tables[i]``. In a pure-decode
    step, ``table_matrix(tables, lens)`` supplies the zero-padded ``(C, max(lens))`` table matrix:
    :func:`padded_tables` by default, or the runner's
    :class:`~paged_edu.engine.input_batch.InputBatch`, which keeps the rows across steps.
    """
    C = len(counts)
    if C == 0:
        raise ValueError("a batch needs at least one chunk")
    n = np.asarray(counts, dtype=np.int64)  # (C,) E.g. [1, 3, 1]
    c = np.asarray(starts, dtype=np.int64)  # (C,) E.g. [5, 0, 9]
    if (n < 1).any():
        raise ValueError(f"chunk {int(np.argmax(n < 1))} has no tokens")
    B = block_size
    lens = np.fromiter(map(len, tables), dtype=np.int64, count=C)  # (C,) blocks per table, E.g. [2, 1, 3]
    end = c + n  # (C,) E.g. [6, 3, 10]
    short = lens * B < end
    if short.any():
        i = int(np.argmax(short))
        raise ValueError(f"chunk {i}: block table of {int(lens[i])} blocks cannot hold {int(end[i])} tokens")
    D = int((n == 1).sum())  # E.g. 2
    if D == C:  # a pure-decode step (most steps): one row per chunk, in input order
        return pack_decodes(token_ids, c, (table_matrix or padded_tables)(tables, lens), B)
    # E.g. n != 1 = [F, T, F] -> order [0, 2, 1]: A, C, then B
    order = np.argsort(n != 1, kind="stable")  # (C,) decodes first, otherwise input order
    # E.g. n_o [1, 1, 3], c_o [5, 9, 0], end_o [6, 10, 3], lens_o [2, 3, 1]
    n_o, c_o, end_o, lens_o = n[order], c[order], end[order], lens[order]
    T = int(n.sum())  # E.g. 5
    table = padded_tables([tables[i] for i in order.tolist()], lens_o)  # (C, W): in row order
    last_row = np.cumsum(n_o) - 1  # (C,) in row order, E.g. [1, 2, 5] - 1 -> [0, 1, 4]
    first_row = last_row + 1 - n_o  # (C,) E.g. [0, 1, 2]
    chunk_of_row = np.repeat(np.arange(C), n_o)  # (T,) E.g. [0, 1, 2, 2, 2]
    # E.g. [0, 1, 2, 3, 4] - repeat([0-5, 1-9, 2-0], [1, 1, 3]) = [0, 1, 2, 3, 4] - [-5, -8, 2, 2, 2] -> [5, 9, 0, 1, 2]
    positions = np.arange(T) - np.repeat(first_row - c_o, n_o)  # (T,)
    # E.g. blocks table[[0, 1, 2, 2, 2], [1, 2, 0, 0, 0]] * 4 + [1, 1, 0, 1, 2]
    slots = table[chunk_of_row, positions // B].astype(np.int64) * B + positions % B  # (T,)
    ids_in = np.asarray(token_ids, dtype=np.int64)  # (T,) input order: A's, B's three, C's
    if ids_in.shape[0] != T:
        raise ValueError(f"{ids_in.shape[0]} token ids for chunks of {T} tokens")
    in_first = np.cumsum(n) - n  # (C,) where each chunk's tokens start in token_ids, E.g. [0, 1, 4]
    # E.g. in_first[order] - first_row = [0, 4, 1] - [0, 1, 2] = [0, 3, -1]; [0, 1, 2, 3, 4] + [0, 3, -1, -1, -1]
    # -> token_ids[[0, 4, 1, 2, 3]]: A's token, C's, then B's three
    input_ids = ids_in[np.arange(T) + np.repeat(in_first[order] - first_row, n_o)]  # (T,) row order
    logits_rows = np.empty(C, dtype=np.int64)
    logits_rows[order] = last_row  # (C,) input order, E.g. [0, 4, 1]: A's row 0, B's row 4, C's row 1
    Wd = int(lens_o[:D].max()) if D else 0  # E.g. 3
    Wp = int(lens_o[D:].max()) if D < C else 0  # E.g. 1
    return StepBatch(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slots,
        logits_rows=logits_rows,
        num_decodes=D,
        decode_block_tables=table[:D, :Wd] if D else None,
        decode_seq_lens=end_o[:D].astype(np.int32) if D else None,  # E.g. [6, 10]
        prefill_block_tables=table[D:, :Wp] if D < C else None,
        prefill_seq_lens=end_o[D:].astype(np.int32) if D < C else None,  # E.g. [3]
        # E.g. [2] + (2 + cumsum([3])) -> [2, 5]: B owns rows 2:5
        prefill_cu_seqlens_q=np.concatenate([[D], D + np.cumsum(n_o[D:])]).astype(np.int32) if D < C else None,
    )


def pack_one_chunk(
    token_ids: Sequence[int], start: int, count: int, table: Sequence[int], block_size: int
) -> StepBatch:
    """:func:`pack_chunks` of one prompt chunk -- ``count > 1`` tokens from position ``start``, over
    ``table`` -- the step of a request that finds the engine idle, packed without the general path's
    reordering, cumsums and padding (the same arrays, as ``tests/engine/test_batch.py`` checks against
    :func:`pack_chunks`). What it buys: ``bench_host.py --workload lone`` (the server's settings, this
    project's 2-core CPU), the prompt step's ``pack_chunks`` ~70 -> ~15 us (perf_counter around it);
    the A/B of the whole prompt call: ``benchmarks/records/cpu/host_ab_lone_prompt.json``. With the other two
    cuts of that change (:meth:`~paged_edu.engine.cuda_graphs.MixedCudaGraphs.stage`), on an H100 (one lease,
    ``benchmarks/bench_ttft.py``): a 96-token prompt step's host time 0.694 -> 0.479 ms, its TTFT inside the
    engine 1.677 -> 1.469 ms (``benchmarks/records/h100/host_ttft_ab_63658e5_log.txt``)."""
    B, end = block_size, start + count
    if len(table) * B < end:
        raise ValueError(f"chunk 0: block table of {len(table)} blocks cannot hold {end} tokens")
    if len(token_ids) != count:
        raise ValueError(f"{len(token_ids)} token ids for chunks of {count} tokens")
    positions = np.arange(start, end, dtype=np.int64)  # (T,) E.g. start 0, count 3: [0, 1, 2]
    blocks = np.asarray(table, dtype=np.int32)  # (W,)
    return StepBatch(
        input_ids=np.asarray(token_ids, dtype=np.int64),
        positions=positions,
        slot_mapping=blocks[positions // B].astype(np.int64) * B + positions % B,  # (T,)
        logits_rows=np.array([count - 1], dtype=np.int64),  # the chunk's last row
        num_decodes=0,
        decode_block_tables=None,
        decode_seq_lens=None,
        prefill_block_tables=blocks[None, :],  # (1, W)
        prefill_seq_lens=np.array([end], dtype=np.int32),
        prefill_cu_seqlens_q=np.array([0, count], dtype=np.int32),
    )


def padded_tables(tables: Sequence[Sequence[int]], lens: np.ndarray) -> np.ndarray:
    """``tables`` (of lengths ``lens``) as one zero-padded ``(C, max(lens))`` int32 matrix."""
    C, W = len(lens), int(lens.max())
    table = np.zeros((C, W), dtype=np.int32)  # (C, W)
    # E.g. tables [[7, 2], [5]], lens [2, 1]: mask [[T, T], [T, F]] takes 7, 2, 5 -> [[7, 2], [5, 0]]
    table[np.arange(W)[None, :] < lens[:, None]] = np.fromiter(
        chain.from_iterable(tables), dtype=np.int32, count=int(lens.sum())
    )
    return table


def pack_decodes(token_ids, c: np.ndarray, table: np.ndarray, B: int) -> StepBatch:
    """:func:`pack_chunks` when every chunk is one token (``token_ids``, at positions ``c``), over its
    ``(C, W)`` table matrix: ``positions = c``, no reordering."""
    C = len(c)
    # E.g. c [5, 9], B = 4: table[[0, 1], [1, 2]] * 4 + [1, 1]
    slots = table[np.arange(C), c // B].astype(np.int64) * B + c % B  # (C,)
    return StepBatch(
        input_ids=np.asarray(token_ids, dtype=np.int64),
        positions=c,
        slot_mapping=slots,
        logits_rows=np.arange(C, dtype=np.int64),  # (C,) E.g. [0, 1]: row i is chunk i's last (only) token
        num_decodes=C,
        decode_block_tables=table,
        decode_seq_lens=(c + 1).astype(np.int32),  # (C,) E.g. [6, 10]
        prefill_block_tables=None,
        prefill_seq_lens=None,
        prefill_cu_seqlens_q=None,
    )


_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(np.float32): torch.float32}


class BatchStaging:
    """One preallocated byte buffer on the host (pinned on CUDA) and its twin on the device.

    :meth:`upload` writes every array at an :attr:`ALIGN`-byte aligned offset, copies the used
    prefix to the device in one ``copy_``, and returns a typed device view per array. The buffers
    are reused every step (and grown when a step needs more): the previous step's copy is finished
    by then, since the engine waits for its sampled tokens before it prepares the next step.

    Why aligned as ``cudaMalloc`` aligns (256 bytes): Triton specialises a kernel on whether each
    pointer argument is 16-byte aligned, so a view at an odd offset compiles (and caches) another
    variant -- on the H200 a mixed prefill/decode step took 430 ms on average while 8-byte aligned
    views kept compiling new variants.
    """

    ALIGN = 256

    def __init__(self, device: torch.device, num_bytes: int = 1 << 16) -> None:
        self.device = torch.device(device)
        self._alloc(num_bytes)

    def _alloc(self, num_bytes: int) -> None:
        pin = self.device.type == "cuda"
        self.host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=pin)  # (num_bytes,)
        self.host_np = self.host.numpy()
        self.dev = (
            self.host if self.device.type == "cpu" else torch.empty(num_bytes, dtype=torch.uint8, device=self.device)
        )

    def upload(self, arrays: dict[str, np.ndarray | None]) -> dict[str, torch.Tensor | None]:
        _wait(self)  # the last copy out of the host buffer must be done before it is overwritten
        offsets, total = {}, 0
        for name, a in arrays.items():
            if a is not None:
                offsets[name] = total
                total += -(-a.nbytes // self.ALIGN) * self.ALIGN
        if total > self.host.numel():
            self._alloc(max(total, 2 * self.host.numel()))
        for name, off in offsets.items():
            a = arrays[name]
            self.host_np[off : off + a.nbytes].view(a.dtype).reshape(a.shape)[...] = a
        if self.dev is not self.host:
            self.dev[:total].copy_(self.host[:total], non_blocking=True)  # the one host-to-device copy
            _record(self)
        out: dict[str, torch.Tensor | None] = {}
        for name, a in arrays.items():
            if a is None:
                out[name] = None
                continue
            off = offsets[name]
            out[name] = self.dev[off : off + a.nbytes].view(_DTYPES[a.dtype]).view(a.shape)
        return out


class StaticStaging:
    """Fixed fields at fixed offsets of one pinned host buffer and its device twin (a captured CUDA
    graph reads the device views, so they may never move): write the host views with numpy, then
    :meth:`upload` copies the prefix that holds the step's rows in one ``copy_``. The last field is
    the only 2-D one (``(rows, width)``); only its first ``rows`` rows travel.

    On a CPU the "device" buffer is the host buffer itself (as :class:`BatchStaging`'s) and
    :meth:`upload` copies nothing: the CPU engine's forward pass runs inside the step's launch, so
    the next step never writes the views while one reads them. What it buys, measured
    (``bench_host.py --graph-path``, 256 running, this project's 2-core CPU): the decode step's
    memcpy of the whole padded block-table region (256 x 128 int32), ~30 us of a ~0.45 ms step
    (``benchmarks/records/cpu/host_ab_cpu_staging.txt``). A GPU's host pays one ``cudaMemcpyAsync``
    launch for it instead, so this does not carry over to a GPU's host time."""

    def __init__(self, device: torch.device, fields: dict[str, tuple[np.dtype, tuple[int, ...]]]) -> None:
        offsets, total = {}, 0
        for name, (dtype, shape) in fields.items():
            offsets[name] = total
            total += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // BatchStaging.ALIGN) * BatchStaging.ALIGN
        self.host = torch.zeros(total, dtype=torch.uint8, pin_memory=device.type == "cuda")  # (total,)
        self.dev = (
            self.host if device.type == "cpu" else torch.zeros(total, dtype=torch.uint8, device=device)
        )  # (total,)
        host_np = self.host.numpy()
        self.np: dict[str, np.ndarray] = {}  # host views, written by numpy
        self.views: dict[str, torch.Tensor] = {}  # device views, read by the graph
        for name, (dtype, shape) in fields.items():
            off, nbytes = offsets[name], int(np.prod(shape)) * np.dtype(dtype).itemsize
            self.np[name] = host_np[off : off + nbytes].view(dtype).reshape(shape)
            self.views[name] = self.dev[off : off + nbytes].view(_DTYPES[np.dtype(dtype)]).view(shape)
        self._last_off, (_, last_shape) = offsets[name], fields[name]
        self._row_bytes = int(np.prod(last_shape[1:])) * np.dtype(fields[name][0]).itemsize

    def wait(self) -> None:
        """Call before writing the host views: the last copy out of them must be done."""
        _wait(self)

    def upload(self, rows: int) -> None:
        if self.dev is self.host:  # a CPU "device" reads the host views themselves (class docstring)
            return
        end = self._last_off + rows * self._row_bytes
        self.dev[:end].copy_(self.host[:end], non_blocking=True)  # the one host-to-device copy
        if self.dev.is_cuda:
            _record(self)


def _record(staging) -> None:
    """Mark the copy just queued out of ``staging.host`` (one CUDA event per buffer, re-recorded)."""
    if getattr(staging, "copied", None) is None:
        staging.copied = torch.cuda.Event()
    staging.copied.record()
    staging.copy_pending = True


def _wait(staging) -> None:
    """A pinned buffer is read by its copy after ``copy_`` returns: wait for that copy before writing
    it again. Free in steady state (the engine already waited for the step's tokens); needed after
    a step that sampled nothing (a prompt chunk in the middle of its prompt), which never waits."""
    if getattr(staging, "copy_pending", False):
        staging.copied.synchronize()
        staging.copy_pending = False


def prepare_batch(chunks: Sequence[BatchChunk], block_size: int, device: torch.device | str = "cpu") -> ForwardBatch:
    """Pack the chunks of one step into a :class:`ForwardBatch` (one host-to-device copy in all).

    One-token chunks -- decodes, and a prompt whose every other token hit the prefix cache -- are
    moved to the front so that a single decode-kernel call serves them all. (The engine's runner
    does the same through a reused :class:`BatchStaging`; this function stages into a fresh one.)
    """
    if not chunks:
        raise ValueError("a batch needs at least one chunk")
    batch = pack_chunks(
        list(chain.from_iterable(c.token_ids for c in chunks)),
        [c.start for c in chunks],
        [len(c.token_ids) for c in chunks],
        [c.block_table for c in chunks],
        block_size,
    )
    arrays = batch.arrays()
    staging = BatchStaging(
        torch.device(device), sum(a.nbytes + BatchStaging.ALIGN for a in arrays.values() if a is not None)
    )
    return batch.on_device(staging.upload(arrays))

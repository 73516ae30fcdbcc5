"""Static against continuous batching on the same requests and KV budget; chunked prefill; step phases.

Static batching (what ``transformers.generate`` does with a batch) admits ``b`` requests, runs
them together until the *longest* is done, and only then admits the next ``b``. With a contiguous
cache it must reserve each sequence's worst case, ``L_max`` slots, so a budget of ``M`` token
slots runs batches of ``b = M // L_max``. Continuous batching (iteration-level scheduling, Orca;
vLLM) admits a waiting request in the step after any running one finishes, and the paged cache
gives each sequence only the blocks it fills.

Both run here on the same :class:`~paged_edu.engine.Engine` and the same model: the static
baseline is the engine driven the static way -- a batch is added only when the previous one is
done, and every member is asked for the batch's longest output, so rows that finished their own
output are *still computed* (as a padded batch computes them) and their extra tokens thrown away.

Measured (:class:`BatchingRun`): useful tokens per second, steps, the KV slots holding a live
token per step (over the same pool of ``M`` slots), and the timeline of who is in the batch at each
step: :data:`WAITING`, :data:`USEFUL`, :data:`WASTED` (finished, still computed), :data:`DONE`.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from paged_edu.engine import Engine, SamplingParams, StepMetrics
from paged_edu.cache.sizing import dtype_name
from paged_edu.labs.card import roofline_card
from paged_edu.sim.costmodel import CostModel
from paged_edu.sim.workloads import sharegpt

__all__ = [
    "DONE",
    "USEFUL",
    "WAITING",
    "WASTED",
    "BatchingRun",
    "PHASES",
    "make_requests",
    "sharegpt_requests",
    "chunked_prefill_trace",
    "compare_batching",
    "phase_profile",
    "run_continuous",
    "run_static",
]

WAITING, USEFUL, WASTED, DONE = 0, 1, 2, 3  # timeline codes: request x step
PHASES = ("schedule", "prepare", "forward", "sample", "update")


def make_requests(
    num: int,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    prompt_len: tuple[int, int] = (4, 24),
    output_len: tuple[int, int] = (2, 40),
) -> list[tuple[list[int], int]]:
    """``num`` requests ``(prompt token ids, output length)`` with lengths uniform in the ranges given."""
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        p = rng.randint(*prompt_len)
        out.append(([rng.randrange(3, vocab_size) for _ in range(p)], rng.randint(*output_len)))
    return out


def sharegpt_requests(num: int, seed: int, vocab_size: int, scale: float = 1.0) -> tuple[list[list[int]], list[int]]:
    """``num`` ShareGPT-like requests (:func:`paged_edu.sim.workloads.sharegpt`, lengths times ``scale``):
    random prompt token ids (``seed + 1``) and output lengths -- the engine benchmarks' workload."""
    rng = np.random.default_rng(seed + 1)
    prompts, outputs = [], []
    for r in sharegpt(num, seed=seed):
        p = max(1, int(round(r.prompt_len * scale)))
        prompts.append(rng.integers(3, vocab_size, size=p).tolist())
        outputs.append(max(1, int(round(r.output_len * scale))))
    return prompts, outputs


@dataclass
class BatchingRun:
    """One way of batching one workload: what it computed, how long it took, who ran when."""

    name: str
    num_steps: int
    useful_tokens: int  # tokens the requests asked for
    computed_tokens: int  # tokens sampled, wasted ones included
    seconds: float
    kv_slots: int  # the KV budget, in token slots
    batch_size: list[int] = field(default_factory=list)  # sequences computed per step
    live_tokens: list[int] = field(default_factory=list)  # useful tokens in the cache per step
    timeline: list[list[int]] = field(default_factory=list)  # request x step codes
    outputs: list[list[int]] = field(default_factory=list)  # each request's own tokens

    @property
    def tokens_per_s(self) -> float:
        return self.useful_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def wasted_fraction(self) -> float:
        return 1 - self.useful_tokens / self.computed_tokens if self.computed_tokens else 0.0

    @property
    def kv_holding_token(self) -> float:
        """Mean over steps of the budget's slots that hold a live, useful token."""
        return sum(self.live_tokens) / (len(self.live_tokens) * self.kv_slots) if self.live_tokens else 0.0


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _engine(model, kv_slots: int, block_size: int, max_num_seqs: int, **kwargs) -> Engine:
    return Engine(
        model,
        num_blocks=kv_slots // block_size,
        block_size=block_size,
        enable_prefix_caching=False,
        max_num_seqs=max_num_seqs,
        **kwargs,
    )


def run_continuous(
    model, requests, *, kv_slots: int, block_size: int = 16, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048
) -> BatchingRun:
    """All requests into one engine at once; it admits whatever the pool and ``max_num_seqs`` allow."""
    with _engine(model, kv_slots, block_size, max_num_seqs, max_num_batched_tokens=max_num_batched_tokens) as engine:
        steps: list[StepMetrics] = []
        engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepMetrics) else None)
        ids = [engine.add_request(p, SamplingParams(max_tokens=n)) for p, n in requests]
        row = {rid: k for k, rid in enumerate(ids)}
        timeline: list[list[int]] = [[] for _ in ids]
        outputs: dict[int, list[int]] = {}
        _sync(model.device)
        t0 = time.perf_counter()
        while engine.has_unfinished():
            finished = engine.step()
            in_batch = {s.request_id for s in engine.scheduler.running} | {o.request_id for o in finished}
            for o in finished:
                outputs[o.request_id] = o.outputs[0]
            for rid, k in row.items():
                timeline[k].append(USEFUL if rid in in_batch else DONE if rid in outputs else WAITING)
        _sync(model.device)
        seconds = time.perf_counter() - t0
        useful = sum(n for _, n in requests)
        return BatchingRun(
            "continuous",
            len(steps),
            useful,
            useful,
            seconds,
            kv_slots,
            [s.num_decode_seqs + (s.num_prefill_tokens > 0) for s in steps],
            [s.num_tokens_in_cache for s in steps],
            timeline,
            [outputs[i] for i in ids],
        )


def run_static(
    model,
    requests,
    *,
    kv_slots: int,
    block_size: int = 16,
    max_seq_len: int | None = None,
    max_num_batched_tokens: int = 2048,
) -> BatchingRun:
    """Batches of ``b = kv_slots // max_seq_len`` in arrival order, each run to its longest output.

    ``max_seq_len`` (``L_max``, what a contiguous cache reserves per sequence) defaults to the
    workload's longest prompt plus its longest output: the most a padded row can reach, and
    generous to the static baseline, which in practice must reserve the model's maximum. The KV
    accounting is that contiguous reservation; the engine that computes the batches is only given
    blocks enough for ``b`` rows of ``L_max``, so it never preempts.
    """
    if max_seq_len is None:
        max_seq_len = max(len(p) for p, _ in requests) + max(n for _, n in requests)
    b = kv_slots // max_seq_len
    if b < 1:
        raise ValueError(f"kv_slots={kv_slots} cannot hold even one sequence of L_max={max_seq_len} tokens")
    with _engine(
        model,
        b * -(-max_seq_len // block_size) * block_size,
        block_size,
        b,
        max_num_batched_tokens=max_num_batched_tokens,
    ) as engine:
        timeline: list[list[int]] = [[] for _ in requests]
        outputs: list[list[int]] = [[] for _ in requests]
        batch_size, live, computed = [], [], 0
        _sync(model.device)
        t0 = time.perf_counter()
        for start in range(0, len(requests), b):
            members = list(range(start, min(start + b, len(requests))))
            longest = max(requests[k][1] for k in members)
            for k in members:
                engine.add_request(requests[k][0], SamplingParams(max_tokens=longest))
            for t in range(longest):  # step t samples token t + 1 of every member
                for out in engine.step():
                    k = out.request_id  # added in workload order: request k has id k
                    outputs[k] = out.outputs[0][: requests[k][1]]
                batch_size.append(len(members))
                live.append(sum(len(requests[k][0]) + min(t, requests[k][1]) for k in members))
                for k in range(len(requests)):
                    own = requests[k][1]
                    code = (USEFUL if t < own else WASTED) if k in members else (DONE if k < start else WAITING)
                    timeline[k].append(code)
            computed += longest * len(members)
            if engine.has_unfinished():
                raise RuntimeError("a static batch did not finish in its longest output's number of steps")
        _sync(model.device)
        seconds = time.perf_counter() - t0
        useful = sum(n for _, n in requests)
        return BatchingRun(
            f"static (b = {b})",
            len(batch_size),
            useful,
            computed,
            seconds,
            kv_slots,
            batch_size,
            live,
            timeline,
            outputs,
        )


def compare_batching(
    model, requests, *, kv_slots: int, block_size: int = 16, max_seq_len: int | None = None
) -> tuple[BatchingRun, BatchingRun]:
    """``(static, continuous)`` on the same requests, model and KV budget, each timed on its second run.

    The first run of each is an untimed warm-up: a fresh process pays for lazy initialisation, and
    on a GPU Triton compiles a kernel variant the first time it meets a new batch shape -- seconds
    that would otherwise land in whichever run met the shape first.
    """

    def both():
        return (
            run_static(model, requests, kv_slots=kv_slots, block_size=block_size, max_seq_len=max_seq_len),
            run_continuous(model, requests, kv_slots=kv_slots, block_size=block_size),
        )

    both()
    return both()


# ----------------------------------------------------------------------------------------------
# Chunked prefill
# ----------------------------------------------------------------------------------------------


def chunked_prefill_trace(
    model,
    *,
    max_num_batched_tokens: int,
    long_prompt_len: int = 200,
    num_decodes: int = 3,
    decode_len: int = 24,
    arrive_at_step: int = 2,
    block_size: int = 16,
) -> dict[str, list]:
    """A long prompt arrives while ``num_decodes`` requests decode; what each step computes.

    Returns per step: ``decode_tokens`` (one per running decode), ``prefill_tokens`` (the long
    prompt's chunk, or the short prompts' prefill in step 0), and ``long_done`` (tokens of the long
    prompt computed so far).
    """
    vocab = model.config.vocab_size
    with Engine(
        model,
        num_blocks=64 + 2 * (long_prompt_len // block_size),
        block_size=block_size,
        enable_prefix_caching=False,
        max_num_batched_tokens=max_num_batched_tokens,
    ) as engine:
        steps: list[StepMetrics] = []
        engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepMetrics) else None)
        for i in range(num_decodes):
            engine.add_request([3 + (5 * i + t) % (vocab - 3) for t in range(6)], SamplingParams(max_tokens=decode_len))
        long_id, long_seq, done = None, None, []
        while engine.has_unfinished():
            if engine.step_count == arrive_at_step and long_id is None:
                long_id = engine.add_request(
                    [3 + (11 * t) % (vocab - 3) for t in range(long_prompt_len)], SamplingParams(max_tokens=2)
                )
            engine.step()
            if long_id is not None:
                long_seq = next((s for s in engine.scheduler.running if s.request_id == long_id), long_seq)
            done.append(min(long_prompt_len, long_seq.num_computed_tokens) if long_seq is not None else 0)
        return {
            "step": [s.step for s in steps],
            "decode_tokens": [s.num_decode_seqs for s in steps],
            "prefill_tokens": [s.num_prefill_tokens for s in steps],
            "long_done": done,
            "long_prompt_len": long_prompt_len,
            "budget": max_num_batched_tokens,
        }


# ----------------------------------------------------------------------------------------------
# Where a step's time goes
# ----------------------------------------------------------------------------------------------


def phase_profile(
    model,
    requests,
    *,
    num_blocks: int,
    block_size: int = 16,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 2048,
    gpu: str | None = None,
    **engine_kwargs,
) -> dict[str, list]:
    """Run the requests; per step: the engine's ``phase_times`` and the cost model's roofline time.

    On a CUDA device the engine synchronises at every phase boundary (``sync_timing=True``), so
    GPU work is booked to the phase that launched it. The roofline is :meth:`CostModel.roofline` on
    each step's exact chunks (``StepShape.of_chunks``): the time the step's FLOPs and bytes need on
    ``gpu`` at full efficiency, no overhead, the tied LM head's read counted -- what a perfect engine
    could reach there. ``gpu`` None: the card the model runs on (:func:`~paged_edu.labs.card.this_card`;
    the H200's on a CPU), else a key of :data:`~paged_edu.core.hardware.GPUS`.
    """
    on_gpu = model.device.type == "cuda"
    with Engine(
        model,
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        sync_timing=on_gpu,
        **engine_kwargs,
    ) as engine:
        steps: list[StepMetrics] = []
        engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepMetrics) else None)
        engine.run([p for p, _ in requests], [SamplingParams(max_tokens=n) for _, n in requests])
        card = roofline_card(gpu, model.device)
        roofline = CostModel(model=model.config.geometry(dtype_name(model.dtype)), gpu=card.gpu).roofline()
        out = {phase: [s.phase_times.get(phase, 0.0) for s in steps] for phase in PHASES}
        out.update(
            step=[s.step for s in steps],
            duration=[s.duration for s in steps],
            batched_tokens=[s.num_batched_tokens for s in steps],
            num_decode_seqs=[s.num_decode_seqs for s in steps],
            roofline=[roofline.step_time(s.shape) for s in steps],
            gpu=roofline.gpu.name,
            gpu_spec=card.spec,
            cuda_graph_steps=engine.num_graph_steps,
        )
        return out

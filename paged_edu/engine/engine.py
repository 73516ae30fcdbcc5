"""The engine: continuous batching of a real model over the paged KV cache.

What you will learn
-------------------
One call of :meth:`Engine.step` is one *iteration* of iteration-level scheduling:

1. the :class:`~paged_edu.engine.scheduler.Scheduler` picks the tokens of this step -- one token for
   every running decode, then prompt chunks under the ``max_num_batched_tokens`` budget -- and
   may preempt sequences when the pool runs out of blocks;
2. the engine applies the block copies the scheduler asked for, in order: swap-outs to CPU
   memory, copy-on-write copies (``allocator.take_copies()``), swap-ins back to the GPU;
3. one forward pass of :class:`~paged_edu.models.llama.PagedLlama` over the flat batch: per layer, one
   decode-kernel call for all one-token rows and one prefill call for the prompt chunks;
4. one token is sampled for every sequence whose chunk reached its last known token (``n`` of
   them for a parallel-sampling request finishing its prompt: the scheduler forks the children);
5. :meth:`Scheduler.update` appends the tokens and finishes sequences on ``max_tokens`` or a stop
   token, freeing their blocks at once -- the next step can admit a waiting request into them.

A prefix-cache hit needs no special case here: the allocator reports ``num_cached_tokens`` at
admission and the scheduler starts the prompt's first chunk after them, so their K/V is never
computed again.

Metrics: every step emits a :class:`StepMetrics` and every finished request a
:class:`RequestMetrics` to the callbacks given to :meth:`Engine.subscribe` -- the stream the
lesson widgets draw live.

The fixed contract::

    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=..., block_size=16,
                    enable_prefix_caching=True, preemption_mode="recompute")  # or "swap"
    outputs = engine.generate(prompts, max_new_tokens=32)  # greedy; new tokens only
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.validation import as_int
from paged_edu.cache.kv_cache import PagedKVCache
from paged_edu.models.llama import BatchChunk, PagedLlama, prepare_batch
from paged_edu.engine.sampling import Sampler, SamplingParams, sample
from paged_edu.engine.scheduler import Scheduler, SchedulerOutput
from paged_edu.engine.sequence import Sequence as Seq

__all__ = ["Engine", "RequestMetrics", "RequestOutput", "SamplingParams", "StepMetrics"]


# ----------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class RequestMetrics:
    """Latency and size of one finished request (times in seconds since the engine started)."""

    request_id: int
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_prompt_tokens: int
    num_output_tokens: int  # all samples together
    num_cached_tokens: int  # prompt tokens served by the prefix cache
    num_preemptions: int
    inter_token_latencies: list[float] = field(default_factory=list)
    kind: str = "request"

    @property
    def ttft(self) -> float | None:
        """Time to first token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def mean_itl(self) -> float | None:
        """Mean inter-token latency over every sample's consecutive tokens."""
        itl = self.inter_token_latencies
        return sum(itl) / len(itl) if itl else None

    @property
    def latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time


@dataclass(slots=True)
class StepMetrics:
    """What one engine step did and the state it left (one event of the stream)."""

    step: int
    time: float  # seconds since the engine started, at the step's end
    duration: float  # seconds spent in the step
    num_running: int
    num_waiting: int
    num_swapped: int
    num_batched_tokens: int
    num_prefill_tokens: int
    num_decode_seqs: int
    num_preempted: int  # this step
    num_preemptions: int  # since the start
    num_finished: int  # sequences finished this step
    kv_usage: float  # fraction of GPU blocks held by live sequences
    num_used_blocks: int
    num_tokens_in_cache: int  # computed tokens of live sequences (a shared block counts once per sequence)
    prefix_hit_rate: float  # cached / queried prompt tokens since the start
    # seconds per phase of the step: "schedule", "prepare", "forward", "sample", "update" (host wall
    # time; exact per phase only with Engine(sync_timing=True), else GPU work lands where it syncs)
    phase_times: dict[str, float] = field(default_factory=dict)
    kind: str = "step"


@dataclass(slots=True)
class RequestOutput:
    """A finished request: its ``n`` samples (new tokens only) and its metrics."""

    request_id: int
    prompt_token_ids: list[int]
    outputs: list[list[int]]  # by sample index
    finish_reasons: list[str]
    metrics: RequestMetrics


@dataclass(slots=True)
class _Request:
    request_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    finished: list[Seq] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------


class Engine:
    """Continuous batching of a :class:`PagedLlama` over a block allocator and a paged KV cache.

    Parameters
    ----------
    model: the decoder; its dtype and device are the cache's.
    num_blocks, block_size: the GPU pool (``num_blocks * block_size`` token slots per layer).
    enable_prefix_caching: reuse full blocks of identical prompt prefixes.
    preemption_mode: ``"recompute"`` (free and requeue), ``"swap"`` (copy to CPU blocks and back), or
        ``"auto"``: vLLM's rule -- recompute a lone sequence, swap parallel samples that share blocks.
    num_cpu_blocks: the swap space (default: as many as the GPU pool in swap or auto mode, else 0).
    max_num_seqs, max_num_batched_tokens, enable_chunked_prefill: the scheduler's limits.
    attn_impl, prefill_impl: kernels for decode and prefill rows (default: Triton on CUDA, the
        vectorised PyTorch reference on a CPU, where the Triton interpreter would be too slow).
    cuda_graphs: replay captured CUDA graphs for pure-decode steps (default: on for CUDA).
    max_model_len: the longest sequence (prompt + output) accepted; sets the graphs' table width
        (default: the model's positions, capped by what the pool holds).
    sync_timing: synchronise the device at every phase boundary so that ``StepMetrics.phase_times``
        attributes GPU time to the phase that launched it (slower; for measuring, not serving).
    """

    def __init__(
        self,
        model: PagedLlama,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        preemption_mode: str = "recompute",
        *,
        num_cpu_blocks: int | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        enable_chunked_prefill: bool = True,
        attn_impl: str | None = None,
        prefill_impl: str | None = None,
        cuda_graphs: bool | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        sync_timing: bool = False,
    ) -> None:
        if not isinstance(model, PagedLlama):
            raise TypeError(f"model must be a PagedLlama (use PagedLlama.from_hf), got {type(model).__name__}")
        if preemption_mode not in ("recompute", "swap", "auto"):
            raise ValueError(f"preemption_mode must be 'recompute', 'swap' or 'auto', got {preemption_mode!r}")
        if num_cpu_blocks is None:
            num_cpu_blocks = num_blocks if preemption_mode in ("swap", "auto") else 0
        self.model = model
        self.config = model.config
        self.device = model.device
        on_gpu = self.device.type == "cuda"
        model.attn_impl = attn_impl or ("auto" if on_gpu else "torch")
        model.prefill_impl = prefill_impl or ("auto" if on_gpu and _has_triton_prefill() else "torch")
        self.allocator = BlockAllocator(num_blocks, block_size, enable_prefix_caching)
        self.scheduler = Scheduler(
            self.allocator, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill, preemption_mode=preemption_mode,
            num_cpu_blocks=num_cpu_blocks,
        )
        c = self.config
        self.kv_cache = PagedKVCache(
            c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim,
            dtype=model.dtype, device=self.device, num_cpu_blocks=num_cpu_blocks,
        )
        self._kv_pairs = list(zip(self.kv_cache.k_caches, self.kv_cache.v_caches))
        self.block_size = block_size
        if max_model_len is None:
            max_model_len = min(c.max_position_embeddings, num_blocks * block_size)
        if not isinstance(max_model_len, int) or max_model_len < 1:
            raise ValueError(f"max_model_len must be an int >= 1, got {max_model_len!r}")
        self.max_model_len = max_model_len
        self.graphs = None
        self.graph_error: str | None = None
        if cuda_graphs is None:
            cuda_graphs = on_gpu
        if cuda_graphs:
            if not on_gpu:
                raise ValueError("cuda_graphs=True needs the model on a CUDA device")
            from paged_edu.models.llama import DecodeCudaGraphs

            try:
                self.graphs = DecodeCudaGraphs(model, self._kv_pairs, max_num_seqs, -(-max_model_len // block_size))
            except Exception as exc:  # capture is an optimisation: fall back to eager steps, say why
                import warnings

                self.graph_error = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"CUDA-graph capture failed, decode steps run eagerly: {self.graph_error}")
        self.sampler = Sampler(seed)
        self.sync_timing = bool(sync_timing)
        self._requests: dict[int, _Request] = {}
        self._subscribers: list[Callable] = []
        self._next_request_id = 0
        self._t0 = time.perf_counter()
        self.step_count = 0
        self.num_generated_tokens = 0
        self.num_blocks_swapped_out = 0
        self.num_blocks_swapped_in = 0
        self.num_blocks_copied = 0  # copy-on-write
        self.num_graph_steps = 0  # decode steps served by a CUDA-graph replay

    # -- events --------------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[StepMetrics | RequestMetrics], None]) -> Callable[[], None]:
        """Call ``callback(event)`` after every step (:class:`StepMetrics`) and for every finished
        request (:class:`RequestMetrics`); returns a function that unsubscribes."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) if callback in self._subscribers else None

    def _emit(self, event) -> None:
        for callback in list(self._subscribers):
            callback(event)

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def _lap(self, phase_times: dict[str, float], phase: str, since: float) -> float:
        """Book the time since ``since`` to ``phase``; returns now (synchronised if ``sync_timing``)."""
        if self.sync_timing and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = self.now()
        phase_times[phase] = phase_times.get(phase, 0.0) + (now - since)
        return now

    # -- requests ------------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None) -> int:
        """Queue a request; returns its id. Checks the prompt against the model and the pool."""
        params = SamplingParams() if params is None else params
        prompt = self._check_request(prompt_token_ids, params)
        request_id = self._next_request_id
        seq = Seq(
            self.scheduler.new_seq_id(), prompt, params.max_tokens, arrival_time=self.now(),
            stop_token_ids=params.stop_token_ids, request_id=request_id, num_samples=params.n,
        )
        self.scheduler.add(seq)
        self._next_request_id += 1
        self._requests[request_id] = _Request(request_id, prompt, params, seq.arrival_time)
        self.sampler.add(request_id, params)
        return request_id

    def _check_request(self, prompt_token_ids, params) -> list[int]:
        """Everything that can be wrong with a request, checked before anything is queued."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be SamplingParams, got {type(params).__name__}")
        prompt = self._check_prompt(prompt_token_ids)
        if params.n > self.scheduler.max_num_seqs:
            raise ValueError(f"n={params.n} samples can never run at once with max_num_seqs={self.scheduler.max_num_seqs}")
        longest = len(prompt) + params.max_tokens
        if longest > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}) = {longest} tokens exceeds "
                f"max_model_len={self.max_model_len} (the model has {self.config.max_position_embeddings} positions)"
            )
        needed = -(-longest // self.block_size)
        if needed > self.allocator.num_blocks:
            raise ValueError(
                f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}) = {longest} tokens needs {needed} blocks "
                f"of {self.block_size}, more than the whole pool ({self.allocator.num_blocks} blocks)"
            )
        return prompt

    def _check_prompt(self, prompt_token_ids) -> list[int]:
        if isinstance(prompt_token_ids, (str, bytes)) or not isinstance(prompt_token_ids, Sequence):
            raise TypeError(f"a prompt must be a list of token ids, got {type(prompt_token_ids).__name__}")
        prompt = [as_int(t, "token ids must be ints") for t in prompt_token_ids]
        if not prompt:
            raise ValueError("a prompt needs at least one token")
        vocab = self.config.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
        return prompt

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- one step ------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Run one iteration; return the requests that finished in it."""
        phases: dict[str, float] = {}
        t_start = self.now()
        sched = self.scheduler.schedule()
        t = self._lap(phases, "schedule", t_start)
        if sched.is_empty:
            if self.scheduler.has_unfinished():
                raise RuntimeError(
                    "the scheduler could schedule nothing although requests wait: the pool "
                    f"({self.allocator.num_blocks} blocks, {self.allocator.num_free_blocks} free) or "
                    f"max_num_seqs={self.scheduler.max_num_seqs} is too small for the next request"
                )
            return []
        self._apply_block_ops(sched)

        chunks = []
        emitting = []  # (index in scheduled, seq, number of samples to draw)
        for i, item in enumerate(sched.scheduled):
            seq = item.seq
            table = self.allocator.block_table(seq.seq_id)
            chunks.append(BatchChunk(_token_slice(seq, item.start, item.end), item.start, table))
            if item.emits_token:
                n = seq.num_samples if (seq.num_samples > 1 and not seq.output_token_ids) else 1
                emitting.append((i, seq, n))

        batch = prepare_batch(chunks, self.block_size, self.device)
        t = self._lap(phases, "prepare", t)
        if self.graphs is not None and self.graphs.can_run(batch):
            hidden = self.graphs.run(batch)  # (T, hidden), one graph replay
            self.num_graph_steps += 1
        else:
            hidden = self.model(batch, self._kv_pairs)  # (T, hidden)
        t = self._lap(phases, "forward", t)

        sampled: dict[int, int | list[int]] = {}
        if emitting:
            rows, temps, top_ps, uniforms = [], [], [], []
            for i, seq, n in emitting:
                params = self._requests[seq.request_id].params
                for k in range(n):
                    rows.append(i)
                    temps.append(params.temperature)
                    top_ps.append(params.top_p)
                    index = k if n > 1 else seq.sample_index
                    uniforms.append(self.sampler.uniform(seq.request_id, index))
            row_ids = batch.logits_rows[torch.tensor(rows, device=self.device)]
            logits = self.model.compute_logits(hidden[row_ids])  # (num_samples, vocab) fp32
            tokens = sample(logits, temps, top_ps, uniforms)
            pos = 0
            for i, seq, n in emitting:
                sampled[seq.seq_id] = tokens[pos] if n == 1 else tokens[pos:pos + n]
                pos += n
            self.num_generated_tokens += len(tokens)
        t = self._lap(phases, "sample", t)

        finished_seqs = self.scheduler.update(sched.scheduled, sampled, t)
        outputs = self._collect(finished_seqs)
        now = self._lap(phases, "update", t)
        if self._subscribers:
            self._emit(self._step_metrics(sched, now, now - t_start, len(finished_seqs), phases))
            for out in outputs:
                self._emit(out.metrics)
        self.step_count += 1
        return outputs

    def _apply_block_ops(self, sched: SchedulerOutput) -> None:
        """Swap-outs, copy-on-write copies and swap-ins, in the scheduler's order (runs of one kind batched)."""
        ops = sched.block_ops
        i = 0
        while i < len(ops):
            kind = ops[i][0]
            j = i
            while j < len(ops) and ops[j][0] == kind:
                j += 1
            pairs = [(a, b) for _, a, b in ops[i:j]]
            if kind == "swap_out":
                self.kv_cache.swap_out(pairs)
                self.num_blocks_swapped_out += len(pairs)
            elif kind == "copy":
                self.kv_cache.copy_blocks(pairs)
                self.num_blocks_copied += len(pairs)
            elif kind == "swap_in":
                self.kv_cache.swap_in(pairs)
                self.num_blocks_swapped_in += len(pairs)
            else:
                raise ValueError(f"unknown block op {kind!r}")
            i = j

    def _collect(self, finished_seqs: list[Seq]) -> list[RequestOutput]:
        outputs = []
        for seq in finished_seqs:
            request = self._requests[seq.request_id]
            request.finished.append(seq)
            self.sampler.remove(seq.request_id, seq.sample_index)
            if len(request.finished) < request.params.n:
                continue
            del self._requests[seq.request_id]
            samples = sorted(request.finished, key=lambda s: s.sample_index)
            itl = [x for s in samples for x in s.inter_token_latencies]
            first = samples[0]
            metrics = RequestMetrics(
                request_id=request.request_id,
                arrival_time=request.arrival_time,
                first_scheduled_time=first.first_scheduled_time,
                first_token_time=min(s.first_token_time for s in samples if s.first_token_time is not None),
                finish_time=max(s.finish_time for s in samples if s.finish_time is not None),
                num_prompt_tokens=len(request.prompt_token_ids),
                num_output_tokens=sum(len(s.output_token_ids) for s in samples),
                num_cached_tokens=first.num_cached_tokens,
                num_preemptions=sum(s.num_preemptions for s in samples),
                inter_token_latencies=itl,
            )
            outputs.append(RequestOutput(
                request.request_id, request.prompt_token_ids, [list(s.output_token_ids) for s in samples],
                [s.finish_reason for s in samples], metrics,
            ))
        return outputs

    def _step_metrics(self, sched: SchedulerOutput, now: float, duration: float, num_finished: int,
                      phase_times: dict[str, float]) -> StepMetrics:
        stats = self.scheduler.stats()
        decodes = sum(1 for s in sched.scheduled if not s.is_prefill)
        prefill_tokens = sum(s.num_new_tokens for s in sched.scheduled if s.is_prefill)
        in_cache = sum(s.num_computed_tokens for s in self.scheduler.running)
        return StepMetrics(
            step=self.step_count, time=now, duration=duration,
            num_running=stats["running"], num_waiting=stats["waiting"], num_swapped=stats["swapped"],
            num_batched_tokens=sched.num_batched_tokens, num_prefill_tokens=prefill_tokens,
            num_decode_seqs=decodes, num_preempted=len(sched.preempted), num_preemptions=stats["preemptions"],
            num_finished=num_finished, kv_usage=stats["kv_usage"], num_used_blocks=self.allocator.num_used_blocks,
            num_tokens_in_cache=in_cache, prefix_hit_rate=stats["prefix_hit_rate"], phase_times=phase_times,
        )

    # -- batch helpers -------------------------------------------------------------------------
    def run(self, prompts: Sequence[Sequence[int]], sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
            *, use_tqdm: bool | None = None) -> list[RequestOutput]:
        """Add every prompt, step until all are done; outputs in the order of ``prompts``."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(f"{len(params_list)} sampling params for {len(prompts)} prompts")
        for p, sp in zip(prompts, params_list):  # validate everything before queueing anything
            self._check_request(p, sp)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params_list)]
        wanted = set(ids)
        results: dict[int, RequestOutput] = {}
        show = len(prompts) >= 64 if use_tqdm is None else use_tqdm
        bar = None
        if show:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(ids), desc="requests", unit="req")
        try:
            while len(results) < len(ids):
                for out in self.step():
                    if out.request_id in wanted:
                        results[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
                if not self.has_unfinished() and len(results) < len(ids):
                    raise RuntimeError("the engine stopped with requests unfinished")
        finally:
            if bar is not None:
                bar.close()
        return [results[i] for i in ids]

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, use_tqdm: bool | None = None) -> list[list[int]]:
        """New tokens for each prompt: greedy with ``max_new_tokens`` unless ``sampling_params`` say otherwise.

        One sample per prompt; for ``n > 1`` use :meth:`run`, which returns every sample.
        """
        if sampling_params is None:
            sampling_params = SamplingParams(max_tokens=max_new_tokens)
        params = [sampling_params] if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        if any(p.n != 1 for p in params):
            raise ValueError("generate returns one sample per prompt; use Engine.run for n > 1")
        return [out.outputs[0] for out in self.run(prompts, sampling_params, use_tqdm=use_tqdm)]

    def chat(self, conversations, tokenizer, sampling_params: SamplingParams | None = None,
             *, max_new_tokens: int = 64) -> list[str]:
        """Reply to chat conversations: apply the tokenizer's chat template, generate, decode.

        ``conversations`` is one conversation (a list of ``{"role", "content"}`` dicts) or a list of
        them; the tokenizer's end-of-sequence token stops a reply. Returns one string each.
        """
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        eos = tokenizer.eos_token_id
        if sampling_params is None:
            sampling_params = SamplingParams(max_tokens=max_new_tokens, stop_token_ids=(eos,) if eos is not None else ())
        prompts = []
        for messages in conversations:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompts.append(tokenizer.encode(text, add_special_tokens=False))
        replies = self.generate(prompts, sampling_params=sampling_params)
        return [tokenizer.decode(r, skip_special_tokens=True) for r in replies]

    # -- inspection ----------------------------------------------------------------------------
    def stats(self) -> dict:
        """The scheduler's gauges plus the engine's counters."""
        out = dict(self.scheduler.stats())
        out.update(step=self.step_count, generated_tokens=self.num_generated_tokens,
                   blocks_swapped_out=self.num_blocks_swapped_out, blocks_swapped_in=self.num_blocks_swapped_in,
                   blocks_copied=self.num_blocks_copied,
                   used_blocks=self.allocator.num_used_blocks, free_blocks=self.allocator.num_free_blocks)
        return out

    def __repr__(self) -> str:
        a = self.allocator
        return (f"Engine(num_blocks={a.num_blocks}, block_size={a.block_size}, "
                f"prefix_caching={a.enable_prefix_caching}, preemption_mode={self.scheduler.preemption_mode!r}, "
                f"device={self.device}, dtype={self.model.dtype})")


def _has_triton_prefill() -> bool:
    try:
        import paged_edu.kernels.triton_prefill  # noqa: F401
    except ImportError:
        return False
    return True


def _token_slice(seq: Seq, start: int, end: int) -> list[int]:
    """``seq.token_ids[start:end]`` without building the whole prompt + output list."""
    p = seq.num_prompt_tokens
    if start >= p:
        return seq.output_token_ids[start - p:end - p]
    if end <= p:
        return seq.prompt_token_ids[start:end]
    return seq.prompt_token_ids[start:] + seq.output_token_ids[:end - p]

"""The engine: continuous batching of a real model over the paged KV cache.

What you will learn
-------------------
One call of :meth:`Engine.step` is one *iteration* of iteration-level scheduling:

1. the :class:`~paged_edu.sched.scheduler.Scheduler` picks the tokens of this step -- one token for
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

A prefix-cache hit needs no special case: the scheduler starts the prompt's first chunk after the
``num_cached_tokens`` the allocator reports at admission, so their K/V is never computed again.

The phases are named once, in :mod:`~paged_edu.engine.step`; the speed machinery (packing the flat
batch with numpy into one pinned buffer, CUDA-graph replays, sampling on the device with one copy
back) lives in the :class:`~paged_edu.engine.runner.ModelRunner`, so that :meth:`Engine.step` reads
as the five steps above. ``Engine(..., async_scheduling=True)`` runs the same phases with the host one
step ahead: step N+1 is scheduled and launched before step N's tokens are read
(:mod:`~paged_edu.engine.overlap`). Every setting is a field of one
:class:`~paged_edu.engine.config.EngineConfig`, documented there.
Every step emits a :class:`StepMetrics` (``phase_times``: where its time went) and every finished
request a :class:`RequestMetrics` to the callbacks of :meth:`Engine.subscribe` -- the stream the
lesson widgets draw live -- after the step's state is committed; a callback that raises is isolated.
A request is checked in full before it is queued (:meth:`Engine.add_request`);
:meth:`Engine.abort_request` stops a request, or one of its samples, at any point (from a callback
inside a step it runs when the step ends). A step whose block copies, forward pass or sampling
raise (a CUDA OOM, a bad kernel input) is undone and raises :class:`StepFailed`: nothing is lost,
and the next step retries the work; aborting the requests it names drops their queued block copies
too, and :meth:`Engine.reset` empties an engine whose failure belongs to no request.

An engine holds a KV pool (most of a GPU, in serving) and CUDA graphs: nothing in it points back at
it, so dropping the last reference frees them at once, and :meth:`Engine.close` -- or
``with Engine(...) as engine:`` -- frees them at a known point (a notebook cell that builds a new
engine finds the memory, as :func:`~paged_edu.cache.sizing.check_blocks_fit` counts it).

The fixed contract::

    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=..., block_size=16,
                    enable_prefix_caching=True, preemption_mode="recompute")  # or "swap"
    outputs = engine.generate(prompts, max_new_tokens=32)  # greedy; new tokens only

    Engine(model, config: EngineConfig | None = None, *, allocator=None, **settings)
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch

from paged_edu.cache.kv_cache import PagedKVCache
from paged_edu.cache.sizing import bytes_per_block, check_blocks_fit
from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.validation import FieldTypeError, FieldValueError, as_int, cache_key
from paged_edu.engine.config import EngineConfig, make_config
from paged_edu.engine.input_batch import InputBatch
from paged_edu.engine.outputs import RequestMetrics, RequestOutput, RequestState, StepMetrics
from paged_edu.engine.overlap import AsyncScheduling
from paged_edu.engine.requests import check_inputs
from paged_edu.engine.runner import ModelRunner
from paged_edu.engine.sampling import Sampler, SamplingParams
from paged_edu.engine.step import StepFailed, StepPhases
from paged_edu.engine.timeline import StepRecord, Timeline
from paged_edu.models.llama import PagedLlama
from paged_edu.sched.memory_manager import (
    MemoryManager,
    block_table_versions_reader,
    block_tables_reader,
    is_empty,
    latest_table_version_reader,
)
from paged_edu.sched.scheduler import Scheduler
from paged_edu.sched.sequence import Sequence as SchedSequence

__all__ = ["Engine", "StepFailed"]


class Engine:
    """Continuous batching of a :class:`PagedLlama` over a block allocator and a paged KV cache.

    ``Engine(model, config=None, *, allocator=None, **settings)``:

    * ``model`` -- the decoder; its dtype and device are the cache's;
    * ``config`` -- an :class:`~paged_edu.engine.config.EngineConfig`, every other setting, each
      documented there; ``settings`` -- fields of it (or of its ``kernels``, a
      :class:`~paged_edu.engine.config.KernelConfig`) by name, over ``config``:
      ``Engine(model, num_blocks=64, block_size=16)``. An unknown name is refused, naming it;
    * ``allocator`` -- a memory manager of ``num_blocks`` x ``block_size`` to run on instead of a new
      :class:`BlockAllocator` (lesson 5 runs a learner's); it must hold no sequence yet.

    ``engine.config`` is the config in force: the one given, every ``None`` default decided for
    this model and device (:meth:`~paged_edu.engine.config.EngineConfig.in_force`).
    """

    def __init__(
        self,
        model: PagedLlama,
        config: EngineConfig | None = None,
        *,
        allocator: MemoryManager | None = None,
        **overrides,
    ) -> None:
        if not isinstance(model, PagedLlama):
            raise FieldTypeError(
                "model", f"model must be a PagedLlama (use PagedLlama.from_hf), got {type(model).__name__}"
            )
        if allocator is not None and not isinstance(allocator, MemoryManager):
            raise FieldTypeError(
                "allocator",
                "allocator must be a memory manager (a BlockAllocator, a RadixAllocator, "
                f"or anything with the MemoryManager protocol), got {type(allocator).__name__}",
            )
        c = model.config
        config = make_config(config, overrides).in_force(c.max_position_embeddings, model.device)
        num_blocks, block_size = config.num_blocks, config.block_size
        block_bytes = bytes_per_block(c.num_layers, block_size, c.num_kv_heads, c.head_dim, model.dtype)
        check_blocks_fit("num_blocks", num_blocks, block_bytes, model.device)
        check_blocks_fit("num_cpu_blocks", config.num_cpu_blocks, block_bytes, torch.device("cpu"))
        self.config = config
        self.model = model
        self.device = model.device
        self.max_model_len = config.max_model_len
        self.block_size = block_size
        # A prompt computed over several steps must not be hit in the prefix cache before its K/V
        # exists: the allocator publishes a block when the scheduler marks it computed.
        a = self.allocator = (
            allocator
            if allocator is not None
            else BlockAllocator(num_blocks, block_size, config.enable_prefix_caching, cache_when_computed=True)
        )
        if (a.num_blocks, a.block_size, a.num_free_blocks) != (num_blocks, block_size, num_blocks):
            raise ValueError(f"allocator must be an empty pool of num_blocks={num_blocks} x block_size={block_size}")
        if not is_empty(a):
            raise ValueError(
                f"allocator still caches {a.num_cached_blocks} blocks whose K/V is in another engine's "
                f"KV cache, not this one's: pass a new allocator, or call its reset_prefix_cache() first"
            )
        self.scheduler = Scheduler(
            a,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enable_chunked_prefill=config.enable_chunked_prefill,
            preemption_mode=config.preemption_mode,
            num_cpu_blocks=config.num_cpu_blocks,
            max_model_len=self.max_model_len,
        )
        self.kv_cache = PagedKVCache(
            c.num_layers,
            num_blocks,
            block_size,
            c.num_kv_heads,
            c.head_dim,
            dtype=model.dtype,
            device=self.device,
            num_cpu_blocks=config.num_cpu_blocks,
        )
        self.runner = ModelRunner(
            model,
            self.kv_cache,
            config.kernels,
            max_num_seqs=config.max_num_seqs,
            max_model_len=min(self.max_model_len, num_blocks * block_size),
            max_num_batched_tokens=config.max_num_batched_tokens,
        )
        self.sampler = Sampler(config.seed)
        self.subscriber_errors: list[tuple[Callable, Exception]] = []  # callbacks that raised, isolated
        self._requests: dict[int, RequestState] = {}  # live requests by id
        self._busy = False  # inside a step or an abort: calls back into the engine are deferred
        self._deferred_aborts: list[tuple[int, int | None]] = []  # (request_id, sample_index) asked for meanwhile
        self._aborted_outputs: list[RequestOutput] = []  # completed by abort_request, reported by the next step
        self._subscribers: list[Callable] = []
        self._closed = False
        self._next_request_id = 0
        self._t0 = time.perf_counter()
        self._timeline = Timeline(self.device, self._t0) if config.record_timeline else None
        self.runner.timeline = self._timeline
        self.phases = StepPhases(
            self.scheduler,
            self.runner,
            self.sampler,
            self._requests,
            self._subscribers,
            # the decode batch kept across steps, where the manager numbers its tables' edits
            input_batch=InputBatch(
                block_size, block_tables_reader(a), block_table_versions_reader(a), latest_table_version_reader(a)
            ),
            timeline=self._timeline,
            t0=self._t0,
            sync_timing=config.sync_timing,
        )
        self.overlap = AsyncScheduling(self.phases) if config.async_scheduling else None

    # The runner's counters and CUDA-graph state, read by tests, stats() and the benchmark.
    num_blocks_swapped_out = property(lambda self: self.runner.num_blocks["swap_out"])
    num_blocks_swapped_in = property(lambda self: self.runner.num_blocks["swap_in"])
    num_blocks_copied = property(lambda self: self.runner.num_blocks["copy"])  # copy-on-write
    graphs = property(lambda self: self.runner.graphs)
    graph_error = property(lambda self: self.runner.graph_error)
    num_graph_steps = property(lambda self: self.runner.num_graph_steps)
    num_mixed_graph_steps = property(lambda self: self.runner.num_mixed_graph_steps)

    @property
    def timeline(self) -> list[StepRecord]:
        """One :class:`~paged_edu.engine.timeline.StepRecord` per step launched (``record_timeline=True``)."""
        if self._timeline is None:
            raise RuntimeError("this engine records no timeline: build it with Engine(..., record_timeline=True)")
        return self._timeline.records

    # -- events --------------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[StepMetrics | RequestMetrics], None]) -> Callable[[], None]:
        """Call ``callback(event)`` after every step (:class:`StepMetrics`) and for every finished
        request (:class:`RequestMetrics`); returns a function that unsubscribes.

        Events are emitted after the step's state is committed. A callback that raises is
        isolated: the error is recorded in ``subscriber_errors`` and warned about, the other
        callbacks still run, and the step returns its outputs as usual.
        """
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) if callback in self._subscribers else None

    def _emit(self, event) -> None:
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception as exc:  # a view must not lose the engine's outputs
                self.subscriber_errors.append((callback, exc))
                warnings.warn(
                    f"engine subscriber {callback!r} raised {type(exc).__name__}: {exc} "
                    f"(on {event.kind} event; isolated, see Engine.subscriber_errors)",
                    stacklevel=3,
                )

    def now(self) -> float:
        return time.perf_counter() - self._t0

    # The step's counters (kept by its phases).
    step_count = property(lambda self: self.phases.step_count)
    num_failed_steps = property(lambda self: self.phases.num_failed_steps)  # steps that raised StepFailed

    @property
    def num_generated_tokens(self) -> int:
        """Tokens generated so far and kept, every request's samples together (a token async
        scheduling drew for a sequence that had already stopped is not one)."""
        return self.phases.num_finished_tokens + self.phases.live_output_tokens()

    # -- requests ------------------------------------------------------------------------------
    def add_request(
        self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None, *, cache_salt: str | None = None
    ) -> int:
        """Queue a request; returns its id. All or nothing: a request the model, the pool or the
        scheduler can never serve raises (naming the limit) and leaves the engine as it was.

        ``cache_salt`` (a non-empty str of at most 256 characters, on the request as vLLM's
        ``cache_salt``, not on the sampling params): the request hits only prefix-cache blocks
        cached by requests with the same salt, so one tenant cannot time another's prompts."""
        self._refuse_if_busy("add_request")
        params = SamplingParams() if params is None else params
        prompt = check_inputs(prompt_token_ids, params, self.model.config.vocab_size)
        self._check_cache_salt("cache_salt", cache_salt)
        return self._queue(prompt, params, cache_salt)

    def _refuse_if_busy(self, call: str) -> None:
        self._refuse_if_closed(call)
        if self._busy:
            raise RuntimeError(
                f"{call} was called from inside a step or an abort (from a subscriber?); "
                "call it after the current one returns"
            )

    def _queue(self, prompt: list[int], params: SamplingParams, cache_salt: str | None) -> int:
        """Queue a request whose inputs are checked; the scheduler checks that it fits -- before its
        sequence (and its ``n`` samples' record) is built -- and raises if it does not; returns its id."""
        try:
            self.scheduler.check_fits(len(prompt), params.max_tokens, params.n)
        except FieldValueError as exc:
            if exc.field != "max_model_len":
                raise
            positions = self.model.config.max_position_embeddings
            raise FieldValueError(exc.field, f"{exc} (the model has {positions} positions)") from None
        request_id = self._next_request_id
        seq = SchedSequence(
            self.scheduler.new_seq_id(),
            prompt,
            params.max_tokens,
            arrival_time=self.now(),
            stop_token_ids=params.stop_token_ids,
            request_id=request_id,
            num_samples=params.n,
            cache_salt=cache_salt,
        )
        self.scheduler.add(seq, validate=False)  # (checked above)
        self._next_request_id += 1
        self._requests[request_id] = RequestState(request_id, prompt, params, seq.arrival_time, seq.samples)
        self.sampler.add(request_id, params)  # cannot fail: SamplingParams checked the seed's range
        return request_id

    def _check_cache_salt(self, name: str, cache_salt: str | None) -> None:
        """A salt the allocator can take: None, or a non-empty str of bounded length."""
        if cache_salt is None:
            return
        cache_key(name, cache_salt)
        if not _takes_cache_salt(self.allocator):
            raise TypeError(
                f"{name} needs an allocator whose allocate() takes cache_salt=; "
                f"{type(self.allocator).__name__} does not"
            )

    def add_requests(
        self,
        prompts: Sequence[Sequence[int]],
        params: Sequence[SamplingParams],
        *,
        cache_salts: Sequence[str | None] | None = None,
    ) -> list[int]:
        """Queue several requests, all or nothing: every one's inputs are checked before the first
        is queued, and if the scheduler refuses one, those queued before it are withdrawn without a trace.
        ``cache_salts``: one :meth:`add_request` ``cache_salt`` per prompt (None: unsalted)."""
        self._refuse_if_busy("add_requests")
        if isinstance(params, SamplingParams) or len(params) != len(prompts):
            got = "one SamplingParams" if isinstance(params, SamplingParams) else f"{len(params)} sampling params"
            raise ValueError(f"add_requests needs one SamplingParams per prompt: {got} for {len(prompts)} prompts")
        if cache_salts is None:
            cache_salts = [None] * len(prompts)
        elif isinstance(cache_salts, str) or len(cache_salts) != len(prompts):
            got = "one str" if isinstance(cache_salts, str) else f"{len(cache_salts)} salts"
            raise ValueError(
                f"add_requests needs one cache salt (or None) per prompt: {got} for {len(prompts)} prompts"
            )
        checked = []
        for i, (p, sp, salt) in enumerate(zip(prompts, params, cache_salts, strict=True)):
            checked.append(check_inputs(p, sp, self.model.config.vocab_size))
            self._check_cache_salt(f"cache_salts[{i}]", salt)
        ids: list[int] = []
        try:
            for prompt, sp, salt in zip(checked, params, cache_salts):
                ids.append(self._queue(prompt, sp, salt))
        except Exception:
            for rid in ids:  # still waiting (no step ran): no block, no event, no output
                seq = next(s for s in self.scheduler.waiting if s.request_id == rid)
                self.scheduler.abort(seq)
                self.sampler.remove_request(rid, self._requests.pop(rid).params.n)
            self._next_request_id -= len(ids)
            raise
        return ids

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort_request(self, request_id: int, sample_index: int | None = None) -> RequestOutput | None:
        """Stop a live request (every sample, or only ``sample_index`` of an ``n > 1`` request).

        Its blocks are freed at once, its random streams dropped; what each aborted sample generated
        is kept, with ``finish_reason="abort"`` (``[]`` if aborted before the fork). Returns the
        :class:`RequestOutput` when this completes the request (the next :meth:`step` reports it
        too, so a loop over steps sees every request end), else ``None`` (a later step returns
        it). An unknown or finished request or sample raises ``ValueError``, changing nothing.

        Called back from inside a step or an abort (a subscriber of the allocator's block events),
        it is checked now and runs when that step or abort ends (returning ``None``; a later step
        reports the request): the scheduler is never changed under its own feet.
        """
        self._refuse_if_closed("abort_request")
        request = self._live_request(request_id)
        if self._busy:
            sample_index = request.samples.check_index(sample_index)
            self._deferred_aborts.append((request.request_id, sample_index))
            return None
        with self._critical():
            return self._abort(request, sample_index)

    def _abort(self, request: RequestState, sample_index: int | None) -> RequestOutput | None:
        i = request.samples.check_live(sample_index)
        now = self.now()
        for seq in request.samples.abort(i):  # none for a sample not forked yet
            self.scheduler.abort(seq)  # frees its blocks (or CPU blocks); finish_reason = "abort"
            seq.finish_time = now
        if self.runner.num_unapplied_block_ops:  # copies a failed step queued for it go with it
            self.phases.drop_dead_block_ops()
        if i is not None:  # (every stream of a request that ends is dropped by finish_request)
            self.sampler.remove(request.request_id, i)
        if not request.done:
            return None
        output = self.phases.finish_request(request)
        self._aborted_outputs.append(output)
        if self._subscribers:
            self._emit(output.metrics)
        return output

    @contextmanager
    def _critical(self):
        """Scheduler state changes here; engine calls from callbacks wait until it ends."""
        self._refuse_if_busy("Engine.step()")
        self._busy = True
        try:
            yield
        finally:
            self._busy = False
            while self._deferred_aborts:  # in the order asked for; a request done meanwhile needs none
                request_id, sample_index = self._deferred_aborts.pop(0)
                request = self._requests.get(request_id)
                if request is not None and not request.samples.has_ended(sample_index):
                    with self._critical():
                        self._abort(request, sample_index)

    def reset(self) -> list[RequestOutput]:
        """Back to an empty engine that serves: every live request aborted, the block copies still
        queued dropped, the step in flight (async scheduling) discarded, the prefix cache emptied
        (after a device fault its blocks' K/V may not be what their hashes say). Returns the requests
        it ended (``finish_reason="abort"``, as :meth:`abort_request` gives them), and those finished
        but not yet reported. The recovery from a :class:`StepFailed` that names no request."""
        self._refuse_if_busy("reset()")
        unreported = self.overlap.discard() if self.overlap is not None else []
        with self._critical():
            for request in list(self._requests.values()):
                self._abort(request, None)
            self.runner.keep_block_ops(lambda kind, src, dst: False)
            reset_prefix_cache = getattr(self.allocator, "reset_prefix_cache", None)
            if reset_prefix_cache is not None:
                reset_prefix_cache()
        if self._timeline is not None:
            self._timeline.discard()
        return unreported + self._take_aborted()

    # -- giving the memory back ------------------------------------------------------------------
    def close(self) -> None:
        """Give the engine's memory back now: the KV cache, the CUDA graphs and their pools, the pinned
        staging buffers. Live requests are aborted (their blocks freed on the allocator, which may be a
        learner's); counters, :meth:`stats` and the timeline stay readable; every call that would run
        the engine raises. ``with Engine(...) as engine:`` closes it at the end of the block. Closing
        twice does nothing.

        An engine dropped without ``close()`` frees the same memory as soon as its last reference goes
        (nothing in it points back at it: no ``gc.collect()`` needed); ``close()`` does it at a known
        point, whoever still holds the engine. The memory returns to torch's caching allocator, where
        the next engine's pool finds it (:func:`~paged_edu.cache.sizing.check_blocks_fit` counts it)."""
        if self._closed:
            return
        self._refuse_if_busy("close()")
        if self.overlap is not None:
            self.overlap.discard()
        with self._critical():
            for request in list(self._requests.values()):
                self._abort(request, None)
        self._aborted_outputs.clear()
        self._subscribers.clear()  # a callback that holds the engine would keep it alive (a cycle)
        self._closed = True
        self.runner.release()
        self.phases.release()
        self.kv_cache = None

    def __enter__(self) -> Engine:
        self._refuse_if_closed("with Engine(...)")
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return False

    @property
    def closed(self) -> bool:
        return self._closed

    def _refuse_if_closed(self, call: str) -> None:
        if self._closed:
            raise RuntimeError(f"{call}: this engine is closed (Engine.close() gave its memory back); build a new one")

    def _take_aborted(self) -> list[RequestOutput]:
        taken, self._aborted_outputs = self._aborted_outputs, []
        return taken

    def _live_request(self, request_id) -> RequestState:
        rid = as_int(request_id, "request_id must be an int")
        if rid in self._requests:
            return self._requests[rid]
        if 0 <= rid < self._next_request_id:
            raise ValueError(f"request {rid} already finished; there is nothing to abort")
        raise ValueError(f"unknown request id {rid} (ids so far: 0 .. {self._next_request_id - 1})")

    # -- one step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one iteration; return the requests that finished in it (and any that
        :meth:`abort_request` completed since the last step). If a block copy, the forward pass or
        sampling raises, the step is undone and :class:`StepFailed` says where (call again to retry)."""
        with self._critical():
            outputs, metrics = self._step()
        if metrics is not None:  # the step's state is committed: now tell the views (they may call back in)
            self._emit(metrics)
            for out in outputs:
                self._emit(out.metrics)
        return outputs

    @torch.inference_mode()
    def _step(self) -> tuple[list[RequestOutput], StepMetrics | None]:
        """One call's work: the phases of :mod:`~paged_edu.engine.step` in order (or one step ahead,
        :meth:`AsyncScheduling.step`); outputs aborted meanwhile first."""
        if self.overlap is not None:
            outputs, metrics = self.overlap.step()
            return self._take_aborted() + outputs, metrics
        p = self.phases
        p.begin()
        sched = p.schedule()  # 1. what runs this step
        if sched.is_empty:
            if self.scheduler.has_unfinished():
                raise p.stalled()
            return self._take_aborted(), None
        with p.undone_on_failure(sched):  # a raise from here: the step is undone, StepFailed names the phase
            step = p.launch(sched)  # 2.-4. block copies, prepare, the forward pass, the draw on the device
            tokens = p.wait(step)  # 4. the tokens on the host: the one wait for the device
        outputs, num_finished = p.update(step, tokens)  # 5. append, finish, free
        return self._take_aborted() + outputs, p.close(sched, num_finished)

    # -- offline batches: vLLM's LLM.generate / LLM.chat, over add_requests and step ------------
    def run(
        self,
        prompts: Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool | None = None,
    ) -> list[RequestOutput]:
        """Add every prompt, step until all are done; outputs in the order of ``prompts``.

        Nothing is queued unless every request is accepted (see :meth:`add_requests`).
        """
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        elif isinstance(sampling_params, (str, bytes)) or not isinstance(sampling_params, Sequence):
            raise TypeError(
                "sampling_params must be a SamplingParams, a list of them (one per prompt) or None, "
                f"got {type(sampling_params).__name__} {sampling_params!r}"
            )
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(f"{len(params_list)} sampling params for {len(prompts)} prompts")
        ids = self.add_requests(prompts, params_list)
        wanted = set(ids)
        results: dict[int, RequestOutput] = {}
        bar = None
        if len(prompts) >= 64 if use_tqdm is None else use_tqdm:
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
                    raise RuntimeError("the engine stopped with requests unfinished (one was aborted during the run?)")
        finally:
            if bar is not None:
                bar.close()
        return [results[i] for i in ids]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 32,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool | None = None,
    ) -> list[list[int]]:
        """New tokens for each prompt: greedy with ``max_new_tokens`` unless ``sampling_params`` say otherwise.

        One sample per prompt; for ``n > 1`` use :meth:`run`, which returns every sample.
        """
        if sampling_params is None:
            sampling_params = SamplingParams(max_tokens=max_new_tokens)
        params = [sampling_params] if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        if any(not isinstance(p, SamplingParams) for p in params):
            raise TypeError("sampling_params must be SamplingParams or a list of them")
        if any(p.n != 1 for p in params):
            raise ValueError("generate returns one sample per prompt; use Engine.run for n > 1")
        return [out.outputs[0] for out in self.run(prompts, sampling_params, use_tqdm=use_tqdm)]

    def chat(
        self, conversations, tokenizer, sampling_params: SamplingParams | None = None, *, max_new_tokens: int = 64
    ) -> list[str]:
        """Reply to chat conversations: apply the tokenizer's chat template, generate, decode.

        ``conversations`` is one conversation (a list of ``{"role", "content"}`` dicts) or a list of
        them; the tokenizer's end-of-sequence token stops a reply. Returns one string each.
        """
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        eos = tokenizer.eos_token_id
        if sampling_params is None:
            sampling_params = SamplingParams(
                max_tokens=max_new_tokens, stop_token_ids=(eos,) if eos is not None else ()
            )
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
        out.update(
            step=self.step_count,
            generated_tokens=self.num_generated_tokens,
            blocks_swapped_out=self.num_blocks_swapped_out,
            blocks_swapped_in=self.num_blocks_swapped_in,
            blocks_copied=self.num_blocks_copied,
            used_blocks=self.allocator.num_used_blocks,
            free_blocks=self.allocator.num_free_blocks,
        )
        return out

    def __repr__(self) -> str:
        a = self.allocator
        return (
            f"Engine(num_blocks={a.num_blocks}, block_size={a.block_size}, "
            f"prefix_caching={a.enable_prefix_caching}, preemption_mode={self.scheduler.preemption_mode!r}, "
            f"device={self.device}, dtype={self.model.dtype})"
        )


def _takes_cache_salt(allocator) -> bool:
    """Does ``allocator.allocate`` take ``cache_salt=`` (a learner's allocator may not)?"""
    try:
        parameters = inspect.signature(allocator.allocate).parameters
    except (TypeError, ValueError):
        return False
    return "cache_salt" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())

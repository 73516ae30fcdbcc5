"""Offline throughput: the paged engine against transformers ``generate`` with static batching.

    python benchmarks/bench_engine.py                 # on a GPU: every system (~15 min on an H200)
    python benchmarks/bench_engine.py --skip-cb-default --skip-static --skip-eager   # engine + CB with graphs (~5 min)
    python benchmarks/bench_engine.py --skip-peer --skip-static   # the engine alone (~1 min)
    python benchmarks/bench_engine.py --smoke         # a tiny run on a CPU, to check the script
    python benchmarks/bench_engine.py --workload nanovllm   # nano-vllm's benchmark, Qwen3-0.6B geometry (~2 min)
    python benchmarks/bench_engine.py --workload nanovllm --async-scheduling both   # + the host one step ahead

``--workload nanovllm`` is the second yardstick (:mod:`nanovllm_workload` quotes every source): the
256 requests of nano-vllm's ``bench.py`` (prompts and outputs of ``randint(100, 1024)`` tokens, ids
``randint(0, 10000)``, ``seed(0)``, ``ignore_eos``: 142,827 prompt and 133,966 output tokens) on a
random-weight model of Qwen3-0.6B's geometry (28 layers, 16 query / 8 KV heads of 128, hidden 1024,
tied head; Qwen3's qk-norm left out, its cost printed), the engine alone with CUDA graphs, a pool
that holds every sequence to its end (no preemption), and the share of the roofline of its own
steps it reaches, written to ``benchmarks/records/<card>/engine_bench_nanovllm.json``. For comparison, on an A800
(cosmoliu2002/nano-vllm-triton#1, vLLM 0.10.2): vLLM 8,588 tok/s (15.60 s), nano-vllm-triton 10,009
tok/s (13.38 s); the record prices the same steps on that GPU's twin in our table (A100 80GB) to
give each its share of the roofline beside ours.

Every system serves its requests once untimed before its timed run (the same requests: every shape
the timed run meets is compiled or captured before it), and the record counts what was still
compiled (Triton variants) or captured (CUDA graphs, in either system) inside the timed window. The
engine's runs are :mod:`paged_edu.labs.timed_run`'s, the timed run the speed ladder (``bench_ladder.py``)
makes too.

Peers, in the same process on the same requests, weights and KV budget: transformers' own
continuous batching (``ContinuousBatchingManager``, driven like ``generate_batch``; once with CUDA
graphs forced on, once with its defaults; ``--skip-peer``, ``--skip-cb-graphs``, ``--skip-cb-default``)
and its static-batch ``generate`` (``--skip-static``). The JSON is rewritten after every system, so
a run cut short keeps what finished.

Per engine run: useful tokens/s, the mean decode and mixed step against the roofline of the same
steps ("roofline (full efficiency, per-chunk shapes, LM head included)": ``CostModel.roofline()`` on
each step's exact chunks, :mod:`paged_edu.sim.costmodel`), the host time per step -- the
step's wall time minus the time the host waited for the device (``StepMetrics.device_wait``: the
copy of the sampled tokens, the step's one sync), so GPU time is excluded -- and the share of steps
that replayed a captured CUDA graph.

Workload: ``--num-requests`` ShareGPT-like requests (:func:`paged_edu.sim.workloads.sharegpt`: mean
161 prompt / 338 output tokens, prompt + output <= L_max = 2048), random token ids, every request
generating exactly its output length (no stop token). Model: SmolLM2-135M's geometry (30 layers,
9 query / 3 KV heads of 64) with random weights in bf16 -- the same weights for both systems.

The same KV budget: transformers with a contiguous cache must reserve ``L_max`` slots for each
sequence of a static batch (it cannot know the output lengths in advance), so a budget of
``M = b * L_max * M_KV(1)`` bytes runs batches of ``b``. The engine gets the same ``M`` as
``M / (B * M_KV(1))`` blocks and admits as many sequences as the blocks hold.

What is measured, on the same GPU in the same run:

* **throughput** -- useful output tokens per second (tokens past a request's own end, which a
  static batch computes and throws away, do not count). transformers runs static batches of
  ``b`` requests each to its longest output, in workload order; ``--hf-batches`` limits how many
  (the requests are i.i.d., so each batch is a fair sample) to fit the GPU time budget;
* **concurrency** -- sequences in the running batch: ``b`` for transformers, the peak and the
  step-average for the engine;
* **KV memory used by tokens** -- the fraction of the reserved KV slots that hold a live token:
  per step for the engine (tokens / allocated blocks' slots, and / the whole pool), per decode step
  for transformers (tokens / ``b * L_max``, and / the cache it really grows to,
  ``b * (longest prompt + step)``, padding and finished requests included).

Writes ``paged_edu/data/engine_bench.json`` (package data: lessons 5 and 7 read it) and
``figures/engine_bench.png`` (the README's figure) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from paged_edu.cache.sizing import dtype_name  # noqa: E402
from paged_edu.core.hardware import MODELS  # noqa: E402
from paged_edu.kernels.support import SKINNY_MAX_ROWS  # noqa: E402
from paged_edu.labs.batching import sharegpt_requests  # noqa: E402
from paged_edu.labs.card import this_card  # noqa: E402
from paged_edu.labs.timed_run import check_pool_fits, roofline_model, step_speed, timed_run, timeline_run  # noqa: E402
from paged_edu.models.config import LlamaConfig, smollm2_config  # noqa: E402
from paged_edu.models.llama import Kernels, PagedLlama  # noqa: E402
from paged_edu.models.loaders import random_hf_llama  # noqa: E402
from paged_edu.sim.arrivals import L_MAX  # noqa: E402
from engine_report import plot, report  # noqa: E402
from record import provenance, record_path  # noqa: E402
from hf_peers import FIRST_COMPARED, common_prefix, run_hf, run_hf_cb  # noqa: E402


# The smoke runs' model (here and in profile_engine.py --tiny): two layers, 4 query / 2 KV heads of 16.
TINY = LlamaConfig(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=L_MAX,
)


# ----------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------


def run_engine(
    model,
    prompts,
    outputs,
    num_blocks,
    block_size,
    max_num_seqs,
    max_num_batched_tokens,
    log,
    preemption_mode="recompute",
    cuda_graphs=None,
    impls=None,
    spec=None,
    max_model_len=None,
    temperature=0.0,
    roofline_gpus=(),
    async_scheduling=False,
    mixed_graphs=False,
    record_timeline=False,
):
    """Serve the requests twice, timing the second run (:func:`~paged_edu.labs.timed_run.timed_run`): the
    first, untimed, meets every shape the timed one meets (the schedule does not depend on timing), so
    Triton compiles none inside the timed window; the counters say so (``triton_variants_compiled_in_window``,
    ``graph_captures_in_window``: paged_edu captures its decode graphs when the engine is built).
    ``temperature``: every request's (0: greedy); ``spec``: the roofline's model (default SmolLM2-135M's
    row of the model table); ``roofline_gpus``: more GPUs to price the steps on
    (:func:`~paged_edu.labs.timed_run.step_speed`); ``async_scheduling``: the engine's option (the host one
    step ahead); ``mixed_graphs``: the engine's option (steps with prompt chunks in CUDA graphs);
    ``record_timeline``: a third run, after the timed one, with ``Engine(record_timeline=True)``
    (:func:`~paged_edu.labs.timed_run.timeline_run`: host and device per step, the GPU's idle gap between
    decode steps)."""
    engine_kwargs = dict(
        num_blocks=num_blocks,
        block_size=block_size,
        enable_prefix_caching=True,
        preemption_mode=preemption_mode,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        cuda_graphs=cuda_graphs,
        max_model_len=max_model_len,
        async_scheduling=async_scheduling,
        mixed_graphs=mixed_graphs,
        **(impls or {}),
    )
    run = timed_run(model, prompts, outputs, engine_kwargs, temperature=temperature, count_compiles_per_step=True)
    log(f"  engine warm-up on the same {len(prompts)} requests: {run.warmup_seconds:.1f} s")
    engine, steps, outs, dt, useful = run.engine, run.steps, run.outputs, run.seconds, run.useful_tokens
    window = dict(
        triton_variants_compiled_in_window=run.triton_variants_compiled_in_window,
        graph_captures_in_window=run.graph_captures_in_window,
    )
    if useful != sum(outputs):
        raise RuntimeError(f"the engine produced {useful} tokens, expected {sum(outputs)}")
    durations = run.durations
    running = np.array([s.num_running for s in steps])
    slots_used = np.array([s.num_used_blocks * block_size for s in steps])
    in_cache = np.array([s.num_tokens_in_cache for s in steps])
    decode_steps = run.decode
    w = durations / durations.sum()
    ttft = [o.metrics.ttft for o in outs]
    itl = [x for o in outs for x in o.metrics.inter_token_latencies]
    # Where a step's time goes (host wall time per phase; without sync_timing the GPU's work lands
    # in whichever phase waits for it first, usually "sample", which copies the tokens back).
    # (async scheduling: a call's "update" is the previous step's, so the first call has none)
    phase_names = list(dict.fromkeys(k for s in steps for k in s.phase_times))
    phase_ms = {k: float(np.mean([s.phase_times.get(k, 0.0) for s in steps]) * 1e3) for k in phase_names}
    decode_phase_ms = (
        {
            k: float(np.mean([s.phase_times.get(k, 0.0) for s, d in zip(steps, decode_steps) if d]) * 1e3)
            for k in phase_names
        }
        if decode_steps.any()
        else None
    )
    log(
        f"  engine{' (async scheduling)' if async_scheduling else ''}: {len(prompts)} requests, {len(steps)} steps, "
        f"{dt:.1f} s, {useful / dt:,.0f} tok/s, "
        f"peak {running.max()} running, {engine.scheduler.num_preemptions} preemptions, "
        f"{engine.num_graph_steps} graph steps, {engine.num_mixed_graph_steps} mixed-step graphs"
        + (f" (graphs failed: {engine.graph_error})" if engine.graph_error else "")
    )
    log("  mean step phases (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in phase_ms.items()))
    log(
        f"  in the timed window: {window['triton_variants_compiled_in_window']} Triton variants compiled, "
        f"{window['graph_captures_in_window']} CUDA graphs captured"
    )
    # A step that compiled a new Triton variant (a shape, stride or split count not seen before) pays
    # the compiler's time: step_speed counts them, and the mixed steps' mean without them.
    speed = step_speed(run, roofline_model(spec or MODELS["smollm2-135m"], device=model.device), roofline_gpus)
    log(
        f"  host ms/step (wall - device wait): {speed['host_ms_per_step']:.3f} (decode steps "
        f"{speed['host_ms_per_decode_step']:.3f}, at ~256 running {speed['host_ms_at_256_running']}); "
        f"decode step {speed['mean_decode_step_ms']} ms vs roofline {speed['roofline_decode_step_ms']} ms, "
        f"mixed {speed['mean_mixed_step_ms']} vs {speed['roofline_mixed_step_ms']} ms; steps that compiled a Triton "
        f"variant {speed['steps_that_compiled']} ({speed['mixed_steps_that_compiled']} mixed), mixed step without "
        f"them {speed['mean_mixed_step_ms_without_compiles']} ms"
    )
    log(
        "  decode steps by sequences decoded (step / host / device wait, ms): "
        + "; ".join(
            f"{r['num_seqs']}: {r['steps']} steps, {r['step_ms']} / {r['host_ms']} / {r['device_wait_ms']}"
            for r in speed["decode_by_concurrency"]
        )
    )
    engine.close()  # its pool back before the next engine is built (its counters stay readable)
    recorded = None
    if record_timeline:
        recorded = timeline_run(model, prompts, outputs, engine_kwargs, useful / dt, temperature=temperature)
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        log(
            f"  timeline run (record_timeline=True, untimed): per decode step host "
            f"{fmt(recorded['host_ms_per_decode_step'])} ms, device {fmt(recorded['device_ms_per_decode_step'])} ms; "
            f"GPU idle between decode steps (median) {fmt(recorded['gpu_idle_between_decode_steps_ms_median'])} ms "
            f"(target <= 0.1); {recorded['tokens_per_s']:,.0f} tok/s = "
            f"{recorded['tokens_per_s_vs_timed_run']:.3f} x the timed run's"
        )
    return dict(
        **speed,
        **window,
        recorded_timeline=recorded,
        gpu_idle_between_decode_steps_ms_median=recorded and recorded["gpu_idle_between_decode_steps_ms_median"],
        first_outputs=[o.outputs[0] for o in outs[:FIRST_COMPARED]],
        seconds=dt,
        useful_tokens=useful,
        tokens_per_s=useful / dt,
        num_requests=len(prompts),
        async_scheduling=async_scheduling,
        mixed_graphs=mixed_graphs,
        mixed_graph_steps=engine.num_mixed_graph_steps,
        num_sync_steps=engine.overlap.num_sync_steps if engine.overlap else len(steps),  # steps not run ahead
        num_steps=len(steps),
        peak_concurrency=int(running.max()),
        mean_concurrency=float((running * w).sum()),
        num_preemptions=engine.scheduler.num_preemptions,
        cuda_graph_steps=engine.num_graph_steps,
        cuda_graph_error=engine.graph_error,
        kv_use_vs_allocated=float((in_cache / np.maximum(slots_used, 1) * w).sum()),
        kv_use_vs_pool=float((in_cache / (num_blocks * block_size) * w).sum()),
        peak_kv_usage=float(max(s.kv_usage for s in steps)),
        share_of_steps_with_graph=engine.num_graph_steps / len(steps),
        mean_phase_ms=phase_ms,
        mean_decode_phase_ms=decode_phase_ms,
        ttft_p50=float(np.median(ttft)),
        ttft_p90=float(np.percentile(ttft, 90)),
        itl_p50_ms=float(np.median(itl) * 1e3) if itl else None,
        timeline=dict(
            time=[round(s.time - steps[0].time + steps[0].duration, 4) for s in steps][:: max(1, len(steps) // 400)],
            running=running.tolist()[:: max(1, len(steps) // 400)],
            kv_usage=[round(s.kv_usage, 4) for s in steps][:: max(1, len(steps) // 400)],
        ),
    )


@torch.inference_mode()
def check_kernels(model, device, block_size=16, require_cuda=True):
    """One mixed step (prompt chunks + decodes) through the Triton kernels and through the PyTorch
    references, on the same pool contents: the largest logit difference of each row kind."""
    from paged_edu.kernels import triton_available
    from paged_edu.engine.batch import BatchChunk, prepare_batch
    from paged_edu.cache.kv_cache import PagedKVCache

    if (require_cuda and device.type != "cuda") or not triton_available():
        return {}
    c = model.config
    gen = torch.Generator().manual_seed(0)
    lens = [1, 15, 16, 17, 100, 333]
    tables, pos, chunks = [], 0, []
    for n in lens:
        nb = -(-(n + 40) // block_size)
        tables.append(list(range(pos, pos + nb))[::-1])  # non-contiguous order
        pos += nb
    toks = [torch.randint(3, c.vocab_size, (n + 40,), generator=gen).tolist() for n in lens]
    result = {}
    for impl in ("torch", "auto"):
        kernels = Kernels(decode=impl, prefill=impl)
        cache = PagedKVCache(
            c.num_layers, pos, block_size, c.num_kv_heads, c.head_dim, dtype=model.dtype, device=device
        )
        kv = list(zip(cache.k_caches, cache.v_caches))
        model(
            prepare_batch([BatchChunk(t[:n], 0, tb) for t, n, tb in zip(toks, lens, tables)], block_size, device),
            kv,
            kernels,
        )
        # Next step: even sequences decode one token, odd ones prefill a 39-token chunk.
        chunks = [
            BatchChunk(t[n : n + (1 if i % 2 == 0 else 39)], n, tb)
            for i, (t, n, tb) in enumerate(zip(toks, lens, tables))
        ]
        batch = prepare_batch(chunks, block_size, device)
        hidden = model(batch, kv, kernels)
        result[impl] = model.compute_logits(hidden[batch.logits_rows]).float()
    diff = (result["auto"] - result["torch"]).abs().amax(-1)  # (num_chunks,)
    scale = result["torch"].abs().amax().item()
    return dict(
        decode_max_abs_diff=float(diff[0::2].max()), prefill_max_abs_diff=float(diff[1::2].max()), logit_scale=scale
    )


def choose_impls(model, device, block_size, log, args) -> tuple[dict, dict]:
    """The kernel check (:func:`check_kernels`) and the engine's kernels: the PyTorch path for a Triton
    kernel whose logits disagree with it by more than 5 % of their scale; ``--gemm-impl``,
    ``--fuse-decode-store`` and ``--swiglu-gemm`` as the command line asks."""
    kernel_check = check_kernels(model, device, block_size)
    impls = {}
    if args.gemm_impl != "auto":
        impls["gemm_impl"] = args.gemm_impl
    if not args.fuse_decode_store:
        impls["fuse_decode_store"] = False
    if not args.swiglu_gemm:
        impls["swiglu_gemm"] = False
    if not args.pdl:
        impls["pdl"] = False
    if kernel_check:
        log(
            f"kernels vs PyTorch references (bf16 logits, scale {kernel_check['logit_scale']:.2f}): "
            f"decode max |diff| {kernel_check['decode_max_abs_diff']:.4f}, prefill {kernel_check['prefill_max_abs_diff']:.4f}"
        )
        tol = 0.05 * kernel_check["logit_scale"] + 0.05
        if kernel_check["prefill_max_abs_diff"] > tol:
            impls["prefill_impl"] = "torch"
            log("  the Triton prefill disagrees: the engine uses the PyTorch prefill path")
        if kernel_check["decode_max_abs_diff"] > tol:
            impls["attn_impl"] = "torch"
            log("  the Triton decode disagrees: the engine uses the PyTorch decode path")
    return kernel_check, impls


def run_engine_with_graphs(model, prompts, outputs, common, graphs, kw, log):
    """:func:`run_engine` with ``cuda_graphs=graphs`` and its timeline run; if that raises, again eagerly (and say so), so the
    run keeps its other numbers. Returns the result and the graphs setting that ran."""
    try:
        return run_engine(model, prompts, outputs, *common, cuda_graphs=graphs, record_timeline=True, **kw), graphs
    except Exception as exc:
        if graphs is False:
            raise
        import traceback

        traceback.print_exc()
        log(f"engine with CUDA graphs failed ({exc}); running eagerly")
        return run_engine(model, prompts, outputs, *common, cuda_graphs=False, record_timeline=True, **kw), False


def fits_or_exit(model, num_blocks: int, block_size: int, log) -> None:
    """Before anything runs: stop with the pool this run needs (blocks and bytes) if the device cannot
    hold it now (:func:`~paged_edu.labs.timed_run.check_pool_fits`; every engine of the run is closed
    before the next is built, so one pool at a time must fit)."""
    try:
        need = check_pool_fits(model, num_blocks, block_size)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    log(f"KV pool of one engine: {num_blocks:,} blocks = {need / 2**30:.2f} GiB; it fits (one engine at a time)")


def main_nanovllm(args, argv, log):
    """``--workload nanovllm``: nano-vllm's benchmark on Qwen3-0.6B's geometry, the engine alone, against
    the roofline of its own steps (:mod:`nanovllm_workload` holds the sources)."""
    import nanovllm_workload as nv

    from paged_edu.models.config import describe
    from paged_edu.models.loaders import random_llama
    from paged_edu.core.hardware import GPUS
    from paged_edu.sim.costmodel import ROOFLINE_NAME, CostModel

    if args.smoke:
        device, dtype = torch.device("cpu"), torch.float32
        # heads * head_dim = 128 != hidden_size = 64 and a tied head: the two things Qwen3-0.6B's geometry needs.
        config = replace(TINY, head_dim=32, max_position_embeddings=256)
        geometry = "tiny (heads * head_dim != hidden, tied embeddings)"
        prompts, outputs = nv.nanovllm_requests(
            num_seqs=args.num_requests or 6,
            min_len=5,
            max_input_len=40,
            max_output_len=24,
            max_token_id=config.vocab_size - 1,
            seed=args.seed,
        )
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --smoke for a CPU check")
        device, dtype = torch.device("cuda"), torch.bfloat16
        config = nv.qwen3_0_6b_config()
        geometry = "Qwen3-0.6B"
        prompts, outputs = nv.nanovllm_requests(num_seqs=args.num_requests or nv.NUM_SEQS, seed=args.seed)
    max_batched = args.max_num_batched_tokens or nv.MAX_NUM_BATCHED_TOKENS
    max_model_len = min(nv.MAX_MODEL_LEN, config.max_position_embeddings)
    torch.manual_seed(args.seed)
    model = random_llama(config, seed=args.seed, dtype=dtype, device=device)
    # The roofline's model, from the config; P checked against the weights the model really has.
    spec = config.geometry(dtype_name(dtype), name=f"{geometry} geometry, no qk-norm")
    # Every weight but the input embedding (a tied head shares it and is counted once, as the table's P).
    matmul_params = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("embed_tokens."))
    elem = torch.empty((), dtype=dtype).element_size()
    bytes_per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * elem
    # The pool: every sequence's prompt + output in blocks, plus one spare block each -- nothing is ever
    # preempted. (nano-vllm sizes its pool as gpu_memory_utilization = 0.9 of the GPU less the model.)
    B = args.block_size
    num_blocks = sum(-(-(len(p) + o) // B) for p, o in zip(prompts, outputs)) + len(prompts)
    card = this_card(device)  # the roofline's spec: this card's row of the GPU table (module docstring)
    nanovllm_pool_tokens = CostModel(model=spec, gpu=card.gpu).kv_capacity_tokens(nv.GPU_MEMORY_UTILIZATION)
    name = card.device_name
    log(f"device {device} ({name}), {dtype}, torch {torch.__version__}; roofline priced on the {card.label}")
    log(
        f"workload ({nv.WORKLOAD_SOURCE}): {len(prompts)} requests, {sum(map(len, prompts)):,} prompt / "
        f"{sum(outputs):,} output tokens, max total {max(len(p) + o for p, o in zip(prompts, outputs))}, "
        f"temperature {args.temperature}"
    )
    log(
        f"KV pool: {num_blocks:,} blocks of {B} = {num_blocks * B * bytes_per_token / 2**30:.2f} GiB (every sequence "
        f"to its end + 1 block each: no preemption; nano-vllm's 0.9 of the {card.gpu.label} would hold "
        f"~{nanovllm_pool_tokens:,} tokens)"
    )
    fits_or_exit(model, num_blocks, B, log)
    out = Path(
        args.out
        or (ROOT / "build" / "engine_bench_nanovllm_smoke" if args.smoke else record_path("engine_bench_nanovllm"))
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    result = dict(
        **provenance("bench_engine.py", argv),
        complete=False,
        **card.record(),  # device_name, and the GPU spec that priced the roofline (roofline_spec: how it was chosen)
        torch=torch.__version__,
        dtype=str(dtype).replace("torch.", ""),
        model=dict(
            geometry=geometry,
            source=nv.MODEL_SOURCE if not args.smoke else None,
            weights="random",
            config=describe(config),
            kv_bytes_per_token=bytes_per_token,
            matmul_params_counted=matmul_params,
            cost_model_spec=asdict(spec),
        ),
        workload=dict(
            source=nv.WORKLOAD_SOURCE,
            num_requests=len(prompts),
            prompt_tokens=sum(map(len, prompts)),
            output_tokens=sum(outputs),
            seed=args.seed,
            token_ids=f"0..{nv.MAX_TOKEN_ID if not args.smoke else config.vocab_size - 1} (Python's random.randint)",
            ignore_eos=True,
            temperature=args.temperature,
            max_model_len=max_model_len,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=max_batched,
        ),
        kv_budget=dict(
            num_blocks=num_blocks,
            block_size=B,
            tokens=num_blocks * B,
            bytes=num_blocks * B * bytes_per_token,
            rule="every sequence's prompt + output in blocks, plus one spare block each: nothing is preempted",
            nanovllm_default_pool_tokens=nanovllm_pool_tokens,  # on the roofline's card (roofline_gpu)
        ),
    )

    def save():
        out.with_suffix(".json").write_text(json.dumps(result, indent=1))

    kernel_check, impls = choose_impls(model, device, B, log, args)
    result.update(kernel_check=kernel_check, engine_impls=impls or "auto")
    graphs = None if device.type == "cuda" and not args.no_cuda_graphs else False
    common = (num_blocks, B, args.max_num_seqs, max_batched, log)
    kw = dict(
        impls=impls,
        spec=spec,
        max_model_len=max_model_len,
        temperature=args.temperature,
        roofline_gpus=(card.gpu, nv.PEER_GPU),
        mixed_graphs=args.mixed_graphs,
    )
    # --async-scheduling both: "engine" is the synchronous run, "engine_async_scheduling" the other.
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.async_scheduling]
    runs = {}
    for mode in modes:
        runs[mode], _ = run_engine_with_graphs(
            model, prompts, outputs, common, graphs, dict(kw, async_scheduling=mode), log
        )
    eng = result["engine"] = runs[modes[0]]
    if len(modes) > 1:
        result["engine_async_scheduling"] = runs[True]
    # The yardstick: useful tokens/s over the roofline's tokens/s for the same steps (both from this run).
    own = card.gpu.key  # this card's key in roofline_run_s_by_gpu ("measured" for a card not in the table)
    roofline_s = eng["roofline_run_s_by_gpu"][own]
    roofline_tps = eng["useful_tokens"] / roofline_s
    share = eng["tokens_per_s"] / roofline_tps
    peers = nv.peer_shares(eng["roofline_run_s_by_gpu"][nv.PEER_GPU])
    qk = nv.qk_norm_cost(config, sum(map(len, prompts)) + sum(outputs), elem, card.gpu.hbm_bandwidth)
    qk["unfused_share_of_roofline"] = qk["unfused_extra_s"] / roofline_s
    qk["note"] = (
        "Qwen3's q/k RMSNorm is omitted (PagedLlama has none): "
        f"{100 * qk['flops_share']:.2f} % of a token's matmul FLOPs, {qk['weight_values']:,} weights; as its own "
        f"kernel it would add {1e3 * qk['unfused_extra_s']:.1f} ms of HBM traffic at the roofline "
        f"({100 * qk['unfused_share_of_roofline']:.2f} % of it)"
    )
    result["model"]["qk_norm"] = qk
    result["yardstick"] = dict(
        roofline=ROOFLINE_NAME,
        roofline_gpu=card.gpu.name,
        roofline_spec=card.spec,
        peers_roofline_gpu=GPUS[nv.PEER_GPU].name,  # the cited peers' shares are priced on their card, not this one
        useful_tokens=eng["useful_tokens"],
        seconds=eng["seconds"],
        tokens_per_s=eng["tokens_per_s"],
        roofline_run_s=roofline_s,
        roofline_tokens_per_s=roofline_tps,
        share_of_roofline=share,
        target_share=0.6,
        peers=peers,
        peers_source=nv.PEER_SOURCE,
        meets_target=bool(share >= 0.6 and all(share > p["share_of_roofline"] for p in peers)),
        async_scheduling=eng["async_scheduling"],
    )
    if len(modes) > 1:  # the same yardstick for the async run (its own steps' roofline)
        a = runs[True]
        a_share = a["tokens_per_s"] * a["roofline_run_s_by_gpu"][own] / a["useful_tokens"]
        result["yardstick_async_scheduling"] = dict(
            tokens_per_s=a["tokens_per_s"],
            roofline_run_s=a["roofline_run_s_by_gpu"][own],
            share_of_roofline=a_share,
            meets_target=bool(a_share >= 0.6 and all(a_share > p["share_of_roofline"] for p in peers)),
            speedup_over_sync=a["tokens_per_s"] / eng["tokens_per_s"],
        )
    result["complete"] = True
    save()
    log(f"\n{qk['note']}")
    log(
        f"roofline: {ROOFLINE_NAME} on the {card.label}; the cited peers' shares on the "
        f"{card.names(GPUS[nv.PEER_GPU])}, their A800's twin in the table"
    )
    log("| system | GPU | useful tokens/s | roofline tokens/s | share of the roofline |")
    log("|---|---|---:|---:|---:|")
    for mode, run in runs.items():
        run_roofline_tps = run["useful_tokens"] / run["roofline_run_s_by_gpu"][own]
        log(
            f"| paged_edu Engine{', async scheduling' if mode else ''} | {name} | {run['tokens_per_s']:,.0f} | "
            f"{run_roofline_tps:,.0f} | {100 * run['tokens_per_s'] / run_roofline_tps:.1f} % |"
        )
    for p in peers:
        log(
            f"| {p['system']} (cited; roofline of the {GPUS[nv.PEER_GPU].label}) | {p['gpu']} | {p['tokens_per_s']:,.0f} | "
            f"{p['tokens_per_s'] / p['share_of_roofline']:,.0f} | {100 * p['share_of_roofline']:.1f} % |"
        )
    log(
        f"\n{eng['num_steps']} steps ({eng['num_decode_steps']} decode, {eng['num_mixed_steps']} mixed), "
        f"{eng['num_preemptions']} preemptions, {100 * eng['share_of_steps_with_graph']:.0f} % graph steps; decode step "
        f"{eng['mean_decode_step_ms']} ms vs roofline {eng['roofline_decode_step_ms']} ms; target >= 60 % and above "
        f"every peer: {'met' if result['yardstick']['meets_target'] else 'not met'}"
    )
    log(f"\nwrote {out.with_suffix('.json')}")
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--workload",
        choices=("sharegpt", "nanovllm"),
        default="sharegpt",
        help="sharegpt: the ShareGPT-like requests on SmolLM2-135M's geometry, with the transformers peers; "
        "nanovllm: nano-vllm's bench.py workload on Qwen3-0.6B's geometry, the engine alone",
    )
    ap.add_argument("--num-requests", type=int, default=None, help="default 512 (nanovllm: its 256)")
    ap.add_argument("--hf-batch", type=int, default=64, help="transformers' static batch; sets the KV budget")
    ap.add_argument("--hf-batches", type=int, default=1, help="how many static batches transformers runs")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="default 4096 (nanovllm: nano-vllm's 16384)"
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="nanovllm only: the requests' temperature (default 0, greedy, as the roofline counts no sampling; "
        "nano-vllm's bench.py samples at 0.6)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        help="the JSON record, without .json (default: paged_edu/data/engine_bench, the package "
        "data lessons 5 and 7 read; benchmarks/records/<card>/engine_bench_nanovllm with --workload nanovllm; "
        "build/engine_bench_smoke with --smoke)",
    )
    ap.add_argument("--figure", help="the PNG figure (default: figures/engine_bench.png; beside --out with --smoke)")
    ap.add_argument("--smoke", action="store_true", help="a tiny model and workload on the CPU")
    ap.add_argument("--no-cuda-graphs", action="store_true", help="eager decode steps only")
    ap.add_argument("--skip-eager", action="store_true", help="skip the eager run beside the CUDA-graph one")
    ap.add_argument(
        "--async-scheduling",
        nargs="?",
        const="on",
        default="off",
        choices=("off", "on", "both"),
        help="the engine's async_scheduling (the host one step ahead); 'both' (nanovllm only): a synchronous "
        "and an async run, both in the record and the table",
    )
    ap.add_argument("--mixed-graphs", action="store_true", help="the engine's mixed_graphs (steps with prompt chunks)")
    ap.add_argument(
        "--fuse-decode-store",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the engine's fuse_decode_store (default on): the decode kernel rotates and stores the new token itself",
    )
    ap.add_argument(
        "--swiglu-gemm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"the engine's swiglu_gemm (default on): gate_up and silu*mul in one skinny GEMM at <= {SKINNY_MAX_ROWS} rows",
    )
    ap.add_argument(
        "--pdl",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"the engine's pdl (default on): a step of <= {SKINNY_MAX_ROWS} rows launches its Triton kernels as "
        "programmatic dependents (Hopper)",
    )
    ap.add_argument(
        "--gemm-impl",
        choices=("auto", "torch", "triton"),
        default="auto",
        help=f"the engine's gemm_impl: the projections and LM head of decode batches of <= {SKINNY_MAX_ROWS} rows",
    )
    ap.add_argument("--skip-peer", action="store_true", help="skip transformers' continuous batching (both runs)")
    ap.add_argument("--skip-cb-graphs", action="store_true", help="skip transformers CB with CUDA graphs forced on")
    ap.add_argument("--skip-cb-default", action="store_true", help="skip transformers CB with its defaults")
    ap.add_argument("--cb-requests", type=int, default=None, help="serve only the first N requests to transformers CB")
    ap.add_argument(
        "--cb-short-warm-up",
        action="store_true",
        help="warm transformers CB with 8 short requests, not the timed requests (it may then capture graphs "
        "inside its timed window: graph_captures_in_window says how many)",
    )
    ap.add_argument("--skip-static", action="store_true", help="skip transformers' static-batch generate")
    args = ap.parse_args(argv)

    def log(msg):
        print(msg, flush=True)

    if args.workload == "nanovllm":
        return main_nanovllm(args, argv, log)
    if args.temperature:
        ap.error("--temperature is for --workload nanovllm (the default workload compares greedy tokens)")
    if args.async_scheduling == "both":
        ap.error("--async-scheduling both is for --workload nanovllm; use --async-scheduling (on) here")
    args.num_requests = 512 if args.num_requests is None else args.num_requests
    args.max_num_batched_tokens = 4096 if args.max_num_batched_tokens is None else args.max_num_batched_tokens

    if args.smoke:
        device, dtype = torch.device("cpu"), torch.float32
        config = TINY
        scale = 0.1
        args.num_requests, args.hf_batch = min(args.num_requests, 24), min(args.hf_batch, 8)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --smoke for a CPU check")
        device, dtype = torch.device("cuda"), torch.bfloat16
        config = smollm2_config()
        scale = 1.0
    torch.manual_seed(args.seed)
    hf = random_hf_llama(config, seed=args.seed, dtype=dtype, device=device, eos_token_id=None, pad_token_id=0)
    hf.generation_config.eos_token_id = None
    model = PagedLlama.from_hf(hf)
    l_max = int(round(L_MAX * scale))
    prompts, outputs = sharegpt_requests(args.num_requests, args.seed, config.vocab_size, scale)
    bytes_per_token = (
        2 * config.num_layers * config.num_kv_heads * config.head_dim * torch.empty((), dtype=dtype).element_size()
    )
    budget_tokens = args.hf_batch * l_max
    num_blocks = budget_tokens // args.block_size
    log(
        f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else platform.processor()}), "
        f"{dtype}, torch {torch.__version__}"
    )
    log(
        f"workload: {len(prompts)} requests, mean prompt {np.mean([len(p) for p in prompts]):.1f}, "
        f"mean output {np.mean(outputs):.1f}, max total {max(len(p) + o for p, o in zip(prompts, outputs))}"
    )
    log(
        f"KV budget: {args.hf_batch} x L_max {l_max} = {budget_tokens:,} tokens = "
        f"{budget_tokens * bytes_per_token / 2**30:.2f} GiB = {num_blocks} blocks of {args.block_size}"
    )
    fits_or_exit(model, num_blocks, args.block_size, log)
    import transformers

    out = Path(
        args.out
        or (ROOT / "build" / "engine_bench_smoke" if args.smoke else ROOT / "paged_edu" / "data" / "engine_bench")
    )
    figure_path = Path(
        args.figure or (out.with_suffix(".png") if args.smoke else ROOT / "figures" / "engine_bench.png")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    result = dict(
        **provenance("bench_engine.py", argv),
        complete=False,
        **this_card(device).record(),  # device_name, and the GPU spec that priced the roofline
        torch=torch.__version__,
        transformers_version=transformers.__version__,
        dtype=str(dtype).replace("torch.", ""),
        model=dict(
            geometry="SmolLM2-135M" if not args.smoke else "tiny",
            weights="random",
            num_layers=config.num_layers,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            kv_bytes_per_token=bytes_per_token,
        ),
        workload=dict(
            num_requests=len(prompts),
            mean_prompt=float(np.mean([len(p) for p in prompts])),
            mean_output=float(np.mean(outputs)),
            l_max=l_max,
            seed=args.seed,
            source="paged_edu.sim.workloads.sharegpt",
        ),
        kv_budget=dict(
            tokens=budget_tokens,
            bytes=budget_tokens * bytes_per_token,
            num_blocks=num_blocks,
            block_size=args.block_size,
            hf_batch=args.hf_batch,
        ),
    )

    def save():  # after every system: a run cut short keeps what finished
        out.with_suffix(".json").write_text(json.dumps(result, indent=1))

    kernel_check, impls = choose_impls(model, device, args.block_size, log, args)
    result.update(kernel_check=kernel_check, engine_impls=impls or "auto")
    graphs = None if device.type == "cuda" and not args.no_cuda_graphs else False
    common = (num_blocks, args.block_size, args.max_num_seqs, args.max_num_batched_tokens, log)
    # The roofline's model: SmolLM2-135M's row of the model table; the smoke run's tiny model from its config.
    kw = dict(
        impls=impls,
        spec=config.geometry(dtype_name(dtype)) if args.smoke else None,
        async_scheduling=args.async_scheduling == "on",
        mixed_graphs=args.mixed_graphs,
    )
    eng, graphs = run_engine_with_graphs(model, prompts, outputs, common, graphs, kw, log)
    result["engine"] = eng
    save()

    # transformers' continuous batching: same requests, weights, KV budget (blocks of 16) and limits.
    n_cb = len(prompts) if args.cb_requests is None else min(args.cb_requests, len(prompts))
    cb_runs = (
        []
        if args.skip_peer
        else (
            [("transformers_cb_graphs", True)] * (not args.skip_cb_graphs)
            + [("transformers_cb_default", None)] * (not args.skip_cb_default)
        )
    )
    for name, use_graph in cb_runs:
        try:
            res = run_hf_cb(
                hf,
                prompts[:n_cb],
                outputs[:n_cb],
                num_blocks,
                args.block_size,
                args.max_num_batched_tokens,
                args.max_num_seqs,
                use_graph,
                log,
                warm_same=not args.cb_short_warm_up,
            )
            res["common_prefix_with_engine"] = [
                common_prefix(a, b) for a, b in zip(res["first_outputs"], eng["first_outputs"])
            ]
            res["compared_lengths"] = [len(b) for b in eng["first_outputs"]]
            if n_cb < len(prompts):  # the engine on the same subset, for a like-for-like ratio
                sub = result.get("engine_on_cb_requests") or run_engine(
                    model, prompts[:n_cb], outputs[:n_cb], *common, cuda_graphs=graphs, **kw
                )
                sub.pop("timeline", None)
                result["engine_on_cb_requests"] = sub
                res["engine_speedup"] = sub["tokens_per_s"] / res["tokens_per_s"]
            else:
                res["engine_speedup"] = eng["tokens_per_s"] / res["tokens_per_s"]
            log(
                f"  engine / transformers CB: {res['engine_speedup']:.1f}x; greedy tokens in common with the engine "
                f"(first {FIRST_COMPARED} requests): {res['common_prefix_with_engine']}"
            )
        except Exception as exc:  # a peer that breaks must not lose the engine's numbers
            import traceback

            traceback.print_exc()
            res = dict(error=f"{type(exc).__name__}: {exc}")
        result[name] = res
        save()

    n_hf = min(len(prompts), args.hf_batch * args.hf_batches)
    eng_eager = None
    if device.type == "cuda" and graphs is None and not args.skip_eager:
        eng_eager = run_engine(model, prompts[:n_hf], outputs[:n_hf], *common, cuda_graphs=False, **kw)
        eng_eager.pop("timeline")
        result["engine_eager_on_hf_requests"] = eng_eager
        save()
    hf_res = eng_same = None
    if not args.skip_static:
        eng_same = run_engine(model, prompts[:n_hf], outputs[:n_hf], *common, cuda_graphs=graphs, **kw)
        eng_same.pop("timeline")
        result["engine_on_hf_requests"] = eng_same
        save()
        hf_res = run_hf(hf, prompts, outputs, args.hf_batch, args.hf_batches, l_max, device, log)
        result.update(  # like for like only: the engine on the requests generate served
            transformers=hf_res,
            speedup_same_requests=eng_same["tokens_per_s"] / hf_res["tokens_per_s"],
            concurrency_ratio=eng["peak_concurrency"] / hf_res["concurrency"],
            mean_concurrency_ratio=eng["mean_concurrency"] / hf_res["concurrency"],
        )
    result["complete"] = True
    save()
    if hf_res is not None:
        try:
            plot(result, figure_path)
        except ImportError as exc:  # the figure is optional; the JSON holds every number
            log(f"no figure ({exc}); pip install matplotlib")
    report(result, args, log)
    log(f"\nwrote {out.with_suffix('.json')}")
    return result


if __name__ == "__main__":
    main()

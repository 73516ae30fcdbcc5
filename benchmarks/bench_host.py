"""Host time per engine step, with the GPU taken out: the real scheduler, allocator and runner
around a stub model that returns at once.

    python benchmarks/bench_host.py                    # 256 running sequences, 200 decode steps
    python benchmarks/bench_host.py --running 512 --profile
    python benchmarks/bench_host.py --async-scheduling    # the engine's host one step ahead
    python benchmarks/bench_host.py --workload sharegpt --graph-path --async-scheduling   # the real schedule

The prompts' lengths are staggered (``prompt_len - i % 16`` tokens: 142 .. 157), so that every step
1 sequence in ``B = 16`` completes a block -- as in serving, where lengths differ -- and the median step
pays for publishing those blocks and for their new block ids. (Until host8 every prompt had 157
tokens: every sequence completed a block in the same step, one step in 16, and the median step, the
figure this benchmark reports, published none; ``--same-length`` still runs that.)

The pool holds every sequence to its last token (``pool_blocks``), so no timed step preempts at
any ``--running``. Writes its record (the command, the commit, the machine) to
``benchmarks/records/<card>/host_bench.json`` unless ``--out`` says otherwise.

Every step of :meth:`Engine.step` except the model's kernels runs as in serving: scheduling,
block-table appends, batch preparation, sampling bookkeeping, ``update``. The stub's forward
returns zeros and its logits are a small fixed table, so what is timed is the host's share of a
step -- the part issue 14 bounds by 0.5 ms at 256 running sequences. On a CPU the "device" is the
CPU, so the runner's copies are memcpys; on a GPU the same script times the host side of real
launches (with the model stubbed the GPU does almost nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)  # the host's work is single-threaded Python; keep torch's CPU kernels from competing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from paged_edu.engine import Engine, StepMetrics  # noqa: E402
from paged_edu.engine.cuda_graphs import DecodeCudaGraphs, MixedCudaGraphs  # noqa: E402
from paged_edu.engine.sampling import SamplingParams  # noqa: E402
from paged_edu.labs.batching import sharegpt_requests  # noqa: E402
from paged_edu.labs.timed_run import by_concurrency, mean_ms, near_running  # noqa: E402
from paged_edu.labs.timing import frozen_heap  # noqa: E402
from paged_edu.models.config import smollm2_config  # noqa: E402
from paged_edu.models.config import LlamaConfig  # noqa: E402
from paged_edu.models.llama import PagedLlama  # noqa: E402
from record import provenance, record_path  # noqa: E402


def stub_model(device: str = "cpu", vocab: int = 16) -> PagedLlama:
    """A 1-layer PagedLlama whose forward and logits do (almost) nothing."""
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=64,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
    )
    model = PagedLlama(cfg, device=device)
    logits_table = torch.randn(vocab, generator=torch.Generator().manual_seed(0)).to(device)

    def forward(batch, kv_caches, kernels=None):  # (T, hidden) zeros: no kernels worth the name
        return torch.zeros(batch.input_ids.shape[0], cfg.hidden_size, device=device)

    def compute_logits(hidden, kernels=None):  # (N, vocab): the same row for every sequence (a view)
        return logits_table.expand(hidden.shape[0], vocab)

    model.forward = forward
    model.compute_logits = compute_logits
    model.greedy_token = int(logits_table.argmax())  # what greedy sampling draws from these logits: 13
    return model


class StubGraphs(DecodeCudaGraphs):
    """The CUDA-graph path's host side on any device: the runner stages every pure-decode step into
    the static buffers as for a real graph; the "replay" returns fixed outputs at once: zero hidden
    states and, for every sequence, the token greedy sampling draws from the stub's logits (the eager
    path's token). Not token 0: until host8 the replay drew 0 for every sequence, an id a real model
    rarely samples (SmolLM2's ``<|endoftext|>``) and one that sends the allocator's id check
    (:func:`~paged_edu.core.validation.token_array`: a 0 or a 1 may be a bool) down its slow path --
    1.13 against 0.68 us a call of 16 ids on this CPU."""

    def __init__(self, model, max_batch_size: int, max_blocks_per_seq: int) -> None:
        super().__init__(model, None, max_batch_size, max_blocks_per_seq, capture_graphs=False)
        device = model.device
        self.outputs = {
            b: (
                torch.zeros(b, model.config.hidden_size, device=device),
                torch.full((b,), model.greedy_token, dtype=torch.long, device=device),
            )
            for b in self.sizes
        }

    def replay(self, bs: int):
        return self.outputs[bs]


class StubMixedGraphs(MixedCudaGraphs):
    """The mixed-step graphs' host side on any device: the runner stages every step with a prompt chunk
    into their static buffers as for a real graph; the "replay" returns fixed hidden states at once."""

    def __init__(self, model, max_num_tokens: int, max_num_seqs: int, max_blocks_per_seq: int) -> None:
        super().__init__(model, None, max_num_tokens, max_num_seqs, max_blocks_per_seq, capture_graphs=False)
        self.hidden = torch.zeros(max_num_tokens, model.config.hidden_size, device=model.device)

    def replay(self, key: tuple[int, int]):
        return self.hidden[: key[0]]


BLOCK_SIZE = 16
EXTRA_TOKENS = 64  # each request may generate this many tokens past the timed steps (the prefill steps' tokens)


def pool_blocks(running: int, steps: int, prompt_len: int) -> int:
    """Blocks that hold ``running`` sequences of ``prompt_len + steps + EXTRA_TOKENS`` tokens each: a
    pool that never preempts (8,192 blocks, the engine benchmark's pool, preempted at 512 running)."""
    return running * -(-(prompt_len + steps + EXTRA_TOKENS) // BLOCK_SIZE)


def measure(
    running: int = 256,
    steps: int = 200,
    prompt_len: int = 157,
    device: str = "cpu",
    temperature: float = 0.0,
    profile: bool = False,
    graph_path: bool = False,
    async_scheduling: bool = False,
    same_length: bool = False,
) -> dict:
    model = stub_model(device)
    num_blocks = pool_blocks(running, steps, prompt_len)
    max_model_len = prompt_len + steps + EXTRA_TOKENS
    engine = Engine(
        model,
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        max_num_seqs=running,
        max_num_batched_tokens=4096,
        cuda_graphs=False,
        async_scheduling=async_scheduling,
    )
    if graph_path:
        engine.runner.graphs = StubGraphs(model, running, max(2048, max_model_len) // BLOCK_SIZE)
    rng = np.random.default_rng(0)
    for i in range(running):
        engine.add_request(
            rng.integers(3, 16, size=prompt_len if same_length else prompt_len - i % BLOCK_SIZE).tolist(),
            SamplingParams(max_tokens=steps + EXTRA_TOKENS, temperature=temperature, seed=1 if temperature else None),
        )
    events: list[StepMetrics] = []
    engine.subscribe(lambda e: events.append(e) if isinstance(e, StepMetrics) else None)
    while any(e.num_prefill_tokens for e in events[-1:]) or not events:  # admit and prefill everyone
        engine.step()
    events.clear()
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t0)
    if prof is not None:
        prof.disable()
        import pstats

        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    if not all(e.num_decode_seqs == running and not e.num_preempted for e in events):
        raise RuntimeError(
            "a timed step did not decode every sequence (preempted?): the timing would be of a smaller batch"
        )
    # Medians: this measures the host, and a shared CPU adds long stalls that are not the engine's.
    phases = {k: float(np.median([e.phase_times[k] for e in events]) * 1e3) for k in events[0].phase_times}
    return dict(
        running=running,
        steps=steps,
        graph_path=graph_path,
        async_scheduling=async_scheduling,
        same_length=same_length,
        temperature=temperature,
        num_blocks=num_blocks,
        ms_per_step=float(np.median(walls) * 1e3),
        mean_ms_per_step=float(np.mean(walls) * 1e3),
        phase_ms=phases,
        torch=torch.__version__,
        device=device,
    )


def server_engine(model, async_scheduling: bool, graph_path: bool, mixed_graphs: bool = False, **settings) -> Engine:
    """An engine at the server's settings (``max_num_seqs`` 512, ``max_num_batched_tokens`` 4096, prefix
    caching; ``bench_engine``'s pool of 8,192 blocks) over the stub ``model``; ``graph_path``: decode steps
    staged as for their CUDA graphs, ``mixed_graphs``: steps with prompt chunks too (stub replays)."""
    engine = Engine(
        model,
        num_blocks=8192,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=True,
        max_num_seqs=512,
        max_num_batched_tokens=4096,
        cuda_graphs=False,
        async_scheduling=async_scheduling,
        **settings,
    )
    if graph_path:
        engine.runner.graphs = StubGraphs(model, 512, 2048 // BLOCK_SIZE)
    if mixed_graphs:
        engine.runner.mixed_graphs = StubMixedGraphs(model, 4096, 512, 2048 // BLOCK_SIZE)
    return engine


def measure_sharegpt(
    num_requests: int = 512,
    seed: int = 0,
    device: str = "cpu",
    profile: bool = False,
    graph_path: bool = False,
    async_scheduling: bool = False,
) -> dict:
    """Host time of every step of ``bench_engine``'s workload (module docstring), by concurrency."""
    vocab = smollm2_config().vocab_size  # the benchmark's token ids, unchanged
    model = stub_model(device, vocab=vocab)
    prompts, outputs = sharegpt_requests(num_requests, seed, vocab)
    engine = server_engine(model, async_scheduling, graph_path)
    events: list[StepMetrics] = []
    engine.subscribe(lambda e: events.append(e) if isinstance(e, StepMetrics) and e.num_batched_tokens else None)
    prof = None
    with frozen_heap():  # as the engine benchmark's timed window (paged_edu.labs.timed_run)
        for p, o in zip(prompts, outputs):
            engine.add_request(p, SamplingParams(max_tokens=o))
        if profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        while engine.has_unfinished():
            engine.step()
        if prof is not None:
            prof.disable()
    if prof is not None:
        import pstats

        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    # Host time as bench_engine counts it (paged_edu.labs.timed_run.step_speed): a call's wall time less
    # its wait for the device -- with the stub, almost all of it
    host = np.array([e.duration - e.device_wait for e in events])  # (steps,) seconds
    decode = np.array([e.num_prefill_tokens == 0 for e in events])
    running = np.array([e.num_running for e in events])
    near = decode & near_running(running)
    return dict(
        workload=f"bench_engine's {num_requests} ShareGPT-like requests (seed {seed})",
        graph_path=graph_path,
        async_scheduling=async_scheduling,
        num_steps=len(events),
        num_decode_steps=int(decode.sum()),
        num_generated_tokens=engine.num_generated_tokens,  # the requests' output lengths, summed, when all went well
        host_s=round(float(host.sum()), 4),
        host_ms_per_decode_step=mean_ms(host, decode),
        host_ms_at_256_running=mean_ms(host, near),
        # medians too: on a shared CPU a mean is mostly other processes' stalls (an A/B reads these)
        host_ms_p50_per_decode_step=median_ms(host, decode),
        host_ms_p50_at_256_running=median_ms(host, near),
        num_steps_near_256_running=int(near.sum()),
        host_ms_per_mixed_step=mean_ms(host, ~decode),
        host_ms_decode_p50_max=[round(float(np.percentile(host[decode], q)) * 1e3, 4) for q in (50, 100)],
        decode_by_concurrency=by_concurrency(np.array([e.num_decode_seqs for e in events]), decode, host=host),
        torch=torch.__version__,
        device=device,
    )


def measure_lone(
    prompt_lens: tuple[int, ...] = (16, 96, 256),
    repeat: int = 200,
    device: str = "cpu",
    profile: bool = False,
    async_scheduling: bool = True,
) -> dict:
    """A lone prompt of ``L`` tokens on an otherwise idle engine, ``repeat`` times per length, as
    ``bench_ttft.py`` runs them on a GPU: the server's settings (``max_num_seqs`` 512,
    ``max_num_batched_tokens`` 4096, prefix caching, 2048-token tables), both kinds of graph staged
    (stub replays), fresh token ids each time (no prefix hit). Per length, medians of the host's time
    in ``add_request``, in each phase of the call that runs the prompt step (``schedule`` and
    ``prepare`` come before its launch; ``sample`` holds the read of its token, ``update`` the
    bookkeeping after it), and the call's wall time. Each request then decodes one token (max_tokens 2)."""
    vocab = smollm2_config().vocab_size
    model = stub_model(device, vocab=vocab)
    engine = server_engine(model, async_scheduling, graph_path=True, mixed_graphs=True, max_model_len=2048)
    events: list[StepMetrics] = []
    engine.subscribe(lambda e: events.append(e) if isinstance(e, StepMetrics) else None)
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=2)
    rows = {}
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    for L in prompt_lens:
        adds, calls, phases = [], [], []
        for i in range(repeat + 5):  # the first 5: warm-up
            prompt = rng.integers(3, vocab, size=L).tolist()
            events.clear()
            if prof is not None and i >= 5:
                prof.enable()
            t0 = time.perf_counter()
            engine.add_request(prompt, params)
            t1 = time.perf_counter()
            engine.step()  # the prompt step, read before it returns (async: "from idle")
            t2 = time.perf_counter()
            if prof is not None:
                prof.disable()
            while engine.has_unfinished():
                engine.step()
            if i >= 5:
                if events[0].num_prefill_tokens != L:
                    raise RuntimeError(f"the first step ran {events[0].num_prefill_tokens} prompt tokens, not {L}")
                adds.append(t1 - t0)
                calls.append(t2 - t1)
                phases.append(events[0].phase_times)
        rows[L] = dict(
            add_request_ms=round(float(np.median(adds)) * 1e3, 4),
            prompt_call_ms=round(float(np.median(calls)) * 1e3, 4),
            phase_ms={k: round(float(np.median([p[k] for p in phases])) * 1e3, 4) for k in phases[0]},
        )
    if prof is not None:
        import pstats

        pstats.Stats(prof).sort_stats("cumulative").print_stats(60)
    return dict(
        workload=f"lone prompts of {list(prompt_lens)} tokens on an idle engine, {repeat} each",
        async_scheduling=async_scheduling,
        by_prompt_len=rows,
        torch=torch.__version__,
        device=device,
    )


def median_ms(seconds: np.ndarray, mask: np.ndarray) -> float | None:
    """The median of ``seconds[mask]`` in ms, rounded to 0.1 us; None when the mask selects nothing."""
    return round(float(np.median(seconds[mask]) * 1e3), 4) if mask.any() else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--workload",
        choices=("lockstep", "sharegpt", "lone"),
        default="lockstep",
        help="lockstep: --running sequences decoding in step; sharegpt: bench_engine's 512 requests, every step; "
        "lone: one prompt at a time on an idle engine (the server's settings, both graph kinds staged): "
        "the host's share of a time to first token",
    )
    ap.add_argument("--prompt-lens", default="16,96,256", help="lone: the prompt lengths, comma-separated")
    ap.add_argument("--repeat", type=int, default=200, help="lone: prompts per length")
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--profile", action="store_true", help="cProfile the timed steps")
    ap.add_argument("--graph-path", action="store_true", help="stage decode steps as for a CUDA graph (stub replay)")
    ap.add_argument(
        "--async-scheduling",
        action="store_true",
        help="Engine(async_scheduling=True): with the stub's instant device nothing is hidden, so this times "
        "the host's whole work per step in that mode (its bookkeeping included)",
    )
    ap.add_argument(
        "--same-length",
        action="store_true",
        help="lockstep: every prompt 157 tokens (before host8): all sequences complete a block in one "
        "step in 16, so the median step publishes none",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="write the record as JSON here ('' for none; default benchmarks/records/<card>/host_bench.json, "
        "host_bench_sharegpt.json with --workload sharegpt)",
    )
    args = ap.parse_args(argv)
    modes = dict(device=args.device, profile=args.profile, graph_path=args.graph_path)
    if args.workload == "lone":
        lens = tuple(int(x) for x in args.prompt_lens.split(","))
        res = measure_lone(lens, args.repeat, args.device, args.profile, args.async_scheduling)
        note, out = "medians; the CPU may be shared with other work", str(record_path("host_bench_lone.json"))
    elif args.workload == "sharegpt":
        res = measure_sharegpt(**modes, async_scheduling=args.async_scheduling)
        note, out = "the CPU may be shared with other work", str(record_path("host_bench_sharegpt.json"))
    else:
        res = measure(
            args.running,
            args.steps,
            temperature=args.temperature,
            **modes,
            async_scheduling=args.async_scheduling,
            same_length=args.same_length,
        )
        note, out = "medians; the CPU may be shared with other work", str(record_path("host_bench.json"))
    res = {**provenance("bench_host.py", argv, note=note), **res}
    if args.workload == "lone":
        print(f"{res['workload']}, async scheduling {res['async_scheduling']}: medians, ms")
        for L, r in res["by_prompt_len"].items():
            print(
                f"L={L:>4}: add_request {r['add_request_ms']:.4f}, prompt call {r['prompt_call_ms']:.4f} ("
                + ", ".join(f"{k} {v:.4f}" for k, v in r["phase_ms"].items())
                + ")"
            )
    elif args.workload == "sharegpt":
        print(
            f"{res['workload']}: {res['num_steps']} steps ({res['num_decode_steps']} decode), host {res['host_s']:.3f} s; "
            f"per decode step {res['host_ms_per_decode_step']:.3f} ms, at ~256 running "
            f"{res['host_ms_at_256_running']:.3f} ms ({res['num_steps_near_256_running']} steps); medians "
            f"{res['host_ms_p50_per_decode_step']:.3f} and {res['host_ms_p50_at_256_running']:.3f} ms"
        )
        print(f"{'sequences':>9} {'decode steps':>12} {'host ms':>8}")
        for r in res["decode_by_concurrency"]:
            print(f"{r['num_seqs']:>9} {r['steps']:>12} {r['host_ms']:>8.3f}")
    else:
        print(
            f"{res['running']} running, {res['steps']} decode steps: median {res['ms_per_step']:.3f} ms host per step "
            f"(mean {res['mean_ms_per_step']:.3f}); median phases (ms): "
            + ", ".join(f"{k} {v:.3f}" for k, v in res["phase_ms"].items())
        )
    out = out if args.out is None else args.out
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(res, indent=1))
        print(f"wrote {out}")
    return res


if __name__ == "__main__":
    main()

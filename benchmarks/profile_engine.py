"""torch.profiler over the first steps of the engine benchmark's workload: where a step's time goes.

    python benchmarks/profile_engine.py [--steps 22] [--num-requests 512]

The workload, model and pool of ``bench_engine.py`` (512 ShareGPT-like requests, SmolLM2-135M
geometry with random weights, 8,192 blocks of 16). The first steps are the mixed ones: every
request arrives at once, so each step carries 4,096 prompt tokens next to the decodes. One untimed
run of the same steps first (Triton compiles, cuBLAS heuristics), then the profiled run of a fresh
engine: per step its wall time and the time the host waited for the device, then the operators by
host (CPU) time and by device time. On a CPU the device columns are empty.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_engine import make_requests  # noqa: E402
from paged_edu.engine import Engine, StepMetrics  # noqa: E402
from paged_edu.engine.sampling import SamplingParams  # noqa: E402
from paged_edu.models.config import smollm2_config  # noqa: E402
from paged_edu.models.llama import PagedLlama  # noqa: E402
from paged_edu.models.loaders import random_hf_llama  # noqa: E402


def engine_on(model, prompts, outputs):
    engine = Engine(model, num_blocks=8192, block_size=16, enable_prefix_caching=True, max_num_seqs=512,
                    max_num_batched_tokens=4096)
    engine.add_requests(prompts, [SamplingParams(max_tokens=o) for o in outputs])
    return engine


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=22)
    ap.add_argument("--num-requests", type=int, default=512)
    ap.add_argument("--rows", type=int, default=25, help="operators listed per table")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = smollm2_config()
    model = PagedLlama.from_hf(random_hf_llama(config, seed=0, dtype=dtype, device=device, eos_token_id=None,
                                               pad_token_id=0))
    prompts, outputs = make_requests(args.num_requests, 0, config.vocab_size)
    warm = engine_on(model, prompts, outputs)
    for _ in range(args.steps):
        warm.step()
    del warm
    engine = engine_on(model, prompts, outputs)
    steps: list[StepMetrics] = []
    engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepMetrics) else None)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.steps):
            engine.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    print(f"{args.steps} steps in {time.perf_counter() - t0:.3f} s (profiler on)")
    for s in steps:
        print(f"step {s.step}: {s.num_prefill_tokens} prompt + {s.num_decode_seqs} decode tokens, "
              f"{s.duration * 1e3:.1f} ms, waited for the device {s.device_wait * 1e3:.1f} ms; "
              + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in s.phase_times.items()))
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    if device.type == "cuda":
        print(averages.table(sort_by="self_cuda_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()

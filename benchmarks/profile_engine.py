"""torch.profiler over the first steps of the engine benchmark's workload: where a step's time goes.

    python benchmarks/profile_engine.py --device cuda   # benchmarks/records/<card>/profile_engine.{txt,json}
    python benchmarks/profile_engine.py --device cuda --mixed-graphs --out benchmarks/records/h200/profile_engine_mixed_graphs
    python benchmarks/profile_engine.py --tiny --steps 3 --num-requests 8 --out /tmp/p   # a CPU check

The workload, model and pool of ``bench_engine.py`` (512 ShareGPT-like requests, SmolLM2-135M
geometry with random weights, 8,192 blocks of 16, 512 running, 4,096 batch tokens). The first steps
are the mixed ones: every request arrives at once, so each step carries 4,096 prompt tokens next to
the decodes. One untimed run of the same steps first (Triton compiles, cuBLAS heuristics), then the
profiled run of a fresh engine: per step its wall time, the time the host waited for the device, the
phases and the roofline of its exact chunks (``CostModel.roofline``); then the operators by host
(CPU) time and, on a GPU, by device time, and the number of kernels per step. ``--tiny``: a 2-layer
model and short requests, for a check on a CPU (the device columns are then empty).

Writes ``<out>.txt`` (the tables, to commit) and ``<out>.json`` (per-step numbers, the command, the
commit, the machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_engine import TINY  # noqa: E402
from paged_edu.labs.batching import sharegpt_requests  # noqa: E402
from paged_edu.cache.sizing import dtype_name  # noqa: E402
from paged_edu.core.hardware import MODELS  # noqa: E402
from paged_edu.labs.card import this_card  # noqa: E402
from paged_edu.engine import Engine, StepMetrics  # noqa: E402
from paged_edu.engine.sampling import SamplingParams  # noqa: E402
from paged_edu.labs.timing import compiled_variant_counter  # noqa: E402
from paged_edu.models.config import smollm2_config  # noqa: E402
from paged_edu.models.llama import PagedLlama  # noqa: E402
from paged_edu.models.loaders import random_hf_llama  # noqa: E402
from paged_edu.sim.costmodel import ROOFLINE_NAME, CostModel  # noqa: E402
from record import provenance, record_path  # noqa: E402


def engine_on(model, prompts, outputs, args):
    engine = Engine(
        model,
        num_blocks=args.num_blocks,
        block_size=16,
        enable_prefix_caching=True,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        mixed_graphs=args.mixed_graphs,
    )
    engine.add_requests(prompts, [SamplingParams(max_tokens=o) for o in outputs])
    return engine


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=22)
    ap.add_argument("--num-requests", type=int, default=512)
    ap.add_argument("--num-blocks", type=int, default=8192)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=25, help="operators listed per table")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model and requests a tenth as long (a CPU check)")
    ap.add_argument(
        "--mixed-graphs", action="store_true", help="the engine's mixed_graphs: the mixed steps in CUDA graphs"
    )
    ap.add_argument("--out", help="writes <out>.txt and <out>.json (default: benchmarks/records/<card>/profile_engine)")
    args = ap.parse_args(argv)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = TINY if args.tiny else smollm2_config()
    hf = random_hf_llama(config, seed=0, dtype=dtype, device=device, eos_token_id=None, pad_token_id=0)
    model = PagedLlama.from_hf(hf)
    del hf
    prompts, outputs = sharegpt_requests(args.num_requests, 0, config.vocab_size, 0.1 if args.tiny else 1.0)
    spec = config.geometry(dtype_name(dtype)) if args.tiny else MODELS["smollm2-135m"]
    card = this_card(device)  # the roofline's spec: this card's row of the GPU table (the H200's on a CPU)
    roofline = CostModel(model=spec, gpu=card.gpu).roofline()

    with engine_on(model, prompts, outputs, args) as warm:  # closed before the profiled engine's pool is made
        for _ in range(args.steps):
            warm.step()
    engine = engine_on(model, prompts, outputs, args)
    steps: list[StepMetrics] = []
    engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepMetrics) else None)
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    count_variants = compiled_variant_counter()
    variants_before = count_variants()
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.steps):
            engine.step()
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    compiled = count_variants() - variants_before

    lines = [
        f"{args.steps} steps of {'a tiny model' if args.tiny else 'SmolLM2-135M (random weights)'} on {device} "
        f"({str(dtype).replace('torch.', '')}), {args.num_requests} requests, in {wall:.3f} s with the profiler on; "
        f"Triton variants compiled while profiled: {compiled}; mixed_graphs={args.mixed_graphs}",
        f"roofline: {ROOFLINE_NAME}, on the {card.label}",
        "",
        "| step | prompt tokens | decodes | wall ms | device wait ms | roofline us | phases (ms) |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    rows = []
    for s in steps:
        roof = roofline.step_time(s.shape)
        rows.append(
            dict(
                step=s.step,
                prompt_tokens=s.num_prefill_tokens,
                decodes=s.num_decode_seqs,
                wall_ms=s.duration * 1e3,
                device_wait_ms=s.device_wait * 1e3,
                roofline_ms=roof * 1e3,
                phase_ms={k: v * 1e3 for k, v in s.phase_times.items()},
            )
        )
        lines.append(
            f"| {s.step} | {s.num_prefill_tokens} | {s.num_decode_seqs} | {s.duration * 1e3:.2f} | "
            f"{s.device_wait * 1e3:.2f} | {roof * 1e6:.1f} | "
            + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in s.phase_times.items())
            + " |"
        )
    averages = prof.key_averages()
    lines += [
        "",
        "Operators by host (self CPU) time:",
        averages.table(sort_by="self_cpu_time_total", row_limit=args.rows),
    ]
    kernels = None
    if cuda:
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels = len(events) / max(len(steps), 1)
        lines += [
            f"GPU kernels and copies per step: {kernels:.0f}",
            "",
            "Operators by device time:",
            averages.table(sort_by="self_device_time_total", row_limit=args.rows),
        ]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out) if args.out else record_path("profile_engine")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(text + "\n")
    record = dict(
        **provenance("profile_engine.py", argv),
        device=str(device),
        **card.record(),  # device_name, and the GPU spec that priced the roofline
        dtype=str(dtype).replace("torch.", ""),
        roofline=ROOFLINE_NAME,
        mixed_graphs=args.mixed_graphs,
        seconds_profiled=wall,
        triton_variants_compiled=compiled,
        device_events_per_step=kernels,
        steps=rows,
    )
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    print(f"wrote {out.with_suffix('.txt')} and {out.with_suffix('.json')}")
    return record


if __name__ == "__main__":
    main()

"""The speed ladder of lesson 9: the same requests on eager -> CUDA graphs -> fused kernels -> overlap ->
graphs for mixed steps (:mod:`paged_edu.labs.speed_ladder`), each rung an ``Engine`` option.

On a GPU (the default): ``--num-requests`` (256) ShareGPT-like requests on SmolLM2-135M's geometry with
random bf16 weights, a pool of 8,192 blocks of 16, 256 running and 4,096 batched tokens at most --
every rung warmed up on the same requests outside its timed window -- and writes
``paged_edu/data/speed_ladder_h200.json``, the record lesson 9 shows on a CPU. On a CPU
(``--device cpu``): a two-layer model and requests a tenth as long, only the rungs a CPU can run
(the others say why they were skipped), into ``build/speed_ladder_cpu.json``.

    python benchmarks/bench_ladder.py                                 # on the H200
    python benchmarks/bench_ladder.py --device cpu --num-requests 8   # the CPU check

Prints one row per rung: useful tokens/s, the mean decode step, its host / device split, the GPU's idle
gap between decode steps, the mixed step, and the roofline of the decode steps
(``roofline (full efficiency, per-chunk shapes, LM head included)`` on the card it runs on:
:func:`paged_edu.labs.card.this_card`, the H200's row on a CPU; the record says which).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from paged_edu.labs.speed_ladder import STORED_LADDER, ladder_setup, run_ladder, rung_table  # noqa: E402
from paged_edu.labs.card import this_card  # noqa: E402
from record import provenance  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"), help="auto: CUDA when there is one")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        help=f"the JSON record (default: paged_edu/data/{STORED_LADDER} on CUDA, build/speed_ladder_cpu.json on a CPU)",
    )
    args = ap.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --device cpu for a CPU check")
    setup = ladder_setup(device, args.num_requests, args.seed)
    model, prompts, outputs, engine_kwargs = (setup[k] for k in ("model", "prompts", "outputs", "engine_kwargs"))
    label, scale = setup["label"], setup["scale"]
    default_out = ROOT / ("paged_edu/data/" + STORED_LADDER if device.type == "cuda" else "build/speed_ladder_cpu.json")
    out = Path(args.out).with_suffix(".json") if args.out else default_out
    out.parent.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    card = this_card(device)  # the rungs' roofline: this card's row of the GPU table (the H200's on a CPU)
    name = card.device_name
    log(
        f"speed ladder on {name} (roofline on the {card.label}): {label}; {len(prompts)} requests, {sum(outputs):,} output tokens"
    )
    t0 = time.perf_counter()
    rungs = run_ladder(model, prompts, outputs, engine_kwargs, log=log)
    result = dict(
        **provenance("bench_ladder.py", argv),
        **card.record(),  # device_name, and the GPU spec that priced the rungs' roofline
        dtype=str(model.dtype).replace("torch.", ""),
        model=label,
        workload=dict(
            source="paged_edu.labs.speed_ladder.ladder_setup (paged_edu.labs.batching.sharegpt_requests)",
            num_requests=len(prompts),
            seed=args.seed,
            scale=scale,
            prompt_tokens=sum(map(len, prompts)),
            output_tokens=sum(outputs),
        ),
        engine_kwargs=engine_kwargs,
        seconds=time.perf_counter() - t0,
        rungs=rungs,
    )
    out.write_text(json.dumps(result, indent=1))
    log("")
    log(rung_table(rungs))
    log(f"\n{result['seconds']:.1f} s in all; wrote {out}")
    return result


if __name__ == "__main__":
    main()

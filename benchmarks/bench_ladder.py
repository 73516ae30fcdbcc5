"""The speed ladder of lesson 9: the same requests on eager -> CUDA graphs -> fused kernels -> overlap ->
graphs for mixed steps (:mod:`paged_edu.labs.speed_ladder`), each rung an ``Engine`` option.

On a GPU (the default): ``--num-requests`` (256) ShareGPT-like requests on SmolLM2-135M's geometry with
random bf16 weights, a pool of 8,192 blocks of 16, 256 running and 4,096 batched tokens at most --
every rung warmed up on the same requests outside its timed window -- then, on each rung's engine, decode
steps probed at ``--probe-batches`` (``probe_decode_steps``: host phases, device span, and a
``torch.profiler`` profile of kernels and launches: the step-timeline model's inputs,
:mod:`paged_edu.labs.step_timeline`). Writes ``paged_edu/data/speed_ladder_<card>.json`` (``h200``,
``h100``: the record lesson 9 shows beside a live run on the same card, and on a CPU); any other card
writes ``build/speed_ladder_<name>.json``. On a CPU (``--device cpu``): a two-layer model and requests a
tenth as long, only the rungs a CPU can run (the others say why they were skipped), into
``build/speed_ladder_cpu.json``.

    PAGED_EDU_COMMIT=$(git rev-parse HEAD) python benchmarks/bench_ladder.py   # on the H200 or an H100
    python benchmarks/bench_ladder.py --device cpu --num-requests 8              # the CPU check

The record says where it ran: the card (``device_name``), the commit (``$PAGED_EDU_COMMIT`` when set --
a copied tree's git metadata may name another commit -- else git's), the date. Prints one row per rung
(useful tokens/s, the mean decode step, its host / device split, the GPU's idle gap between decode steps,
the mixed step, the roofline of the decode steps on this card), then the step-timeline model's prediction
of every rung's decode step beside the measurement.
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

from paged_edu.labs.speed_ladder import (  # noqa: E402
    PROBE_BATCHES,
    STORED_LADDERS,
    card_of,
    ladder_setup,
    run_ladder,
    rung_table,
)
from paged_edu.labs.card import this_card  # noqa: E402
from paged_edu.labs.step_timeline import predict_ladder  # noqa: E402
from record import provenance  # noqa: E402


def default_out(device: torch.device, name: str) -> Path:
    """Where the record goes: the package's stored ladder of a known card, else build/."""
    if device.type != "cuda":
        return ROOT / "build/speed_ladder_cpu.json"
    card = card_of(name)
    if card is not None:
        return ROOT / "paged_edu/data" / STORED_LADDERS[card]
    return ROOT / "build" / f"speed_ladder_{name.replace(' ', '_').lower()}.json"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"), help="auto: CUDA when there is one")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--probe-batches",
        default=",".join(map(str, PROBE_BATCHES)),
        help="decode batch sizes probed on every rung's engine ('' for none; default %(default)s)",
    )
    ap.add_argument("--probe-context", type=int, default=320, help="prompt tokens of each probed sequence")
    ap.add_argument("--out", help="the JSON record (default: paged_edu/data/speed_ladder_<card>.json on CUDA)")
    args = ap.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --device cpu for a CPU check")
    probes = tuple(int(b) for b in args.probe_batches.split(",") if b.strip())
    setup = ladder_setup(device, args.num_requests, args.seed)
    model, prompts, outputs, engine_kwargs = (setup[k] for k in ("model", "prompts", "outputs", "engine_kwargs"))
    card = this_card(device)  # the rungs' roofline: this card's row of the GPU table (the H200's on a CPU)
    name = card.device_name
    out = Path(args.out).with_suffix(".json") if args.out else default_out(device, name)
    out.parent.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    log(
        f"speed ladder on {name} (roofline on the {card.label}): {setup['label']}; {len(prompts)} requests, "
        f"{sum(outputs):,} output tokens"
    )
    t0 = time.perf_counter()
    rungs = run_ladder(
        model, prompts, outputs, engine_kwargs, log=log, probe_batches=probes, probe_context=args.probe_context
    )
    result = dict(
        **provenance("bench_ladder.py", argv),
        **card.record(),  # device_name, and the GPU spec that priced the rungs' roofline
        card=card_of(name) if device.type == "cuda" else "cpu",
        dtype=str(model.dtype).replace("torch.", ""),
        model=setup["label"],
        workload=dict(
            source="paged_edu.labs.speed_ladder.ladder_setup (paged_edu.labs.batching.sharegpt_requests)",
            num_requests=len(prompts),
            seed=args.seed,
            scale=setup["scale"],
            prompt_tokens=sum(map(len, prompts)),
            output_tokens=sum(outputs),
        ),
        engine_kwargs=engine_kwargs,
        probe=dict(batches=list(probes), context=args.probe_context),
        seconds=time.perf_counter() - t0,
        rungs=rungs,
    )
    out.write_text(json.dumps(result, indent=1))
    log("")
    log(rung_table(rungs))
    if device.type == "cuda" and probes:
        log("\nthe step-timeline model (paged_edu.labs.step_timeline) against the ladder's decode steps:")
        for p in predict_ladder(result):
            log(
                f"  {p['rung']:>26}: predicted {p['predicted_ms']:.3f} ms, measured {p['measured_ms']:.3f} ms "
                f"({p['error']:+.1%})"
            )
    log(f"\n{result['seconds']:.1f} s in all; wrote {out}")
    return result


if __name__ == "__main__":
    main()

"""Lesson 5's static-vs-continuous measurement, as a benchmark with a record.

    python benchmarks/bench_batching.py --device cuda   # lesson 5's H200 run -> benchmarks/records/<card>/
    python benchmarks/bench_batching.py --tiny --num-requests 8 --max-output-len 8 --static-batch 2 --out /tmp/b.json

Section 3 of ``notebooks/05_continuous_batching.ipynb`` with its H200 parameters (``-p device cuda -p
num_requests 256 -p static_batch 32 -p max_output_len 200``): SmolLM2-135M's geometry with the
lesson's seeded random weights (:func:`paged_edu.labs.engine_lab.lesson_model`, no download), in
bf16 on a GPU; the same requests (:func:`paged_edu.labs.batching.make_requests`) and KV budget
(``static_batch x L_max`` token slots) for both ways, each timed on its second run
(:func:`paged_edu.labs.batching.compare_batching`). The lesson's prose quotes this run's useful
tokens/s; the record is what backs them. ``--tiny``: the 2-layer model, for a CPU check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paged_edu.kernels.support import default_dtype  # noqa: E402
from paged_edu.labs.batching import compare_batching, make_requests  # noqa: E402
from paged_edu.labs.engine_lab import lesson_model, tiny_model  # noqa: E402
from paged_edu.models.llama import PagedLlama  # noqa: E402
from record import provenance, write_record  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--max-output-len", type=int, default=200)
    ap.add_argument("--static-batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="the 2-layer random Llama (a CPU check)")
    ap.add_argument("--out", help="the JSON record (default: benchmarks/records/<card>/batching_bench.json)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = default_dtype(device)
    if args.tiny:
        model, label = tiny_model(device, dtype, seed=args.seed), "tiny random Llama"
    else:
        lm = lesson_model(device, seed=args.seed)  # as lesson 5's cell: then its weights in the lesson's dtype
        model, label = PagedLlama.from_hf(lm.hf, dtype=dtype, device=device), lm.label
    requests = make_requests(
        args.num_requests, seed=args.seed, vocab_size=model.config.vocab_size, output_len=(2, args.max_output_len)
    )
    l_max = max(len(p) for p, _ in requests) + max(n for _, n in requests)
    kv_slots = args.static_batch * l_max
    static, cont = compare_batching(model, requests, kv_slots=kv_slots, block_size=16)
    runs = {
        run.name: dict(
            num_steps=run.num_steps,
            useful_tokens=run.useful_tokens,
            computed_tokens=run.computed_tokens,
            seconds=run.seconds,
            tokens_per_s=run.tokens_per_s,
            wasted_fraction=run.wasted_fraction,
            kv_holding_token=run.kv_holding_token,
            max_batch=max(run.batch_size),
        )
        for run in (static, cont)
    }
    record = dict(
        **provenance("bench_batching.py", argv),
        model=label,
        dtype=str(dtype).replace("torch.", ""),
        device=str(device),
        num_requests=len(requests),
        l_max=l_max,
        kv_slots=kv_slots,
        runs=runs,
        continuous_over_static=cont.tokens_per_s / static.tokens_per_s,
    )
    for name, r in runs.items():
        print(
            f"{name:>15}: {r['num_steps']} steps, {r['tokens_per_s']:,.0f} useful tok/s, {r['wasted_fraction']:.0%} of "
            f"computed tokens wasted, KV slots holding a token {r['kv_holding_token']:.0%}"
        )
    print(f"continuous / static: {record['continuous_over_static']:.2f}x")
    write_record(record, args.out, "batching_bench.json")
    return record


if __name__ == "__main__":
    main()

"""Does the compiler keep the rounding a kernel writes? RoPE in the decode kernel, with and without FMA contraction.

    python benchmarks/probe_fp_fusion.py        # on a GPU; writes benchmarks/records/<card>/fp_fusion_probe.json

``triton_store.rope`` rounds each product to the model's dtype before the sum, exactly as PyTorch's
``k * cos + rotate_half(k) * sin`` does in bf16. Triton compiles with ``enable_fp_fusion=True`` by
default, which lets it contract a product and the add that follows into one FMA. This probe runs
one pure-decode step of 64 sequences at SmolLM2's attention geometry (9 query heads, 3 KV heads,
head_dim 64, bf16, 1-599 tokens each) through the two-launch path (``rotary_store_kv_triton`` then the
decode kernel) and the one-launch path (``rotary_store_decode_triton``), each launched with the
contraction forced on and off, and counts the stored keys that differ from PyTorch's. The kernels'
own launches pass ``enable_fp_fusion=False`` (why: this probe); the forcing wraps their launchers.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from paged_edu.kernels import triton_decode, triton_store  # noqa: E402
from paged_edu.kernels.decode import fast, tutorial  # noqa: E402
from paged_edu.labs.timing import random_decode_step  # noqa: E402
from paged_edu.models.config import smollm2_config  # noqa: E402
from paged_edu.models.llama import _rotate_half  # noqa: E402
from paged_edu.models.loaders import random_llama  # noqa: E402
from record import provenance, record_path  # noqa: E402


class ForcedFusion:
    """A kernel's ``kernel[grid](...)`` with ``enable_fp_fusion`` overridden when ``value`` is not None."""

    def __init__(self, kernel):
        self.kernel, self.value = kernel, None

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def call(*args, **kwargs):
            if self.value is not None:
                kwargs["enable_fp_fusion"] = self.value
            return launch(*args, **kwargs)

        return call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="the JSON record (default: benchmarks/records/<card>/fp_fusion_probe.json)")
    args = ap.parse_args(argv)
    args.out = args.out or str(record_path("fp_fusion_probe.json"))
    if not torch.cuda.is_available():
        print("probe_fp_fusion needs a CUDA GPU (the interpreter never contracts: numpy rounds every op)")
        return 1
    store = triton_store._store_kv_kernel = ForcedFusion(triton_store._store_kv_kernel)
    decode = tutorial.paged_decode_kernel = ForcedFusion(tutorial.paged_decode_kernel)  # the two-launch path's
    fused = fast.rotary_store_decode_kernel = ForcedFusion(fast.rotary_store_decode_kernel)  # the one-launch path's
    c = smollm2_config()
    rot = random_llama(replace(c, num_layers=1), seed=0, dtype=torch.bfloat16, device="cuda").rotary
    q, k, v, pool, tables, lens, pos, slots = random_decode_step(c.num_heads, c.num_kv_heads, c.head_dim)
    N, H_kv, D = q.shape[0], c.num_kv_heads, c.head_dim
    tabs, scale = (rot.cos_table, rot.sin_table), D**-0.5
    cos, sin = rot(pos, torch.bfloat16)
    k_ref = pool.clone()
    k_ref.view(-1, H_kv, D)[slots] = k * cos + _rotate_half(k) * sin  # PyTorch's rotation, stored
    rows = []
    for fusion in (True, False):
        store.value = decode.value = fused.value = fusion
        k_two, v_two = pool.clone(), -pool  # the V cache differs from the K cache, as in a model
        q_rot = triton_store.rotary_store_kv_triton(q, k, v, k_two, v_two, slots, pos, *tabs)
        out_two = triton_decode.paged_attention_triton(q_rot, k_two, v_two, tables, lens, scale=scale)
        k_one, v_one = pool.clone(), -pool
        out_one = triton_decode.rotary_store_decode_triton(
            q, k, v, k_one, v_one, tables, lens, slots, pos, *tabs, scale=scale
        )
        rows.append(
            dict(
                enable_fp_fusion=fusion,
                keys_stored=N * H_kv * D,
                two_launch_keys_unlike_pytorch=int((k_two != k_ref).sum()),
                two_launch_queries_unlike_pytorch=int((q_rot != q * cos + _rotate_half(q) * sin).sum()),
                one_launch_keys_unlike_pytorch=int((k_one != k_ref).sum()),
                value_caches_equal=bool(torch.equal(v_one, v_two)),
                outputs=out_one.numel(),
                outputs_unlike_two_launch=int((out_one != out_two).sum()),
                max_abs_output_difference=float((out_one.float() - out_two.float()).abs().max()),
            )
        )
        print(rows[-1])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {**provenance("probe_fp_fusion.py", argv), "device": torch.cuda.get_device_name(), "rows": rows},
            f,
            indent=1,
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile the Triton kernels for a GPU on a machine without one, and compare two checkouts' code.

    python scripts/kernel_code.py dump OUT_DIR [--only decode,fused]    # this checkout's kernels
    python scripts/kernel_code.py compare OLD_DIR NEW_DIR

A maintainers' tool for refactors that must not change what a kernel does on the GPU. ``dump`` calls
each kernel's Python wrapper on CPU tensors shaped like a GPU call (the scenarios below); Triton's
launcher specialises the arguments exactly as it would on a GPU -- pointer alignment, integers equal
to 1 or divisible by 16, ``do_not_specialize`` -- and compiles the kernel for the target (an H100 /
H200, sm_90, unless ``--arch`` says otherwise); the launch itself is skipped (Triton compiles without
a GPU, it only runs on one). Per compiled kernel it writes the TTGIR (source locations stripped) and
the SASS (``cuobjdump`` from Triton's wheel; the constant-bank offsets of the kernel's arguments
blanked, since they follow the argument order).

``compare`` matches the kernels of two dumps by scenario and prints, per kernel, whether the TTGIR has
the same operations (what is loaded, computed and stored, tile by tile) and whether the SASS is the
same instruction sequence. Run ``dump`` with each checkout first on ``PYTHONPATH`` (and the Triton
version of the GPU machine, if it differs from this one's).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret

import torch  # noqa: E402
import triton  # noqa: E402
import triton.runtime.jit as jit  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402


class _NoGPU:
    """Just enough of Triton's active driver for its launcher to specialise and compile for ``target``."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


def _record(out: Path, records: list, scenario: list):
    """Patch Triton's launcher: compile every launch (warm-up only, never run) and write its code."""
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    run, do_compile = jit.JITFunction.run, jit.JITFunction._do_compile

    def compile_only(self, *args, grid, warmup, **kwargs):
        return run(self, *args, grid=grid, warmup=True, **kwargs)

    def compile_and_write(self, key, signature, device, constexprs, options, attrs, warmup):
        kernel = do_compile(self, key, signature, device, constexprs, options, attrs, warmup)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            sass = subprocess.run([bin_dir / "cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
        lines = [
            re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][ARG]", m.group(1))
            for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s*(.*?);", sass)
        ]
        name = f"{len(records):03d}_{scenario[0]}_{self.fn.__name__}"
        (out / f"{name}.sass").write_text("\n".join(lines) + "\n")
        ttgir = "\n".join(line for line in kernel.asm["ttgir"].splitlines() if not line.startswith("#loc"))
        (out / f"{name}.ttgir").write_text(re.sub(r"\s*loc\((?:[^()]|\([^()]*\))*\)", "", ttgir))
        records.append({"scenario": scenario[0], "kernel": self.fn.__name__, "file": name, "instructions": len(lines)})
        return kernel

    jit.JITFunction.run, jit.JITFunction._do_compile = compile_only, compile_and_write


def scenarios():
    """``(name, call)`` pairs: the decode kernels (with and without the fused store, split or not, PDL and
    PRELOAD each way), the prefill, store and skinny-GEMM kernels, at SmolLM2's and the benchmark's shapes."""
    from paged_edu.kernels.triton_decode import paged_attention_triton, rotary_store_decode_triton
    from paged_edu.kernels.triton_gemm import skinny_matmul
    from paged_edu.kernels.triton_prefill import paged_prefill_triton
    from paged_edu.kernels.triton_store import rotary_store_kv_triton, store_kv_triton
    from paged_edu.labs.timing import random_paged_case

    def case(H, H_kv, D, dtype, n=3, s=200):
        return random_paged_case(n, s, H, H_kv, D, 16, dtype=dtype, device="cpu", seed=0)

    for dtype in (torch.bfloat16, torch.float32):
        dt = str(dtype).split(".")[1]
        for H, H_kv, D in ((9, 3, 64), (32, 8, 128), (8, 2, 80)):
            for splits in (1, 4):
                c = case(H, H_kv, D, dtype)
                yield (
                    f"decode_{dt}_{H}_{H_kv}_{D}_s{splits}",
                    lambda c=c, D=D, n=splits: paged_attention_triton(*c, scale=D**-0.5, num_splits=n),
                )
        for H, H_kv, D in ((9, 3, 64), (32, 8, 128)):
            q, k, v, tables, lens = case(H, H_kv, D, dtype)
            qkv = torch.randn(3, (H + 2 * H_kv) * D, dtype=dtype).split([H * D, H_kv * D, H_kv * D], dim=-1)
            new = (qkv[0].view(3, H, D), qkv[1].view(3, H_kv, D), qkv[2].view(3, H_kv, D))  # views of one qkv row
            rest = (k, v, tables, lens, torch.arange(3), (lens - 1).long(), torch.randn(1024, D), torch.randn(1024, D))
            for splits in (1, 4):
                for pdl, preload in ((False, None), (True, None), (True, False), (False, True)):
                    yield (
                        f"fused_{dt}_{H}_{H_kv}_{D}_s{splits}_pdl{int(pdl)}_pre{preload}",
                        lambda n=splits, p=pdl, c=({} if preload is None else {"PRELOAD": preload}), a=new + rest, D=D: (
                            rotary_store_decode_triton(*a, scale=D**-0.5, num_splits=n, config=c, pdl=p)
                        ),
                    )
        for H, H_kv, D in ((9, 3, 64), (32, 8, 128)):
            _, k, v, tables, lens = case(H, H_kv, D, dtype, n=2)
            q = torch.randn(50, H, D, dtype=dtype)
            cu = torch.tensor([0, 30, 50], dtype=torch.int32)
            yield (
                f"prefill_{dt}_{H}_{H_kv}_{D}",
                lambda a=(q, k, v, tables, lens, cu), D=D: paged_prefill_triton(*a, scale=D**-0.5),
            )
        _, k, v, _, _ = case(9, 3, 64, dtype, n=2, s=64)
        key, value, q = (
            torch.randn(5, 3, 64, dtype=dtype),
            torch.randn(5, 3, 64, dtype=dtype),
            torch.randn(5, 9, 64, dtype=dtype),
        )
        tables = (torch.arange(5), torch.randn(100, 64), torch.randn(100, 64))
        yield f"store_{dt}", lambda a=(key, value, k, v, torch.arange(5)): store_kv_triton(*a)
        yield f"rotary_store_{dt}", lambda a=(q, key, value, k, v, torch.arange(5)) + tables: rotary_store_kv_triton(*a)
        for M, N, K, swiglu in (
            (1, 576, 576, False),
            (16, 1728, 576, False),
            (48, 576, 1536, False),
            (1, 3072, 576, True),
        ):
            for pdl in (False, True):
                x, w = torch.randn(M, K, dtype=dtype), torch.randn(N, K, dtype=dtype)
                yield (
                    f"gemm_{dt}_{M}_{N}_{K}_sw{int(swiglu)}_pdl{int(pdl)}",
                    lambda x=x, w=w, s=swiglu, p=pdl: skinny_matmul(x, w, swiglu=s, pdl=p),
                )


def dump(out: Path, only: list[str], arch: int) -> None:
    driver.set_active(_NoGPU(GPUTarget("cuda", arch, 32)))
    torch.Tensor.is_cuda = property(lambda self: True)  # the wrappers refuse CPU tensors when compiling
    import importlib

    from paged_edu.kernels import pdl

    pdl.pdl_supported = lambda device: True  # a Hopper GPU: PDL on where a scenario asks for it
    for name in ("support", "triton_decode", "decode.tuning", "triton_gemm"):  # wherever a checkout keeps it
        try:
            module = importlib.import_module(f"paged_edu.kernels.{name}")
        except ImportError:
            continue
        for attr in ("num_sms", "_num_sms"):
            if hasattr(module, attr):
                setattr(module, attr, lambda device_index: 132)  # an H100 SXM's SMs
    torch.cuda.current_device = lambda: 0
    out.mkdir(parents=True, exist_ok=True)
    records, scenario = [], [None]
    _record(out, records, scenario)
    for name, call in scenarios():
        if only and not name.startswith(tuple(only)):
            continue
        scenario[0] = name
        call()
    (out / "records.json").write_text(
        json.dumps({"triton": triton.__version__, "arch": arch, "kernels": records}, indent=1)
    )
    print(f"{len(records)} kernels compiled for sm_{arch} with Triton {triton.__version__} into {out}")


def _ops(ttgir: str) -> list[str]:
    """The TTGIR's operations, SSA names blanked and layout aliases (``#blocked1``: numbered in order of
    first use) replaced by the layouts they name, in order; the function's signature left out."""
    aliases = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, flags=re.M))
    for alias in sorted(aliases, key=len, reverse=True):
        ttgir = re.sub(re.escape(alias) + r"\b", aliases[alias], ttgir)
    lines = (re.sub(r"%[\w.#]+", "%", line.strip()) for line in ttgir.splitlines())
    return [line for line in lines if re.search(r"\b[a-z]+\.[a-z_]+", line) and not line.startswith(("tt.func", "#"))]


def compare(old: Path, new: Path) -> int:
    """Per kernel of both dumps: the same TTGIR operations? the same SASS sequence? Returns 1 if any differ."""
    a, b = (json.loads((d / "records.json").read_text()) for d in (old, new))
    print(f"old: Triton {a['triton']}, sm_{a['arch']}; new: Triton {b['triton']}, sm_{b['arch']}")
    by_scenario = collections.defaultdict(lambda: ([], []))
    for side, dump_ in enumerate((a, b)):
        for r in dump_["kernels"]:
            by_scenario[r["scenario"]][side].append(r)
    same_ir = same_sass = total = 0
    for scenario, (olds, news) in sorted(by_scenario.items()):
        if len(olds) != len(news):
            print(f"{scenario}: {len(olds)} kernels before, {len(news)} after")
            continue
        for r, s in zip(olds, news):  # the kernels of one scenario, in launch order
            ir = sorted(_ops((old / f"{r['file']}.ttgir").read_text())) == sorted(
                _ops((new / f"{s['file']}.ttgir").read_text())
            )
            sass = (old / f"{r['file']}.sass").read_text().split("\n") == (new / f"{s['file']}.sass").read_text().split(
                "\n"
            )
            opcodes = [
                collections.Counter(x.split()[0] for x in (d / f"{f}.sass").read_text().split("\n") if x)
                for d, f in ((old, r["file"]), (new, s["file"]))
            ]
            total, same_ir, same_sass = total + 1, same_ir + ir, same_sass + sass
            if not (ir and sass):
                how = (
                    "identical" if sass else "same opcodes, reordered" if opcodes[0] == opcodes[1] else "opcodes differ"
                )
                print(
                    f"{scenario}: {r['kernel']} -> {s['kernel']}: TTGIR operations {'same' if ir else 'DIFFER'}; "
                    f"SASS {r['instructions']} -> {s['instructions']} instructions, {how}"
                )
    print(f"{total} kernels: TTGIR operations the same in {same_ir}, SASS identical in {same_sass}")
    return 0 if same_ir == total else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="compile this checkout's kernels and write their code")
    d.add_argument("out", type=Path)
    d.add_argument("--only", default="", help="scenario prefixes, comma-separated (decode, fused, prefill, store, ...)")
    d.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100 / H200)")
    c = sub.add_parser("compare", help="compare two dumps kernel by kernel")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    args = ap.parse_args(argv)
    if args.command == "dump":
        dump(args.out, [p for p in args.only.split(",") if p], args.arch)
        return 0
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())

"""Lesson 4's measurements: the ladder loop -> torch -> Triton, and split-KV, on the device at hand.

* :func:`gpu_ladder` -- on a CUDA GPU, exactly as ``benchmarks/bench_kernels.py`` measures (same
  :class:`~paged_edu.labs.timing.Timer`, same copy ceiling, same random paged cases): microseconds
  and % of the copy ceiling per implementation, every output checked against the fp32 oracle.
* :func:`split_sweep` -- the Triton kernel's time against the number of KV splits for one case.
* :func:`cpu_ladder` -- on a CPU, a small case timed by wall clock: the loop, the torch reference and
  the Triton kernel in the interpreter (which simulates every program in Python: slow, and not a
  measure of the GPU kernel's speed).
* :func:`stored_gpu_figures` -- the stored H200 figures (``paged_edu/data/kernel_bench.json``, ``docs/benchmarks.md``), to show
  beside a CPU run.
* :func:`source_between` -- lines of a function's source, for reading the kernel in the lesson;
  :func:`source_of` -- a kernel module to read it from, Triton installed or not.
* :func:`kernel_outline` -- a ``@triton.jit`` kernel's size and the ``@triton.jit`` helpers it calls,
  read from its source: what lesson 4 shows of the two decode kernels built from the same pieces.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import textwrap
from types import SimpleNamespace
from pathlib import Path

import torch

from paged_edu import data
from paged_edu.kernels import paged_attention_decode, triton_interpreting
from paged_edu.kernels.reference import paged_attention_loop, paged_attention_torch
from paged_edu.labs.seed_kernel import paged_attention_decode_step_fixed
from paged_edu.labs.timing import Timer, copy_ceiling_us, decode_bytes, random_paged_case, rel_err, wall_us

__all__ = [
    "cpu_ladder",
    "gpu_ladder",
    "kernel_outline",
    "source_between",
    "source_of",
    "split_sweep",
    "stored_gpu_figures",
]


def _impl_fn(impl: str, case, scale: float):
    q, k, v, t, lens = case
    if impl == "loop":
        return lambda: paged_attention_loop(q, k, v, t, lens, scale=scale)
    if impl == "seed":  # the seed's own code, with its 3-line fix (as written it fails on bf16)
        return lambda: paged_attention_decode_step_fixed(q, k, v, t, lens, block_size=k.shape[1])
    if impl == "torch":
        return lambda: paged_attention_torch(q, k, v, t, lens, scale=scale)
    return lambda: paged_attention_decode(q, k, v, t, lens, impl="triton", validate=False)


def _measured_case(timer, num_seqs, seq_len, num_q_heads, num_kv_heads, head_dim, block_size):
    """A random paged decode case on the GPU with what every timing of it needs: the bytes one call must
    move, the copy ceiling for its K/V (µs and GB/s, measured now), the scale and the fp32 oracle's output."""
    case = random_paged_case(num_seqs, seq_len, num_q_heads, num_kv_heads, head_dim, block_size)
    k = case[1]
    kv_bytes = 2 * k.numel() * k.element_size()
    io_bytes = decode_bytes(num_seqs, seq_len, num_q_heads, num_kv_heads, head_dim, k.element_size())
    ceil_us = copy_ceiling_us(timer, kv_bytes)
    scale = head_dim**-0.5
    ref = paged_attention_torch(*case, scale=scale).float()
    return case, io_bytes, ceil_us, 2 * kv_bytes / ceil_us / 1e3, scale, ref


def gpu_ladder(
    cases, *, num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16, loop_cases=(), reps=50, warmup=10
) -> list[dict]:
    """Per case ``(num_seqs, seq_len)``: the copy ceiling and each implementation's µs, GB/s, % of ceiling."""
    timer = Timer(reps, warmup)
    rows = []
    for num_seqs, seq_len in cases:
        case, io_bytes, ceil_us, ceil_gbs, scale, ref = _measured_case(
            timer, num_seqs, seq_len, num_q_heads, num_kv_heads, head_dim, block_size
        )
        row = {
            "case": f"{num_seqs}x{seq_len}",
            "bytes": io_bytes,
            "ceiling_us": ceil_us,
            "ceiling_GBps": ceil_gbs,
            "impls": {},
        }
        for impl in ("seed", "loop", "torch", "triton"):
            if impl in ("seed", "loop") and (num_seqs, seq_len) not in set(loop_cases):
                continue
            fn = _impl_fn(impl, case, scale)
            us, _, out = timer.eager(fn) if impl in ("seed", "loop") else timer.graph(fn)
            gbs = io_bytes / us / 1e3
            row["impls"][impl] = {
                "us": us,
                "GBps": gbs,
                "pct_of_ceiling": 100 * gbs / ceil_gbs,
                "rel_err": rel_err(out, ref),
            }
        rows.append(row)
        del case, ref
        torch.cuda.empty_cache()
    return rows


def split_sweep(
    num_seqs: int,
    seq_len: int,
    splits,
    *,
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=128,
    block_size=16,
    reps=50,
    warmup=10,
) -> dict:
    """The Triton kernel with ``num_splits`` forced to each value of ``splits``; µs and % of ceiling each,
    and the split count the kernel picks by itself (:func:`~paged_edu.kernels.decode.tuning.choose_num_splits`)."""
    from paged_edu.kernels.decode import choose_num_splits, decode_config, paged_attention_triton
    from paged_edu.kernels.support import num_sms

    timer = Timer(reps, warmup)
    case, io_bytes, ceil_us, ceil_gbs, scale, ref = _measured_case(
        timer, num_seqs, seq_len, num_q_heads, num_kv_heads, head_dim, block_size
    )
    q = case[0]
    cfg = decode_config(head_dim, num_q_heads // num_kv_heads, on_gpu=True)
    chosen = choose_num_splits(num_seqs, num_kv_heads, seq_len, cfg["TILE"], num_sms(q.device.index or 0))
    points = []
    for n in sorted(set(splits) | {chosen}):  # the kernel's own choice is always measured too
        us, _, out = timer.graph(lambda: paged_attention_triton(*case, scale=scale, num_splits=n))
        points.append(
            {
                "splits": n,
                "us": us,
                "pct_of_ceiling": 100 * io_bytes / us / 1e3 / ceil_gbs,
                "rel_err": rel_err(out, ref),
            }
        )
    case = q = ref = None  # free the case's tensors (the lambdas above hold the names)
    torch.cuda.empty_cache()
    return {
        "case": f"{num_seqs}x{seq_len}",
        "ceiling_us": ceil_us,
        "programs_without_splits": num_seqs * num_kv_heads,
        "chosen_splits": chosen,
        "points": points,
    }


def cpu_ladder(
    num_seqs=2, seq_len=64, *, num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16, dtype=torch.float32, reps=3
) -> dict:
    """Wall-clock µs of the seed's code (fixed), loop, torch and Triton (interpreted on a CPU) at a small size, and their errors."""
    case = random_paged_case(
        num_seqs, seq_len, num_q_heads, num_kv_heads, head_dim, block_size, dtype=dtype, device="cpu"
    )
    scale = head_dim**-0.5
    ref = paged_attention_torch(*case, scale=scale).float()
    out = {"case": f"{num_seqs}x{seq_len}", "impls": {}}
    # One thread: at this size every op is tiny, and a thread pool on a busy machine costs far more than
    # the work (seen here: 0.5 s instead of 1 ms for the loop with 2 threads on a shared 2-core machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for impl in ("seed", "loop", "torch", "triton"):
            if impl == "triton" and not triton_interpreting():
                continue  # CPU tensors need Triton's interpreter (TRITON_INTERPRET=1 before the import)
            us, o = wall_us(_impl_fn(impl, case, scale), reps=reps)
            out["impls"][impl] = {"us": us, "rel_err": rel_err(o, ref)}
    finally:
        torch.set_num_threads(threads)
    return out


def stored_gpu_figures(name: str = "kernel_bench.json", *, path: Path | None = None) -> dict | None:
    """The stored ``name`` (:mod:`paged_edu.data`) -- ``kernel_bench.json`` (the H200 run of docs/benchmarks.md) or
    ``kernel_sweep.json`` (its configuration sweep) -- or, given ``path``, that file: None if it is not there."""
    if path is None:
        return data.load_json(name)
    path = Path(path)
    if not path.exists():
        return None
    with open(path) as f:
        return json.load(f)


def source_between(fn, start: str, stop: str | None = None) -> str:
    """The lines of ``fn``'s source from the first holding ``start`` up to (not including) the first
    later one holding ``stop`` (the end when ``stop`` is None). ``fn`` is a function (``@triton.jit``
    ones too) or its source text (what :func:`source_of` gives where Triton is not installed)."""
    text = fn if isinstance(fn, str) else inspect.getsource(getattr(fn, "fn", fn))
    lines = text.splitlines()
    try:
        i = next(k for k, line in enumerate(lines) if start in line)
    except StopIteration:
        name = lines[0].strip() if isinstance(fn, str) else fn.__name__
        raise ValueError(f"{start!r} is not in the source of {name}") from None
    j = len(lines) if stop is None else next((k for k in range(i + 1, len(lines)) if stop in lines[k]), len(lines))
    return "\n".join(lines[i:j])


def source_of(module: str):
    """The module named ``module``, to read its functions with :func:`source_between`: the module itself
    where it imports; where it cannot because Triton is not installed (macOS, Windows), a namespace of its
    top-level functions and classes -- and of what it imports from paged_edu -- each as its source text
    (decorators included), read from the files."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name != "triton":
            raise
    # The file, found without importing the module or its package (whose __init__ may import Triton too):
    # the nearest package above it that imports, then the rest of the name as folders and a .py file.
    parts = module.split(".")
    for k in range(len(parts) - 1, 0, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:k]))
            break
        except ImportError:
            continue
    folder = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts[k:-1])
    path = folder / f"{parts[-1]}.py" if (folder / f"{parts[-1]}.py").exists() else folder / parts[-1] / "__init__.py"
    text = Path(path).read_text()
    lines = text.splitlines()
    defs = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            defs[node.name] = "\n".join(lines[first - 1 : node.end_lineno])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("paged_edu."):
            source = source_of(node.module)  # a name the module re-exports, read where it is defined
            defs.update({a.asname or a.name: getattr(source, a.name) for a in node.names if hasattr(source, a.name)})
    return SimpleNamespace(__name__=module, __file__=str(path), **defs)


def kernel_outline(kernel) -> dict:
    """A ``@triton.jit`` function read from its source: its ``name``, ``lines`` (the ``def`` line to the
    last), ``parameters`` (of which ``compile_time``: the ``tl.constexpr`` ones), and the ``@triton.jit``
    functions it calls, in the order they first appear -- ``helpers``, each as ``"module.name"`` with the
    module's last part (``"pieces.attend_tile"``)."""
    fn = getattr(kernel, "fn", kernel)
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    params = inspect.signature(fn).parameters.values()
    calls = sorted(
        (n.lineno, n.col_offset, n.func.id)
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    )
    helpers = []
    for _, _, name in calls:
        target = fn.__globals__.get(name)
        if hasattr(target, "fn"):  # a JITFunction (or the interpreter's stand-in): it wraps the Python function
            label = f"{target.fn.__module__.rsplit('.', 1)[-1]}.{name}"
            if label not in helpers:
                helpers.append(label)
    return {
        "name": fn.__name__,
        "lines": node.end_lineno - node.lineno + 1,
        "parameters": len(params),
        "compile_time": sum("constexpr" in str(p.annotation) for p in params),
        "helpers": helpers,
    }

"""How many kernels one decode layer launches, counted on the CPU.

On a GPU a decode step of a small model is bound by its number of kernels (``paged_edu/kernels/pdl.py``), so
each fusion says how many launches it removes. Here one layer's forward of a pure-decode step runs in the
Triton interpreter under a recorder that sees every launch a GPU would make: each Triton kernel (by name) and
each PyTorch op that computes (an op that is neither a view nor an allocation launches a kernel on a GPU).
The oracle is the list of kernels each :class:`~paged_edu.models.llama.Kernels` setting is documented to run.
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import TINY_LLAMA
from torch.utils._python_dispatch import TorchDispatchMode

from paged_edu.kernels import kernel_support, triton_available
from paged_edu.models.config import smollm2_config
from paged_edu.models.llama import Kernels

if not triton_available() or not kernel_support("cpu").fused:
    pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1, tests/conftest.py)", allow_module_level=True)

from paged_edu.kernels.decode.tuning import choose_num_splits, decode_config  # noqa: E402
from paged_edu.kernels.triton_fused import round_to  # noqa: E402

# PyTorch ops that launch nothing on a GPU: a new tensor's memory, and views of an existing one.
NO_KERNEL = {"empty.memory_format", "empty_strided.default", "empty_like.default"}


class Launches(TorchDispatchMode):
    """Every kernel launched inside ``with Launches() as rec:``, in order, in ``rec.kernels``: a Triton
    kernel's name, or ``torch:<op>`` for a PyTorch op that computes. The interpreter's own tensor copies
    inside a Triton launch are not counted (the GPU has none). Run the code once before recording: a first
    call may allocate what later calls reuse (the skinny GEMM's split-K counters, one ``torch.zeros``), as
    the engine's warm-up does before it captures a graph."""

    def __init__(self):
        super().__init__()
        self.kernels: list[str] = []
        self._in_triton = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._in_triton and not func.is_view and func.__name__ not in NO_KERNEL:
            self.kernels.append(f"torch:{func.__name__}")  # e.g. torch:add.Tensor
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        interpreted = type(round_to)  # the class of every @triton.jit kernel under the interpreter
        real_run = interpreted.run

        def run(fn, *args, **kwargs):
            self.kernels.append(fn.__name__)
            self._in_triton = True
            try:
                return real_run(fn, *args, **kwargs)
            finally:
                self._in_triton = False

        self._restore = (interpreted, real_run)
        interpreted.run = run
        return super().__enter__()

    def __exit__(self, *exc):
        interpreted, real_run = self._restore
        interpreted.run = real_run
        return super().__exit__(*exc)


def decode_layer_launches(batch_size: int, table_blocks: int = 2, **settings) -> list[str]:
    """The kernels of layer 1 (a middle layer: it has a residual) in a pure-decode step of ``batch_size``
    sequences of 6 tokens in blocks of 4, each block table ``table_blocks`` wide (the engine pads every table to
    its width, ``max_model_len / block_size``: the decode kernel sizes its splits by that width), the Triton
    kernels all on (``settings`` override :class:`Kernels` fields)."""
    from paged_edu.engine.batch import BatchChunk, prepare_batch
    from paged_edu.models.loaders import random_llama

    model = random_llama(TINY_LLAMA, seed=3, device="cpu")
    c, block = model.config, 4
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = (torch.randn(2 * batch_size, block, c.num_kv_heads, c.head_dim, generator=g) for _ in range(2))
    padding = [0] * (table_blocks - 2)  # block 0 past the sequence's end: never read
    chunks = [BatchChunk([7 + i % 50], 5, [2 * i, 2 * i + 1, *padding]) for i in range(batch_size)]
    batch = prepare_batch(chunks, block, "cpu")
    kernels = Kernels(**{"decode": "triton", "prefill": "torch", "fused": "triton", "gemm": "triton", **settings})
    kernels = kernels.resolve(torch.device("cpu")).for_step(batch_size)
    h = torch.randn(batch_size, c.hidden_size, generator=g)  # (T, hidden): the previous layer's output
    residual = torch.randn(batch_size, c.hidden_size, generator=g)
    if kernels.fused_ops:  # the fused kernels read each token's row of the (L, D) tables themselves
        cos, sin = model.rotary.cos_table, model.rotary.sin_table
    else:
        cos, sin = model.rotary(batch.positions, h.dtype)  # (T, 1, D) each
    layer = model.layers[1]
    layer(h, residual, cos, sin, k_cache, v_cache, batch, kernels)  # once before: what a first call allocates
    with Launches() as rec:
        layer(h, residual, cos, sin, k_cache, v_cache, batch, kernels)
    return rec.kernels


NORM, GEMM, DECODE = "_add_rms_norm_kernel", "_skinny_matmul_kernel", "rotary_store_decode_kernel"
# What each setting is documented to launch, in order (models/llama.py, kernels/triton_gemm.py).
EXPECTED = {
    "default": [NORM, GEMM, DECODE, GEMM, NORM, GEMM, GEMM],  # norm, qkv, attention, o, norm, gate_up+SiLU, down
    "no swiglu_gemm": [NORM, GEMM, DECODE, GEMM, NORM, GEMM, "_silu_and_mul_kernel", GEMM],
    "no fuse_decode_store": [NORM, GEMM, "_store_kv_kernel", "paged_decode_kernel", GEMM, NORM, GEMM, GEMM],
}
SETTINGS = {
    "default": {},
    "no swiglu_gemm": {"swiglu_gemm": False},
    "no fuse_decode_store": {"fuse_decode_store": False},
}


@pytest.mark.parametrize("batch_size", [1, 64])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_decode_layer_launches_the_kernels_each_setting_documents(name, batch_size):
    """No PyTorch op computes inside a decode layer of <= 64 rows (every kernel is a Triton launch), and each
    setting launches its documented list: 7 by default. The tables here are as wide as the sequences (6
    tokens): the decode kernel runs unsplit, so no merge kernel follows it (the next test)."""
    got = decode_layer_launches(batch_size, **SETTINGS[name])
    assert got == EXPECTED[name], (name, batch_size, got)


def test_at_the_engines_table_width_the_decode_kernel_merges_its_splits_in_an_eighth_launch():
    """At the engine's table width the decode kernel cuts each sequence into splits (``choose_num_splits``:
    enough programs for the SMs) and ``merge_splits_kernel`` adds them up after it: 8 launches a layer. On the
    interpreter (8 "SMs") a batch of 1 over a 64-block table splits; on a GPU of 132 SMs (H100, H200) every
    SmolLM2 batch of 1 to 64 splits at the engine's default width (the model's 8,192 positions), so a fused
    decode step there launches 8 kernels a layer, 240 of a step's 244 (``docs/benchmarks.md``)."""
    got = decode_layer_launches(1, table_blocks=64)
    want = EXPECTED["default"]
    assert got == [*want[:3], "merge_splits_kernel", *want[3:]], got
    c = smollm2_config()
    tile = decode_config(c.head_dim, c.num_heads // c.num_kv_heads, on_gpu=True)["TILE"]
    splits = [choose_num_splits(b, c.num_kv_heads, c.max_position_embeddings, tile, num_sms=132) for b in range(1, 65)]
    assert min(splits) > 1, splits


def test_the_recorder_sees_pytorch_kernels_too():
    """The recorder can fail: the plain PyTorch layer computes with aten ops, and it counts them."""
    got = decode_layer_launches(1, fused="torch", decode="torch", gemm="torch")
    assert got and all(k.startswith("torch:") for k in got), got
    assert len(got) > 20  # the norms alone are nine kernels each (kernels/triton_fused.py)

"""Programmatic dependent launch (paged_edu/kernels/pdl.py): when it applies, and that a decode step
launched that way computes exactly what the same kernels compute launched one after the other."""

from __future__ import annotations

import pytest
import torch
from model_helpers import TINY_LLAMA, stale_gpu_pools

from paged_edu.kernels import triton_available
from paged_edu.kernels.support import SKINNY_MAX_ROWS
from paged_edu.models.config import smollm2_config
from paged_edu.models.llama import Kernels, PagedLlama

pytestmark = pytest.mark.skipif(not triton_available(), reason="the Triton kernels need the triton package")


def test_pdl_is_off_where_the_gpu_cannot_launch_that_way():
    """On a CPU no launch asks for PDL and the resolved choice says so -- with the Triton kernels
    interpreted too -- so ``gemm="auto"`` stays PyTorch's."""
    from paged_edu.kernels import triton_interpreting
    from paged_edu.kernels.pdl import launch_options

    cpu = torch.device("cpu")
    assert launch_options(True, cpu) == {"USE_PDL": False}
    assert launch_options(False, cpu) == {"USE_PDL": False}
    resolved = Kernels(fused="torch").resolve(cpu)
    assert resolved.pdl is False and resolved.gemm == "torch"
    if triton_interpreting():  # the whole decode chain in (interpreted) Triton: still no PDL
        resolved = Kernels(decode="triton", fused="triton").resolve(cpu)
        assert resolved.fused_decode and resolved.pdl is False and resolved.gemm == "torch"


@pytest.mark.parametrize(
    "num_tokens, on", [(1, True), (8, True), (SKINNY_MAX_ROWS, True), (SKINNY_MAX_ROWS + 1, False), (256, False)]
)
def test_pdl_applies_only_to_steps_the_skinny_gemm_takes(num_tokens, on):
    """The measured rule (kernels/pdl.py): a chain is launched early only where all of it is Triton's --
    a decode batch or a step with prompt chunks alike, up to the skinny GEMM's 64 rows."""
    kernels = Kernels(pdl=True)  # as resolve() leaves it on a GPU that has PDL
    step = kernels.for_step(num_tokens)
    assert step.pdl is on
    assert (step.decode, step.gemm, step.fused, step.swiglu_gemm) == (
        kernels.decode,
        kernels.gemm,
        kernels.fused,
        kernels.swiglu_gemm,
    )
    assert Kernels(pdl=False).for_step(num_tokens).pdl is False


def test_the_engine_checks_its_pdl_flag():
    from paged_edu.engine import Engine

    model = PagedLlama(TINY_LLAMA, seed=0)
    with pytest.raises(ValueError, match="pdl"):
        Engine(model, num_blocks=8, block_size=4, pdl="yes")
    assert Engine(model, num_blocks=8, block_size=4, pdl=False).runner.kernels.pdl is False


def _pdl_gpu() -> bool:
    from paged_edu.kernels.pdl import pdl_supported

    return torch.cuda.is_available() and pdl_supported(torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs", [1, 8, 32, 48, SKINNY_MAX_ROWS])
def test_gpu_decode_graph_with_pdl_is_bit_for_bit_the_plain_chain(num_seqs):
    """SmolLM2's 30 layers, bf16, the engine's decode CUDA graphs (the skinny GEMM, the decode kernel
    with its own store, split-K and split-KV merges at 100 tokens of context): launched as programmatic
    dependents, the hidden states and greedy tokens are bit for bit those of the same kernels launched
    one after the other. A wait placed after a load of an earlier kernel's output, or a store before it,
    would read or clobber values still being written, and differ."""
    if not _pdl_gpu():
        pytest.skip("programmatic dependent launch needs a Hopper (sm_90) or newer GPU")
    import numpy as np

    from paged_edu.engine.cuda_graphs import DecodeCudaGraphs
    from paged_edu.models.loaders import random_llama

    C = smollm2_config()
    model = random_llama(C, seed=0, dtype=torch.bfloat16, device="cuda")
    context, per_seq = 100, 7  # tokens per sequence, the new one included; its blocks of 16
    blocks = np.random.default_rng(num_seqs).permutation(512)[: num_seqs * per_seq].reshape(num_seqs, per_seq)
    out, pools = {}, {}
    for pdl in (False, True):
        caches = stale_gpu_pools(C, num_blocks=512)  # the same stale pool for both
        kernels = Kernels(fused="triton", gemm="triton", pdl=pdl)
        graphs = DecodeCudaGraphs(model, caches, SKINNY_MAX_ROWS, 8, kernels=kernels)
        assert graphs.kernels.pdl is pdl
        inputs = graphs.staging.np
        inputs["input_ids"][:num_seqs] = np.arange(100, 100 + num_seqs)
        inputs["positions"][:num_seqs] = context - 1
        inputs["block_tables"][:num_seqs, :per_seq] = blocks
        pos = context - 1
        inputs["slot_mapping"][:num_seqs] = blocks[:, pos // 16] * 16 + pos % 16
        inputs["seq_lens"][:num_seqs] = context
        graphs.staging.upload(num_seqs)
        runs = []
        for _ in range(3):  # replays: the split-K counters and buffers reused
            hidden, greedy = graphs.replay(num_seqs)
            torch.cuda.synchronize()
            runs.append((hidden.clone(), greedy.clone()))
        for hidden, greedy in runs[1:]:
            assert torch.equal(hidden, runs[0][0]) and torch.equal(greedy, runs[0][1])
        out[pdl], pools[pdl] = runs[0], caches
    assert torch.equal(out[True][0], out[False][0])
    assert torch.equal(out[True][1], out[False][1])
    for (k1, v1), (k0, v0) in zip(pools[True], pools[False]):  # the new tokens' K/V, stored alike
        assert torch.equal(k1, k0) and torch.equal(v1, v0)


@pytest.mark.gpu
def test_gpu_engine_defaults_turn_pdl_on_where_it_applies():
    """On a GPU with PDL the engine's default kernels launch the decode chain that way with the skinny
    GEMM; on an older GPU both stay off (cuBLAS)."""
    from paged_edu.engine import Engine

    model = PagedLlama(TINY_LLAMA, seed=0, device="cuda", dtype=torch.bfloat16)
    kernels = Engine(model, num_blocks=8, block_size=4, cuda_graphs=False).runner.kernels
    on = _pdl_gpu()
    assert kernels.pdl is on and kernels.gemm == ("triton" if on else "torch")


@pytest.mark.gpu
@pytest.mark.parametrize("decodes, prompt, cached", [(0, 40, 0), (0, 7, 0), (3, 20, 30)])
def test_gpu_mixed_step_graph_with_pdl_is_bit_for_bit_the_plain_chain(decodes, prompt, cached):
    """A step with a prompt chunk of at most 64 rows -- a lone prompt (the first token of a request on an
    idle server), or decode rows beside a chunk over a cached prefix -- in the engine's mixed-step graphs,
    SmolLM2's 30 layers, bf16: launched as programmatic dependents (the rotary + store and prefill kernels
    in the chain too), the hidden states and the K/V stored are bit for bit those of the same kernels
    launched one after the other. A wait placed after a load of the previous kernel's output (q, the K/V
    just stored), or a store before it, would read values still being written, and differ."""
    if not _pdl_gpu():
        pytest.skip("programmatic dependent launch needs a Hopper (sm_90) or newer GPU")
    import numpy as np

    from paged_edu.engine.batch import pack_chunks
    from paged_edu.engine.cuda_graphs import MixedCudaGraphs
    from paged_edu.models.loaders import random_llama

    C, B = smollm2_config(), 16
    model = random_llama(C, seed=0, dtype=torch.bfloat16, device="cuda")
    rng = np.random.default_rng(prompt)
    free = [int(b) for b in rng.permutation(np.arange(1, 128))]
    counts = [1] * decodes + [prompt]
    starts = [int(rng.integers(5, 60)) for _ in range(decodes)] + [cached]
    tables = [[free.pop() for _ in range(-(-(s + n) // B))] for s, n in zip(starts, counts)]
    token_ids = [int(t) for t in rng.integers(0, C.vocab_size, sum(counts))]
    out, pools = {}, {}
    for pdl in (False, True):
        caches = stale_gpu_pools(C, num_blocks=128)  # the same stale pool for both
        kernels = Kernels(fused="triton", gemm="triton", pdl=pdl)
        graphs = MixedCudaGraphs(model, caches, SKINNY_MAX_ROWS, 8, 8, kernels)
        batch = pack_chunks(token_ids, starts, counts, tables, B)
        key = graphs.size_for(batch)
        assert key[0] <= SKINNY_MAX_ROWS and graphs.kernels.for_step(key[0]).pdl is pdl
        graphs.stage(batch, key, batch.logits_rows, None)
        runs = []
        for _ in range(3):  # replays on the same buffers
            hidden = graphs.replay(key)[: sum(counts)]
            torch.cuda.synchronize()
            runs.append(hidden.clone())
        for hidden in runs[1:]:
            assert torch.equal(hidden, runs[0])
        out[pdl], pools[pdl] = runs[0], caches
    assert torch.equal(out[True], out[False])
    for (k1, v1), (k0, v0) in zip(pools[True], pools[False]):  # the new tokens' K/V, stored alike
        assert torch.equal(k1, k0) and torch.equal(v1, v0)

"""CUDA graphs for steps with prompt chunks, against independent oracles: the model's own eager
forward pass on the unpadded step (hidden states and the K/V it stores) and transformers' greedy
tokens. On a CPU the padded batch the graph would replay runs eagerly (``capture_graphs=False``:
same buffers, padding and bucket choice); on a GPU it is captured and replayed."""

from __future__ import annotations

import random

import pytest
import torch

from paged_edu.core.validation import FieldTypeError
from paged_edu.engine import Engine
from paged_edu.engine.batch import BatchChunk, pack_chunks, prepare_batch
from paged_edu.engine.cuda_graphs import MixedCudaGraphs
from paged_edu.engine.sampling import SamplingParams
from paged_edu.labs.engine_lab import tiny_model
from paged_edu.models.llama import Kernels

B = 4  # tokens per block
NUM_BLOCKS = 64


def kv_pool(model, device, seed: int = 0):
    """Random K/V per layer, as if earlier tokens had been stored: attention reads it either way."""
    g = torch.Generator().manual_seed(seed)
    c = model.config
    shape = (NUM_BLOCKS, B, c.num_kv_heads, c.head_dim)
    return [
        (
            torch.randn(shape, generator=g).to(device, model.dtype),
            torch.randn(shape, generator=g).to(device, model.dtype),
        )
        for _ in range(c.num_layers)
    ]


def mixed_chunks(seed: int, num_decodes: int = 3) -> list[BatchChunk]:
    """Decodes and prompt chunks over cached prefixes, in random order, on distinct blocks."""
    rng = random.Random(seed)
    free = list(range(1, NUM_BLOCKS))
    rng.shuffle(free)
    chunks = []
    for n in [1] * num_decodes + [rng.randrange(2, 9), rng.randrange(2, 9)]:
        start = rng.randrange(0, 17)
        table = [free.pop() for _ in range(-(-(start + n) // B))]
        chunks.append(BatchChunk([rng.randrange(300) for _ in range(n)], start, table))
    rng.shuffle(chunks)
    return chunks


def graphs_for(model, kv, kernels, capture: bool, max_num_tokens=64, max_num_seqs=8):
    return MixedCudaGraphs(model, kv, max_num_tokens, max_num_seqs, NUM_BLOCKS, kernels, capture_graphs=capture)


def run_step(graphs: MixedCudaGraphs, chunks):
    """Stage a step as the runner does and replay it: ``(hidden[:T], bucket)``."""
    batch = pack_chunks(
        [t for c in chunks for t in c.token_ids],
        [c.start for c in chunks],
        [len(c.token_ids) for c in chunks],
        [c.block_table for c in chunks],
        B,
    )
    key = graphs.size_for(batch)
    sampling = graphs.stage(batch, key, batch.logits_rows, None)
    assert sampling.rows.tolist() == batch.logits_rows.tolist() and sampling.temperatures is None
    T = batch.input_ids.shape[0]
    return graphs.replay(key)[:T], key


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fused", ["torch", "triton"])
def test_padded_mixed_step_is_the_forward_pass_and_stores_the_same_kv(seed, fused):
    """The padded step (spare rows, spare decode rows, spare chunks of length 0) gives the unpadded
    forward pass's hidden states and K/V, twice in a row on the same buffers (the second step's
    stale rows from the first must not leak), including a step with no decode at all."""
    model = tiny_model(seed=seed, vocab_size=300)
    kernels = Kernels("torch", "torch", fused).resolve(model.device)
    want_kv, got_kv = kv_pool(model, "cpu", seed), kv_pool(model, "cpu", seed)
    graphs = graphs_for(model, got_kv, kernels, capture=False)
    for chunks, decodes in ((mixed_chunks(seed), True), (mixed_chunks(seed + 10, num_decodes=0), False)):
        want = model(prepare_batch(chunks, B), want_kv, kernels)  # (T, hidden)
        got, (Tb, Dcap) = run_step(graphs, chunks)
        assert Tb > got.shape[0]  # padded
        assert Dcap == (min(8, Tb) if decodes else 0)  # no decode: the bucket's graph without decode rows
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # (a padded matmul may round differently)
        for (wk, wv), (gk, gv) in zip(want_kv, got_kv):  # and the padding rows stored nothing
            torch.testing.assert_close(gk, wk, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(gv, wv, rtol=1e-5, atol=1e-5)


def test_a_bucket_gives_the_prefill_kernel_the_chunks_it_can_hold():
    """A step of Tb tokens has at most min(max_num_seqs, Tb) chunks: the graph of bucket 16 passes the
    prefill kernel 16 chunk slots (its grid and search), not max_num_seqs = 32 -- and a step that
    fills the bucket with chunks (7 prompt chunks of 2 tokens, 2 decodes) is still the forward pass."""
    model = tiny_model(seed=3, vocab_size=300)
    kernels = Kernels("torch", "torch", "torch").resolve(model.device)
    want_kv, got_kv = kv_pool(model, "cpu", 3), kv_pool(model, "cpu", 3)
    graphs = graphs_for(model, got_kv, kernels, capture=False, max_num_tokens=64, max_num_seqs=32)
    assert [graphs._batch((Tb, 0)).prefill_cu_seqlens_q.shape[0] for Tb in graphs.sizes] == [17, 33, 33]
    rng = random.Random(5)
    free = list(range(1, NUM_BLOCKS))
    rng.shuffle(free)
    chunks = []
    for n in [1, 1] + [2] * 7:
        start = rng.randrange(0, 9)
        chunks.append(
            BatchChunk([rng.randrange(300) for _ in range(n)], start, [free.pop() for _ in range(-(-(start + n) // B))])
        )
    want = model(prepare_batch(chunks, B), want_kv, kernels)  # (16, hidden)
    got, key = run_step(graphs, chunks)
    assert key == (16, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_steps_of_other_buckets_on_the_same_buffers_are_each_the_forward_pass():
    """``stage`` writes only the chunk slots of the step's own graph (``max_chunks(Tb)``): a step of a
    larger bucket (many chunks), then a lone prompt of a smaller one, then one of the larger again, on
    the same buffers -- each the unpadded forward pass (no stale slot read), each graph's chunk slots
    the padded definition (lengths 0 and ``cu`` at ``T`` past the step's chunks), the sampled rows
    and their params staged with them."""
    model = tiny_model(seed=4, vocab_size=300)
    kernels = Kernels("torch", "torch", "torch").resolve(model.device)
    want_kv, got_kv = kv_pool(model, "cpu", 4), kv_pool(model, "cpu", 4)
    graphs = graphs_for(model, got_kv, kernels, capture=False, max_num_tokens=64, max_num_seqs=32)
    rng = random.Random(7)
    free = list(range(1, NUM_BLOCKS))
    rng.shuffle(free)

    def chunks_of(counts):
        chunks = []
        for n in counts:
            start = rng.randrange(0, 5)
            table = [free.pop() for _ in range(-(-(start + n) // B))]
            chunks.append(BatchChunk([rng.randrange(300) for _ in range(n)], start, table))
        return chunks

    for counts in ([2] * 20, [10], [3, 4], [2] * 20):
        chunks = chunks_of(counts)
        want = model(prepare_batch(chunks, B), want_kv, kernels)  # (T, hidden)
        batch = prepare_batch(chunks, B)
        (Tb, Dcap) = key = graphs.size_for(batch)
        params = ([0.5] * len(counts), [0.9] * len(counts), [0.25] * len(counts))
        sampling = graphs.stage(batch, key, batch.logits_rows, params)
        T, C = batch.input_ids.shape[0], graphs.max_chunks(Tb)
        staged = graphs._batch(key)
        ends = [c.start + len(c.token_ids) for c in chunks]
        assert staged.prefill_seq_lens.tolist() == ends + [0] * (C - len(chunks))
        assert staged.prefill_cu_seqlens_q.tolist() == [0, *torch.tensor(counts).cumsum(0).tolist()] + [T] * (
            C - len(chunks)
        )
        assert sampling.rows.tolist() == batch.logits_rows.tolist()
        assert sampling.temperatures.tolist() == [0.5] * len(counts) and sampling.uniforms.tolist() == [0.25] * len(
            counts
        )
        torch.testing.assert_close(graphs.replay(key)[:T], want, rtol=1e-5, atol=1e-5)
        free.extend(b for c in chunks for b in c.block_table)  # their K/V is in both pools: reusable
    assert graphs.stage(batch, key, list(range(33)), None) is None  # more sampled rows than slots: not staged


def test_buckets_cover_every_step_up_to_the_token_budget():
    model = tiny_model(vocab_size=300)
    kv = kv_pool(model, "cpu")
    graphs = MixedCudaGraphs(model, kv, 2048, 8, NUM_BLOCKS, capture_graphs=False)
    assert graphs.sizes == [16, 32, 64, 128, 256, 512, 1024, 1536, 2048]
    for T in range(1, 2049):
        Tb = next(t for t in graphs.sizes if t >= T)
        assert Tb == 16 or graphs.sizes[graphs.sizes.index(Tb) - 1] < T
    batch = pack_chunks(list(range(9)), [0], [9], [[1, 2, 3]], B)
    assert graphs.size_for(batch) == (16, 0)  # a prompt alone: the graph without decode rows
    with_decode = pack_chunks(list(range(10)), [4, 0], [1, 9], [[4, 5], [1, 2, 3]], B)
    assert graphs.size_for(with_decode) == (16, 8)  # min(max_num_seqs, Tb) decode rows
    assert graphs.keys[:4] == [(16, 0), (16, 8), (32, 0), (32, 8)]
    too_wide = pack_chunks(list(range(9)), [0], [9], [list(range(NUM_BLOCKS + 1))], B)
    assert graphs.size_for(too_wide) is None  # a table wider than the graph's: eager
    many = pack_chunks(list(range(9)), list(range(9)), [1] * 9, [[i] * 3 for i in range(9)], B)
    assert graphs.size_for(many) is None  # more chunks than max_num_seqs: eager
    assert MixedCudaGraphs(model, kv, 100, 8, 8, capture_graphs=False).sizes[-1] == 100


@pytest.mark.parametrize("max_num_seqs", [8, 32])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_engine_on_mixed_step_graphs_gives_transformers_tokens(hf_greedy_case, async_scheduling, max_num_seqs):
    """Steps with prompt chunks (chunked: 24 tokens a step, decodes alongside) through the padded
    graph batch, async scheduling's placeholders filled into the graph's own ids: transformers'
    greedy tokens -- with max_num_seqs = 32 too, past every bucket (16, 24): the prefill kernel
    then gets the bucket's chunk slots, not max_num_seqs."""
    from paged_edu.models.llama import PagedLlama

    hf, prompts, want = hf_greedy_case
    engine = Engine(
        PagedLlama.from_hf(hf),
        num_blocks=96,
        block_size=B,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=24,
        async_scheduling=async_scheduling,
    )
    r = engine.runner
    r.mixed_graphs = MixedCudaGraphs(engine.model, r.kv_pairs, 24, max_num_seqs, 64, r.kernels, capture_graphs=False)
    assert engine.generate(prompts, max_new_tokens=9) == want
    assert engine.num_mixed_graph_steps > 0 and engine.num_graph_steps == 0


def test_mixed_graphs_need_cuda_and_a_flag():
    model = tiny_model(vocab_size=300)
    with pytest.raises(ValueError, match="mixed_graphs=True needs the model on a CUDA device"):
        Engine(model, num_blocks=8, block_size=B, mixed_graphs=True)
    with pytest.raises(FieldTypeError, match="mixed_graphs"):
        Engine(model, num_blocks=8, block_size=B, mixed_graphs="yes")
    with pytest.raises(ValueError, match="CUDA"):
        MixedCudaGraphs(model, kv_pool(model, "cpu"), 64, 8, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_captured_mixed_steps_give_the_forward_pass(dtype):
    model = tiny_model(device="cuda", dtype=dtype, seed=2, vocab_size=300)
    kernels = Kernels().resolve(model.device)
    want_kv, got_kv = kv_pool(model, "cuda", 0), kv_pool(model, "cuda", 0)
    graphs = graphs_for(model, got_kv, kernels, capture=True)
    # a graph per bucket without decode rows, and one with a decode row per chunk a step of it can hold
    assert set(graphs.graphs) == {(Tb, D) for Tb in graphs.sizes for D in (0, graphs.max_chunks(Tb))}
    for seed in range(4):
        chunks = mixed_chunks(seed, num_decodes=seed % 4)
        want = model(prepare_batch(chunks, B, "cuda"), want_kv, kernels)
        got, Tb = run_step(graphs, chunks)
        torch.cuda.synchronize()
        tol = 1e-4 if dtype == torch.float32 else 3e-2  # a padded GEMM may pick another algorithm
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        for (wk, wv), (gk, gv) in zip(want_kv, got_kv):
            torch.testing.assert_close(gk, wk, rtol=tol, atol=tol)
            torch.testing.assert_close(gv, wv, rtol=tol, atol=tol)


@pytest.mark.gpu
def test_gpu_engine_with_every_graph_gives_the_eager_tokens():
    """Decode and mixed-step graphs, with and without async scheduling, against the eager engine on
    the same GPU model: greedy and seeded sampling, n > 1, and a tight pool that preempts."""
    model = tiny_model(device="cuda", seed=7, vocab_size=512)
    rng = random.Random(0)
    prompts = [[rng.randrange(512) for _ in range(rng.randrange(1, 90))] for _ in range(24)]
    params = [
        SamplingParams(max_tokens=12, temperature=0.0 if i % 2 else 0.8, seed=i, n=1 if i % 2 else 1 + i % 3)
        for i in range(24)
    ]
    runs = {}
    for graphs, async_scheduling in ((False, False), (True, False), (True, True)):
        engine = Engine(
            model,
            num_blocks=80,
            block_size=B,
            max_num_seqs=16,
            max_num_batched_tokens=64,
            cuda_graphs=graphs,
            mixed_graphs=graphs,
            async_scheduling=async_scheduling,
        )
        assert engine.graph_error is None
        runs[graphs, async_scheduling] = [(o.outputs, o.finish_reasons) for o in engine.run(prompts, params)]
        assert (engine.num_mixed_graph_steps > 0) == graphs
        assert engine.allocator.num_used_blocks == 0
    assert runs[True, False] == runs[False, False]
    assert runs[True, True] == runs[False, False]

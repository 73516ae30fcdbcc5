"""The runner's speed machinery against plain definitions: the vectorised batch against a per-token
loop, device sampling against :func:`sample`, the prefetched uniforms against one draw at a time."""

from __future__ import annotations

import random

import pytest
import torch

from paged_edu.engine.batch import BatchChunk, pack_chunks, pack_one_chunk, prepare_batch
from paged_edu.engine.sampling import Sampler, SamplingParams, sample, sample_on_device


def brute_force_batch(chunks, B):
    """The batch by its definition, one token at a time (the pre-vectorised prepare_batch)."""
    order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].token_ids) != 1)
    ids, pos, slots, last = [], [], [], [0] * len(chunks)
    for i in order:
        c = chunks[i]
        for k, tok in enumerate(c.token_ids):
            t = c.start + k
            ids.append(tok)
            pos.append(t)
            slots.append(c.block_table[t // B] * B + t % B)
        last[i] = len(ids) - 1
    dec = [chunks[i] for i in order if len(chunks[i].token_ids) == 1]
    pre = [chunks[i] for i in order if len(chunks[i].token_ids) != 1]
    return ids, pos, slots, last, dec, pre


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_batch_equals_the_per_token_definition(seed):
    rng = random.Random(seed)
    B = rng.choice([1, 4, 16])
    chunks = []
    for _ in range(rng.randrange(1, 12)):
        start = rng.randrange(0, 40)
        n = rng.choice([1, 1, rng.randrange(1, 30)])
        blocks = rng.sample(range(200), -(-(start + n) // B) + rng.randrange(0, 3))  # tables may run longer
        chunks.append(BatchChunk([rng.randrange(1000) for _ in range(n)], start, blocks))
    batch = prepare_batch(chunks, B)
    ids, pos, slots, last, dec, pre = brute_force_batch(chunks, B)
    assert batch.input_ids.tolist() == ids and batch.positions.tolist() == pos
    assert batch.slot_mapping.tolist() == slots and batch.logits_rows.tolist() == last
    assert batch.num_decodes == len(dec)
    for tables, lens, group in (
        (batch.decode_block_tables, batch.decode_seq_lens, dec),
        (batch.prefill_block_tables, batch.prefill_seq_lens, pre),
    ):
        if not group:
            assert tables is None and lens is None
            continue
        assert lens.tolist() == [c.start + len(c.token_ids) for c in group]
        for row, c in zip(tables.tolist(), group):
            assert row[: len(c.block_table)] == c.block_table and not any(row[len(c.block_table) :])
    if pre:
        cu = [len(dec)]  # the chunks' rows follow the decode rows
        for c in pre:
            cu.append(cu[-1] + len(c.token_ids))
        assert batch.prefill_cu_seqlens_q.tolist() == cu
    else:
        assert batch.prefill_cu_seqlens_q is None
    assert batch.input_ids.dtype == batch.positions.dtype == batch.slot_mapping.dtype == torch.int64


@pytest.mark.parametrize("seed", range(6))
def test_one_prompt_chunk_packs_as_the_general_path_and_the_definition(seed):
    """``pack_one_chunk`` (the lone prompt's short path) gives :func:`pack_chunks`'s arrays -- values,
    dtypes, shapes -- and the per-token definition."""
    rng = random.Random(seed)
    B = rng.choice([1, 4, 16])
    start, n = rng.randrange(0, 40), rng.randrange(2, 60)
    chunk = BatchChunk([rng.randrange(1000) for _ in range(n)], start, rng.sample(range(200), -(-(start + n) // B)))
    short = pack_one_chunk(chunk.token_ids, start, n, chunk.block_table, B)
    general = pack_chunks(chunk.token_ids, [start], [n], [chunk.block_table], B)
    for name in ("input_ids", "positions", "slot_mapping", "logits_rows", "prefill_block_tables", "prefill_seq_lens",
                 "prefill_cu_seqlens_q"):  # fmt: skip
        a, b = getattr(short, name), getattr(general, name)
        assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all(), name
    assert short.num_decodes == general.num_decodes == 0
    assert short.decode_block_tables is short.decode_seq_lens is None
    ids, pos, slots, last, _, _ = brute_force_batch([chunk], B)
    assert short.input_ids.tolist() == ids and short.positions.tolist() == pos
    assert short.slot_mapping.tolist() == slots and short.logits_rows.tolist() == last
    with pytest.raises(ValueError, match="chunk 0: block table of 1 blocks cannot hold 5 tokens"):
        pack_one_chunk([1, 2], 3, 2, [0], 4)


def test_bad_chunks_raise_naming_the_chunk():
    with pytest.raises(ValueError, match="chunk 1 has no tokens"):
        prepare_batch([BatchChunk([1], 0, [0]), BatchChunk([], 0, [1])], 4)
    with pytest.raises(ValueError, match="chunk 0: block table of 1 blocks cannot hold 5 tokens"):
        prepare_batch([BatchChunk([1, 2], 3, [0])], 4)


def test_device_sampling_equals_sample():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=gen) * 3
    temps = [0.0 if i % 3 == 0 else 0.5 + i / 64 for i in range(64)]
    top_ps = [1.0 if i % 2 else 0.7 for i in range(64)]
    us = torch.rand(64, generator=gen).tolist()
    want = sample(logits, temps, top_ps, us)
    got = sample_on_device(logits, torch.tensor(temps), torch.tensor(top_ps), torch.tensor(us)).tolist()
    assert got == want
    assert [want[i] for i in range(0, 64, 3)] == logits.argmax(-1)[::3].tolist()  # greedy rows


def test_prefetched_uniforms_are_the_generator_stream_one_draw_at_a_time():
    """A request's draws do not change with prefetching: element k of the stream, as a scalar draw."""
    s = Sampler()
    s.add(0, SamplingParams(temperature=1.0, seed=42, n=2))
    draws = [s.uniform(0, 1) for _ in range(Sampler.PREFETCH * 2 + 5)]  # across refills
    gen = torch.Generator().manual_seed(43)
    assert draws == [float(torch.rand((), generator=gen)) for _ in range(len(draws))]
    s.remove(0, 1)
    assert s.uniform(0, 1) == 0.0 and len(s) == 1


def test_staged_views_are_aligned_for_triton():
    """Every field of a staged batch starts on a 256-byte boundary of one buffer (Triton compiles a
    new kernel variant for a pointer that is not 16-byte aligned)."""
    chunks = [BatchChunk([5], 3, [0]), BatchChunk([1, 2, 3], 0, [2]), BatchChunk([7], 9, [4, 1, 3])]
    batch = prepare_batch(chunks, 4)
    fields = [
        batch.input_ids,
        batch.positions,
        batch.slot_mapping,
        batch.logits_rows,
        batch.decode_block_tables,
        batch.decode_seq_lens,
        batch.prefill_block_tables,
        batch.prefill_seq_lens,
        batch.prefill_cu_seqlens_q,
    ]
    base = batch.input_ids.untyped_storage().data_ptr()
    assert all(f.untyped_storage().data_ptr() == base for f in fields)  # one buffer, one copy
    assert all((f.data_ptr() - base) % 256 == 0 for f in fields)


def test_the_graph_path_stages_pads_and_samples_like_the_eager_path(hf_greedy_case):
    """The CUDA-graph path without CUDA: a stand-in whose replay runs the captured forward eagerly on
    the static staged inputs (padded to the captured sizes) gives transformers' greedy tokens, and
    so does seeded sampling through the staged uniforms (same tokens as the eager engine)."""
    from paged_edu.engine import Engine
    from paged_edu.engine.cuda_graphs import DecodeCudaGraphs
    from paged_edu.models.llama import PagedLlama

    class EagerGraphs(DecodeCudaGraphs):  # the graphs' staging and padding, replayed eagerly, replays counted
        def __init__(self, model, kv_caches, n, W, kernels):
            super().__init__(model, kv_caches, n, W, kernels, capture_graphs=False)
            self.replays = []

        def replay(self, bs):
            self.replays.append(bs)
            return super().replay(bs)

    hf, prompts, want = hf_greedy_case
    params = [SamplingParams(max_tokens=9, temperature=0.9, top_p=0.9, seed=5 + i) for i in range(len(prompts))]
    runs = {}
    for graphs in (False, True):
        engine = Engine(PagedLlama.from_hf(hf), num_blocks=64, block_size=4, max_num_seqs=8)
        if graphs:
            engine.runner.graphs = EagerGraphs(engine.model, engine.runner.kv_pairs, 8, 64, engine.runner.kernels)
        runs[graphs] = engine.run(prompts, params)
        if graphs:
            assert engine.generate(prompts, max_new_tokens=9) == want
            assert 8 in engine.runner.graphs.replays  # 7 sequences padded to the captured 8
    assert [o.outputs for o in runs[True]] == [o.outputs for o in runs[False]]

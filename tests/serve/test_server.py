"""``paged-edu serve`` on the tiny random model, driven over real HTTP on 127.0.0.1: by the ``openai``
package (the client learners use) and by raw httpx, streamed and not. Oracles: ``Engine.run`` on the
same weights for greedy tokens, a ChatML prompt written out by hand, the client's own counts against
the server's ``/metrics`` (read with prometheus_client's text parser), and the allocator's state
read on the engine's thread. The reliability points of issue 46 (item 6) each have a test here or
in ``test_serve_cli.py`` (SIGTERM, the API key, the command line).
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from hang_guard import HANG_GUARD_S
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import ThreadServer, stream_all_at_once

from paged_edu.engine import Engine, SamplingParams

B = 16
MAX_BODY = 65_536
EOS = 258  # the byte tokenizer's <|im_end|>


@pytest.fixture(scope="module")
def srv():
    server = ThreadServer(
        [
            "--model", "tiny-random", "--num-gpu-blocks-override", "4096", "--max-num-seqs", "256",
            "--max-model-len", "2048", "--max-body-bytes", str(MAX_BODY),
        ]
    )  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(srv):
    c = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=HANG_GUARD_S)
    yield c
    c.close()


@pytest.fixture(scope="module")
def tiny_model():
    """The server's weights, built here from the same seed (its engine core builds its own copy)."""
    import torch

    from paged_edu.serve.launch import tiny_random_model

    return tiny_random_model(torch.device("cpu"), torch.float32, seed=0)[0]


def reference(model, prompts, params) -> list[list[int]]:
    """What ``Engine.run`` generates for ``prompts`` on the server's weights (a fresh, synchronous engine)."""
    engine = Engine(model, num_blocks=4096, block_size=B, max_model_len=2048)
    return [o.outputs for o in engine.run(prompts, params, use_tqdm=False)]


def metrics(srv) -> dict[str, float]:
    text = httpx.get(f"{srv.base_url}/metrics", timeout=HANG_GUARD_S).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert s.labels.get("model_name") == "tiny-random" and s.labels.get("engine") == "0", s
            if not s.name.endswith("_bucket"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def wait_idle(srv) -> None:
    """Until the engine holds no request (bounded): an abort frees blocks at the core's next turn."""
    deadline = time.monotonic() + HANG_GUARD_S
    while srv.state()["has_unfinished"]:
        assert time.monotonic() < deadline, "the engine never went idle"
        time.sleep(0.02)


def used_blocks(srv) -> int:
    return srv.state()["num_used_blocks"]


def prompt_ids(k: int, n: int) -> list[int]:
    return [(31 * k + 7 * i) % 250 + 1 for i in range(n)]


# -- the API --------------------------------------------------------------------------------------


def test_models_health_and_metrics_names(srv, client):
    assert [m.id for m in client.models.list().data] == ["tiny-random"]
    assert httpx.get(f"{srv.base_url}/health").status_code == 200
    names = {f.name for f in text_string_to_metric_families(httpx.get(f"{srv.base_url}/metrics").text)}
    # prometheus_client's parser names a counter's family without its _total
    for name in (
        "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions", "vllm:prompt_tokens",
        "vllm:generation_tokens", "vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
    ):  # fmt: skip
        assert name in names, name
    assert "vllm:prefix_cache_hit_rate" not in names  # not a served metric, in vLLM neither


def test_greedy_completion_is_engine_runs_tokens(srv, client, tiny_model):
    prompts = [prompt_ids(k, 20 + 9 * k) for k in range(4)]
    want = reference(tiny_model, prompts, SamplingParams(max_tokens=12))
    for prompt, (expected,) in zip(prompts, want):
        r = client.completions.create(
            model="tiny-random", prompt=prompt, max_tokens=12, temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )  # fmt: skip
        choice = r.choices[0]
        assert choice.model_extra["token_ids"] == expected
        assert choice.finish_reason == "length"
        assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == 12
        assert choice.text == bytes(t for t in expected if t < 256).decode("utf-8", errors="replace")


def _idle_cpu_share(server: ThreadServer, seconds: float = 0.5) -> float:
    """The share of a core the server's engine core process takes while nothing is asked of it (user and
    system CPU time, read with psutil as ``benchmarks/bench_api_stream.py`` reads the server's processes)."""
    import psutil

    core = psutil.Process(server.server.client.process.pid)
    start, cpu = time.monotonic(), sum(core.cpu_times()[:2])
    time.sleep(seconds)
    return (sum(core.cpu_times()[:2]) - cpu) / (time.monotonic() - start)


def test_a_spinning_engine_core_serves_engine_runs_tokens_and_stops(srv, tiny_model):
    """``--no-sleep-on-idle``: the core spins while idle (a core's worth of CPU, where the default's sleeps),
    serves the same greedy tokens as ``Engine.run``, and a stop while it spins ends it."""
    spinning = ThreadServer(
        [
            "--model", "tiny-random", "--num-gpu-blocks-override", "4096", "--max-num-seqs", "256",
            "--max-model-len", "2048", "--no-sleep-on-idle",
        ]
    )  # fmt: skip
    try:
        wait_idle(srv)
        assert _idle_cpu_share(srv) < 0.2  # the default: asleep in poll
        assert _idle_cpu_share(spinning) > 0.3  # (a share, not a core: a 2-core CI box runs other tests beside it)
        prompts = [prompt_ids(k, 20 + 9 * k) for k in range(2)]
        want = reference(tiny_model, prompts, SamplingParams(max_tokens=12))
        with openai.OpenAI(base_url=f"{spinning.base_url}/v1", api_key="unused", max_retries=0) as c:
            for prompt, (expected,) in zip(prompts, want):
                r = c.completions.create(
                    model="tiny-random", prompt=prompt, max_tokens=12, temperature=0,
                    extra_body={"ignore_eos": True, "return_token_ids": True},
                )  # fmt: skip
                assert r.choices[0].model_extra["token_ids"] == expected
    finally:
        spinning.stop()
    assert spinning.server.client.process.poll() == 0  # the "stop" reached the spinning loop: the core exited


def test_chat_uses_the_chatml_template_and_streams_the_same_reply(srv, client, tiny_model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    by_hand = [
        257,
        *b"system\nBe brief.",
        258,
        *b"\n",
        257,
        *b"user\nHi there",
        258,
        *b"\n",
        257,
        *b"assistant\n",
    ]  # <|im_start|> = 257, <|im_end|> = 258
    (expected,) = reference(tiny_model, [by_hand], SamplingParams(max_tokens=10, stop_token_ids=(EOS,)))[0]
    r = client.chat.completions.create(
        model="tiny-random", messages=messages, max_tokens=10, temperature=0, extra_body={"return_token_ids": True}
    )
    assert r.usage.prompt_tokens == len(by_hand)
    assert r.choices[0].model_extra["token_ids"] == expected
    text = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="tiny-random", messages=messages, max_tokens=10, temperature=0, stream=True
        )
        if chunk.choices
    )
    assert text == r.choices[0].message.content


def test_streamed_usage_counts_cached_prompt_tokens(srv, client):
    prompt = prompt_ids(99, 3 * B + 5)
    for expected_cached in (0, 3 * B):  # the second time, its three full blocks are cached
        stream = client.completions.create(
            model="tiny-random", prompt=prompt, max_tokens=4, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = list(stream)
        usage = chunks[-1].usage
        assert chunks[-1].choices == [] and usage.completion_tokens == 4
        assert usage.prompt_tokens_details.cached_tokens == expected_cached


def test_stop_string_ends_the_text_and_frees_the_blocks(srv, client):
    prompt = prompt_ids(5, 30)
    full = client.completions.create(model="tiny-random", prompt=prompt, max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text  # fmt: skip
    k = next(i for i in range(3, len(full)) if full[i] not in full[:i] and full[i] != "\ufffd")
    r = client.completions.create(
        model="tiny-random",
        prompt=prompt,
        max_tokens=24,
        temperature=0,
        stop=[full[k]],
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].text == full[:k]
    assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["stop_reason"] == full[k]
    wait_idle(srv)
    assert used_blocks(srv) == 0


def test_n_seeded_samples_are_engine_runs(srv, client, tiny_model):
    prompt = prompt_ids(7, 25)
    params = SamplingParams(max_tokens=8, temperature=0.8, seed=11, n=3, stop_token_ids=(EOS,))
    (expected,) = reference(tiny_model, [prompt], params)
    r = client.completions.create(
        model="tiny-random", prompt=prompt, max_tokens=8, temperature=0.8, seed=11, n=3,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    assert [c.model_extra["token_ids"] for c in sorted(r.choices, key=lambda c: c.index)] == expected


# -- bad requests: 400 naming the field, the engine serving on -------------------------------------

BAD = [
    (b'{"prompt": [1, 2', None, "not valid JSON"),
    (b'{"prompt": [1, 2], "max_tokens": "ten"}', "max_tokens", "max_tokens"),
    (b'{"prompt": [1, 2], "max_tokens": 5000}', "max_tokens", "past the model length"),
    (b'{"prompt": [1, 2], "cache_salt": ""}', "cache_salt", "non-empty"),
    (b'{"prompt": [1, 2], "n": 0, "temperature": 1}', "n", "n must be in"),
    (b'{"prompt": [1, 2], "n": 129, "temperature": 1}', "n", "n must be in"),
    (b'{"prompt": [1, 2], "temperature": -1}', "temperature", ">= 0"),
    (b'{"prompt": [1, 2], "logprobs": 2}', "logprobs", "not supported"),
    (b'{"prompt": [1, 2], "top_p": 0}', "top_p", "(0, 1]"),
    (b'{"prompt": [1, 300]}', "prompt", "outside the vocabulary"),
    (b'{"prompt": 5}', "prompt", "wrong type"),
    (b'{"prompt": [[1], [2]]}', "prompt", "one prompt per request"),
]


@pytest.mark.parametrize("body,param,words", BAD, ids=[b[2] for b in BAD])
def test_a_bad_completion_is_a_400_naming_the_field(srv, body, param, words):
    r = httpx.post(f"{srv.base_url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["code"] == 400 and error["type"]


def test_prompt_too_long_and_unsupported_chat_fields_via_openai(srv, client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny-random", prompt=prompt_ids(1, 2048), max_tokens=1)
    assert info.value.status_code == 400 and info.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny-random", messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )  # fmt: skip
    assert info.value.body["param"] == "tools" and "not supported" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny-random", messages=[{"role": "robot", "content": "hi"}])
    assert info.value.body["param"] == "messages.0.role"
    assert used_blocks(srv) == 0  # nothing was queued
    ok = client.completions.create(model="tiny-random", prompt=[1, 2, 3], max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason in ("length", "stop")  # and it serves on


def test_an_unknown_field_is_ignored_with_a_warning(srv, client, caplog):
    with caplog.at_level("WARNING", logger="paged_edu.serve"):
        r = client.completions.create(
            model="tiny-random", prompt=[4, 5, 6], max_tokens=3, temperature=0, extra_body={"frobnicate": 1}
        )
    assert r.choices[0].finish_reason in ("length", "stop")
    assert any("frobnicate" in rec.getMessage() and "ignored" in rec.getMessage() for rec in caplog.records)


def test_a_body_past_the_bound_is_a_413_before_it_is_parsed(srv):
    big = b'{"prompt": "' + b"x" * MAX_BODY + b'"}'
    r = httpx.post(f"{srv.base_url}/v1/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "--max-body-bytes" in r.json()["error"]["message"]

    def chunked():  # no Content-Length: the bound holds while the body is read
        for _ in range(MAX_BODY // 1000 + 2):
            yield b"x" * 1000

    r = httpx.post(f"{srv.base_url}/v1/completions", content=chunked())
    assert r.status_code == 413
    r = httpx.post(f"{srv.base_url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
    assert r.status_code == 200


# -- clients that leave -----------------------------------------------------------------------------


def test_a_client_that_disconnects_mid_stream_is_aborted_and_its_blocks_freed(srv):
    before = metrics(srv)["vllm:generation_tokens_total"]
    body = {"prompt": prompt_ids(3, 40), "max_tokens": 1500, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{srv.base_url}/v1/completions", json=body, timeout=HANG_GUARD_S) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # one chunk, then hang up
    wait_idle(srv)
    assert used_blocks(srv) == 0
    generated = metrics(srv)["vllm:generation_tokens_total"] - before
    assert 1 <= generated < 1500  # aborted, not run to its end


def test_a_waiting_non_streamed_client_that_leaves_is_aborted(srv):
    before = metrics(srv)["vllm:generation_tokens_total"]
    body = {"prompt": prompt_ids(4, 40), "max_tokens": 1500, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{srv.base_url}/v1/completions", json=body, timeout=httpx.Timeout(0.5, connect=HANG_GUARD_S))
    wait_idle(srv)
    assert used_blocks(srv) == 0
    assert metrics(srv)["vllm:generation_tokens_total"] - before < 1500


# -- the counters against the client's own counts ---------------------------------------------------


def test_metrics_count_what_the_clients_saw(srv, client):
    wait_idle(srv)
    before = metrics(srv)
    prompts = [prompt_ids(40 + k, 10 + 13 * k) for k in range(5)] + [prompt_ids(40, 10)]  # the last one repeats
    lens = [3, 5, 8, 2, 6, 4]
    cached = 0
    for p, m in zip(prompts, lens):
        r = client.completions.create(model="tiny-random", prompt=p, max_tokens=m, temperature=0,
                                      extra_body={"ignore_eos": True})  # fmt: skip
        cached += r.usage.prompt_tokens_details.cached_tokens
    after = metrics(srv)
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    assert d["vllm:prompt_tokens_total"] == sum(map(len, prompts))
    assert d["vllm:prefix_cache_queries_total"] == sum(map(len, prompts))
    assert d["vllm:prefix_cache_hits_total"] == cached
    assert d["vllm:generation_tokens_total"] == sum(lens)
    assert d["vllm:time_to_first_token_seconds_count"] == len(prompts)
    assert d["vllm:e2e_request_latency_seconds_count"] == len(prompts)
    assert d["vllm:inter_token_latency_seconds_count"] == sum(m - 1 for m in lens)
    # Each TTFT in two at the start of the request's first engine step: both parts >= 0, summing to it.
    assert [d[f"vllm:request_{k}_time_seconds_count"] for k in ("queue", "prefill")] == [len(prompts)] * 2
    parts = [d[f"vllm:request_{k}_time_seconds_sum"] for k in ("queue", "prefill")]
    assert min(parts) >= 0 and sum(parts) == pytest.approx(d["vllm:time_to_first_token_seconds_sum"], rel=1e-6)
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0


# -- many clients at once ---------------------------------------------------------------------------

NUM_CLIENTS = 256


def test_256_concurrent_streaming_clients(srv, tiny_model):
    """Every request answered; the greedy three quarters token for token as ``Engine.run``; no block leaked."""
    prompts = [prompt_ids(k % 200, 8 + k % 40) + prompt_ids(k, 4) for k in range(NUM_CLIENTS)]  # shared heads
    greedy = [k for k in range(NUM_CLIENTS) if k % 4]
    t0 = time.perf_counter()
    results = stream_all_at_once(srv.base_url, prompts, 16, sampled={k for k in range(NUM_CLIENTS) if not k % 4})
    seconds = time.perf_counter() - t0
    assert all(finish == "length" and len(ids) == 16 for ids, finish in results)
    want = reference(tiny_model, [prompts[k] for k in greedy], SamplingParams(max_tokens=16))
    assert [results[k][0] for k in greedy] == [w[0] for w in want]
    wait_idle(srv)
    assert used_blocks(srv) == 0
    print(f"\n{NUM_CLIENTS} concurrent streaming clients served in {seconds:.1f} s, 0 blocks left in use")

"""``paged-edu serve --api-server-count N`` (vLLM's flag): N API server processes on one port and one engine
core, driven as a subprocess over real HTTP (the ``openai`` package, httpx). Oracles: ``Engine.run`` on
the same weights for greedy tokens, the clients' own counts against ``/metrics`` (whichever process
answers the scrape), each API server's count of the requests it sent to the core (the line it prints
as it stops) against the number sent, and the processes' exit statuses."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import httpx
import pytest
from hang_guard import HANG_GUARD_S
from server_helpers import ROOT, ProcessServer, stream_all_at_once
from test_server import prompt_ids, reference

from paged_edu.engine import SamplingParams

TINY = ["--model", "tiny-random", "--num-gpu-blocks-override", "4096", "--max-model-len", "2048"]
NUM_REQUESTS = 96
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def tiny_model():
    import torch

    from paged_edu.serve.launch import tiny_random_model

    return tiny_random_model(torch.device("cpu"), torch.float32, seed=0)[0]


def counters(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=HANG_GUARD_S).text  # a new connection: any API server may answer
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if not s.name.endswith("_bucket")
    }


def pids(server: ProcessServer) -> tuple[int, list[int]]:
    """The engine core's pid and the API servers', from the description line the server prints."""
    line = next(line for line in server.lines if "API servers: processes" in line)
    core = int(re.search(r"engine core: process (\d+)", line)[1])
    return core, [int(p) for p in re.search(r"API servers: processes ([\d, ]+)", line)[1].split(", ")]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_two_api_servers_serve_every_request_and_sum_their_metrics(tiny_model):
    server = ProcessServer([*TINY, "--api-server-count", "2"])
    try:
        core, workers = pids(server)
        before = counters(server.base_url)
        prompts = [prompt_ids(k % 50, 6 + k % 30) + prompt_ids(k, 3) for k in range(NUM_REQUESTS)]
        greedy = [k for k in range(NUM_REQUESTS) if k % 3]

        results = stream_all_at_once(server.base_url, prompts, MAX_TOKENS, sampled=set(range(0, NUM_REQUESTS, 3)))
        assert all(finish == "length" and len(ids) == MAX_TOKENS for ids, finish in results)
        want = reference(tiny_model, [prompts[k] for k in greedy], SamplingParams(max_tokens=MAX_TOKENS))
        assert [results[k][0] for k in greedy] == [w[0] for w in want]

        # Every scrape -- answered by either process -- counts all of them, once.
        scrapes = [counters(server.base_url) for _ in range(6)]
        for after in scrapes:
            d = {k: after[k] - before.get(k, 0.0) for k in after}
            assert d["vllm:prompt_tokens_total"] == sum(map(len, prompts))
            assert d["vllm:prefix_cache_queries_total"] == sum(map(len, prompts))  # the core's: not doubled
            assert d["vllm:generation_tokens_total"] == NUM_REQUESTS * MAX_TOKENS
            assert d["vllm:time_to_first_token_seconds_count"] == NUM_REQUESTS
            assert d["vllm:e2e_request_latency_seconds_count"] == NUM_REQUESTS
            assert d["vllm:inter_token_latency_seconds_count"] == NUM_REQUESTS * (MAX_TOKENS - 1)
            assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(HANG_GUARD_S)
    finally:
        status = server.stop()
    assert status == 0 and any("stopped on SIGTERM" in line for line in server.lines)
    served = server.api_server_requests()  # what each API server sent to the core, as it said when it stopped
    # both served (on failure: the lines, to tell a report line lost from one never printed)
    assert len(served) == 2 and min(served) > 0 and sum(served) == NUM_REQUESTS, (served, list(server.lines)[-40:])
    assert all(gone(pid) for pid in (core, *workers))


def test_a_dead_api_server_is_reported_and_the_rest_stopped():
    server = ProcessServer([*TINY, "--api-server-count", "2"])
    try:
        core, workers = pids(server)
        os.kill(workers[1], signal.SIGKILL)
        status = server.proc.wait(HANG_GUARD_S)
    finally:
        server.stop()
    assert status == 1
    assert any(f"API server 1 (process {workers[1]}) exited with status -9" in line for line in server.lines)
    assert all(gone(pid) for pid in (core, workers[0]))


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_bad_api_server_count_is_refused_naming_the_flag(value):
    argv = [sys.executable, "-m", "paged_edu.cli", "serve", "--model", "tiny-random", "--api-server-count", value]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    assert run.returncode == 2 and "--api-server-count" in run.stderr, run.stderr[-500:]


def test_a_bad_api_server_count_from_python_is_refused_naming_the_flag(capsys):
    from paged_edu.serve.flags import parse_serve_args
    from paged_edu.serve.launch import main

    assert main(parse_serve_args(["--model", "tiny-random", "--api-server-count", "0"])) == 2
    assert "--api-server-count must be an integer >= 1, got 0" in capsys.readouterr().err

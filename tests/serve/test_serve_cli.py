"""The command line: ``paged-edu serve`` as a subprocess on 127.0.0.1 (the port it picked, read from its
"ready" line), ``--api-key`` guarding ``/v1/*``, ``paged-edu bench-serve`` measuring it and writing its
JSON, and SIGTERM: a request that can finish within ``--timeout-graceful-shutdown`` does, one that
cannot is cut, and the process exits 0. And the parsing of a flag of our own, ``--sleep-on-idle``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import openai
import pytest
from hang_guard import HANG_GUARD_S
from server_helpers import ROOT, ProcessServer

TINY = ["--model", "tiny-random", "--num-gpu-blocks-override", "1024", "--max-model-len", "2048"]


@pytest.fixture
def keyed():
    server = ProcessServer([*TINY, "--api-key", "sesame"])
    try:
        yield server
    finally:
        server.stop()


def test_api_key_guards_v1_and_bench_serve_measures_the_server(keyed, tmp_path):
    url = keyed.base_url
    assert httpx.get(f"{url}/health").status_code == 200  # not under /v1: no key needed, as in vLLM
    r = httpx.get(f"{url}/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == 401
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    # The completions, served straight from ASGI (app.OpenAIRoutes), are behind the key too; another
    # method on their paths is FastAPI's answer to a route declared POST only.
    body = {"model": "tiny-random", "prompt": "Hello", "max_tokens": 3}
    assert httpx.post(f"{url}/v1/completions", json=body).status_code == 401
    wrong = {"Authorization": "Bearer wrong"}
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    assert httpx.post(f"{url}/v1/chat/completions", json=chat, headers=wrong).status_code == 401
    assert httpx.get(f"{url}/v1/completions", headers={"Authorization": "Bearer sesame"}).status_code == 405
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    good = openai.OpenAI(base_url=f"{url}/v1", api_key="sesame", max_retries=0, timeout=HANG_GUARD_S)
    assert good.completions.create(model="tiny-random", prompt="Hello", max_tokens=3).usage.prompt_tokens == 5

    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [
        sys.executable, "-m", "paged_edu.cli", "bench-serve", "--base-url", url, "--api-key", "sesame",
        "--workload", "multiturn", "--num-prompts", "12", "--length-scale", "0.1", "--ignore-eos",
        "--max-concurrency", "4", "--no-progress", "--json", str(out),
    ]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_GUARD_S, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Serving Benchmark Result" in run.stdout and "Mean TTFT (ms)" in run.stdout
    result = json.loads(out.read_text())
    assert result["completed"] == 12 and result["failed"] == 0
    server = result["server"]
    # The server's own counts of the run agree with what the client counted.
    assert server["generation_tokens"] == result["total_output_tokens"]
    assert server["prompt_tokens"] == result["total_input_tokens"]
    assert server["prefix_cache_hits"] == result["cached_tokens"] > 0  # later turns hit earlier turns' blocks
    assert result["traffic"]["num_follow_ups"] > 0
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "p90_itl_ms", "p50_tpot_ms", "mean_e2el_ms"):
        assert result[key] is not None and result[key] >= 0, key
    # The server's own TTFT runs from the request's arrival to its first token: inside the client's, which
    # adds the trips over HTTP -- request by request, so on average too.
    assert 0 < server["mean_ttft_ms"] < result["mean_ttft_ms"]


def _stream(url: str, max_tokens: int, seen: threading.Event, out: dict) -> None:
    body = {"prompt": [1, 2, 3, 4], "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    events = []
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=HANG_GUARD_S) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    events.append(line[5:].strip())
                    seen.set()
    except httpx.HTTPError as exc:  # the server cut it
        out["error"] = type(exc).__name__
    out["events"] = events
    seen.set()


def test_sigterm_finishes_or_aborts_in_flight_requests_then_exits_0():
    server = ProcessServer([*TINY, "--timeout-graceful-shutdown", "3"])
    try:
        results = {"short": {}, "long": {}}
        threads = []
        for name, n in (("short", 40), ("long", 2000)):
            seen = threading.Event()
            t = threading.Thread(target=_stream, args=(server.base_url, n, seen, results[name]), daemon=True)
            t.start()
            assert seen.wait(HANG_GUARD_S)  # both in flight
            threads.append(t)
        server.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(HANG_GUARD_S)
        server.proc.wait(HANG_GUARD_S)
    finally:
        status = server.stop()  # it stopped on the SIGTERM already: this reads its status
    assert status == 0
    short, long = results["short"]["events"], results["long"]["events"]
    assert short[-1] == "[DONE]" and json.loads(short[-2])["choices"][0]["finish_reason"] == "length"  # finished
    # The long one (2,000 tokens, ~5 s on this CPU) is cut when the grace period ends -- or, on a machine
    # fast enough, finished: either way it ended, and the process said why it stopped.
    cut = "[DONE]" not in long
    assert cut or json.loads(long[-2])["choices"][0]["finish_reason"] == "length"
    assert any("stopped on SIGTERM" in line for line in server.lines)


@pytest.mark.parametrize("argv, sleeps", [([], True), (["--sleep-on-idle"], True), (["--no-sleep-on-idle"], False)])
def test_sleep_on_idle_is_on_unless_turned_off(argv, sleeps):
    from paged_edu.cli import _build_parser
    from paged_edu.serve.flags import parse_serve_args

    assert parse_serve_args(argv).sleep_on_idle is sleeps
    assert _build_parser().parse_args(["serve", *argv]).sleep_on_idle is sleeps  # the command line's own parser

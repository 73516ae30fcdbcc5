"""``benchmarks/bench_api_stream.py``: the real API process and bench-serve client against a stub engine core
(``PAGED_EDU_ENGINE_FACTORY``) -- every token the stub produced reaches the client, and the record says so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_every_token_the_stub_produced_reaches_the_client(tmp_path):
    from bench_api_stream import main

    out = tmp_path / "api_stream.json"
    argv = ["--num-prompts", "12", "--length-scale", "0.05", "--step-ms", "2", "--out", str(out)]
    assert main(argv) == 0
    rec = json.loads(out.read_text())
    (r,) = rec["rounds"]
    assert rec["command"] == "python benchmarks/bench_api_stream.py " + " ".join(argv)
    assert r["completed"] == 12 and not r["errors"]
    assert r["output_tokens"] == r["stub_tokens"] > 12  # the workload's lengths, each token once
    assert r["stub_steps"] >= max(1, r["stub_tokens"] // 12)
    assert r["api_cpu_s_per_1k"] > 0 and r["client_cpu_s_per_1k"] > 0
    # one clock for the client and the core: the adds come after the client's start, before the last reply
    intake = r["intake"]
    assert intake["requests_at_core"] == 12
    assert 0 <= intake["core_first_add_ms"] <= intake["core_last_add_ms"] <= intake["client_last_headers_ms"]
    assert "api_cpu_us_per_request" not in intake  # read only where the intake is alone (--hold-intake)


def test_hold_intake_gives_no_token_before_every_request_is_in(tmp_path):
    from bench_api_stream import HOLD_PAUSE_S, main

    out = tmp_path / "held.json"
    argv = ["--num-prompts", "12", "--length-scale", "0.05", "--step-ms", "2", "--hold-intake", "--out", str(out)]
    assert main(argv) == 0
    (r,) = json.loads(out.read_text())["rounds"]
    assert r["completed"] == 12 and not r["errors"] and r["output_tokens"] == r["stub_tokens"]
    intake = r["intake"]
    assert intake["requests_at_core"] == 12
    # the stub sleeps HOLD_PAUSE_S once the last request is in, before any token: every request's first token
    # comes after it (a lower bound by causality, not a speed target)
    assert intake["ttft_p50_ms"] >= 1e3 * HOLD_PAUSE_S
    assert intake["api_cpu_us_per_request"] >= 0 and intake["client_cpu_us_per_request"] > 0

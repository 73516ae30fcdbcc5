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

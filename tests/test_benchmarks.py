"""The benchmark scripts run (tiny settings on the CPU) and write their records; speed targets are
not asserted here -- they live in the benchmarks' own output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_record_names_the_command_the_commit_and_the_machine():
    from record import provenance

    rec = provenance("bench_x.py", ["--quick"])
    assert rec["command"] == "python benchmarks/bench_x.py --quick"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert rec["commit"].split("+")[0] == head
    assert rec["machine"]["cpu_count"] >= 1 and rec["machine"]["python"]


def test_bench_host_pool_holds_every_sequence_to_its_end():
    from bench_host import BLOCK_SIZE, EXTRA_TOKENS, pool_blocks

    # 512 running, 200 steps, 157-token prompts: 421 tokens = 27 blocks each; the old fixed 8,192 held 16.
    assert pool_blocks(512, 200, 157) == 512 * 27 > 8192
    assert pool_blocks(1, 0, 1) * BLOCK_SIZE >= 1 + EXTRA_TOKENS


@pytest.mark.slow
def test_bench_host_running_512_times_full_steps(tmp_path):
    """Its own documented example: the fixed 8,192-block pool preempted from the ~100th step on."""
    from bench_host import main

    out = tmp_path / "host.json"
    rec = main(["--running", "512", "--steps", "110", "--out", str(out)])
    assert rec["running"] == 512 and rec["num_blocks"] == pool_blocks_for(512, 110)
    assert json.loads(out.read_text())[
        "command"
    ] == "python benchmarks/bench_host.py --running 512 --steps 110 --out " + str(out)


def pool_blocks_for(running, steps):
    from bench_host import pool_blocks

    return pool_blocks(running, steps, 157)


@pytest.mark.slow
def test_profile_engine_runs_on_a_cpu_and_writes_its_table(tmp_path):
    from profile_engine import main

    rec = main(["--tiny", "--steps", "3", "--num-requests", "6", "--device", "cpu", "--out", str(tmp_path / "prof")])
    text = (tmp_path / "prof.txt").read_text()
    assert "roofline (full efficiency, per-chunk shapes, LM head included)" in text and "aten::" in text
    assert len(rec["steps"]) == 3 and rec["steps"][0]["prompt_tokens"] > 0  # the first step carries prompts
    assert all(r["roofline_ms"] > 0 for r in rec["steps"])
    assert json.loads((tmp_path / "prof.json").read_text())["steps"] == rec["steps"]

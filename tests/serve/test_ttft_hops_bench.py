"""``benchmarks/bench_ttft_hops.py``: a lone request's TTFT through the real server, hop by hop, with a stub
engine of fixed step times. Each hop is marked by a wrapper around a server function; a function renamed or
bypassed leaves its hop unmarked, and the hops must then still add up to the client's TTFT."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_the_hops_are_all_marked_in_order_and_add_up_to_the_client_ttft(tmp_path):
    from bench_ttft_hops import HOPS, main

    out = tmp_path / "hops.json"
    argv = ["--requests", "3", "--warmups", "1", "--gap", "0.02", "--prompt-ms", "5", "--out", str(out)]
    assert main(argv) == 0
    rec = json.loads(out.read_text())
    assert rec["command"] == "python benchmarks/bench_ttft_hops.py " + " ".join(argv)
    assert len(rec["rows"]) == 3
    for row in rec["rows"]:
        assert list(row["hops_us"]) == list(HOPS)
        assert all(v >= 0 for v in row["hops_us"].values()), row["hops_us"]
        assert row["hops_us"]["step"] >= 5000  # the stub's prompt step, the request's first
        assert math.isclose(sum(row["hops_us"].values()), row["ttft_us"], rel_tol=1e-6)
        assert row["ttft_us"] <= row["client_ttft_us"] * (1 + 1e-6)

"""Workloads: the stated length assumptions, Poisson arrivals, sharing, and the JSONL trace format."""

import json
import math

import numpy as np
import pytest

from paged_edu.sim import workloads
from paged_edu.sim.request import Request, load_trace, save_trace
from paged_edu.sim.arrivals import L_MAX, poisson_arrivals


def _lengths(requests):
    return np.array([r.prompt_len for r in requests]), np.array([r.output_len for r in requests])


@pytest.mark.parametrize("name, mean_prompt, mean_output", [("sharegpt", 161.31, 337.99), ("alpaca", 19.31, 58.45)])
def test_length_means_match_the_paper(name, mean_prompt, mean_output):
    # Kwon et al. (SOSP 2023) Fig. 11: the means the distributions are fitted to.
    prompt, output = _lengths(workloads.make_workload(name, 40_000, seed=3))
    assert abs(prompt.mean() / mean_prompt - 1) < 0.02, prompt.mean()
    assert abs(output.mean() / mean_output - 1) < 0.02, output.mean()
    assert prompt.min() >= 1 and output.min() >= 1
    assert (prompt + output).max() <= L_MAX
    # Heavy right tail: the median is well below the mean.
    assert np.median(output) < 0.85 * output.mean()


def test_sharegpt_is_longer_and_wider_than_alpaca():
    sp, so = _lengths(workloads.sharegpt(5000, seed=1))
    ap, ao = _lengths(workloads.alpaca(5000, seed=1))
    assert sp.mean() > 5 * ap.mean() and so.mean() > 4 * ao.mean()
    assert so.std() > 4 * ao.std()


def test_seed_determines_the_workload():
    a = workloads.sharegpt(200, rate=3.0, seed=7)
    b = workloads.sharegpt(200, rate=3.0, seed=7)
    c = workloads.sharegpt(200, rate=3.0, seed=8)
    assert [r.to_json() for r in a] == [r.to_json() for r in b]
    assert [r.to_json() for r in a] != [r.to_json() for r in c]


def test_poisson_arrivals():
    rng = np.random.default_rng(0)
    times = poisson_arrivals(40_000, 4.0, rng)
    gaps = np.diff(times)
    assert times[0] == 0 and (gaps >= 0).all()
    assert abs(gaps.mean() - 0.25) < 0.01
    # Exponential gaps: the standard deviation equals the mean.
    assert abs(gaps.std() / gaps.mean() - 1) < 0.03
    assert (poisson_arrivals(5, math.inf, rng) == 0).all()
    with pytest.raises(ValueError, match="rate must be > 0"):
        poisson_arrivals(5, 0.0, rng)
    with pytest.raises(TypeError):
        poisson_arrivals(5, "fast", rng)


def test_chat_shares_one_system_prompt_per_group():
    reqs = workloads.chat(300, rate=2.0, seed=0, system_prompt_len=200, num_groups=3)
    assert {r.prefix_group for r in reqs} == {"system-0", "system-1", "system-2"}
    assert all(r.prefix_len == 200 and r.prompt_len > 200 for r in reqs)
    assert all(r.total_len <= L_MAX for r in reqs)
    with pytest.raises(ValueError, match="system_prompt_len"):
        workloads.chat(3, system_prompt_len=0)


def test_parallel_and_beam_requests():
    reqs = workloads.parallel(50, seed=0, n=6, fork="beam", dataset="alpaca")
    assert all(r.n == 6 and r.fork == "beam" for r in reqs)
    with pytest.raises(ValueError, match="fork must be one of"):
        workloads.parallel(5, n=2, fork="tree")
    with pytest.raises(ValueError, match="n \\(samples per request\\)"):
        workloads.parallel(5, n=0)
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.make_workload("bursty", 5)
    with pytest.raises(ValueError, match="num_requests"):
        workloads.sharegpt(0)


def test_trace_round_trip(tmp_path):
    reqs = workloads.chat(20, rate=1.0, seed=2, system_prompt_len=32) + [
        Request(0.5, 3, 4, prompt=[5, 6, 7], prefix_group="g", prefix_len=2),
        Request(0.7, 10, 3, n=4, fork="beam"),
    ]
    path = tmp_path / "trace.jsonl"
    save_trace(reqs, path)
    back = load_trace(path)
    assert sorted((r.to_json() for r in back), key=json.dumps) == sorted((r.to_json() for r in reqs), key=json.dumps)
    assert [r.arrival_time for r in back] == sorted(r.arrival_time for r in reqs)
    explicit = next(r for r in back if r.prompt is not None)
    assert explicit.prompt == [5, 6, 7] and explicit.prompt_len == 3


@pytest.mark.parametrize(
    "line, error, message",
    [
        ('{"arrival_time": 0, "prompt_len": 5}', KeyError, "missing field 'output_len'"),
        ('{"arrival_time": 0, "prompt_len": 5, "prompt": [1], "output_len": 2}', ValueError, "exactly one of"),
        ('{"arrival_time": 0, "output_len": 2}', ValueError, "exactly one of"),
        ('{"arrival_time": -1, "prompt_len": 5, "output_len": 2}', ValueError, "arrival_time must be finite and >= 0"),
        ('{"arrival_time": 0, "prompt_len": 0, "output_len": 2}', ValueError, "prompt_len must be >= 1"),
        ('{"arrival_time": 0, "prompt_len": 5, "output_len": 2.5}', TypeError, "output_len must be an int"),
        ('{"arrival_time": 0, "prompt_len": true, "output_len": 2}', TypeError, "prompt_len must be an int"),
        ('{"arrival_time": 0, "prompt": [1, -2], "output_len": 2}', ValueError, "prompt .*non-negative.*element 1"),
        # issue 44 item 7: token ids are hashed as int64; 2**63 passed and crashed the run when admitted
        ('{"arrival_time": 0, "prompt": [1, 9223372036854775808], "output_len": 2}', ValueError, "prompt .*element 1"),
        ('{"arrival_time": 0, "prompt": [2, 3, 18446744073709551615], "output_len": 1}', ValueError, "< 2\\*\\*63"),
        ('{"arrival_time": 0, "prompt": [1], "output_len": 1, "output": [9223372036854775808]}', ValueError, "output"),
        ('{"arrival_time": 0, "prompt": [1, 2.0], "output_len": 2}', TypeError, "prompt .*element 1 is float"),
        (
            '{"arrival_time": 0, "prompt": [1], "output_len": 1, "output": [true]}',
            TypeError,
            "output .*element 0 is bool",
        ),
        ('{"arrival_time": 0, "prompt_len": 5, "output_len": 2, "colour": 1}', ValueError, "unknown field"),
        (
            '{"arrival_time": 0, "prompt_len": 5, "output_len": 2, "prefix_len": 3}',
            ValueError,
            "without a prefix_group",
        ),
        (
            '{"arrival_time": 0, "prompt_len": 5, "output_len": 2, "prefix_group": "a", "prefix_len": 9}',
            ValueError,
            "prefix_len must be in",
        ),
        ("[1, 2, 3]", TypeError, "must be a JSON object"),
        ('{"arrival_time": 0, ', ValueError, "not valid JSON"),
    ],
)
def test_bad_trace_records_name_the_line(tmp_path, line, error, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"arrival_time": 0, "prompt_len": 5, "output_len": 2}\n\n' + line + "\n")
    with pytest.raises(error, match=message) as info:
        load_trace(path)
    assert "bad.jsonl:3" in str(info.value)


def test_empty_trace_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="no requests"):
        load_trace(path)

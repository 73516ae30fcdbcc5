"""Lesson 11's lab, without a server: a quantile from histogram buckets against the same interpolation
done by hand, the window's hit rate, the ``vllm serve`` line read back by the CLI's own parser, and
the router view driven headless."""

from __future__ import annotations

import math
import shlex
from types import SimpleNamespace

import pytest

from paged_edu.labs import serving as S

# (upper bound, cumulative count): 10 below 1 ms, 30 more below 5 ms, 40 below 10 ms, 20 past it
WINDOW = [(0.001, 10), (0.005, 40), (0.01, 80), (math.inf, 100)]


@pytest.mark.parametrize(
    "q, by_hand",
    [
        (0.05, 0.0 + (0.001 - 0.0) * (5 - 0) / (10 - 0)),  # rank 5 in the first bucket, from 0
        (0.25, 0.001 + (0.005 - 0.001) * (25 - 10) / (40 - 10)),
        (0.5, 0.005 + (0.01 - 0.005) * (50 - 40) / (80 - 40)),
        (0.8, 0.01),  # rank 80: the bucket's top
        (0.9, 0.01),  # in +Inf: the largest finite bound
    ],
)
def test_histogram_quantile_interpolates_inside_the_bucket(q, by_hand):
    assert S.histogram_quantile(q, WINDOW) == pytest.approx(by_hand)


def test_histogram_quantile_of_nothing_and_a_bad_q():
    assert math.isnan(S.histogram_quantile(0.5, [(0.1, 0), (math.inf, 0)]))
    with pytest.raises(ValueError):
        S.histogram_quantile(1.5, WINDOW)


def test_the_slowest_bucket_is_the_highest_that_holds_an_observation():
    assert S.slowest_bucket(WINDOW) == (0.01, math.inf)  # 20 past 10 ms: +Inf holds the slowest
    assert S.slowest_bucket([(0.001, 10), (0.005, 40), (0.01, 40), (math.inf, 40)]) == (0.001, 0.005)
    assert S.slowest_bucket([(0.001, 3), (math.inf, 3)]) == (0.0, 0.001)
    assert all(math.isnan(b) for b in S.slowest_bucket([(0.1, 0), (math.inf, 0)]))


def test_window_hit_rate_is_the_windows_not_the_totals():
    q, h = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
    assert S.window_hit_rate({q: 1000, h: 900}, {q: 1400, h: 1000}) == pytest.approx(100 / 400)
    assert S.window_hit_rate({q: 5, h: 5}, {q: 5, h: 5}) == 0.0


def test_the_vllm_serve_line_keeps_the_shared_flags_and_names_the_rest():
    from paged_edu.cli import _build_parser

    argv = ["--model", "smollm2", "--max-num-seqs", "6", "--max-model-len", "256", "--swap-space", "2",
            "--no-enable-prefix-caching", "--kv-events-endpoint", "tcp://*:5557"]  # fmt: skip
    line, notes = S.vllm_serve_line(argv)
    words = shlex.split(line)
    assert words[:3] == ["vllm", "serve", "HuggingFaceTB/SmolLM2-135M-Instruct"]
    for flag, value in (("--max-num-seqs", "6"), ("--max-model-len", "256"), ("--block-size", "16")):
        assert words[words.index(flag) + 1] == value
    assert "--no-enable-prefix-caching" in words and "--swap-space" not in words and "--load-format" not in words
    assert any("--swap-space" in n for n in notes)
    assert '"endpoint": "tcp://*:5557"' in line
    ours = _build_parser().parse_args(["serve", *argv])  # and ours reads the same flags back
    assert ours.max_num_seqs == 6 and not ours.enable_prefix_caching


def test_the_router_view_redraws_for_the_request_picked():
    from paged_edu.viz.serving_views import RouterView

    index = SimpleNamespace(snapshots=[("a", {11: "a"}), ("b", {11: "a", 12: "b", 13: "b"})])
    view = RouterView(index, cols=4)
    assert "3 cached blocks" in view.status.value
    view.dropdown.value = "a"
    z = view.fig.data[0].z
    assert view.slider.value == 0 and sum(c not in (0, None) for row in z for c in row) == 1
    with pytest.raises(ValueError):
        view.show(2)


def test_the_router_index_waits_for_a_late_first_batch_then_stops_when_idle():
    """A batch that arrives later than ``idle_s`` after the drain starts (a loaded machine) is still
    applied under that drain's label, not left for the next request's; a drain with nothing coming
    returns after ``first_s``."""
    import threading
    import time

    import msgpack
    import zmq

    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    index = S.RouterIndex(f"tcp://127.0.0.1:{port}")
    try:
        stored = [["BlockStored", [101, 102], None, [1] * 32, 16, None, None, None]]
        deadline = time.monotonic() + 10
        while not index.drain("hello", idle_s=0.05, max_s=0.2, first_s=0.05):  # until subscribed
            pub.send_multipart((b"", (0).to_bytes(8, "big"), msgpack.packb([0.0, [], None])))
            assert time.monotonic() < deadline, "the subscription never reached the publisher"
        index.drain("hello", idle_s=0.1, first_s=0.1)

        def late():
            time.sleep(0.5)  # longer than idle_s below
            pub.send_multipart((b"", (1).to_bytes(8, "big"), msgpack.packb([0.0, stored, None])))

        sender = threading.Thread(target=late)
        sender.start()
        assert index.drain("chat B", idle_s=0.1, first_s=5.0) == 1
        sender.join()
        assert index.blocks == {101: "chat B", 102: "chat B"}
        t0 = time.monotonic()
        assert index.drain("chat C", idle_s=0.1, first_s=0.3) == 0
        assert 0.25 < time.monotonic() - t0 < 3.0
    finally:
        index.close()
        pub.close(linger=0)
        context.term()

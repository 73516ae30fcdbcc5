"""KV events: a ZeroMQ subscriber on 127.0.0.1 replays the server's stream as a KV-aware router would,
decoding vLLM's format with plain msgpack (positional arrays, or maps with ``--kv-events-format map``),
and ends with exactly the blocks the server's prefix cache holds. A small pool makes the server evict
(``BlockRemoved``) and preempt (``vllm:num_preemptions_total`` against the scheduler's own count);
``/reset_prefix_cache`` ends in ``AllBlocksCleared``. Every hash is checked against SHA-256 over
the parent's digest and the block's int64 token ids (framed as the allocator frames them), recomputed here.
"""

from __future__ import annotations

import hashlib
import time
from array import array

import httpx
import msgpack
import pytest
import zmq
from hang_guard import HANG_GUARD_S
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import ThreadServer

B = 16
NUM_BLOCKS = 40


def _argv(cache: str, fmt: str) -> list[str]:
    return [
        "--model", "tiny-random", "--num-gpu-blocks-override", str(NUM_BLOCKS), "--max-num-seqs", "6",
        "--max-model-len", "512", "--prefix-cache", cache, "--kv-events-endpoint", "tcp://127.0.0.1:*",
        "--kv-events-format", fmt, "--kv-events-topic", "kv-events",
    ]  # fmt: skip


class Subscriber:
    """A router's view of one replica: the stream decoded, the cached blocks replayed."""

    def __init__(self, endpoint: str, fmt: str) -> None:
        self.fmt = fmt
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"kv-events")
        self.socket.connect(endpoint)
        self.cached: dict[int, list[int]] = {}  # hash -> the block's tokens
        self.parents: dict[int, int | None] = {}
        self.kinds: list[str] = []
        self.last_seq = -1

    def event(self, ev) -> tuple[str, dict]:
        """One event as ``(tag, fields)`` from either encoding, checking the positional layout."""
        if self.fmt == "map":
            return ev["type"], ev
        tag = ev[0]
        if tag == "BlockStored":
            assert len(ev) == 8 and ev[6] == "GPU" and ev[5] is None and ev[7] is None, ev
            keys = ("block_hashes", "parent_block_hash", "token_ids", "block_size")
            return tag, dict(zip(keys, ev[1:5]))
        if tag == "BlockRemoved":
            assert len(ev) == 3 and ev[2] == "GPU", ev
            return tag, {"block_hashes": ev[1]}
        assert ev == ["AllBlocksCleared"], ev
        return tag, {}

    def receive(self, until_seq: int) -> None:
        """Apply every batch up to number ``until_seq`` (bounded wait)."""
        deadline = time.monotonic() + HANG_GUARD_S
        while self.last_seq < until_seq:
            assert time.monotonic() < deadline, f"batch {until_seq} never came (last {self.last_seq})"
            if not self.socket.poll(100):
                continue
            topic, seq, payload = self.socket.recv_multipart()
            assert topic == b"kv-events"
            n = int.from_bytes(seq, "big")
            assert n == self.last_seq + 1 or self.last_seq == -1, (n, self.last_seq)  # in order, none lost
            self.last_seq = n
            ts, events, rank = msgpack.unpackb(payload, raw=False)
            assert isinstance(ts, float) and rank == 0
            for ev in events:
                self.apply(*self.event(ev))

    def apply(self, tag: str, f: dict) -> None:
        self.kinds.append(tag)
        if tag == "BlockStored":
            tokens, hashes = f["token_ids"], f["block_hashes"]
            assert f["block_size"] == B and len(tokens) == B * len(hashes)
            parent = f["parent_block_hash"]
            for i, h in enumerate(hashes):
                self.cached[h] = tokens[i * B : (i + 1) * B]
                self.parents[h] = parent
                parent = h
        elif tag == "BlockRemoved":
            for h in f["block_hashes"]:
                del self.cached[h]  # a router never hears of a removal of a block it does not know
        else:
            self.cached.clear()

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


def chain(tokens: list[int]) -> list[int]:
    """The unsalted chain recomputed here, framed as paged_edu.core.block_hash frames it:
    SHA-256(b"block" + the parent's length in one byte + the parent's digest + int64 token bytes),
    from the empty root; sent as the low 64 bits."""
    h, out = b"", []
    for i in range(len(tokens) // B):
        h = hashlib.sha256(b"block" + bytes([len(h)]) + h + array("q", tokens[i * B : (i + 1) * B]).tobytes()).digest()
        out.append(int.from_bytes(h[-8:], "big"))
    return out


def complete(base_url: str, prompt: list[int], max_tokens: int, salt: str | None = None) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    if salt:
        body["cache_salt"] = salt
    r = httpx.post(f"{base_url}/v1/completions", json=body, timeout=HANG_GUARD_S)
    assert r.status_code == 200, r.text
    return r.json()


def counter(base_url: str, name: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=HANG_GUARD_S).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


@pytest.mark.parametrize("cache,fmt", [("hash", "array"), ("radix", "map")])
def test_a_subscriber_replays_the_cache_contents(cache, fmt):
    srv = ThreadServer(_argv(cache, fmt))
    sub = Subscriber(srv.server.kv_events_endpoint, fmt)
    try:
        # The subscription takes a moment to reach the publisher: send until a batch arrives.
        deadline = time.monotonic() + HANG_GUARD_S
        k = 0
        while not sub.socket.poll(200):
            assert time.monotonic() < deadline, "no KV event reached the subscriber"
            complete(srv.base_url, [250 - k] * (B + 1), 1)
            k += 1
        r = httpx.post(f"{srv.base_url}/reset_prefix_cache", timeout=HANG_GUARD_S)
        assert r.status_code == 200 and r.json()["num_cached_blocks_left"] == 0
        sub.receive(srv.state()["kv_events_sent"] - 1)
        assert sub.kinds[-1] == "AllBlocksCleared" and sub.cached == {}

        system = [(5 * i) % 240 + 3 for i in range(3 * B)]
        prompts = [system + [(11 * k + i) % 240 + 3 for i in range(B + k)] for k in range(6)]
        preemptions = counter(srv.base_url, "vllm:num_preemptions_total")
        before = srv.state()["num_preemptions"]
        import concurrent.futures as cf

        # Six at once on 40 blocks: each ends at 14-15 blocks (3 of them the shared system prompt's), so
        # any four running together outgrow the pool -- however the six arrive, the engine preempts.
        with cf.ThreadPoolExecutor(6) as pool:
            replies = list(pool.map(lambda p: complete(srv.base_url, p, 10 * B), prompts))
        complete(srv.base_url, system + [9] * B, 2, salt="tenant-a")  # the same head under a salt
        sub.receive(srv.state()["kv_events_sent"] - 1)

        assert "BlockRemoved" in sub.kinds  # the small pool evicted
        d_preempt = counter(srv.base_url, "vllm:num_preemptions_total") - preemptions
        assert d_preempt == srv.state()["num_preemptions"] - before > 0
        # The router's blocks are exactly the cache's.
        state = srv.state()
        assert len(sub.cached) == state["num_cached_blocks"]
        if cache == "hash":  # the allocator's own hashes, each block's low 64 bits (kv_events.external_hash)
            assert sorted(sub.cached) == state["cached_block_hashes"]
        # Every unsalted block is a block of a prompt + reply sent, under the hash recomputed here.
        sent = {}
        for p, r in zip(prompts, replies):
            full = p + r["choices"][0]["token_ids"]
            for i, h in enumerate(chain(full)):
                sent[h] = full[i * B : (i + 1) * B]
        unsalted = {h: t for h, t in sub.cached.items() if h in sent}
        assert all(sent[h] == t for h, t in unsalted.items())
        salted = [h for h in sub.cached if h not in sent]
        assert salted and all(sub.cached[h] in [system[i * B : (i + 1) * B] for i in range(3)] + [[9] * B]
                              for h in salted)  # fmt: skip
        assert any(sub.parents[h] is None for h in salted)  # its first block: no parent, the salt is in the hash
        # A reset empties the cache and says so.
        httpx.post(f"{srv.base_url}/reset_prefix_cache", timeout=HANG_GUARD_S)
        sub.receive(srv.state()["kv_events_sent"] - 1)
        assert sub.cached == {} and srv.state()["num_cached_blocks"] == 0
    finally:
        sub.close()
        srv.stop()

"""KV-cache events in vLLM's wire format, so a KV-aware router written for vLLM can index this server.

A router that spreads requests over replicas (llm-d's precise prefix-cache scorer, NVIDIA Dynamo's
KV router, Ray Serve's KV-aware router) keeps, per replica, the set of blocks its prefix cache
holds, learnt from the replica's event stream: a block stored, a block removed, everything cleared.
The allocator already reports exactly these (``BlockAllocator.subscribe_cache``: ``store``,
``evict``, ``clear``); this module turns them into vLLM's messages and publishes them over ZeroMQ.

The format (``vllm/distributed/kv_events.py``)
----------------------------------------------
A PUB socket sends one multipart message per engine step that changed the cache:
``[topic, sequence number as 8 bytes big-endian, msgpack(batch)]``. The batch and its events are
msgspec structs encoded with ``array_like=True`` -- positional arrays, so the field *order* is the
format -- with ``omit_defaults=True`` dropping trailing fields left at their default:

* ``KVEventBatch``: ``[ts, events, data_parallel_rank]`` (``ts``: seconds since the epoch; rank 0);
* ``BlockStored``: ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium, lora_name]`` -- consecutive blocks of one sequence, ``token_ids`` all their tokens,
  ``parent_block_hash`` the hash of the block before the first (None at a prompt's start);
* ``BlockRemoved``: ``["BlockRemoved", block_hashes, medium]``;
* ``AllBlocksCleared``: ``["AllBlocksCleared"]``.

The tag first is msgspec's ``tag=True`` in an array. ``medium`` is ``"GPU"`` (vLLM's ``MEDIUM_GPU``:
the device pool, whatever the device), ``lora_id`` and ``lora_name`` None (no adapters here).
vLLM's PR vllm-project/vllm#42892 (merged 2026-06-09) switched the *events* to msgpack maps keyed by field name
(``{"type": "BlockStored", "block_hashes": ...}``), the batch staying an array; routers updated for
it (llm-d/llm-d-kv-cache#661, sgl-project/sglang#40684) read both. ``--kv-events-format map`` sends that form.

A block hash is the allocator's chained SHA-256 (:mod:`paged_edu.core.block_hash`), sent as vLLM
sends its own by default: the digest's low 64 bits as an unsigned int (``maybe_convert_block_hash``,
``vllm/v1/core/kv_cache_utils.py``). A radix-tree cache names blocks by path, not by hash: the same
chain is computed from the tokens, so the stream means the same for both caches. A cache salt
enters the first block's parent hash (the allocator's rule), so a salted prompt's blocks have
other hashes than the same prompt unsalted, as in vLLM.
"""

from __future__ import annotations

import time
from array import array

from paged_edu.core.block_hash import extend_chain, prefix_root

__all__ = ["KVEventPublisher", "external_hash"]

MEDIUM = "GPU"
FORMATS = ("array", "map")


def external_hash(block_hash: bytes) -> int:
    """A block's hash as a router sees it: the digest's low 64 bits, unsigned."""
    return int.from_bytes(block_hash, "big") & (2**64 - 1)


def block_stored(hashes: list[int], parent: int | None, token_ids: list[int], block_size: int, fmt: str):
    fields = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name")
    values = (hashes, parent, token_ids, block_size, None, MEDIUM, None)
    return _event("BlockStored", fields, values, fmt)


def block_removed(hashes: list[int], fmt: str):
    return _event("BlockRemoved", ("block_hashes", "medium"), (hashes, MEDIUM), fmt)


def all_blocks_cleared(fmt: str):
    return _event("AllBlocksCleared", (), (), fmt)


def _event(tag: str, fields: tuple, values: tuple, fmt: str):
    if fmt == "map":
        return {"type": tag, **dict(zip(fields, values))}
    return [tag, *values]


class KVEventPublisher:
    """Publishes the prefix cache's changes of ``engine`` on ``endpoint`` (bound: routers connect).

    The allocator's cache events of a step are gathered as they come (:meth:`_on_cache_event`, on
    the engine core's loop) and sent as one batch by :meth:`publish`, after the step.
    """

    def __init__(self, engine, endpoint: str, topic: str = "", fmt: str = "array") -> None:
        import msgpack
        import zmq

        if fmt not in FORMATS:
            raise ValueError(f"kv events format must be one of {FORMATS}, got {fmt!r}")
        self.engine, self.fmt, self.topic = engine, fmt, topic.encode("utf-8")
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.set_hwm(100_000)  # vLLM's default high-water mark
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise ValueError(f"--kv-events-endpoint {endpoint!r}: cannot bind ({exc})") from None
        self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.sequence = 0  # the next batch's number
        self._events: list = []  # this step's, in order
        self._hashes: dict[int, bytes] = {}  # block id -> the chained hash it was stored under
        self._unsubscribe = engine.allocator.subscribe_cache(self._on_cache_event)

    # -- from the allocator (the engine core's loop, inside a step) --------------------------------
    def _on_cache_event(self, event) -> None:
        if event.kind == "store":
            self._stored(event.seq_id, event.block_ids)
        elif event.kind == "evict":
            hashes = [external_hash(h) for b in event.block_ids if (h := self._hashes.pop(b, None)) is not None]
            if hashes:
                self._events.append(block_removed(hashes, self.fmt))
        elif event.kind == "clear":
            self._hashes.clear()
            self._events.append(all_blocks_cleared(self.fmt))

    def _stored(self, seq_id, block_ids: list[int]) -> None:
        """``BlockStored`` per run of consecutive blocks of the sequence's table that entered the cache."""
        seq = self._sequence(seq_id)
        table = self.engine.allocator.block_table(seq_id)
        B = self.engine.allocator.block_size
        tokens = seq.token_ids
        positions = sorted(table.index(b) for b in block_ids)
        run: list[int] = []
        for i in positions:
            if run and i != run[-1] + 1:
                self._store_run(seq, table, tokens, run, B)
                run = []
            run.append(i)
        if run:
            self._store_run(seq, table, tokens, run, B)

    def _store_run(self, seq, table: list[int], tokens: list[int], run: list[int], B: int) -> None:
        first = run[0]
        h = prefix_root(seq.cache_salt) if first == 0 else self._hash_at(seq, table, tokens, first - 1, B)
        parent = None if first == 0 else external_hash(h)  # vLLM: None before a prompt's first block
        hashes = []
        for i in run:
            h = extend_chain(h, array("q", tokens[i * B : (i + 1) * B]))
            self._hashes[table[i]] = h
            hashes.append(external_hash(h))
        self._events.append(block_stored(hashes, parent, list(tokens[first * B : (run[-1] + 1) * B]), B, self.fmt))

    def _hash_at(self, seq, table: list[int], tokens: list[int], i: int, B: int) -> bytes:
        """The chained hash of block ``i`` of the sequence: as stored, else computed from its tokens."""
        known = self._hashes.get(table[i])
        if known is not None:
            return known
        h = prefix_root(seq.cache_salt)
        for j in range(i + 1):
            h = extend_chain(h, array("q", tokens[j * B : (j + 1) * B]))
        return h

    def _sequence(self, seq_id):
        s = self.engine.scheduler
        for queue in (s.running, s.waiting, s.swapped):
            for seq in queue:
                if seq.seq_id == seq_id:
                    return seq
        raise LookupError(f"kv events: sequence {seq_id} stored blocks but is not in the scheduler")

    # -- from the engine core's loop, after a step ------------------------------------------------
    def publish(self) -> None:
        """Send the events gathered since the last call as one batch (nothing if there are none)."""
        if not self._events:
            return
        events, self._events = self._events, []
        payload = self._pack([time.time(), events, 0])
        self._socket.send_multipart((self.topic, self.sequence.to_bytes(8, "big"), payload))
        self.sequence += 1

    def close(self) -> None:
        """Unsubscribe from the allocator and close the socket (again: nothing)."""
        unsubscribe, self._unsubscribe = getattr(self, "_unsubscribe", None), None
        if unsubscribe is not None:
            unsubscribe()
        if not self._socket.closed:
            self._socket.close(linger=0)
            self._context.term()

"""The chained block hash that names a full block in the prefix cache (lesson 3).

A full block ``i`` of a sequence is named by a hash of everything up to its end:

    h_i = H(h_{i-1}, tokens of block i),    h_{-1} = b"" (the empty prefix)

so two prompts share block ``i`` only when their first ``(i + 1) * B`` tokens agree. That is the
condition for its K/V to be the same: past the first layer, the K and V of token ``t`` depend on
every token ``<= t``. A hash of the block's own tokens alone -- the seed document's
``sha256(str(chunk))`` -- would hand one prefix's K/V to another (see ``seed_allocator.py``).

A request may carry a *cache salt* (and other extra keys, as vLLM mixes LoRA names and multimodal
hashes into its block hashes): they enter the hash before the first block, ``h_{-1} =
``:func:`prefix_root` ``(salt, extra keys)``, so requests with different salts share no block and
requests with the same salt share as before (vLLM v1 puts ``request.cache_salt`` into the first
block's extra keys only, ``vllm/v1/core/kv_cache_utils.py``: every later hash chains from it).

``H`` is SHA-256 over the parent's digest and the block's token ids as int64 bytes: stable across
processes (unlike Python's salted ``hash()``), so a hit means the same thing in every run.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from paged_edu.core.validation import token_array

__all__ = [
    "ROOT_HASH",
    "chained_block_hashes",
    "extend_chain",
    "full_blocks",
    "hash_block",
    "hash_chain",
    "prefix_root",
]

ROOT_HASH = b""  # h_{-1}: the hash of the empty prefix, for a request with no salt and no extra key


def prefix_root(cache_salt: str | None = None, extra_keys: Sequence[str] = ()) -> bytes:
    """``h_{-1}`` of a request: :data:`ROOT_HASH` with no salt and no extra key (exactly as without
    salting), else a SHA-256 over the length-prefixed UTF-8 of the salt and each extra key (checked
    by the caller: :func:`~paged_edu.core.validation.cache_key`). Also names the radix tree's
    per-salt child of the root."""
    if cache_salt is None and not extra_keys:
        return ROOT_HASH
    h = hashlib.sha256(b"paged_edu prefix root")
    for part in (cache_salt or "", *extra_keys):
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(4, "little") + data)
    return h.digest()


def hash_block(parent_hash: bytes, token_bytes: bytes) -> bytes:
    """``h_i = H(h_{i-1}, tokens of block i)``: SHA-256 over the parent's digest and the token bytes."""
    return hashlib.sha256(parent_hash + token_bytes).digest()


def extend_chain(parent_hash: bytes, block_tokens: array) -> bytes:
    """The hash of a block that has just become full, given its parent's: the chain grows by one."""
    return hash_block(parent_hash, block_tokens.tobytes())


def full_blocks(packed: array, block_size: int) -> list[array]:
    """The tokens of every *full* block of ``packed`` (a partial tail is left out)."""
    return [packed[start : start + block_size] for start in range(0, len(packed) - block_size + 1, block_size)]


def hash_chain(blocks: list[array], parent_hash: bytes = ROOT_HASH) -> list[bytes]:
    """``[h_0, h_1, ...]`` of consecutive full blocks, starting after ``parent_hash``."""
    hashes = []
    for block in blocks:
        parent_hash = hash_block(parent_hash, block.tobytes())
        hashes.append(parent_hash)
    return hashes


def chained_block_hashes(token_ids: Sequence[int], block_size: int, parent_hash: bytes = ROOT_HASH) -> list[bytes]:
    """The chained hashes of every *full* block of ``token_ids`` (a partial tail has none).

    ``parent_hash`` is the hash of the block before the first one (the empty prefix by default), so
    a sequence's chain can be extended one block at a time.
    """
    return hash_chain(full_blocks(token_array("token_ids", token_ids), block_size), parent_hash)

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
processes (unlike Python's salted ``hash()``), so a hit means the same thing in every run. Its input
is *framed* so that no two different things hash the same bytes:

    root:   SHA-256(b"root"  || len(salt) || salt || len(key) || key ...)
    block:  SHA-256(b"block" || len(h_{i-1}) || h_{i-1} || tokens of block i)

Without the frame a salted root ``SHA-256(tag || salt)`` and an unsalted block ``SHA-256(tokens)`` are
the same function of their bytes: a prompt whose first block's int64 bytes spell ``tag || salt`` gets
``h_0`` equal to the salted root, so its second block hashes exactly like the tenant's first block --
and hits it, without the salt. With the frame, equal hashes mean equal inputs (barring a SHA-256
collision): a root never equals a block's hash (the tags differ in their first byte), and a block's
parent is read back whole (its length comes first: 0 for the unsalted root, 32 for a digest), so a
block's hash fixes its tokens, its parent's hash, and so on down to the root -- the salt. vLLM gets the
same from hashing a structured tuple ``(parent hash, token ids, extra keys)``, pickled or CBOR-encoded
(``hash_block_tokens``), whose encoding frames every field; we hash bytes, so we frame them ourselves.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from paged_edu.core.validation import token_array

__all__ = [
    "BLOCK_TAG",
    "ROOT_HASH",
    "ROOT_TAG",
    "chained_block_hashes",
    "extend_chain",
    "full_blocks",
    "hash_block",
    "hash_chain",
    "prefix_root",
]

ROOT_HASH = b""  # h_{-1}: the hash of the empty prefix, for a request with no salt and no extra key
# The first bytes of every hashed input: what is hashed (a salt's root, a block), so that no root's input
# is ever a block's. They differ in their first byte.
ROOT_TAG = b"root"
BLOCK_TAG = b"block"
_PARENT_LENGTH = {0: b"\x00", 32: b"\x20"}  # a block's parent is ROOT_HASH or a SHA-256 digest, framed by its length


def prefix_root(cache_salt: str | None = None, extra_keys: Sequence[str] = ()) -> bytes:
    """``h_{-1}`` of a request: :data:`ROOT_HASH` with no salt and no extra key (exactly as without
    salting), else a SHA-256 over :data:`ROOT_TAG` and the length-prefixed UTF-8 of the salt and each
    extra key (checked by the caller: :func:`~paged_edu.core.validation.cache_key`). Also names the
    radix tree's per-salt child of the root."""
    if cache_salt is None and not extra_keys:
        return ROOT_HASH
    h = hashlib.sha256(ROOT_TAG)
    for part in (cache_salt or "", *extra_keys):
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(4, "little") + data)
    return h.digest()


def hash_block(parent_hash: bytes, token_bytes: bytes) -> bytes:
    """``h_i = H(h_{i-1}, tokens of block i)``: SHA-256 over :data:`BLOCK_TAG`, the parent's length
    (one byte: 0 for :data:`ROOT_HASH`, 32 for a digest), the parent and the token bytes."""
    length = _PARENT_LENGTH.get(len(parent_hash))
    if length is None:
        raise ValueError(
            f"parent_hash must be ROOT_HASH (b'') or a 32-byte hash (a root or a block's), got {len(parent_hash)} bytes"
        )
    return hashlib.sha256(BLOCK_TAG + length + parent_hash + token_bytes).digest()


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

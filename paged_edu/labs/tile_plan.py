"""Which key tiles a paged prefill program reads, and which of them need the causal mask (lesson 10).

What you will learn
-------------------
The prefill kernel (:mod:`paged_edu.kernels.triton_prefill`) gives each program ``BLOCK_Q`` new tokens of
one sequence's chunk: tokens ``q_block * BLOCK_Q ..`` at positions ``p = ctx + j`` (``ctx`` cached tokens
before the chunk). Token ``j`` sees keys ``0 .. p``. Keys come ``TILE`` at a time, and a tile is one of

* **full** -- every key of it is visible to every token of the program: its last key is at most the
  first token's position ``ctx + q_block * BLOCK_Q``; there are ``(ctx + q_block * BLOCK_Q + 1) // TILE``
  of them, read in a loop with no mask at all;
* **diagonal** -- the causal diagonal crosses it: some of its keys are past some token's position, so
  the scores there are masked to ``-inf``; the tiles from the full ones up to ``cdiv(key_end, TILE)``,
  ``key_end = ctx + min((q_block + 1) * BLOCK_Q, q_len)`` (the last token's position + 1);
* **skipped** -- past ``key_end``: no token of the program sees any of it, never read.

:func:`tile_plan` states that schedule in Python, with the kernel's own formulas, for every program of
a chunk; :func:`visibility` is the brute-force oracle it is tested against (key ``t`` is visible to
token ``j`` iff ``t <= ctx + j``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TilePlan", "tile_plan", "visibility"]

FULL, DIAGONAL_SEEN, DIAGONAL_MASKED, SKIPPED = 1, 2, 3, 0  # what a (token, key) cell of the plan is


@dataclass(frozen=True, slots=True)
class TilePlan:
    """The key tiles of every program of one chunk, and per (new token, key) cell what happens to it."""

    ctx: int
    q_len: int
    block_q: int
    tile: int
    programs: list[dict]  # per program: q_block, tokens (first, last), num_full, num_tiles (read)
    # (q_len, ctx + q_len rounded up to a tile) int: FULL, DIAGONAL_SEEN, DIAGONAL_MASKED or SKIPPED (a diagonal
    # tile's keys past the sequence's end are scored and masked too)
    cells: np.ndarray

    @property
    def tiles_read(self) -> int:
        return sum(p["num_tiles"] for p in self.programs)

    @property
    def tiles_masked(self) -> int:
        return sum(p["num_tiles"] - p["num_full"] for p in self.programs)

    @property
    def keys_scored(self) -> int:
        """Scores computed: every key of every tile read, for every token of the program."""
        return int((self.cells != SKIPPED).sum())

    @property
    def keys_needed(self) -> int:
        """Scores the causal attention needs: key ``t`` for token ``j`` with ``t <= ctx + j``."""
        return int(visibility(self.ctx, self.q_len).sum())


def tile_plan(ctx: int, q_len: int, block_q: int, tile: int) -> TilePlan:
    """The prefill kernel's tile schedule for a chunk of ``q_len`` new tokens over ``ctx`` cached ones."""
    for name, value, low in (("ctx", ctx, 0), ("q_len", q_len, 1), ("block_q", block_q, 1), ("tile", tile, 1)):
        if not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    seq_len = ctx + q_len
    cells = np.zeros((q_len, -(-seq_len // tile) * tile), dtype=np.int8)
    programs = []
    for q_block in range(-(-q_len // block_q)):
        first, last = q_block * block_q, min((q_block + 1) * block_q, q_len) - 1
        key_end = ctx + last + 1
        num_full = (ctx + first + 1) // tile
        num_tiles = -(-key_end // tile)
        programs.append(dict(q_block=q_block, tokens=(first, last), num_full=num_full, num_tiles=num_tiles))
        for j in range(first, last + 1):
            cells[j, : num_full * tile] = FULL
            keys = np.arange(num_full * tile, num_tiles * tile)
            cells[j, keys] = np.where(keys <= ctx + j, DIAGONAL_SEEN, DIAGONAL_MASKED)
    return TilePlan(ctx, q_len, block_q, tile, programs, cells)


def visibility(ctx: int, q_len: int) -> np.ndarray:
    """(q_len, ctx + q_len) bool: key ``t`` is visible to new token ``j`` iff ``t <= ctx + j`` (the oracle)."""
    return np.arange(ctx + q_len)[None, :] <= (ctx + np.arange(q_len))[:, None]

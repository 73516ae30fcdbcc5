"""The seed's Figure 2, as an object: online softmax over the scattered blocks of a real paged KV cache.

One sequence of ``seq_len`` tokens lives in a :class:`~paged_edu.cache.kv_cache.PagedKVCache`
whose pool it shares with other requests; a :class:`~paged_edu.core.allocator.BlockAllocator`
placed its blocks, so its block table ``B(0), B(1), ...`` points all over the pool. One query
(``num_q_heads`` heads, GQA over ``num_kv_heads``) attends to it.

* :meth:`OnlineSoftmaxStepper.step` processes the next *logical* block ``b``: it reads physical
  block ``B(b)`` from the pool, computes the scores ``S_b = q K_B(b)^T * scale`` of all ``B`` slots,
  marks which slots hold tokens (``valid``; only the last block has a masked tail, whose slots
  still hold a previous occupant's K/V) and folds them into the state ``(m, l, o)`` with
  ``update`` -- :func:`paged_edu.kernels.online_softmax.block_update`, or a learner's version.
  After each step it records the state and the relative error of ``o / l`` against attention over
  the whole sequence, computed without any block table (the oracle); the error reaches float32
  rounding (~1e-7) exactly at the last block.
* :meth:`shuffle` moves the sequence's blocks to other physical blocks (through the allocator:
  the table changes) and replays the steps done so far: every number stays the same, bit for bit.
* :meth:`reset` starts the walk again.

:mod:`paged_edu.viz.softmax_stepper` is the widget over this object.
"""

from __future__ import annotations

import math
import random

import torch

from paged_edu.cache.kv_cache import PagedKVCache
from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.validation import as_int
from paged_edu.kernels.online_softmax import block_update, empty_state

__all__ = ["OnlineSoftmaxStepper"]

SEQ = "query"  # the sequence's id in the allocator; the other requests are "other0", "other1", ...


class OnlineSoftmaxStepper:
    """State of the block-by-block online softmax for one query over one paged sequence."""

    def __init__(
        self,
        seq_len: int = 45,
        *,
        block_size: int = 8,
        num_blocks: int = 12,
        num_q_heads: int = 4,
        num_kv_heads: int = 2,
        head_dim: int = 16,
        device="cpu",
        dtype=torch.float32,
        seed: int = 0,
        update=None,
    ) -> None:
        names = ("seq_len", "block_size", "num_blocks", "num_q_heads", "num_kv_heads", "head_dim")
        values = (seq_len, block_size, num_blocks, num_q_heads, num_kv_heads, head_dim)
        for name, value in zip(names, values):
            if as_int(value, f"{name} must be an int") < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if num_q_heads % num_kv_heads:
            raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        needed = -(-seq_len // block_size)
        if needed > num_blocks:
            raise ValueError(
                f"seq_len={seq_len} needs {needed} blocks of {block_size}, the pool has num_blocks={num_blocks}"
            )
        self.update = block_update if update is None else update
        if not callable(self.update):
            raise TypeError(f"update must be a function (m, l, o, scores, values, valid) -> (m, l, o), got {update!r}")
        self.seq_len, self.block_size, self.num_blocks = seq_len, block_size, num_blocks
        self.num_q_heads, self.num_kv_heads, self.head_dim = num_q_heads, num_kv_heads, head_dim
        self.num_logical_blocks = needed
        self.scale = 1.0 / math.sqrt(head_dim)
        self._rng = random.Random(as_int(seed, "seed must be an int"))

        g = torch.Generator().manual_seed(seed)
        self.kv = PagedKVCache(1, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
        device = self.kv.device
        self.keys = torch.randn(seq_len, num_kv_heads, head_dim, generator=g).to(device, dtype)  # (s, H_kv, D)
        self.values = torch.randn(seq_len, num_kv_heads, head_dim, generator=g).to(device, dtype)  # (s, H_kv, D)
        self.query = (2.0 * torch.randn(num_q_heads, head_dim, generator=g)).to(device, dtype)  # (H_q, D)
        # What the other requests (and earlier occupants) left in the pool: every slot holds something.
        k_cache, v_cache = self.kv.layer(0)
        k_cache.copy_(torch.randn(k_cache.shape, generator=g).to(dtype))
        v_cache.copy_(torch.randn(v_cache.shape, generator=g).to(dtype))
        self.kv_head_of = torch.arange(num_q_heads, device=device) // (num_q_heads // num_kv_heads)  # (H_q,)
        self.truth = self._oracle()  # (H_q, D)
        self.allocator: BlockAllocator
        self._place(self._rng.sample(range(num_blocks), needed))
        self.reset()

    # -- the oracle: attention over the contiguous sequence, no block table ---------------------
    def _oracle(self) -> torch.Tensor:
        k = self.keys.float()[:, self.kv_head_of]  # (s, H_q, D)
        v = self.values.float()[:, self.kv_head_of]  # (s, H_q, D)
        S = torch.einsum("hd,shd->hs", self.query.float(), k) * self.scale  # (H_q, s)
        return torch.einsum("hs,shd->hd", torch.softmax(S, dim=-1), v)  # (H_q, D)

    # -- placing the sequence in the pool ---------------------------------------------------------
    def _place(self, physical: list[int]) -> None:
        """Give the sequence the physical blocks ``physical`` (in logical order), via a real allocator:
        every block is first taken by another request; freeing ours in order makes them the next ones
        handed out. Then store the sequence's K/V at its slots."""
        allocator = BlockAllocator(self.num_blocks, self.block_size, enable_prefix_caching=False)
        for b in range(self.num_blocks):
            allocator.allocate(f"other{b}", [0])  # block b
        for b in physical:
            allocator.free(f"other{b}")
        allocator.allocate(SEQ, list(range(self.seq_len)))
        if allocator.block_table(SEQ) != physical:  # the allocator's order is what we relied on
            raise RuntimeError(f"allocator gave {allocator.block_table(SEQ)}, expected {physical}")
        self.allocator = allocator
        slots = allocator.slot_mapping(SEQ)
        self.kv.store(0, self.keys, self.values, slots, impl="torch")

    @property
    def block_table(self) -> list[int]:
        """``B(b)`` for ``b = 0 .. ceil(s/B) - 1``."""
        return self.allocator.block_table(SEQ)

    def shuffle(self) -> list[int]:
        """Move the sequence's blocks to other physical blocks; replay the steps done; return the new table."""
        old, steps = self.block_table, self.num_processed
        new = old
        while new == old and self.num_blocks > 1:
            new = self._rng.sample(range(self.num_blocks), self.num_logical_blocks)
        self._place(new)  # the blocks we leave keep their contents: stale data for whoever comes next
        self.reset()
        for _ in range(steps):
            self.step()
        return new

    # -- the walk ---------------------------------------------------------------------------------
    def reset(self) -> None:
        """Back to the empty state ``(m, l, o) = (-inf, 0, 0)`` before block 0."""
        self.m, self.l, self.o = empty_state(self.num_q_heads, self.head_dim, device=self.kv.device)
        self.history: list[dict] = []

    @property
    def num_processed(self) -> int:
        return len(self.history)

    @property
    def done(self) -> bool:
        return self.num_processed == self.num_logical_blocks

    def block_inputs(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(scores (H_q, B), values (H_q, B, D), valid (B,))`` of logical block ``b``, read from the pool."""
        b = as_int(b, "b must be an int")
        if not 0 <= b < self.num_logical_blocks:
            raise ValueError(f"b must be in [0, {self.num_logical_blocks}), got {b}")
        k_cache, v_cache = self.kv.layer(0)
        block_id = self.block_table[b]  # B(b): the physical block
        k_blk = k_cache[block_id].float()[:, self.kv_head_of]  # (B, H_q, D): query head h reads KV head h // G
        v_blk = v_cache[block_id].float()[:, self.kv_head_of]  # (B, H_q, D)
        scores = torch.einsum("hd,bhd->hb", self.query.float(), k_blk) * self.scale  # (H_q, B)
        valid = torch.arange(self.block_size, device=self.kv.device) < self.seq_len - b * self.block_size  # (B,)
        return scores, v_blk.permute(1, 0, 2), valid

    def step(self) -> dict:
        """Process the next logical block; return what was recorded for it."""
        if self.done:
            raise RuntimeError(f"all {self.num_logical_blocks} blocks are processed: call reset() or shuffle()")
        b = self.num_processed
        scores, values, valid = self.block_inputs(b)
        new = self.update(self.m, self.l, self.o, scores, values, valid)
        m, l, o = self._check_state(new)  # a learner's update may return anything: state unchanged then
        self.m, self.l, self.o = m, l, o
        record = {
            "b": b,
            "block_id": self.block_table[b],
            "num_valid": int(valid.sum()),
            "scores": scores,
            "valid": valid,
            "m": m.clone(),
            "l": l.clone(),
            "o": o.clone(),
            "error": self.error(),
        }
        self.history.append(record)
        return record

    def run(self) -> torch.Tensor:
        """Step to the last block; return ``o / l`` (H_q, D)."""
        while not self.done:
            self.step()
        return self.output()

    def _check_state(self, new) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shapes = ((self.num_q_heads,), (self.num_q_heads,), (self.num_q_heads, self.head_dim))
        if not isinstance(new, (tuple, list)) or len(new) != 3:
            raise TypeError(f"update must return a tuple (m, l, o), got {type(new).__name__}")
        for name, t, shape in zip("mlo", new, shapes):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"update returned {name} of shape {got}, expected {shape}")
        return tuple(t.float() for t in new)

    def output(self) -> torch.Tensor:
        """``o / l`` so far (H_q, D): attention over the blocks processed (NaN before the first)."""
        return self.o / self.l[:, None]

    def error(self) -> torch.Tensor:
        """Relative error ``|o/l - O| / |O|`` per query head (H_q,), against the whole-sequence oracle."""
        return (self.output() - self.truth).norm(dim=-1) / self.truth.norm(dim=-1)

    # -- the same inputs for the library's kernels --------------------------------------------------
    def decode_inputs(self):
        """``(q, k_cache, v_cache, block_tables, seq_lens)`` for :func:`paged_edu.kernels.paged_attention_decode`."""
        k_cache, v_cache = self.kv.layer(0)
        device = self.kv.device
        tables = torch.tensor([self.block_table], dtype=torch.int32, device=device)  # (1, ceil(s/B))
        lens = torch.tensor([self.seq_len], dtype=torch.int32, device=device)  # (1,)
        return self.query[None], k_cache, v_cache, tables, lens

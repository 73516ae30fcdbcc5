"""Real K/V tensors behind a widget: what the allocator decides, the tensors obey.

A :class:`KVView` pairs a :class:`~paged_edu.core.allocator.BlockAllocator` with one layer of a paged
KV cache, ``k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim)``, and fills it
with the prefix-dependent K/V of :class:`~paged_edu.labs.toy_kv.ToyLayer`. It plays the model: it
keeps each sequence's token ids (the allocator counts slots and never needs them), and widgets call
it after each allocator operation; it also answers the two questions lessons 2 and 3 ask of the tensors:

* where does token ``t`` live? ``BasePtr_K + B(t//B) * S_block + (t mod B) * S_token + h * S_head``,
  with the strides computed from the symbols, against ``k_cache[B(t//B), t mod B, h].data_ptr()`` --
  and where the seed's formula as written, ``... + (t mod B) * d_head``, lands instead;
* did copy-on-write copy the right bytes, and leave the source alone?
"""

from __future__ import annotations

import torch

from paged_edu.core.allocator import BlockAllocator
from paged_edu.kernels.support import default_dtype
from paged_edu.labs.toy_kv import ToyLayer

__all__ = ["KVView"]


class KVView:
    """One layer of paged K/V on ``device``, written through ``allocator``'s slot mapping."""

    def __init__(
        self,
        allocator: BlockAllocator,
        *,
        device="cpu",
        dtype: torch.dtype | None = None,
        num_kv_heads: int = 2,
        head_dim: int = 64,
        seed: int = 0,
    ) -> None:
        from paged_edu.cache.kv_cache import PagedKVCache

        self.allocator = allocator
        self.device = torch.device(device)
        self.dtype = default_dtype(self.device) if dtype is None else dtype
        self.layer = ToyLayer(
            num_kv_heads=num_kv_heads, head_dim=head_dim, num_q_heads=2 * num_kv_heads, seed=seed
        )  # GQA 2:1
        self.cache = PagedKVCache(
            1, allocator.num_blocks, allocator.block_size, num_kv_heads, head_dim, dtype=self.dtype, device=self.device
        )
        self.tokens: dict = {}  # seq_id -> its token ids, as the engine's sequences hold them

    @property
    def k_cache(self) -> torch.Tensor:  # (num_blocks, block_size, num_kv_heads, head_dim)
        return self.cache.k_caches[0]

    @property
    def v_cache(self) -> torch.Tensor:  # (num_blocks, block_size, num_kv_heads, head_dim)
        return self.cache.v_caches[0]

    def expected_kv(self, seq_id) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V the sequence's tokens *should* have: ``(n, num_kv_heads, head_dim)`` each."""
        return self.layer.kv(self.tokens[seq_id], device=self.device, dtype=self.dtype)

    def write_prompt(self, seq_id, token_ids) -> int:
        """Store the K/V of the prompt ``token_ids`` (just allocated), skipping the leading tokens the
        prefix cache already holds.

        Returns how many tokens were written (``n - num_cached_tokens``), as an engine would.
        """
        self.tokens[seq_id] = [int(t) for t in token_ids]
        k, v = self.expected_kv(seq_id)  # (n, H_kv, D)
        start = self.allocator.num_cached_tokens(seq_id)
        slots = torch.tensor(self.allocator.slot_mapping(seq_id, start), device=self.device, dtype=torch.int64)
        self.cache.store(0, k[start:].contiguous(), v[start:].contiguous(), slots)
        return len(slots)

    def write_last(self, seq_id, token_id: int) -> None:
        """Store the K/V of the sequence's newest token ``token_id``, in the slot ``allocator.append_slots``
        reserved for it (the caller then tells the allocator: ``mark_computed(seq_id, n, [token_id])``)."""
        self.tokens[seq_id].append(int(token_id))
        k, v = self.expected_kv(seq_id)
        n = len(k)
        slots = torch.tensor(self.allocator.slot_mapping(seq_id, n - 1), device=self.device, dtype=torch.int64)
        self.cache.store(0, k[n - 1 :], v[n - 1 :], slots)

    def fork(self, parent, child) -> None:
        """``child`` (just forked by the allocator) holds ``parent``'s tokens."""
        self.tokens[child] = list(self.tokens[parent])

    def gather(self, seq_id) -> tuple[torch.Tensor, torch.Tensor]:
        """Read the sequence back through its block table: ``(n, H_kv, D)`` each."""
        return self.cache.gather(0, self.allocator.block_table(seq_id), self.allocator.num_tokens(seq_id))

    def reads_back(self, seq_id) -> bool:
        """Does the sequence read exactly its own K/V through its block table?"""
        k, v = self.gather(seq_id)
        k_ref, v_ref = self.expected_kv(seq_id)
        return bool(torch.equal(k, k_ref) and torch.equal(v, v_ref))

    def check_address(self, seq_id, t: int, kv_head: int = 0) -> dict:
        """Token ``t``'s K address from the *symbols* (not the tensor's strides), next to the
        tensor's own ``data_ptr()``, and where the seed's formula as written lands instead
        (see :func:`paged_edu.labs.experiments.address_check`)."""
        from paged_edu.labs.experiments import address_check

        k_ref, _ = self.expected_kv(seq_id)
        a = address_check(self.cache, self.allocator.block_table(seq_id), t, k_ref, kv_head=kv_head)
        actual = self.k_cache[a["block"], a["j"], kv_head].data_ptr()
        return {
            "base": a["base"],
            "s_block": a["symbols"]["S_block"],
            "s_token": a["symbols"]["S_token"],
            "s_head": a["symbols"]["S_head"],
            "kv_head": kv_head,
            "strides_match": a["strides_match"],
            "address_formula": a["right_address"],
            "address_tensor": actual,
            "address_match": a["right_address"] == actual,
            "value_match": a["right"]["k_matches"],
            "seed_address": a["seed_address"],
            "seed_lands": a["seed"],
        }

    def copy_block(self, src: int, dst: int) -> dict:
        """Apply one copy-on-write copy on the device; record what to check afterwards."""
        self.cache.copy_blocks([(src, dst)])
        k, v = self.k_cache, self.v_cache
        return {
            "src": src,
            "dst": dst,
            "copy_equal": bool(torch.equal(k[dst], k[src]) and torch.equal(v[dst], v[src])),
            "src_k": k[src].clone(),
            "src_v": v[src].clone(),
            "source_untouched": None,
        }

    def block_unchanged(self, check: dict) -> bool:
        src = check["src"]
        return bool(torch.equal(self.k_cache[src], check["src_k"]) and torch.equal(self.v_cache[src], check["src_v"]))

    # -- attention over the paged tensors ---------------------------------------------------------
    def batch(self, seq_ids) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q (num_seqs, H_q, D)``, int32 ``block_tables (num_seqs, max_blocks)`` and ``seq_lens``:
        the decode inputs for the newest token of each sequence."""
        seq_ids = list(seq_ids)
        tables = [self.allocator.block_table(s) for s in seq_ids]
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=self.device)
        seq_lens = torch.tensor([self.allocator.num_tokens(s) for s in seq_ids], dtype=torch.int32, device=self.device)
        q = torch.stack(
            [self.layer.query(self.tokens[s], device=self.device, dtype=self.dtype) for s in seq_ids]
        )  # (num_seqs, H_q, D)
        return q, block_tables, seq_lens

    def attention(self, seq_ids, impl: str = "auto") -> torch.Tensor:
        """Paged decode attention: the kernel reads K/V through the block tables. ``(num_seqs, H_q, D)``."""
        from paged_edu.kernels import paged_attention_decode

        q, block_tables, seq_lens = self.batch(seq_ids)
        return paged_attention_decode(q, self.k_cache, self.v_cache, block_tables, seq_lens, impl=impl)

    def attention_truth(self, seq_ids) -> torch.Tensor:
        """``softmax(q K^T / sqrt(d)) V`` over each sequence's own K/V, contiguous, in fp32."""
        group = self.layer.num_q_heads // self.layer.num_kv_heads
        outs = []
        for s in seq_ids:
            tokens = self.tokens[s]
            q = self.layer.query(tokens)  # (H_q, D) fp32 on the CPU
            k, v = self.layer.kv(tokens)  # (n, H_kv, D)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (n, H_q, D)
            scores = torch.einsum("hd,thd->ht", q, k) / self.layer.head_dim**0.5  # (H_q, n)
            outs.append(torch.einsum("ht,thd->hd", scores.softmax(-1), v))
        return torch.stack(outs).to(self.device)  # (num_seqs, H_q, D)

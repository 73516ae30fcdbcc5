"""A Llama-family decoder whose attention lives on the paged KV cache.

What you will learn
-------------------
* the Llama block -- RMSNorm, rotary position embeddings (RoPE), grouped-query attention (GQA),
  the SwiGLU MLP -- in one screen of PyTorch, with the shapes written next to every tensor;
* how an engine feeds a *flat* batch (:class:`ForwardBatch`): the new tokens of every scheduled
  sequence side by side, ``T`` rows in all, each with its position and its *slot*
  ``B(t // B) * B + t mod B`` in the pool (the engine's runner, :mod:`paged_edu.engine.runner`,
  builds it);
* that attention is the only layer that knows about blocks: it stores the new K/V through the
  ``slot_mapping`` (:func:`paged_edu.cache.kv_cache.store_kv`, the cache's one store call) and
  reads the past through block tables -- one :func:`paged_edu.kernels.paged_attention_decode`
  call for every one-token (decode) row of the step, one
  :func:`paged_edu.kernels.paged_attention_prefill` call for the prompt chunks. Everything else
  (norms, projections, MLP) is per token and never sees the cache.

* why a GPU runs the per-token ops *fused*: on a small model a decode step is a thousand tiny
  kernels, so where Triton compiles (:func:`paged_edu.kernels.kernel_support`) the residual add
  and RMSNorm are one kernel, the rotary embedding and the K/V store one, SiLU and the product
  one (:mod:`paged_edu.kernels.triton_fused`, :mod:`paged_edu.kernels.triton_store`) -- with the
  PyTorch path's rounding, so both paths give the same numbers. A pure-decode step goes one
  further (``Kernels.fuse_decode_store``, on by default): the decode attention kernel rotates and stores
  the new token itself (:func:`paged_edu.kernels.triton_decode.rotary_store_decode_triton`), and a batch of
  <= 64 rows runs the MLP's gate_up projection and SiLU-and-mul as one skinny GEMM
  (``Kernels.swiglu_gemm``, on by default: :mod:`paged_edu.kernels.triton_gemm`'s SwiGLU epilogue). Such a
  layer launches seven kernels: add and norm, qkv, attention (rotary and K/V store inside), o_proj, add and
  norm, gate_up with SiLU-and-mul, down -- eight where the decode kernel splits the sequences and merges the
  splits in a second kernel (at the engine's table width, every batch of 1 to 64 on 132 SMs:
  :func:`~paged_edu.kernels.decode.tuning.choose_num_splits`); ``tests/models/test_decode_launches.py`` counts
  them. On a CPU the model runs plain PyTorch.

``PagedLlama.from_hf(hf_model)`` copies the weights of any Hugging Face ``LlamaForCausalLM``; the
config lives in :mod:`paged_edu.models.config`, random and real (SmolLM2) weights in
:mod:`paged_edu.models.loaders`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from paged_edu.cache.kv_cache import store_kv
from paged_edu.kernels import kernel_support, paged_attention_decode, paged_attention_prefill, resolve_impl
from paged_edu.kernels.support import SKINNY_MAX_ROWS
from paged_edu.models.config import LlamaConfig

__all__ = ["ForwardBatch", "Kernels", "PagedLlama"]


# ----------------------------------------------------------------------------------------------
# The flat batch of one engine step
# ----------------------------------------------------------------------------------------------


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
    prefill_cu_seqlens_q: torch.Tensor | None  # int32 (P + 1,): chunk i owns rows cu[i]:cu[i+1] (cu[0] = D)
    logits_rows: torch.Tensor  # (num_chunks,) int64: the row of each chunk's last token, input order


# ----------------------------------------------------------------------------------------------
# The layers
# ----------------------------------------------------------------------------------------------


def _pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch on ``device`` (:func:`paged_edu.kernels.pdl.pdl_supported`; needs Triton)."""
    from paged_edu.kernels.pdl import pdl_supported

    return pdl_supported(torch.device(device))


@dataclass(frozen=True, slots=True)
class Kernels:
    """Which implementation each op of a forward pass runs: the caller's choice, passed to
    :meth:`PagedLlama.forward` with every batch -- never set on the model, so two engines that share
    one model each run their own kernels.

    The fields are the engine's kernel settings named by the op they pick; each is documented once,
    with what it buys, in :class:`~paged_edu.engine.config.KernelConfig` (``attn_impl`` -> ``decode``,
    ``prefill_impl`` -> ``prefill``, ``fused_impl`` -> ``fused``, ``gemm_impl`` -> ``gemm``; the flags
    keep their names), whose ``model_kernels()`` makes this record.
    """

    decode: str = "auto"  # paged_attention_decode's impl: "auto", "triton", "torch" or "loop"
    prefill: str = "auto"  # paged_attention_prefill's impl: "auto", "triton" or "torch"
    fused: str = "auto"  # the per-token ops (norm, rotary + store, SiLU-and-mul): "auto", "triton" or "torch"
    gemm: str = "auto"  # the projections and LM head at <= 64 rows: "auto", "triton" (skinny GEMM) or "torch"
    fuse_decode_store: bool = True  # a pure-decode step's rotary + K/V store inside the Triton decode kernel
    swiglu_gemm: bool = True  # gate_up and SiLU-and-mul in one skinny GEMM at <= 64 rows
    pdl: bool = True  # programmatic dependent launches in a step of <= 64 rows (see resolve and for_step)

    def resolve(self, device: torch.device) -> Kernels:
        """The same choice with every ``"auto"`` made concrete: ``fused`` ``"triton"`` where the fused
        kernels compile, else ``"torch"``; ``decode`` and ``prefill`` as
        :func:`~paged_edu.kernels.resolve_impl` resolves them; ``pdl`` on only where the decode chain is
        all Triton on a GPU with programmatic launches; ``gemm`` ``"triton"`` where ``pdl`` is on, else
        ``"torch"``. A fused or gemm choice that cannot run here raises ``ValueError``."""
        support = kernel_support(device)
        for name, value, runs in (("fused_impl", self.fused, support.fused), ("gemm_impl", self.gemm, support.gemm)):
            if value not in ("auto", "triton", "torch"):
                raise ValueError(f"{name} must be 'auto', 'triton' or 'torch', got {value!r}")
            if value == "triton" and not runs:
                raise ValueError(
                    f"{name}='triton', but its Triton kernels cannot run on {device} here "
                    "(see paged_edu.kernels.kernel_support); use 'auto' or 'torch'"
                )
        fused = ("triton" if support.use_triton("fused") else "torch") if self.fused == "auto" else self.fused
        resolved = replace(
            self,
            decode=resolve_impl(self.decode, device, "decode"),
            prefill=resolve_impl(self.prefill, device, "prefill"),
            fused=fused,
        )
        pdl = self.pdl and resolved.fused_decode and support.gemm and _pdl_supported(device)
        gemm = ("triton" if pdl else "torch") if self.gemm == "auto" else self.gemm
        return replace(resolved, gemm=gemm, pdl=pdl)

    def for_step(self, num_tokens: int) -> Kernels:
        """The choice for one step (after :meth:`resolve`): ``pdl`` only for a step of at most 64 rows,
        where every kernel of the chain is Triton's -- a decode batch, or a step with prompt chunks (the
        rotary + store and prefill kernels take part too: a lone short prompt, the first token of a
        request on an idle server); above, the projections are cuBLAS's, and there a chain of Triton
        kernels launched early measured slower on the H200 (kernels/pdl.py)."""
        if self.pdl and num_tokens > SKINNY_MAX_ROWS:
            return replace(self, pdl=False)
        return self

    @property
    def fused_ops(self) -> bool:
        """Run the fused Triton kernels for the per-token ops (after :meth:`resolve`)."""
        return self.fused == "triton"

    @property
    def fused_decode(self) -> bool:
        """A pure-decode step's rotary embedding and K/V store run inside the Triton decode kernel
        (after :meth:`resolve`): one launch fewer per layer."""
        return self.fuse_decode_store and self.fused_ops and self.decode == "triton"


def linear(layer: nn.Linear, x: torch.Tensor, gemm: str = "torch", pdl: bool = False) -> torch.Tensor:
    """``layer(x)`` (``x @ W^T``, no bias): with ``gemm="triton"`` and at most 64 rows, the skinny GEMM
    (:func:`~paged_edu.kernels.triton_gemm.skinny_matmul`, a decode batch's projection; ``pdl``: launched
    as a programmatic dependent), else PyTorch."""
    if gemm == "triton" and x.shape[0] <= SKINNY_MAX_ROWS and layer.bias is None:  # fixed in a graph
        from paged_edu.kernels.triton_gemm import skinny_matmul

        return skinny_matmul(x, layer.weight, pdl=pdl)
    return layer(x)


class RMSNorm(nn.Module):
    """``y = w * x / sqrt(mean(x^2) + eps)``, the statistics in fp32 (as Hugging Face computes it).

    ``norm(h, residual)`` first adds the sub-layer output ``h`` to the residual stream and returns
    ``(y, h + residual)``: the add belongs to the norm, as in vLLM, so that on a GPU both are one
    kernel (``fused=True``: :func:`~paged_edu.kernels.triton_fused.add_rms_norm_triton`, nine
    PyTorch kernels in one, the same rounding). ``residual=None`` (the first layer) normalises ``h``.
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, fused: bool = False, pdl: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if fused:
            from paged_edu.kernels.triton_fused import add_rms_norm_triton

            return add_rms_norm_triton(x, self.weight, self.eps, residual, pdl=pdl)
        if residual is not None:
            x = x + residual  # (T, hidden): the residual stream after this sub-layer
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype), x


class Rotary(nn.Module):
    """RoPE: rotate each (i, i + D/2) pair of q and k by ``position * inv_freq_i``.

    The cos/sin table for every position is built once in fp32 (``model.to(dtype)`` then rounds it,
    exactly as the ``.to(dtype)`` below would); a step indexes it by ``positions`` (the fused
    kernel reads its rows itself).
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
        self.scale = config.head_dim**-0.5
        # q, k and v projections fused into one matmul: (H + 2 H_kv) * D outputs.
        self.qkv_proj = nn.Linear(
            config.hidden_size, (config.num_heads + 2 * config.num_kv_heads) * config.head_dim, bias=False
        )
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, kernels: Kernels) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The new tokens' q ``(T, H, D)``, k and v ``(T, H_kv, D)``, not yet rotated: views of one matmul."""
        T = x.shape[0]
        H, H_kv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = linear(self.qkv_proj, x, kernels.gemm, kernels.pdl).split([H * D, H_kv * D, H_kv * D], dim=-1)
        return q.view(T, H, D), k.view(T, H_kv, D), v.view(T, H_kv, D)

    def project(self, x, cos, sin, k_cache, v_cache, batch: ForwardBatch, kernels: Kernels) -> torch.Tensor:
        """The queries ``(T, H, D)`` of the new tokens; their keys and values go into the pool."""
        q, k, v = self.qkv(x, kernels)  # (T, H, D), (T, H_kv, D), (T, H_kv, D)
        if kernels.fused_ops:
            # One kernel rotates q and k and stores k, v at their slots: the three lines below
            # (ten small kernels) with the same rounding. cos, sin are the whole (L, D) tables here.
            from paged_edu.kernels.triton_store import rotary_store_kv_triton

            return rotary_store_kv_triton(
                q, k, v, k_cache, v_cache, batch.slot_mapping, batch.positions, cos, sin, pdl=kernels.pdl
            )
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        store_kv(k, v, k_cache, v_cache, batch.slot_mapping)  # the pool now holds every token up to each row
        return q

    def attend(self, q, k_cache, v_cache, batch: ForwardBatch, kernels: Kernels) -> torch.Tensor:
        """Attention of the queries ``q`` ``(T, H, D)`` over the pool, through the block tables: the
        only part of the model that reads other tokens. Decode rows first, then the prompt chunks."""
        Dn = batch.num_decodes
        decode = dict(scale=self.scale, impl=kernels.decode, validate=False)
        if batch.prefill_cu_seqlens_q is None:  # a pure decode step: one kernel call, no copy
            return paged_attention_decode(
                q, k_cache, v_cache, batch.decode_block_tables, batch.decode_seq_lens, **decode
            )
        out = torch.empty_like(q)  # (T, H, D)
        if Dn:
            out[:Dn] = paged_attention_decode(
                q[:Dn], k_cache, v_cache, batch.decode_block_tables, batch.decode_seq_lens, **decode
            )
        # The prompt chunks own rows cu[0] = Dn .. cu[-1] of q: written into out in place.
        return paged_attention_prefill(
            q,
            k_cache,
            v_cache,
            batch.prefill_block_tables,
            batch.prefill_seq_lens,
            batch.prefill_cu_seqlens_q,
            scale=self.scale,
            impl=kernels.prefill,
            validate=False,
            out=out,
            pdl=kernels.pdl,
        )

    def forward(self, x, cos, sin, k_cache, v_cache, batch: ForwardBatch, kernels: Kernels):
        if kernels.fused_decode and batch.prefill_cu_seqlens_q is None:
            # A pure decode step on the GPU: the decode kernel rotates q and k and stores k, v itself
            # (project + attend in one launch). cos, sin are the whole (L, D) tables here.
            from paged_edu.kernels.triton_decode import rotary_store_decode_triton

            q, k, v = self.qkv(x, kernels)  # (T, H, D), (T, H_kv, D), (T, H_kv, D)
            out = rotary_store_decode_triton(
                q,
                k,
                v,
                k_cache,
                v_cache,
                batch.decode_block_tables,
                batch.decode_seq_lens,
                batch.slot_mapping,
                batch.positions,
                cos,
                sin,
                scale=self.scale,
                pdl=kernels.pdl,
            )  # (T, H, D)
        else:
            q = self.project(x, cos, sin, k_cache, v_cache, batch, kernels)  # (T, H, D)
            out = self.attend(q, k_cache, v_cache, batch, kernels)  # (T, H, D)
        return linear(self.o_proj, out.flatten(1), kernels.gemm, kernels.pdl)  # (T, hidden)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``, gate and up fused into one matmul."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, kernels: Kernels = Kernels(fused="torch")) -> torch.Tensor:
        """``x`` (T, hidden) -> (T, hidden); ``kernels`` (resolved) picks the fused ops and the GEMMs."""
        gemm, pdl = kernels.gemm, kernels.pdl
        if kernels.swiglu_gemm and kernels.fused_ops and x.shape[0] <= SKINNY_MAX_ROWS:
            from paged_edu.kernels.triton_gemm import skinny_matmul

            # gate_up, then silu and the product in the GEMM's epilogue: one kernel, the same rounding
            return linear(self.down_proj, skinny_matmul(x, self.gate_up_proj.weight, swiglu=True, pdl=pdl), gemm, pdl)
        gate_up = linear(self.gate_up_proj, x, gemm, pdl)  # (T, 2I): gate, then up
        if kernels.fused_ops:  # silu and the product in one kernel, the same rounding
            from paged_edu.kernels.triton_fused import silu_and_mul_triton

            return linear(self.down_proj, silu_and_mul_triton(gate_up), gemm, pdl)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)  # (T, I) each
        return linear(self.down_proj, nn.functional.silu(gate) * up, gemm, pdl)


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = PagedAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, h, residual, cos, sin, k_cache, v_cache, batch, kernels: Kernels):
        """``h``: the previous sub-layer's output; ``residual``: the stream before it (``None`` at
        the first layer). Each norm adds the two first, so the pair passes on to the next layer:
        ``h_out + residual_out`` is the classic ``x + attn(norm(x)) + mlp(norm(...))``."""
        # residual += h; x = norm(residual)
        x, residual = self.input_layernorm(h, residual, kernels.fused_ops, kernels.pdl)
        h = self.self_attn(x, cos, sin, k_cache, v_cache, batch, kernels)  # (T, hidden)
        x, residual = self.post_attention_layernorm(h, residual, kernels.fused_ops, kernels.pdl)
        return self.mlp(x, kernels), residual


# ----------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------


class PagedLlama(nn.Module):
    """A Llama-family causal LM over a paged KV cache.

    ``forward(batch, kv_caches)`` computes the hidden states of a step's ``T`` new tokens, writing
    their K/V into ``kv_caches[layer] = (k_cache, v_cache)``, each
    ``(num_blocks, block_size, num_kv_heads, head_dim)``; ``compute_logits`` turns the rows that
    sample into fp32 logits.

    ``forward(batch, kv_caches, kernels)`` runs the :class:`Kernels` its caller picks: the decode
    kernel (``"auto"``, ``"triton"``, ``"torch"``, ``"loop"``), the prefill path (``"auto"``,
    ``"triton"``, ``"torch"``) and the per-token ops (``"auto"``: the fused Triton kernels where they
    compile, PyTorch elsewhere; ``"triton"``, also under the interpreter: tests; or ``"torch"``);
    ``"auto"`` follows :mod:`paged_edu.kernels` (Triton on CUDA). On a CPU the engine asks for
    ``"torch"``: the Triton interpreter is exact but far too slow for a 30-layer model. The choice
    travels with each call, not on the model, so engines sharing one model never reconfigure each other.
    """

    def __init__(
        self,
        config: LlamaConfig,
        *,
        inv_freq: torch.Tensor | None = None,
        attention_scaling: float = 1.0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        self.config = config
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

    def forward(
        self,
        batch: ForwardBatch,
        kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
        kernels: Kernels | None = None,
    ) -> torch.Tensor:
        """Hidden states ``(T, hidden)`` of the batch's new tokens, run by ``kernels`` (default:
        ``Kernels()``, every op ``"auto"``)."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"need one (k_cache, v_cache) pair per layer ({len(self.layers)}), got {len(kv_caches)}")
        kernels = (kernels or Kernels()).resolve(self.device)
        kernels = kernels.for_step(batch.input_ids.shape[0])
        h = self.embed_tokens(batch.input_ids)  # (T, hidden)
        if kernels.fused_ops:  # the rotary kernel reads each token's row of the tables itself
            cos, sin = self.rotary.cos_table, self.rotary.sin_table  # (L, D) each
        else:
            cos, sin = self.rotary(batch.positions, h.dtype)  # (T, 1, D) each
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            h, residual = layer(h, residual, cos, sin, k_cache, v_cache, batch, kernels)
        hidden, _ = self.norm(h, residual, kernels.fused_ops, kernels.pdl)
        return hidden  # (T, hidden)

    def compute_logits(self, hidden: torch.Tensor, kernels: Kernels | None = None) -> torch.Tensor:
        """fp32 logits ``(N, vocab)`` of ``hidden`` ``(N, hidden)``: the LM head by ``kernels.gemm``."""
        return linear(self.lm_head, hidden, kernels.gemm if kernels else "torch").float()  # (N, vocab) fp32

    def greedy_tokens(self, hidden: torch.Tensor, kernels: Kernels | None = None) -> torch.Tensor:
        """``compute_logits(hidden, kernels).argmax(-1)`` without the fp32 copy of the logits: widening
        to fp32 is exact and keeps their order (ties: the first index, in both), so the tokens are the same."""
        return linear(self.lm_head, hidden, kernels.gemm if kernels else "torch").argmax(dim=-1)  # (N,) int64

    # -- weights -------------------------------------------------------------------------------
    @classmethod
    def from_hf(
        cls, hf_model, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> PagedLlama:
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

"""A Llama-family model's numbers: :class:`LlamaConfig`, its Hugging Face names, SmolLM2's config.

The config is what builds the model, with no torch: its Hugging Face fields, the engine's limits
(``max_position_embeddings``), the norm's epsilon and RoPE's base. What the rest of the package needs of
the model's shape -- the bytes a token costs in the cache, the cost model's FLOPs and bytes -- is
:meth:`LlamaConfig.geometry`, the package's one geometry type (:class:`~paged_edu.core.hardware.ModelGeometry`);
:func:`smollm2_config` is built from SmolLM2-135M's row of the model table.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from paged_edu.core.hardware import MODELS, ModelGeometry
from paged_edu.core.validation import FieldValueError, integer, real

__all__ = ["LlamaConfig", "describe", "smollm2_config"]


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
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            setattr(self, name, integer(name, getattr(self, name), low=1))  # numpy ints become plain ints
        for name in ("rms_norm_eps", "rope_theta"):
            value = real(name, getattr(self, name))
            if not 0 < value < math.inf:  # NaN fails this too
                raise FieldValueError(name, f"{name} must be a finite number > 0, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    def geometry(self, dtype: str = "bf16", name: str = "model") -> ModelGeometry:
        """This model's shape, weights in ``dtype`` (a :data:`~paged_edu.core.hardware.DTYPE_BYTES` name).

        ``num_params`` counts every weight: per layer the projections, the MLP and two norms, then the
        final norm, the input embedding and an untied LM head; ``matmul_params`` (the cost model's
        ``P``) is all of them but the input embedding, as in the model table.
        """
        d, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = d * (2 * q + 2 * kv) + 3 * d * self.intermediate_size + 2 * d
        head = 0 if self.tie_word_embeddings else d * self.vocab_size
        matmul = self.num_layers * per_layer + d + head
        return ModelGeometry(
            name,
            self.num_layers,
            self.num_kv_heads,
            self.head_dim,
            dtype,
            num_q_heads=self.num_heads,
            d_model=d,
            vocab_size=self.vocab_size,
            num_params=float(matmul + d * self.vocab_size),
            matmul_params=float(matmul),
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
        )

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

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``(N, K)`` of each projection's weight (``y (M, N) = x (M, K) @ W^T``), as ``PagedLlama``
        fuses them: q/k/v in one, gate/up in one; the LM head last."""
        return {
            "qkv": ((self.num_heads + 2 * self.num_kv_heads) * self.head_dim, self.hidden_size),
            "o_proj": (self.hidden_size, self.num_heads * self.head_dim),
            "gate_up": (2 * self.intermediate_size, self.hidden_size),
            "down": (self.hidden_size, self.intermediate_size),
            "lm_head": (self.vocab_size, self.hidden_size),
        }

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
    """SmolLM2-135M: its row of the model table (30 layers, 9 query / 3 KV heads of 64, vocab 49,152,
    tied embeddings) and what only the config holds (MLP width, norm epsilon, RoPE base)."""
    g = MODELS["smollm2-135m"]
    config = dict(
        vocab_size=g.vocab_size,
        hidden_size=g.d_model,
        intermediate_size=1536,
        num_layers=g.num_layers,
        num_heads=g.num_q_heads,
        num_kv_heads=g.num_kv_heads,
        head_dim=g.head_dim,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=g.tie_word_embeddings,
        max_position_embeddings=g.max_position_embeddings,
    )
    config.update(overrides)
    return LlamaConfig(**config)


def describe(config: LlamaConfig) -> dict:
    """The config as a plain dict (for JSON results)."""
    return asdict(config)

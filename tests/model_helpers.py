"""Model configurations the tests share."""

from paged_edu.models.config import LlamaConfig

# Two layers, 4 query / 2 KV heads of 16: a forward pass in milliseconds, even under Triton's interpreter.
TINY_LLAMA = LlamaConfig(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=64,
)

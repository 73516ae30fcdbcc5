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


def stale_gpu_pools(config: LlamaConfig, seed: int = 7, num_blocks: int = 64, block_size: int = 16) -> list:
    """One ``(k_cache, v_cache)`` pair per layer of random bf16 values on the GPU -- earlier tokens'
    K/V and garbage -- the same for the same ``seed`` (the GPU tests' stale pool)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    return [
        tuple(torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
        for _ in range(config.num_layers)
    ]

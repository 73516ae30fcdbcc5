"""nano-vllm's benchmark workload on Qwen3-0.6B's geometry: the second yardstick of ``bench_engine.py``.

``python benchmarks/bench_engine.py --workload nanovllm`` serves this workload; this module holds the
facts it is built from (each quoted with its source; the code is ours) and the small sums the
record needs.

**The workload** -- nano-vllm's ``bench.py`` (GeeeekExplorer/nano-vllm), the lines that fix it::

    seed(0)
    num_seqs = 256
    max_input_len = 1024
    max_ouput_len = 1024
    llm = LLM(path, enforce_eager=False, max_model_len=4096)
    prompt_token_ids = [[randint(0, 10000) for _ in range(randint(100, max_input_len))] for _ in range(num_seqs)]
    sampling_params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=randint(100, max_ouput_len)) for _ in range(num_seqs)]

with ``from random import randint, seed`` (Python's ``random``). Its README reports "Output Tokens
133,966" for that workload and, for the same setup on Qwen3.5, "Prompt Tokens 142,827":
:func:`nanovllm_requests` reproduces both sums (a test checks them). Its engine defaults
(``nanovllm/config.py``): ``max_num_batched_tokens: int = 16384``, ``max_num_seqs: int = 512``,
``gpu_memory_utilization: float = 0.9``, ``kvcache_block_size: int = 256``.

**The model** -- Qwen3-0.6B's ``config.json`` (huggingface.co/Qwen/Qwen3-0.6B, 726 bytes; as copied
in huggingface.co/TensorStack/TextEncoder/blob/main/Qwen-3-06B/config.json and printed by
``AutoConfig.from_pretrained("Qwen/Qwen3-0.6B")`` in kiraa-blog.vercel.app/post/learning-qwen3-0.6b)::

    "head_dim": 128, "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000, "tie_word_embeddings": true, "vocab_size": 151936

Its model card: "Number of Paramaters (Non-Embedding): 0.44B" -- the cost model's ``P`` below is
440,459,264. ``head_dim * num_attention_heads = 2048 != hidden_size``: :class:`LlamaConfig` keeps
``head_dim`` apart, and ``PagedLlama`` ties the LM head to the embedding. What ``PagedLlama`` lacks is
Qwen3's *qk-norm* (an RMSNorm over ``head_dim`` of every query and key head before RoPE; its model
card: "qk layernorm for all models"); :func:`qk_norm_cost` sizes what leaving it out saves.

**Peers on this workload** (cosmoliu2002/nano-vllm-triton#1, NVIDIA A800-SXM4-80GB, vLLM 0.10.2,
"Model: Qwen3-0.6B, Total: 133966tok"): vLLM 15.60 s = 8,587.95 tok/s; nano-vllm-triton (a Triton
port of nano-vllm) 13.38 s = 10,009.26 tok/s. nano-vllm's own README (RTX 4070 Laptop, 8 GB): vLLM
98.37 s, nano-vllm 93.41 s -- a GPU our table does not hold. The A800 is a GA100 like the A100 80GB
(the same 312 TFLOP/s dense bf16 and 2,039 GB/s HBM2e; its NVLink is cut to 400 GB/s, which one GPU
does not use), so the record prices the A800 runs with the table's ``a100-80gb`` row: the roofline
of the engine's own steps on that GPU over each peer's time is the share of the roofline the peer
reached. (Their schedules differ from ours only in the number of steps, hence in weight reads: the
decode steps' KV reads and every FLOP are the same for any schedule that never preempts.)
"""

from __future__ import annotations

import random

from paged_edu.models.config import LlamaConfig

# nano-vllm's bench.py (see the module docstring).
NUM_SEQS = 256
MIN_LEN = 100  # randint(100, max_input_len) and randint(100, max_ouput_len)
MAX_INPUT_LEN = 1024
MAX_OUTPUT_LEN = 1024
MAX_TOKEN_ID = 10000  # randint(0, 10000): ids 0..10000 inclusive
SEED = 0
MAX_MODEL_LEN = 4096  # LLM(path, ..., max_model_len=4096)
# nanovllm/config.py's defaults: the scheduler's token budget per step and the KV pool's share of the GPU.
MAX_NUM_BATCHED_TOKENS = 16384
GPU_MEMORY_UTILIZATION = 0.9
# nano-vllm's README: the workload's sums.
README_PROMPT_TOKENS = 142_827
README_OUTPUT_TOKENS = 133_966

# cosmoliu2002/nano-vllm-triton#1: seconds for the 133,966 output tokens on an NVIDIA A800-SXM4-80GB.
PEERS = (
    dict(system="vLLM 0.10.2", seconds=15.60, tokens_per_s=8587.95),
    dict(system="nano-vllm-triton", seconds=13.38, tokens_per_s=10009.26),
)
PEER_GPU = "a100-80gb"  # the A800-SXM4-80GB's twin in paged_edu.core.hardware (see the docstring)
PEER_SOURCE = "cosmoliu2002/nano-vllm-triton#1 (NVIDIA A800-SXM4-80GB, Qwen3-0.6B, Total: 133966tok)"
WORKLOAD_SOURCE = "GeeeekExplorer/nano-vllm bench.py"
MODEL_SOURCE = "huggingface.co/Qwen/Qwen3-0.6B config.json"


def nanovllm_requests(
    num_seqs: int = NUM_SEQS,
    min_len: int = MIN_LEN,
    max_input_len: int = MAX_INPUT_LEN,
    max_output_len: int = MAX_OUTPUT_LEN,
    max_token_id: int = MAX_TOKEN_ID,
    seed: int = SEED,
) -> tuple[list[list[int]], list[int]]:
    """nano-vllm's requests: ``(prompts, output lengths)``, drawn in its script's order.

    One ``random.Random(seed)`` (the same stream as ``random.seed(seed)`` and the module's ``randint``):
    for each sequence its prompt length, then its token ids; then every output length. Each output
    length is generated in full (``ignore_eos``).
    """
    rng = random.Random(seed)
    prompts = [
        [rng.randint(0, max_token_id) for _ in range(rng.randint(min_len, max_input_len))] for _ in range(num_seqs)
    ]
    outputs = [rng.randint(min_len, max_output_len) for _ in range(num_seqs)]
    return prompts, outputs


def qwen3_0_6b_config(**overrides) -> LlamaConfig:
    """Qwen3-0.6B's geometry (its config.json, quoted above) as a :class:`LlamaConfig`; no qk-norm."""
    config = dict(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    )
    config.update(overrides)
    return LlamaConfig(**config)


def qk_norm_cost(config: LlamaConfig, num_tokens: int, dtype_bytes: int, hbm_bandwidth: float) -> dict:
    """What Qwen3's qk-norm would add to a run that computes ``num_tokens`` tokens.

    Per token and layer it normalises ``(H + H_kv)`` vectors of ``D``: ~4 FLOPs an element (square,
    sum, scale, weight) against the layer's ``2 P / layers`` matmul FLOPs; its weights are
    ``2 D`` values a layer. Fused into the rotary kernel it moves no extra byte; as its own kernel it
    reads and writes q and k once more: ``2 (H + H_kv) D`` values a token and layer, timed here at
    the roofline's bandwidth. (Two more small kernels a layer would also add ``2 * layers`` launches
    a step.)
    """
    c = config
    elems = (c.num_heads + c.num_kv_heads) * c.head_dim  # per token and layer
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    layer_params = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
    unfused_bytes = float(num_tokens) * c.num_layers * 2 * elems * dtype_bytes
    return dict(
        implemented=False,
        flops_share=4 * elems / (2 * layer_params),
        weight_values=2 * c.head_dim * c.num_layers,
        unfused_extra_bytes=unfused_bytes,
        unfused_extra_s=unfused_bytes / hbm_bandwidth,
        extra_kernels_per_step_unfused=2 * c.num_layers,
    )


def peer_shares(roofline_s_on_peer_gpu: float) -> list[dict]:
    """Each cited peer's share of the roofline: the roofline's seconds on their GPU over their seconds."""
    return [
        dict(
            **p,
            gpu="NVIDIA A800-SXM4-80GB",
            priced_as=PEER_GPU,
            share_of_roofline=roofline_s_on_peer_gpu / p["seconds"],
        )
        for p in PEERS
    ]

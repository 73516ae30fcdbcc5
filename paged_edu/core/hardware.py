"""The one table of model geometries and the one table of GPUs.

Everything that needs a model's shape or a GPU's size reads it here: the memory model
(:data:`paged_edu.core.memory.PRESETS`), the simulator's cost model
(:data:`paged_edu.sim.costmodel.MODELS` / ``GPUS``) and the lesson widgets. Each figure carries its
source next to it.

GPU memory is in bytes *as the device reports it*: ``nvidia-smi``'s ``memory.total`` in MiB, times
2**20. Datasheets round ("141 GB", "80 GB"); the device reports a little more or less, and
``torch.cuda.get_device_properties(0).total_memory`` (CUDA's ``totalGlobalMem``) a few hundred MiB
less again, the driver's own reservation (an A100 40GB: 40,960 MiB in ``nvidia-smi``,
42,298,834,944 bytes = 40,339 MiB in ``deviceQuery``, NVIDIA/nvidia-docker#1648 and
bottlerocket-os/bottlerocket#3873).

Plain Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DTYPE_BYTES", "GPU_TABLE", "MODEL_TABLE", "MORE_MODELS", "MiB", "GPU", "ModelGeometry"]

MiB = 1 << 20
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}  # bytes of one value


@dataclass(frozen=True, slots=True)
class ModelGeometry:
    """A decoder's shape: what the KV cache, the cost model and the weight budget need.

    ``num_params`` counts every weight (what the weights take in memory); ``matmul_params`` the
    weights one token multiplies through outside the input embedding (the cost model's ``P``). An MLA model
    (DeepSeek-V2/V3) caches a ``latent_dim`` latent plus a ``rope_dim`` RoPE key per layer instead
    of K and V per KV head. :meth:`paged_edu.core.memory.KVSpec.from_geometry` is the memory model's view of
    the same geometry.
    """

    name: str  # the memory model's preset name, e.g. "Llama-3-8B"
    key: str  # the command line's --model value, e.g. "llama-3-8b"
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    d_model: int
    vocab_size: int
    num_params: float
    matmul_params: float
    dtype: str = "bf16"
    latent_dim: int = 0
    rope_dim: int = 0
    max_position_embeddings: int = 0  # the config's context length: vLLM's default --max-model-len
    # The LM head is the input embedding (config.json's tie_word_embeddings): its d_model x vocab
    # weights are then not in matmul_params (which leaves the input embedding out); untied, they are.
    tie_word_embeddings: bool = False
    note: str = ""
    source: str = ""

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True, slots=True)
class GPU:
    """One GPU: memory as the device reports it, the roofline's two ceilings, the host link."""

    key: str  # the command line's --gpu value, e.g. "h200"
    name: str  # the device name nvidia-smi prints
    label: str  # the datasheet's name, for menus: "H200 (141 GB)"
    memory_bytes: int  # nvidia-smi memory.total (MiB) * 2**20
    peak_flops: float  # dense bf16/fp16 tensor-core FLOP/s (datasheets quote 2x "with sparsity")
    datasheet_bandwidth: float  # HBM bytes/s on the datasheet
    hbm_bandwidth: float  # bytes/s a device copy reaches (read + write counted): the roofline's
    pcie_bandwidth: float  # bytes/s host <-> device one way, for swapping (an assumption)
    source: str = ""


MODEL_TABLE: dict[str, ModelGeometry] = {
    m.name: m
    for m in (
        ModelGeometry(
            "Seed 70B example",
            "llama-2-70b",
            80,
            64,
            8,
            128,
            8192,
            32000,
            70.6e9,
            68.7e9,
            "fp16",
            max_position_embeddings=4096,
            note="the seed's worked example (Llama-2/3-70B geometry)",
            source="meta-llama/Llama-2-70b-hf config.json; matmul params = total - the 32000 x 8192 input embedding",
        ),
        ModelGeometry(
            "Llama-3-8B",
            "llama-3-8b",
            32,
            32,
            8,
            128,
            4096,
            128256,
            8.03e9,
            7.50e9,
            "bf16",
            max_position_embeddings=8192,
            note="GQA: 32 query heads share 8 KV heads",
            source="meta-llama/Meta-Llama-3-8B config.json",
        ),
        ModelGeometry(
            "Llama-2-7B",
            "llama-2-7b",
            32,
            32,
            32,
            128,
            4096,
            32000,
            6.74e9,
            6.61e9,
            "fp16",
            max_position_embeddings=4096,
            note="no GQA: one KV head per query head",
            source="meta-llama/Llama-2-7b-hf config.json",
        ),
        ModelGeometry(
            "OPT-13B",
            "opt-13b",
            40,
            40,
            40,
            128,
            5120,
            50272,
            12.9e9,
            12.85e9,
            "fp16",
            max_position_embeddings=2048,
            note="the PagedAttention paper's example: 800 KB per token",
            source="facebook/opt-13b config.json; Kwon et al. 2023 section 3 (800 KB of KV per token)",
        ),
        ModelGeometry(
            "SmolLM2-135M",
            "smollm2-135m",
            30,
            9,
            3,
            64,
            576,
            49152,
            0.135e9,
            0.1065e9,
            "bf16",
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            note="the model our engine runs: 9 query / 3 KV heads",
            source="HuggingFaceTB/SmolLM2-135M config.json (tie_word_embeddings true)",
        ),
        ModelGeometry(
            "DeepSeek-V3 (MLA)",
            "deepseek-v3",
            61,
            128,
            1,
            64,
            7168,
            129280,
            671e9,
            37e9,
            "bf16",
            latent_dim=512,
            rope_dim=64,
            max_position_embeddings=163840,
            note="MLA: a 512-dim latent + 64-dim RoPE key per layer, shared by all 128 heads",
            source="deepseek-ai/DeepSeek-V3 config.json (kv_lora_rank 512, qk_rope_head_dim 64, max_position_embeddings 163840); "
            "671B total, 37B activated per token (MoE)",
        ),
    )
}

# Models that need more than one GPU, for lesson 8's "past one GPU" tables. Kept out of MODEL_TABLE
# so that lessons 1-7 (which list every MODEL_TABLE row in checked outputs) read as they were stored.
MORE_MODELS: dict[str, ModelGeometry] = {
    m.name: m
    for m in (
        ModelGeometry(
            # 80 x (q 8192^2 + k, v 8192 x 1024 + o 8192^2 + MLP 3 x 8192 x 28672 + 2 norms) + 2 x 128256 x 8192
            # (untied embeddings) + the final norm = 70,553,706,496; matmul = that - the input embedding.
            "Llama-3-70B",
            "llama-3-70b",
            80,
            64,
            8,
            128,
            8192,
            128256,
            70.55e9,
            69.50e9,
            "bf16",
            max_position_embeddings=8192,
            note="GQA: 64 query heads share 8 KV heads; 141 GB of bf16 weights: more than one H200",
            source="meta-llama/Meta-Llama-3-70B config.json as copied in e.g. "
            "https://huggingface.co/kittn/Meta-Llama-3-70B-quant/blob/main/config.json (num_hidden_layers 80, "
            "num_attention_heads 64, num_key_value_heads 8, hidden_size 8192, intermediate_size 28672, "
            "vocab_size 128256, tie_word_embeddings false, max_position_embeddings 8192); "
            "parameters counted from it",
        ),
    )
}

_SMI = "nvidia-smi memory.total"
GPU_TABLE: dict[str, GPU] = {
    g.key: g
    for g in (
        GPU(
            "h200",
            "NVIDIA H200",
            "H200 (141 GB)",
            143_771 * MiB,
            989e12,
            4.8e12,
            4.24e12,
            55e9,
            f"{_SMI} 143,771 MiB (nvidia-smi tables in public issues, e.g. 8 x 'NVIDIA H200 0MiB / 143771MiB'); "
            "989 TFLOP/s dense bf16 and 4.8 TB/s: NVIDIA H200 datasheet (1,979 TFLOP/s is with sparsity); "
            "copy ceiling 4.24 TB/s measured on our H200 (shared/guides/gpu.md); PCIe Gen5 x16 assumed 55 GB/s",
        ),
        GPU(
            "h100",
            "NVIDIA H100 80GB HBM3",
            "H100 80GB",
            81_559 * MiB,
            989e12,
            3.35e12,
            3.0e12,
            55e9,
            f"{_SMI} 81,559 MiB (modal-labs/modal-client#2797; NVIDIA/nccl#1264); 989.4 TFLOP/s dense bf16, "
            "3.35 TB/s: NVIDIA H100 SXM datasheet; copy ceiling = datasheet derated to 90%",
        ),
        GPU(
            "a100-80gb",
            "NVIDIA A100-SXM4-80GB",
            "A100 80GB",
            81_920 * MiB,
            312e12,
            2.039e12,
            1.835e12,
            25e9,
            f"{_SMI} 81,920 MiB (modal-labs/modal-client#2797); 312 TFLOP/s dense bf16, 2,039 GB/s: "
            "NVIDIA A100 datasheet; copy ceiling = datasheet derated to 90%; PCIe Gen4 x16 assumed 25 GB/s",
        ),
        GPU(
            "a100-40gb",
            "NVIDIA A100-SXM4-40GB",
            "A100 40GB",
            40_960 * MiB,
            312e12,
            1.555e12,
            1.4e12,
            25e9,
            f"the PagedAttention paper's GPU: {_SMI} 40,960 MiB (modal-labs/modal-client#2797); "
            "312 TFLOP/s dense bf16, 1,555 GB/s: NVIDIA A100 datasheet; copy ceiling = datasheet derated to 90%",
        ),
        GPU(
            "t4",
            "Tesla T4",
            "T4 (16 GB)",
            15_360 * MiB,
            65e12,
            320e9,
            288e9,
            12e9,
            f"Colab's free GPU: {_SMI} 15,360 MiB (modal-labs/modal-client#2797); 65 TFLOP/s fp16 "
            "(no bf16 tensor cores), 320 GB/s: NVIDIA T4 datasheet; copy ceiling = datasheet derated to 90%; "
            "PCIe Gen3 x16 assumed 12 GB/s",
        ),
    )
}

"""The one model table and the one GPU table, and the one type for a model's shape.

:class:`ModelGeometry` is a decoder's shape; everything that needs one reads it here, through a view
of the same record: the memory model's bytes per token (:attr:`ModelGeometry.kv_bytes_per_token`,
lesson 1's ``M_KV(1)``; :meth:`~ModelGeometry.per_gpu` under tensor / pipeline parallelism), the cost
model's FLOPs and bytes per token (:mod:`paged_edu.sim.costmodel`), the weight budget, the lesson
widgets, and the engine's model (:meth:`paged_edu.models.config.LlamaConfig.geometry`).
:data:`MODELS` and :data:`GPUS` are keyed by the command line's ``--model`` / ``--gpu`` value;
:func:`find_model` finds a model by that key or by its name. Each figure carries its source next to it.

For a decoder with ``N_layers`` layers, ``N_kv`` key/value heads of size ``d_head``, every token
stores one key and one value vector per layer and KV head:

    M_KV(1) = 2 * N_layers * N_kv * d_head * sizeof(KV dtype)   bytes.

On one GPU of a deployment split ``tp`` ways by tensor parallelism and ``pp`` ways by pipeline
parallelism (:meth:`ModelGeometry.per_gpu`), a GPU holds the KV heads of its tensor-parallel rank --
``max(1, N_kv // tp)``, a head *replicated* on ``tp / N_kv`` ranks when ``tp > N_kv`` -- for the
layers of its pipeline stage, at most ``ceil(N_layers / pp)``; an MLA latent is one "head" every
rank keeps whole. The KV-cache dtype (``--kv-cache-dtype fp8``: 1 byte) scales it all.

GPU memory is in bytes *as the device reports it*: ``nvidia-smi``'s ``memory.total`` in MiB, times
2**20. Datasheets round ("141 GB", "80 GB"); the device reports a little more or less, and
``torch.cuda.get_device_properties(0).total_memory`` (CUDA's ``totalGlobalMem``) a few hundred MiB
less again, the driver's own reservation (an A100 40GB: 40,960 MiB in ``nvidia-smi``,
42,298,834,944 bytes = 40,339 MiB in ``deviceQuery``, NVIDIA/nvidia-docker#1648 and
bottlerocket-os/bottlerocket#3873).

Plain Python, no torch.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, replace

from paged_edu.core.validation import FieldValueError, choice, integer

__all__ = [
    "DTYPE_BYTES",
    "GPUS",
    "MODELS",
    "MiB",
    "GPU",
    "ModelGeometry",
    "find_model",
    "gpu_of_device",
    "kv_heads_per_rank",
    "measured_gpu",
]

MiB = 1 << 20
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}  # bytes of one value


@dataclass(frozen=True, slots=True)
class ModelGeometry:
    """A decoder's shape: what the KV cache, the cost model and the weight budget need.

    The first five fields fix the cache; a geometry of only those (``ModelGeometry("toy", 2, 2, 8)``)
    is enough for the memory model. The rest are keywords: ``num_params`` counts every weight (what
    the weights take in memory), ``matmul_params`` the weights one token multiplies through outside
    the input embedding (the cost model's ``P``); both are 0 when unknown. A standard (MHA/GQA)
    model caches K and V, ``2 * num_layers * num_kv_heads * head_dim`` values per token; an MLA
    model (DeepSeek-V2/V3) caches one ``latent_dim`` latent plus a ``rope_dim`` RoPE key per layer,
    shared by all heads: ``num_layers * (latent_dim + rope_dim)``.
    """

    name: str  # e.g. "Llama-3-8B"
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bf16"  # the weights' dtype, and the cache's unless kv_cache_dtype says otherwise
    _: KW_ONLY
    key: str = ""  # the command line's --model value, e.g. "llama-3-8b"
    num_q_heads: int = 0
    d_model: int = 0
    vocab_size: int = 0
    num_params: float = 0.0
    matmul_params: float = 0.0
    kv_cache_dtype: str | None = None  # vLLM's --kv-cache-dtype; None: the weights' dtype ("auto")
    latent_dim: int = 0  # MLA only
    rope_dim: int = 0  # MLA only
    max_position_embeddings: int = 0  # the config's context length: vLLM's default --max-model-len
    # The LM head is the input embedding (config.json's tie_word_embeddings): its d_model x vocab
    # weights are then not in matmul_params (which leaves the input embedding out); untied, they are.
    tie_word_embeddings: bool = False
    note: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        for name, value in (("dtype", self.dtype), ("kv_cache_dtype", self.kv_dtype)):
            choice(name, value, tuple(sorted(DTYPE_BYTES)))
        for field_name in ("num_layers", "num_kv_heads", "head_dim"):
            integer(field_name, getattr(self, field_name), low=1)
        integer("latent_dim", self.latent_dim, low=0)
        integer("rope_dim", self.rope_dim, low=0)

    # -- the cache (the memory model's view) -------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.latent_dim > 0

    @property
    def kv_dtype(self) -> str:
        """The cache's dtype: ``kv_cache_dtype``, or the weights' when it is None."""
        return self.dtype if self.kv_cache_dtype is None else self.kv_cache_dtype

    @property
    def kv_values_per_token(self) -> int:
        if self.is_mla:
            return self.num_layers * (self.latent_dim + self.rope_dim)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """``M_KV(1)``: bytes one token occupies in the cache, all layers."""
        return self.kv_values_per_token * DTYPE_BYTES[self.kv_dtype]

    def block_bytes(self, block_size: int) -> int:
        """Bytes of one block of ``B`` tokens across all layers (K and V)."""
        return self.kv_bytes_per_token * integer("block_size", block_size, low=1)

    def per_gpu(
        self, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1, kv_cache_dtype: str | None = None
    ) -> ModelGeometry:
        """The cache one GPU holds per token when the model runs on ``tp x pp`` GPUs.

        * tensor parallelism splits the KV heads: ``kv_heads_per_rank(N_kv, tp)`` each (vLLM's
          ``ModelConfig.get_num_kv_heads``: ``max(1, N_kv // tp)``, replicated when ``tp > N_kv``);
          an MLA latent is not split -- every rank caches it whole (vLLM returns 1 KV head for MLA);
        * pipeline parallelism splits the layers: the busiest stage holds ``ceil(N_layers / pp)``,
          and it is the one whose memory runs out first;
        * ``kv_cache_dtype`` (``"fp8"``, ``"bf16"``, ...; None keeps the model's) sets the bytes per value.

        ``kv_bytes_per_token`` of the result is then per GPU (its other fields stay the whole
        model's). The block tables are the same on every GPU (one scheduler drives all ranks), so a
        GPU's pool of blocks is the deployment's.
        """
        tp = integer("tensor_parallel_size", tensor_parallel_size, low=1)
        pp = integer("pipeline_parallel_size", pipeline_parallel_size, low=1)
        if pp > self.num_layers:
            raise FieldValueError(
                "pipeline_parallel_size", f"pipeline_parallel_size={pp} exceeds the model's {self.num_layers} layers"
            )
        dtype = choice(
            "kv_cache_dtype", self.kv_dtype if kv_cache_dtype is None else kv_cache_dtype, tuple(sorted(DTYPE_BYTES))
        )
        heads = self.num_kv_heads if self.is_mla else kv_heads_per_rank(self.num_kv_heads, tp)[0]
        return replace(
            self,
            name=f"{self.name} per GPU at tp={tp}, pp={pp}, {dtype}",
            num_layers=-(-self.num_layers // pp),
            num_kv_heads=heads,
            kv_cache_dtype=dtype,
        )

    # -- the weights and the work per token (the cost model's view) --------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_bytes(self) -> float:
        """What every weight takes in memory: ``num_params * sizeof(dtype)``."""
        return self.num_params * self.dtype_bytes

    @property
    def matmul_weight_bytes(self) -> float:
        """``sizeof(dtype) * P``: the weights a step reads once, whatever its batch."""
        return self.matmul_params * self.dtype_bytes

    @property
    def lm_head_bytes(self) -> float:
        """Bytes of LM-head weights a sampling step reads that ``P`` does not count: the whole
        ``d_model x vocab`` matrix when it is tied to the input embedding (SmolLM2-135M: 56.6 MB), 0
        when untied (``P`` already counts the head)."""
        return self.d_model * self.vocab_size * self.dtype_bytes if self.tie_word_embeddings else 0.0

    @property
    def matmul_flops_per_token(self) -> float:
        """``2 P``: a multiply and an add per weight, for each new token."""
        return 2.0 * self.matmul_params

    @property
    def lm_head_flops_per_token(self) -> float:
        """``2 d_model vocab``: the LM head, for each token that is sampled."""
        return 2.0 * self.d_model * self.vocab_size

    @property
    def attention_flops_per_pair(self) -> float:
        """``4 layers q_heads head_dim``: ``QK^T`` and ``PV`` for one query-key pair, every layer and head."""
        return 4.0 * self.num_layers * self.num_q_heads * self.head_dim


def kv_heads_per_rank(num_kv_heads: int, tensor_parallel_size: int) -> tuple[int, int]:
    """``(KV heads on each rank, ranks holding each head)`` under ``tp``-way tensor parallelism.

    ``tp <= N_kv``: the heads are split, ``N_kv / tp`` per rank, each held once; ``tp > N_kv``: one
    head per rank, each replicated on ``tp / N_kv`` ranks. Either way one must divide the other,
    as vLLM's ``QKVParallelLinear`` requires (``divide(tp, N_kv)`` / ``divide(N_kv, tp)``).
    """
    tp = integer("tensor_parallel_size", tensor_parallel_size, low=1)
    n = integer("num_kv_heads", num_kv_heads, low=1)
    if tp <= n:
        if n % tp:
            raise FieldValueError(
                "tensor_parallel_size", f"num_kv_heads={n} is not divisible by tensor_parallel_size={tp}"
            )
        return n // tp, 1
    if tp % n:
        raise FieldValueError(
            "tensor_parallel_size",
            f"tensor_parallel_size={tp} is not a multiple of num_kv_heads={n}: the heads cannot be replicated evenly",
        )
    return 1, tp // n


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


# Every model of the package, keyed by --model. Llama-3-70B needs more than one GPU (lesson 8's
# "past one GPU" tables); the cost model leaves MLA models out (it counts K and V per KV head).
MODELS: dict[str, ModelGeometry] = {
    g.key: g
    for g in (
        ModelGeometry(
            "Seed 70B example",
            num_layers=80,
            num_kv_heads=8,
            head_dim=128,
            dtype="fp16",
            key="llama-2-70b",
            num_q_heads=64,
            d_model=8192,
            vocab_size=32000,
            num_params=70.6e9,
            matmul_params=68.7e9,
            max_position_embeddings=4096,
            note="the seed's worked example (Llama-2/3-70B geometry)",
            source="meta-llama/Llama-2-70b-hf config.json; matmul params = total - the 32000 x 8192 input embedding",
        ),
        ModelGeometry(
            "Llama-3-8B",
            num_layers=32,
            num_kv_heads=8,
            head_dim=128,
            dtype="bf16",
            key="llama-3-8b",
            num_q_heads=32,
            d_model=4096,
            vocab_size=128256,
            num_params=8.03e9,
            matmul_params=7.50e9,
            max_position_embeddings=8192,
            note="GQA: 32 query heads share 8 KV heads",
            source="meta-llama/Meta-Llama-3-8B config.json",
        ),
        ModelGeometry(
            "Llama-2-7B",
            num_layers=32,
            num_kv_heads=32,
            head_dim=128,
            dtype="fp16",
            key="llama-2-7b",
            num_q_heads=32,
            d_model=4096,
            vocab_size=32000,
            num_params=6.74e9,
            matmul_params=6.61e9,
            max_position_embeddings=4096,
            note="no GQA: one KV head per query head",
            source="meta-llama/Llama-2-7b-hf config.json",
        ),
        ModelGeometry(
            "OPT-13B",
            num_layers=40,
            num_kv_heads=40,
            head_dim=128,
            dtype="fp16",
            key="opt-13b",
            num_q_heads=40,
            d_model=5120,
            vocab_size=50272,
            num_params=12.9e9,
            matmul_params=12.85e9,
            max_position_embeddings=2048,
            note="the PagedAttention paper's example: 800 KB per token",
            source="facebook/opt-13b config.json; Kwon et al. 2023 section 3 (800 KB of KV per token)",
        ),
        ModelGeometry(
            "SmolLM2-135M",
            num_layers=30,
            num_kv_heads=3,
            head_dim=64,
            dtype="bf16",
            key="smollm2-135m",
            num_q_heads=9,
            d_model=576,
            vocab_size=49152,
            num_params=0.135e9,
            matmul_params=0.1065e9,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            note="the model our engine runs: 9 query / 3 KV heads",
            source="HuggingFaceTB/SmolLM2-135M config.json (tie_word_embeddings true)",
        ),
        ModelGeometry(
            "DeepSeek-V3 (MLA)",
            num_layers=61,
            num_kv_heads=1,
            head_dim=64,
            dtype="bf16",
            key="deepseek-v3",
            num_q_heads=128,
            d_model=7168,
            vocab_size=129280,
            num_params=671e9,
            matmul_params=37e9,
            latent_dim=512,
            rope_dim=64,
            max_position_embeddings=163840,
            note="MLA: a 512-dim latent + 64-dim RoPE key per layer, shared by all 128 heads",
            source="deepseek-ai/DeepSeek-V3 config.json (kv_lora_rank 512, qk_rope_head_dim 64, max_position_embeddings "
            "163840); 671B total, 37B activated per token (MoE)",
        ),
        ModelGeometry(
            # 80 x (q 8192^2 + k, v 8192 x 1024 + o 8192^2 + MLP 3 x 8192 x 28672 + 2 norms) + 2 x 128256 x 8192
            # (untied embeddings) + the final norm = 70,553,706,496; matmul = that - the input embedding.
            "Llama-3-70B",
            num_layers=80,
            num_kv_heads=8,
            head_dim=128,
            dtype="bf16",
            key="llama-3-70b",
            num_q_heads=64,
            d_model=8192,
            vocab_size=128256,
            num_params=70.55e9,
            matmul_params=69.50e9,
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
GPUS: dict[str, GPU] = {
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


def find_model(model: str) -> ModelGeometry:
    """A model of :data:`MODELS` by key (``"llama-3-70b"``) or name (``"Llama-3-70B"``)."""
    for g in MODELS.values():
        if model in (g.key, g.name):
            return g
    raise FieldValueError("model", f"unknown model {model!r}; choose one of {sorted(MODELS)}")


def gpu_of_device(device_name: str) -> GPU | None:
    """The row of :data:`GPUS` for a device as CUDA names it (``torch.cuda.get_device_name()``, the
    name ``nvidia-smi`` prints), or None for a card the table does not hold.

    Only the exact name counts: ``"NVIDIA H100 80GB HBM3"`` is the SXM card of the ``h100`` row,
    while ``"NVIDIA H100 PCIe"`` (2.0 TB/s, not 3.35) is another card, and pricing it on the SXM's
    datasheet would flatter nothing and mislead everyone (:func:`measured_gpu` is its row).
    """
    return next((g for g in GPUS.values() if g.name == device_name), None)


def measured_gpu(device_name: str, memory_bytes: int, copy_bandwidth: float, matmul_flops: float) -> GPU:
    """A row for a card :data:`GPUS` does not hold, from what was measured on it: its memory as the
    device reports it, its copy ceiling (bytes/s of an eager device copy, read + write counted) as
    the roofline's bandwidth, and the FLOP/s of a large bf16 matmul as its peak (a lower bound of
    the datasheet's). Its ``key`` is ``"measured"``; its ``source`` says so."""
    return GPU(
        "measured",
        device_name,
        f"{device_name} (measured)",
        int(memory_bytes),
        float(matmul_flops),
        float(copy_bandwidth),
        float(copy_bandwidth),
        25e9,
        f"not in the GPU table: copy ceiling {copy_bandwidth / 1e12:.2f} TB/s and bf16 matmul "
        f"{matmul_flops / 1e12:.0f} TFLOP/s measured on this card; PCIe assumed 25 GB/s",
    )

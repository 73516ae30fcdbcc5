"""An engine's settings: one frozen record, every field checked once, when it is made.

An :class:`~paged_edu.engine.engine.Engine` is a model, a memory manager and one
:class:`EngineConfig`. The speed knobs -- which kernels run and whether CUDA graphs replay them --
are one nested record, :class:`KernelConfig` (the field ``EngineConfig.kernels``), handed whole to
the model runner, which turns it into the model's :class:`~paged_edu.models.llama.Kernels`::

    config = EngineConfig(num_blocks=1024, block_size=16, kernels=KernelConfig(cuda_graphs=False))
    engine = Engine(model, config)
    engine = Engine(model, num_blocks=1024, block_size=16, cuda_graphs=False)  # the same, by name
    engine.config  # the config in force: every "decided by the engine" default made concrete

Keyword settings given to ``Engine(...)`` are fields of either record (:func:`make_config` routes a
``KernelConfig`` field to ``kernels``); a name of neither is refused, naming it. A value is checked
where the record is made (a ``FieldTypeError`` or ``FieldValueError`` whose ``.field`` names it);
what depends on the model or the device -- the model's positions, whether a Triton kernel runs
here -- is checked when the engine is built (:meth:`EngineConfig.in_force`).

mini-sglang keeps its engine's settings the same way (a frozen ``EngineConfig``,
``python/minisgl/engine/config.py``); vLLM nests one dataclass per concern in ``VllmConfig``
(``vllm/config/__init__.py``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields, replace

import torch

from paged_edu.core import validation as check
from paged_edu.core.validation import FieldTypeError, FieldValueError
from paged_edu.sched.scheduler import PREEMPTION_MODES

__all__ = ["EngineConfig", "KernelConfig", "make_config", "setting_names"]

DECODE_IMPLS = ("auto", "triton", "torch", "loop")
PREFILL_IMPLS = ("auto", "triton", "torch")
OP_IMPLS = ("auto", "triton", "torch")


@dataclass(frozen=True, slots=True)
class KernelConfig:
    """Which kernels a forward pass runs, and how they are launched: speed only, never the numbers
    a step computes (every choice gives the same tokens; the tests check it).

    ``attn_impl`` -- the decode rows' attention (:func:`~paged_edu.kernels.paged_attention_decode`):
    ``"auto"``, ``"triton"``, ``"torch"`` or ``"loop"``; ``prefill_impl`` -- the prompt chunks'
    (:func:`~paged_edu.kernels.paged_attention_prefill`): ``"auto"``, ``"triton"`` or ``"torch"``.
    ``None`` (the default): ``"auto"`` on CUDA (Triton where :func:`~paged_edu.kernels.kernel_support`
    says it runs), ``"torch"`` on a CPU, where the Triton interpreter is exact but far too slow for a
    whole model.

    ``fused_impl`` -- the per-token ops (residual add + RMSNorm, rotary + K/V store, SiLU-and-mul):
    ``"triton"`` runs each as one fused kernel (:mod:`~paged_edu.kernels.triton_fused`,
    :mod:`~paged_edu.kernels.triton_store`) with the PyTorch path's rounding; ``"torch"``; ``"auto"``:
    Triton where it compiles.

    ``gemm_impl`` -- the projections and the LM head of steps of at most 64 rows: ``"torch"``
    (cuBLAS), ``"triton"`` (:mod:`~paged_edu.kernels.triton_gemm`'s skinny GEMM) or ``"auto"``: the
    skinny GEMM where ``pdl`` is on, else cuBLAS -- alone the two tie on the H200, but only Triton's
    kernels take part in a programmatic launch chain.

    ``fuse_decode_store`` -- a pure-decode step's rotary embedding and K/V store inside the Triton
    decode kernel (:func:`~paged_edu.kernels.triton_decode.rotary_store_decode_triton`: one launch
    fewer per layer; with the fused ops and the Triton decode kernel). False: the separate rotary +
    store kernel, as in a step with prompts.

    ``swiglu_gemm`` -- the MLP's gate_up projection and SiLU-and-mul as one skinny GEMM at <= 64 rows
    (:func:`~paged_edu.kernels.triton_gemm.skinny_matmul` with ``swiglu=True``; with the fused ops,
    whatever ``gemm_impl`` says). On the H200 its tuned tiling beats cuBLAS + the SiLU kernel. False:
    the two.

    ``pdl`` -- a step of <= 64 rows (a decode batch, or prompt chunks) launches its Triton kernels as
    programmatic dependents, each launched while the previous one ends (:mod:`~paged_edu.kernels.pdl`;
    864 -> 711 us a decode step at batch 1 on the H200, a 16-token prompt step 1,029 -> 804 us on the
    H100). Only where the whole decode chain is Triton on a GPU that has it (Hopper and later);
    :meth:`~paged_edu.models.llama.Kernels.resolve` turns it off elsewhere.

    ``cuda_graphs`` -- replay captured CUDA graphs for pure-decode steps
    (:class:`~paged_edu.engine.cuda_graphs.DecodeCudaGraphs`; ``None``, the default: on for CUDA).
    ``mixed_graphs`` -- replay captured graphs for steps with prompt chunks too, one per token bucket
    up to ``max_num_batched_tokens`` (:class:`~paged_edu.engine.cuda_graphs.MixedCudaGraphs`; needs
    CUDA; off by default: capturing them takes a few seconds when the engine is built).
    """

    attn_impl: str | None = None
    prefill_impl: str | None = None
    fused_impl: str = "auto"
    gemm_impl: str = "auto"
    fuse_decode_store: bool = True
    swiglu_gemm: bool = True
    pdl: bool = True
    cuda_graphs: bool | None = None
    mixed_graphs: bool = False

    def __post_init__(self) -> None:
        if self.attn_impl is not None:
            check.choice("attn_impl", self.attn_impl, DECODE_IMPLS)
        if self.prefill_impl is not None:
            check.choice("prefill_impl", self.prefill_impl, PREFILL_IMPLS)
        check.choice("fused_impl", self.fused_impl, OP_IMPLS)
        check.choice("gemm_impl", self.gemm_impl, OP_IMPLS)
        for name in ("fuse_decode_store", "swiglu_gemm", "pdl", "mixed_graphs"):
            object.__setattr__(self, name, check.flag(name, getattr(self, name)))
        if self.cuda_graphs is not None:
            object.__setattr__(self, "cuda_graphs", check.flag("cuda_graphs", self.cuda_graphs))

    def for_device(self, device: torch.device) -> KernelConfig:
        """This choice on ``device``: ``None`` defaults decided; a Triton kernel that cannot run here,
        or a graph on a CPU, refused (naming the field)."""
        from paged_edu.kernels import kernel_support

        on_gpu = device.type == "cuda"
        attn = self.attn_impl or ("auto" if on_gpu else "torch")
        prefill = self.prefill_impl or ("auto" if on_gpu else "torch")
        for name, impl, kernel in (("attn_impl", attn, "decode"), ("prefill_impl", prefill, "prefill")):
            if impl == "triton" and not getattr(kernel_support(device), kernel):
                raise FieldValueError(
                    name,
                    f"{name}='triton', but the Triton {kernel} kernel cannot run on {device} here "
                    "(see paged_edu.kernels.kernel_support); use 'auto' or 'torch'",
                )
        cuda_graphs = on_gpu if self.cuda_graphs is None else self.cuda_graphs
        for name, wanted in (("cuda_graphs", cuda_graphs), ("mixed_graphs", self.mixed_graphs)):
            if wanted and not on_gpu:
                raise FieldValueError(name, f"{name}=True needs the model on a CUDA device")
        return replace(self, attn_impl=attn, prefill_impl=prefill, cuda_graphs=cuda_graphs)

    def model_kernels(self):
        """The model's :class:`~paged_edu.models.llama.Kernels` for this choice (not yet resolved for a device)."""
        from paged_edu.models.llama import Kernels

        return Kernels(
            decode=self.attn_impl or "auto",
            prefill=self.prefill_impl or "auto",
            fused=self.fused_impl,
            gemm=self.gemm_impl,
            fuse_decode_store=self.fuse_decode_store,
            swiglu_gemm=self.swiglu_gemm,
            pdl=self.pdl,
        )


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Every setting of an :class:`~paged_edu.engine.engine.Engine` except its model and its memory
    manager, each documented here and checked here, once.

    The pool: ``num_blocks`` x ``block_size`` token slots per layer on the model's device (no default:
    lesson 2 sizes it); ``enable_prefix_caching`` -- reuse full blocks of identical prompt prefixes;
    ``num_cpu_blocks`` -- the swap space in CPU memory (``None``: as many as the GPU pool in ``"swap"``
    or ``"auto"`` mode, else 0).

    The scheduler (:class:`~paged_edu.sched.scheduler.Scheduler`): ``max_num_seqs`` -- sequences in a
    step; ``max_num_batched_tokens`` -- new tokens in a step; ``enable_chunked_prefill`` -- split a
    prompt over steps; ``preemption_mode`` -- ``"recompute"`` (free and requeue), ``"swap"`` (copy to
    CPU blocks and back), or ``"auto"``: vLLM's rule -- recompute a lone sequence, swap parallel
    samples that share blocks; ``max_model_len`` -- the longest sequence (prompt + output) accepted:
    at most the model's positions (more is refused when the engine is built); ``None``: those
    positions, capped by what the pool holds.

    ``seed`` -- where the random streams of requests without a seed of their own start.

    ``async_scheduling`` -- schedule and prepare step N+1 while the device runs step N, the sampled ids
    fed to it on the device (vLLM's option of that name; :mod:`~paged_edu.engine.overlap` says how,
    and which steps stay synchronous). A call of ``step()`` then returns the requests that finished in
    the step launched by the call before. Off by default: on the H200 it serves nano-vllm's benchmark
    1.24x faster (``benchmarks/records/h200/engine_bench_nanovllm.json``), but the lessons step the engine one
    call at a time and read its state after each, which running ahead changes.

    ``kernels`` -- the kernels and their launches (:class:`KernelConfig`).

    Measuring: ``sync_timing`` -- synchronise the device at every phase boundary so that
    ``StepMetrics.phase_times`` books GPU time to the phase that launched it (slower; for measuring,
    not serving); ``record_timeline`` -- keep a :class:`~paged_edu.engine.timeline.StepRecord` of host
    and device intervals per launched step (``Engine.timeline``).
    """

    num_blocks: int
    block_size: int = 16
    enable_prefix_caching: bool = True
    num_cpu_blocks: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"
    max_model_len: int | None = None
    seed: int = 0
    async_scheduling: bool = False
    kernels: KernelConfig = KernelConfig()
    sync_timing: bool = False
    record_timeline: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: the checked, plain-Python values go in once
        for name, high in (("num_blocks", check.MAX_NUM_BLOCKS), ("block_size", None)):
            set_(self, name, check.integer(name, getattr(self, name), low=1, high=high))
        if self.num_cpu_blocks is not None:
            n = check.integer("num_cpu_blocks", self.num_cpu_blocks, low=0, high=check.MAX_NUM_BLOCKS)
            set_(self, "num_cpu_blocks", n)
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            set_(self, name, check.integer(name, getattr(self, name), low=1))
        check.choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        if self.preemption_mode == "swap" and self.num_cpu_blocks == 0:
            raise FieldValueError("num_cpu_blocks", "preemption_mode='swap' needs num_cpu_blocks > 0 to swap into")
        if self.max_model_len is not None:
            set_(self, "max_model_len", check.integer("max_model_len", self.max_model_len, low=1))
        set_(self, "seed", check.seed("seed", self.seed))
        for name in (
            "enable_prefix_caching",
            "enable_chunked_prefill",
            "async_scheduling",
            "sync_timing",
            "record_timeline",
        ):
            set_(self, name, check.flag(name, getattr(self, name)))
        if not isinstance(self.kernels, KernelConfig):
            raise FieldTypeError(
                "kernels", f"kernels must be a KernelConfig, got {type(self.kernels).__name__} {self.kernels!r}"
            )

    def replace(self, **changes) -> EngineConfig:
        """A copy with ``changes``: fields of this record, or of :class:`KernelConfig` (routed to
        ``kernels``); an unknown name is refused, naming it."""
        return make_config(self, changes)

    def in_force(self, num_positions: int, device: torch.device) -> EngineConfig:
        """This config for a model of ``num_positions`` positions on ``device``, every ``None`` default
        decided: ``num_cpu_blocks``, ``max_model_len`` (refused above the positions) and the kernels'
        (:meth:`KernelConfig.for_device`)."""
        from paged_edu.engine.requests import check_max_model_len

        num_cpu_blocks = self.num_cpu_blocks
        if num_cpu_blocks is None:
            num_cpu_blocks = self.num_blocks if self.preemption_mode in ("swap", "auto") else 0
        return replace(
            self,
            num_cpu_blocks=num_cpu_blocks,
            max_model_len=check_max_model_len(self.max_model_len, num_positions, self.num_blocks, self.block_size),
            kernels=self.kernels.for_device(device),
        )


_ENGINE_FIELDS = tuple(f.name for f in fields(EngineConfig))
_KERNEL_FIELDS = tuple(f.name for f in fields(KernelConfig))


def setting_names() -> tuple[str, ...]:
    """Every name ``Engine(model, **settings)`` takes: the fields of both records."""
    return _ENGINE_FIELDS + _KERNEL_FIELDS


def make_config(config: EngineConfig | None, settings: dict) -> EngineConfig:
    """``config`` (or a new one) with ``settings`` by name -- :class:`EngineConfig` fields, and
    :class:`KernelConfig` fields routed to ``kernels``. A value that is not an ``EngineConfig``, a
    name of neither record, or no ``num_blocks`` anywhere is refused, naming it."""
    if config is not None and not isinstance(config, EngineConfig):
        raise FieldTypeError(
            "config",
            f"config must be an EngineConfig or None, got {type(config).__name__} {config!r}; "
            "pass settings by name, e.g. Engine(model, num_blocks=64, block_size=16)",
        )
    engine, kernels = {}, {}
    for name, value in settings.items():
        if name in _ENGINE_FIELDS:
            engine[name] = value
        elif name in _KERNEL_FIELDS:
            kernels[name] = value
        else:
            near = difflib.get_close_matches(name, setting_names(), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise FieldTypeError(
                name,
                f"unknown engine setting {name!r}{hint}: the settings are the fields of EngineConfig and KernelConfig",
            )
    base = engine.pop("kernels", KernelConfig() if config is None else config.kernels)
    if kernels:
        if not isinstance(base, KernelConfig):
            raise FieldTypeError("kernels", f"kernels must be a KernelConfig, got {type(base).__name__} {base!r}")
        base = replace(base, **kernels)
    if config is not None:
        return replace(config, **engine, kernels=base)
    if "num_blocks" not in engine:
        raise FieldTypeError(
            "num_blocks", "an engine needs num_blocks, the size of its pool: Engine(model, num_blocks=...)"
        )
    return EngineConfig(**engine, kernels=base)

"""Lesson 8: a ``vllm serve`` command line read the way vLLM reads it, then said in paged_edu's terms.

:func:`parse_vllm_serve` reads eight flags with vLLM's own defaults and accepted values; a bad value
or a flag it does not know raises ``ValueError`` naming the flag. :func:`translate` turns them, on a
model and a GPU of :mod:`paged_edu.core.hardware`, into the pool they leave -- with the sizing the
simulator already uses (:meth:`paged_edu.sim.costmodel.CostModel.kv_budget_bytes`, vLLM's rule
``utilization * total - weights``, every weight of the model table counted) and the memory model's
bytes per token (:attr:`paged_edu.core.hardware.ModelGeometry.kv_bytes_per_token`) -- and :func:`simulate_flags` serves a workload with those
settings in the simulator (prefix caching on: the ``paged-prefix`` manager; off: ``paged``).

The pool, blocks of ``B`` tokens, and what it allows::

    num_blocks      = floor((u * M_GPU - N_params * sizeof(dtype)) / (B * M_KV))
    kv_tokens       = num_blocks * B
    max_concurrency = num_blocks / ceil(max_model_len / B)        # requests at full length at once

Where the defaults and the checks come from -- vLLM v0.11 (the search tool's stored snapshots of
``vllm-project/vllm`` main, late 2025; the version is inferred from their deprecation notes, "will
be removed in v0.12"):

* ``vllm/config/cache.py`` (``CacheConfig``, commit c1d8642): ``block_size`` one of
  ``BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]`` ("On CUDA devices, only block sizes up to 32
  are supported"), 16 when not given (``DEFAULT_BLOCK_SIZE = 16`` in the later snapshot 002f10e);
  ``gpu_memory_utilization`` 0.9, ``Field(gt=0, le=1)``; ``swap_space`` 4 GiB per GPU, ``ge=0``;
  ``cache_dtype`` "auto" (the model's dtype), one of ``CacheDType``; ``enable_prefix_caching``
  None, "Enabled by default for V1".
* ``vllm/engine/arg_utils.py`` (``EngineArgs``, commit 99d7eb5): a bool field becomes
  ``--flag`` / ``--no-flag`` (``argparse.BooleanOptionalAction``); ``max_model_len`` and
  ``max_num_batched_tokens`` parse ``human_readable_int`` ("1k" = 1,000, "1K" = 1,024);
  ``_set_default_args``: prefix caching on for generative non-hybrid models, and for the OpenAI
  server (``vllm serve``) ``max_num_batched_tokens`` 8,192 and ``max_num_seqs`` 1,024 on a GPU
  with >= 70 GiB that is not an A100 (H100, H200), else 2,048 and 256;
  ``max_num_seqs = min(that, max_num_batched_tokens)``.
* ``vllm/config/scheduler.py`` (``SchedulerConfig.verify_max_model_len``):
  ``max_num_batched_tokens`` must be >= ``max_num_seqs``.
* ``vllm/v1/worker/gpu_worker.py`` (``Worker.determine_available_memory``): the KV cache gets
  ``total * gpu_memory_utilization - peak`` (weights, the dummy forward's activations, non-torch
  memory); we subtract the weights only, so our pool is an upper bound.
* ``vllm/v1/core/kv_cache_utils.py``: ``get_max_concurrency_for_kv_cache_config`` =
  ``num_blocks / cdiv(max_model_len, block_size)`` for full attention, and the start-up error "To
  serve at least one request with the models's max seq len ..." when not even that fits.
* ``--max-model-len`` defaults to the model's ``max_position_embeddings``; a larger value is refused
  ("User-specified max_model_len ... is greater than the derived max_model_len", ``ModelConfig``).
* Newer than these: the later snapshot of ``vllm/config/cache.py`` (002f10e) raises the default
  ``gpu_memory_utilization`` to 0.92, adds ``float16`` and several 4-/8-bit formats to
  ``CacheDType``, and has no ``swap_space`` field; the translator keeps to v0.11.
* Swap: the V1 engine preempts by recomputation ("Preempted requests are recomputed",
  https://docs.vllm.ai/en/v0.10.1.1/configuration/optimization.html), so the simulated run
  recomputes; the CPU blocks ``--swap-space`` would give are reported (our engine's swap mode).
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from dataclasses import dataclass, replace

from paged_edu.core.hardware import GPUS, MODELS, ModelGeometry, find_model

__all__ = [
    "FLAGS",
    "VLLM_SOURCE",
    "ServeFlags",
    "Translation",
    "allocate_pool",
    "model_for",
    "parse_vllm_serve",
    "simulate_flags",
    "translate",
]

VLLM_SOURCE = "vLLM v0.11 (vllm-project/vllm main, late 2025: vllm/config/cache.py, vllm/engine/arg_utils.py)"
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # vllm/config/cache.py BlockSize
CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")  # CacheDType
GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class ServeFlags:
    """What the command line says; ``None`` means "not given: vLLM picks it" (see :meth:`resolved`)."""

    model: str
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    swap_space: float = 4.0  # GiB of CPU memory per GPU
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"

    def resolved(self, gpu_key: str, geometry: ModelGeometry) -> "ServeFlags":
        """The flags vLLM would run with on ``gpu_key`` for ``geometry``: every ``None`` filled in."""
        gpu = GPUS[gpu_key]
        big = gpu.memory_bytes >= 70 * GiB and "a100" not in gpu.name.lower()
        tokens = self.max_num_batched_tokens or (8192 if big else 2048)
        seqs = self.max_num_seqs or min(1024 if big else 256, tokens)
        length = self.max_model_len or geometry.max_position_embeddings
        if not length:
            raise ValueError(f"--max-model-len: the model table has no context length for {geometry.name}; give one")
        if self.max_model_len and geometry.max_position_embeddings and length > geometry.max_position_embeddings:
            raise ValueError(
                f"--max-model-len: User-specified max_model_len ({length}) is greater than the derived "
                f"max_model_len (max_position_embeddings={geometry.max_position_embeddings} in "
                f"{geometry.name}'s config.json)"
            )
        if tokens < seqs:
            raise ValueError(
                f"--max-num-batched-tokens: max_num_batched_tokens ({tokens}) must be greater than or "
                f"equal to max_num_seqs ({seqs})"
            )
        return replace(self, max_num_seqs=seqs, max_num_batched_tokens=tokens, max_model_len=length)


def _unit_float(flag: str, text: str) -> float:
    value = _float(flag, text)
    if not 0 < value <= 1:
        raise ValueError(f"{flag}: {text!r} is out of range; it takes a fraction in (0, 1] of the GPU's memory")
    return value


def _float(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{flag}: {text!r} is not a finite number")
    return value


def _swap(flag: str, text: str) -> float:
    value = _float(flag, text)
    if value < 0:
        raise ValueError(f"{flag}: {text!r} is negative; it takes GiB of CPU memory per GPU, >= 0")
    return value


def _human_int(flag: str, text: str) -> int:
    """vLLM's ``human_readable_int``: ``1k`` = 1,000, ``1K`` = 1,024 (no decimals with K/M/G), >= 1."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG])", text.strip())
    try:
        if match:
            number, suffix = match.groups()
            if suffix in "kmg":
                value = int(float(number) * 10 ** (3 * "kmg".index(suffix) + 3))
            else:
                value = int(number) * 2 ** (10 * "KMG".index(suffix) + 10)
        else:
            value = int(text)
    except ValueError:
        raise ValueError(
            f"{flag}: {text!r} is not an integer (1k = 1,000 and 1K = 1,024 are allowed, decimals only with k/m/g)"
        ) from None
    if value < 1:
        raise ValueError(f"{flag}: {text!r} must be >= 1")
    return value


def _positive_int(flag: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{flag}: {text!r} must be >= 1")
    return value


def _block_size(flag: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value not in BLOCK_SIZES:
        raise ValueError(f"{flag}: invalid choice {text!r} (choose from {', '.join(map(str, BLOCK_SIZES))})")
    return value


def _cache_dtype(flag: str, text: str) -> str:
    if text not in CACHE_DTYPES:
        raise ValueError(f"{flag}: invalid choice {text!r} (choose from {', '.join(CACHE_DTYPES)})")
    if text == "fp8_ds_mla":
        raise ValueError(
            f"{flag}: {text!r} is a choice vLLM accepts that paged_edu does not model; "
            "use auto, bfloat16 or an fp8 variant"
        )
    return text


# flag -> (ServeFlags field, parser of its value text or None for a bare switch, what it means)
FLAGS: dict[str, tuple[str, object, str]] = {
    "--gpu-memory-utilization": ("gpu_memory_utilization", _unit_float, "the share of the GPU vLLM may use"),
    "--block-size": ("block_size", _block_size, "B, tokens per KV block"),
    "--max-num-seqs": ("max_num_seqs", _positive_int, "sequences per step at most (running requests)"),
    "--max-num-batched-tokens": ("max_num_batched_tokens", _human_int, "tokens per step at most (prefill chunks)"),
    "--enable-prefix-caching": ("enable_prefix_caching", None, "reuse computed blocks by their hash"),
    "--no-enable-prefix-caching": ("enable_prefix_caching", None, "no prefix cache"),
    "--swap-space": ("swap_space", _swap, "GiB of CPU memory per GPU for swapped blocks"),
    "--max-model-len": ("max_model_len", _human_int, "prompt + output tokens of one request at most"),
    "--kv-cache-dtype": ("kv_cache_dtype", _cache_dtype, "the dtype of cached K and V"),
}


def parse_vllm_serve(command: str) -> ServeFlags:
    """Read ``vllm serve MODEL [--flag value | --flag=value ...]`` (split as a shell would, ``shlex``).

    Only the flags of :data:`FLAGS` are read; anything else -- an unknown flag, a missing or extra
    value, a value vLLM would refuse -- raises ``ValueError`` naming the flag.
    """
    if not isinstance(command, str):
        raise TypeError(f"command must be a string, got {type(command).__name__}")
    try:
        words = shlex.split(command.replace("\\\n", " "))
    except ValueError as exc:  # an unclosed quote
        raise ValueError(f"the command line does not split into words: {exc}") from None
    if words[:2] != ["vllm", "serve"]:
        raise ValueError(f"the command must start with 'vllm serve MODEL', got {' '.join(words[:2]) or 'nothing'!r}")
    if len(words) < 3 or words[2].startswith("-"):
        raise ValueError("vllm serve needs the model first: 'vllm serve MODEL --flag value ...'")
    values: dict[str, object] = {"model": words[2]}
    i = 3
    while i < len(words):
        word = words[i]
        flag, eq, inline = word.partition("=")
        if flag not in FLAGS:
            if not word.startswith("--"):
                raise ValueError(
                    f"unexpected argument {word!r}: every flag starts with '--' (vllm serve takes one MODEL)"
                )
            near = difflib.get_close_matches(flag.replace("_", "-"), FLAGS, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            raise ValueError(f"unrecognized flag {flag}{hint} (this translator reads {', '.join(FLAGS)})")
        field, parse, _ = FLAGS[flag]
        if parse is None:
            if eq:
                raise ValueError(f"{flag} is a switch and takes no value (got {word!r})")
            values[field] = not flag.startswith("--no-")
            i += 1
            continue
        if eq:
            text, i = inline, i + 1
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            text, i = words[i + 1], i + 2
        else:
            raise ValueError(f"{flag} expects a value ({FLAGS[flag][2]})")
        values[field] = parse(flag, text)
    return ServeFlags(**values)


def model_for(name: str) -> ModelGeometry:
    """The row of the model table whose ``key`` the model name contains (``facebook/opt-13b`` -> OPT-13B)."""
    lowered = name.lower()
    for g in MODELS.values():
        if g.key in lowered or g.name.lower() in lowered:
            return g
    keys = ", ".join(g.key for g in MODELS.values())
    raise ValueError(f"model {name!r} is not in paged_edu's model table; pick one of: {keys}")


@dataclass(frozen=True, slots=True)
class Translation:
    """The flags on one model and GPU, in paged_edu's terms (bytes and counts)."""

    flags: ServeFlags  # resolved: every default filled in
    model: str
    gpu: str
    total_bytes: int  # the GPU's memory: the table's, or a measured figure
    kv_dtype: str  # the memory model's dtype name of the cache
    bytes_per_token: int  # M_KV
    block_bytes: int  # B * M_KV
    weight_bytes: float
    budget_bytes: float  # u * M_GPU - weight_bytes
    num_blocks: int
    num_cpu_blocks: int  # what --swap-space holds

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.flags.block_size

    @property
    def blocks_per_request(self) -> int:
        """``ceil(max_model_len / B)``: what one request at full length holds."""
        return -(-self.flags.max_model_len // self.flags.block_size)

    @property
    def max_concurrency(self) -> float:
        """vLLM's "Maximum concurrency for max_model_len tokens per request": ``num_blocks / ceil(L / B)``."""
        return self.num_blocks / self.blocks_per_request

    def rows(self) -> list[tuple[str, str, str]]:
        """(flag, value, what it does here) for the lesson's table."""
        f = self.flags
        gib = 2**30
        return [
            (
                "--gpu-memory-utilization",
                f"{f.gpu_memory_utilization:g}",
                f"KV budget = {f.gpu_memory_utilization:g} x {self.total_bytes / gib:.1f} GiB - "
                f"{self.weight_bytes / gib:.1f} GiB weights = {self.budget_bytes / gib:.2f} GiB",
            ),
            ("--kv-cache-dtype", f.kv_cache_dtype, f"{self.kv_dtype}: M_KV = {self.bytes_per_token:,} bytes per token"),
            (
                "--block-size",
                str(f.block_size),
                f"one block = {f.block_size} x {self.bytes_per_token:,} = {self.block_bytes:,} bytes; "
                f"{self.num_blocks:,} blocks ({self.kv_tokens:,} tokens of KV)",
            ),
            (
                "--max-model-len",
                f"{f.max_model_len:,}",
                f"{self.blocks_per_request:,} blocks per request at full length: "
                f"max concurrency {self.max_concurrency:.2f}x",
            ),
            ("--max-num-seqs", f"{f.max_num_seqs:,}", "running sequences per step at most (Scheduler.max_num_seqs)"),
            (
                "--max-num-batched-tokens",
                f"{f.max_num_batched_tokens:,}",
                "tokens per step at most; longer prompts are prefilled in chunks",
            ),
            (
                "--enable-prefix-caching" if f.enable_prefix_caching else "--no-enable-prefix-caching",
                "on" if f.enable_prefix_caching else "off",
                "simulated as paged-prefix (block hashes)" if f.enable_prefix_caching else "simulated as paged",
            ),
            ("--swap-space", f"{f.swap_space:g} GiB", f"{self.num_cpu_blocks:,} CPU blocks (V1 recomputes instead)"),
        ]

    def describe(self) -> str:
        width = max(len(r[0]) for r in self.rows())
        head = f"{self.flags.model} on {GPUS[self.gpu].label} ({self.model}):"
        return "\n".join([head] + [f"  {a:<{width}} {b:>9}  {c}" for a, b, c in self.rows()])


_KV_DTYPE = {"bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "fp8_inc": "fp8"}


def _cost_model(geometry: ModelGeometry, gpu_key: str, kv_dtype: str, total_bytes: int | None = None):
    from paged_edu.sim.costmodel import CostModel

    gpu = GPUS[gpu_key] if total_bytes is None else replace(GPUS[gpu_key], memory_bytes=int(total_bytes))
    return CostModel(model=replace(geometry, kv_cache_dtype=kv_dtype), gpu=gpu)


def translate(
    flags: ServeFlags | str, model: str | None = None, gpu: str = "h200", total_bytes: int | None = None
) -> Translation:
    """``flags`` (or a command line) on model ``model`` (a :data:`MODELS` name or key; default:
    the one the command names) and GPU ``gpu`` (a :data:`GPUS` key); ``total_bytes`` replaces
    the table's memory with a measured figure (``torch.cuda.mem_get_info()[1]``)."""
    from paged_edu.cache.sizing import num_blocks_for_budget

    if isinstance(flags, str):
        flags = parse_vllm_serve(flags)
    if gpu not in GPUS:
        raise ValueError(f"gpu={gpu!r} is not in the GPU table; choose one of {', '.join(GPUS)}")
    geometry = model_for(flags.model) if model is None else MODELS.get(model) or model_for(model)
    flags = flags.resolved(gpu, geometry)
    kv_dtype = _KV_DTYPE.get(flags.kv_cache_dtype, geometry.dtype)
    spec = replace(geometry, kv_cache_dtype=kv_dtype)
    weights = geometry.weight_bytes  # every weight, as it sits in memory
    try:
        cost = _cost_model(geometry, gpu, kv_dtype, total_bytes)
        budget = cost.kv_budget_bytes(flags.gpu_memory_utilization, weights)
    except ValueError as exc:
        raise ValueError(
            f"--gpu-memory-utilization={flags.gpu_memory_utilization:g}: {exc} "
            "(a model this size is split over several GPUs: tensor or pipeline parallelism)"
        ) from None
    block_bytes = spec.block_bytes(flags.block_size)
    blocks_per_request = -(-flags.max_model_len // flags.block_size)
    try:
        num_blocks = num_blocks_for_budget(
            int(budget), block_bytes, min_blocks=blocks_per_request, what=f"{geometry.name} on {GPUS[gpu].label}: "
        )
    except ValueError as exc:
        raise ValueError(
            f"--max-model-len / --gpu-memory-utilization: to serve at least one request of "
            f"max_model_len={flags.max_model_len} ({exc})"
        ) from None
    return Translation(
        flags,
        geometry.name,
        gpu,
        cost.gpu.memory_bytes,
        kv_dtype,
        spec.kv_bytes_per_token,
        block_bytes,
        weights,
        budget,
        num_blocks,
        int(flags.swap_space * GiB // block_bytes),
    )


def simulate_flags(
    translation: Translation,
    workload: str = "multiturn",
    num_requests: int = 200,
    rate: float = math.inf,
    seed: int = 0,
):
    """Serve ``workload`` (a :func:`paged_edu.sim.workloads.make_workload` name) with the translated
    settings; returns the :class:`~paged_edu.sim.results.SimResult`."""
    from paged_edu.sim.results import SimConfig
    from paged_edu.sim.simulator import simulate
    from paged_edu.sim.workloads import make_workload

    f = translation.flags
    geometry = find_model(translation.model)
    if geometry.is_mla:
        raise ValueError(f"{geometry.name} is an MLA model; the simulator's cost model counts K and V per KV head")
    requests = make_workload(workload, num_requests, rate, seed)
    longest = max(r.total_len for r in requests)
    if longest - 1 > f.max_model_len:
        raise ValueError(
            f"--max-model-len={f.max_model_len}: the {workload} workload has requests of {longest} "
            "tokens; vLLM would refuse them"
        )
    config = SimConfig(
        manager="paged-prefix" if f.enable_prefix_caching else "paged",
        block_size=f.block_size,
        num_kv_slots=translation.kv_tokens,
        max_seq_len=f.max_model_len,
        max_num_seqs=f.max_num_seqs,
        max_num_batched_tokens=f.max_num_batched_tokens,
    )
    return simulate(
        requests, config, _cost_model(geometry, translation.gpu, translation.kv_dtype, translation.total_bytes)
    )


def allocate_pool(translation: Translation, device):
    """The pool the flags leave, really allocated: a :class:`~paged_edu.cache.kv_cache.PagedKVCache` of
    ``translation.num_blocks`` blocks on ``device`` (a cache in the model's own dtype; fp8 is not
    allocated here). Meant for a GPU whose memory the translation was made with."""
    import torch

    from paged_edu.cache.kv_cache import PagedKVCache

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if translation.kv_dtype not in dtypes:
        raise ValueError(f"--kv-cache-dtype: allocate_pool builds {sorted(dtypes)} caches, not {translation.kv_dtype}")
    g = find_model(translation.model)
    return PagedKVCache(
        g.num_layers,
        translation.num_blocks,
        translation.flags.block_size,
        g.num_kv_heads,
        g.head_dim,
        dtype=dtypes[translation.kv_dtype],
        device=device,
    )

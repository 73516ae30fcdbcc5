"""Lesson 8, "past one GPU": the per-GPU KV table and how vLLM and SGLang spread over GPUs and nodes.

The numbers come from :mod:`paged_edu.core.parallel_kv` (per-GPU bytes from
:meth:`~paged_edu.core.hardware.ModelGeometry.per_gpu`); this module only lays them out, and keeps the cited
claims about the two systems' multi-GPU machinery (:data:`MULTI_GPU_CLAIMS`, looked up with the
``search`` tool; each :class:`~paged_edu.lessons.where_it_lives.Claim` carries its source).
"""

from __future__ import annotations

import html

from paged_edu.core.parallel_kv import parallel_kv_rows
from paged_edu.lessons.where_it_lives import Claim

__all__ = [
    "MULTI_GPU_CLAIMS",
    "kv_per_gpu_rows",
    "kv_per_gpu_table_html",
    "kv_per_gpu_table_markdown",
    "multi_gpu_markdown",
]

COLUMNS = (
    "model",
    "GPUs (tp x pp)",
    "KV dtype",
    "KV heads / GPU",
    "copies of each head",
    "KV bytes / token / GPU",
    "weights / GPU (GB)",
    "KV budget / GPU (GB)",
    "blocks",
    "tokens",
)

MULTI_GPU_CLAIMS: tuple[Claim, ...] = (
    Claim(
        "vLLM's ParallelConfig has tensor_parallel_size, pipeline_parallel_size and data_parallel_size; the "
        "distributed executor backend is one of ray, mp, uni, external_launcher",
        "https://docs.vllm.ai/en/v0.10.1.1/api/vllm/config/parallel.html",
    ),
    Claim(
        "vLLM's distributed runtime is Ray or Python multiprocessing: multiprocessing on one node, Ray "
        "for multi-node (the distributed-serving guide of v0.5)",
        "https://docs.vllm.ai/en/v0.5.1/serving/distributed_serving.html",
    ),
    Claim(
        "vLLM v1's RayExecutorV2 reuses MultiprocExecutor's message-queue control plane and NCCL data "
        "plane, with the workers as Ray actors",
        "https://docs.vllm.ai/en/v0.25.0/api/vllm/v1/executor/ray_executor_v2/",
    ),
    Claim(
        "one scheduler drives every worker: EngineCore measures each worker's free memory, builds their KV "
        "cache configs together (get_kv_cache_configs) and one scheduler config from them "
        "(generate_scheduler_kv_cache_config, which asserts every worker has the same num_blocks)",
        "vllm-project/vllm:vllm/v1/engine/core.py (EngineCore._initialize_kv_caches); "
        "vllm-project/vllm:vllm/v1/core/kv_cache_utils.py (generate_scheduler_kv_cache_config)",
    ),
    Claim(
        "SGLang's parallel flags: --tp-size (--tensor-parallel-size), --dp-size (--data-parallel-size), "
        "--ep-size (--expert-parallel-size) for MoE experts, --enable-dp-attention",
        "https://docs.sglang.io/cookbook/base/reference/server_arguments",
    ),
    Claim(
        "SGLang's ServerArgs: tp_size, pp_size, dp_size; nnodes, node_rank and dist_init_addr ('The host address "
        "for initializing distributed backend'); dist_timeout 'for torch.distributed initialization'; nccl_port "
        "'for NCCL distributed environment setup'",
        "sgl-project/sglang:python/sglang/srt/server_args.py (ServerArgs)",
    ),
    Claim(
        "SGLang across nodes: the same launch on every node with --dist-init-addr (the first node's ip:port), "
        "--nnodes and --node-rank, e.g. --tp 16 over two 8-GPU nodes",
        "https://docs.sglang.io/references/multi_node_deployment/multi_node.html",
    ),
    Claim(
        "SGLang's multi-node guide asks for a fast interconnect and NCCL",
        "https://mintlify.com/sgl-project/sglang/deployment/multi-node",
    ),
)


def multi_gpu_markdown(claims: tuple[Claim, ...] = MULTI_GPU_CLAIMS) -> str:
    """The claims as a markdown list, each with its source."""
    return "\n".join(
        f"- {c.text} ([source]({c.source}))" if c.source.startswith("http") else f"- {c.text} (`{c.source}`)"
        for c in claims
    )


def kv_per_gpu_rows(**kwargs) -> list[tuple]:
    """:func:`~paged_edu.core.parallel_kv.parallel_kv_rows` as display tuples in :data:`COLUMNS` order."""
    out = []
    for r in parallel_kv_rows(**kwargs):
        fits = r["fits"]
        out.append(
            (
                r["model"],
                f"{r['num_gpus']} ({r['tensor_parallel_size']} x {r['pipeline_parallel_size']})",
                r["kv_cache_dtype"],
                r["kv_heads_per_gpu"],
                r["kv_head_replicas"],
                f"{r['bytes_per_token_per_gpu']:,}",
                f"{r['weights_bytes_per_gpu'] / 1e9:.1f}",
                f"{r['kv_budget_bytes_per_gpu'] / 1e9:.1f}",
                f"{r['num_blocks']:,}" if fits else "weights do not fit",
                f"{r['num_tokens']:,}" if fits else "-",
            )
        )
    return out


def kv_per_gpu_table_markdown(**kwargs) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in kv_per_gpu_rows(**kwargs)]
    return "\n".join(lines)


def kv_per_gpu_table_html(**kwargs) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in kv_per_gpu_rows(**kwargs)
    )
    return f"<table><tr>{head}</tr>{body}</table>"

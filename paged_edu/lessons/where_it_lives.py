"""Lesson 8: where each paged_edu concept lives in vLLM (v1) and in SGLang.

:data:`CONCEPTS` is a tuple of :class:`Concept` records: the paged_edu objects (``module:qualname``,
each resolved by import in the tests), then what vLLM v1 and SGLang do, claim by claim, each
:class:`Claim` with its ``source`` -- ``owner/repo:path (symbol)`` for code read with the ``search``
tool (or a URL) -- and what differs. Where something was looked for and not found, the claim says
"not found". The code was read in the stored snapshots of vllm-project/vllm and sgl-project/sglang
(file versions vary; a symbol may have moved since). :func:`concept_table` gives the rows as dicts,
:func:`concept_table_markdown` / :func:`concept_table_html` render them for the notebook.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

__all__ = [
    "CONCEPTS",
    "Claim",
    "Concept",
    "concept_table",
    "concept_table_html",
    "concept_table_markdown",
    "resolve",
    "source_problems",
]

V, S = "vllm-project/vllm:", "sgl-project/sglang:"
V_DOC = V + "docs/design/prefix_caching.md"
V_UTILS = V + "vllm/v1/core/kv_cache_utils.py"
V_POOL = V + "vllm/v1/core/block_pool.py (BlockPool)"
V_SCHED = V + "vllm/v1/core/sched/scheduler.py"
S_RADIX = S + "python/sglang/srt/mem_cache/radix_cache.py"
S_BATCH = S + "python/sglang/srt/managers/schedule_batch.py"
S_POLICY = S + "python/sglang/srt/managers/schedule_policy.py"
S_POOL = S + "python/sglang/srt/mem_cache/memory_pool.py"
S_ARGS = S + "python/sglang/srt/server_args.py"


@dataclass(frozen=True, slots=True)
class Claim:
    text: str
    source: str  # "owner/repo:path (symbol)" or a URL


@dataclass(frozen=True, slots=True)
class Concept:
    concept: str
    lessons: str
    paged_edu: tuple[str, ...]  # "module:qualname", importable
    vllm: tuple[Claim, ...]
    sglang: tuple[Claim, ...]
    differs: tuple[Claim, ...] = ()


def C(text: str, source: str) -> Claim:
    return Claim(text, source)


# One cited place: "owner/repo:path/to/file.ext" with an optional " (Symbol.name, a note)" that starts with
# the symbol or section it names, or an address.
_CODE_SOURCE = re.compile(r"^[\w.-]+/[\w.-]+:[\w./-]+\.\w+( \([\w.]+[^()]*\))?$")
_URL_SOURCE = re.compile(r"^https?://[^\s/]+\.[^\s/]+\S*$")


def source_problems(concept: "Concept") -> list[str]:
    """What is wrong with the sources of ``concept``'s claims (empty: every claim is cited properly).

    Each claim needs a non-empty text and a source of ``"; "``-separated parts, each a file in a
    repository (``owner/repo:path.ext``, optionally ``(Symbol)``) or an http(s) address; a vLLM claim
    must cite vllm-project/vllm and an SGLang claim sgl-project/sglang (or their documentation sites).
    """
    problems = []
    for side, claims, home in (
        ("vLLM", concept.vllm, ("vllm-project/vllm", "vllm.ai")),
        ("SGLang", concept.sglang, ("sgl-project/sglang", "sglang", "lmsys.org")),
        ("differs", concept.differs, ()),
    ):
        if side != "differs" and not claims:
            problems.append(f"{concept.concept}: no {side} claim")
        for claim in claims:
            if not claim.text.strip():
                problems.append(f"{concept.concept}: a {side} claim without text")
            for part in claim.source.split("; "):
                if not (_CODE_SOURCE.match(part) or _URL_SOURCE.match(part)):
                    problems.append(
                        f"{concept.concept}: {side} source {part!r} is neither owner/repo:path (symbol) nor an address"
                    )
            if home and not any(h in claim.source for h in home):
                problems.append(f"{concept.concept}: the {side} claim cites {claim.source!r}, not {home[0]}")
    return problems


CONCEPTS: tuple[Concept, ...] = (
    Concept(
        "block table",
        "2, 5",
        ("paged_edu.core.allocator:BlockAllocator.block_table", "paged_edu.cache.kv_cache:PagedKVCache"),
        (
            C("the KV cache manager keeps 'request blocks: mapping from request ID to allocated block IDs'", V_DOC),
            C(
                "the worker's BlockTable: an int32 [max_num_reqs, max_num_blocks_per_req] CPU/GPU buffer, rows added "
                "with add_row / append_row",
                V + "vllm/v1/worker/block_table.py (BlockTable)",
            ),
        ),
        (
            C(
                "ReqToTokenPool.req_to_token maps (request row, position) to a token slot: a block table with one "
                "entry per token",
                S_POOL + " (ReqToTokenPool)",
            ),
        ),
        (
            C(
                "vLLM v1's block table is append-only: a block computed twice stays duplicated until the request "
                "frees it",
                V_DOC + " (Duplicated blocks)",
            ),
            C(
                "BlockTable may split one allocation block into several kernel blocks (kernel_block_size)",
                V + "vllm/v1/worker/block_table.py (BlockTable.map_to_kernel_blocks)",
            ),
        ),
    ),
    Concept(
        "slot mapping",
        "2, 4",
        ("paged_edu.core.allocator:BlockAllocator.slot_mapping",),
        (
            C(
                "BlockTable.compute_slot_mapping runs a Triton kernel: slot = block_table[pos // block_size] * "
                "block_size + pos % block_size, the rest padded with PAD_SLOT_ID 'for CUDA graph compatibility'",
                V + "vllm/v1/worker/block_table.py (_compute_slot_mapping_kernel)",
            ),
        ),
        (
            C(
                "out_cache_loc: the token slots allocated for a step's new tokens (alloc_token_slots), written into "
                "req_to_token",
                S_BATCH + " (ScheduleBatch.prepare_for_decode)",
            ),
        ),
    ),
    Concept(
        "ref count",
        "3",
        ("paged_edu.core.allocator:BlockAllocator.ref_count",),
        (
            C(
                "KVCacheBlock.ref_cnt; BlockPool.touch increments it (taking a ref-0 cached block off the free "
                "queue), free_blocks decrements it",
                V_UTILS + " (KVCacheBlock)",
            ),
            C("touch / free_blocks", V_POOL),
        ),
        (
            C(
                "TreeNode.lock_ref: how many running requests use a tree node; the root is locked at 1; "
                "inc_lock_ref / dec_lock_ref walk the path to the root",
                S_RADIX + " (TreeNode, RadixCache.reset)",
            ),
        ),
        (C("SGLang counts per tree node (a whole edge of tokens), vLLM per block", S_RADIX + " (TreeNode)"),),
    ),
    Concept(
        "block hash (chained)",
        "3",
        ("paged_edu.core.block_hash:chained_block_hashes",),
        (
            C(
                "hash_block_tokens hashes the tuple (parent hash, block token ids, extra_keys); the first block's "
                "parent is NONE_HASH, os.urandom(32) unless PYTHONHASHSEED is set",
                V_UTILS + " (hash_block_tokens, init_none_hash)",
            ),
            C(
                "extra keys: the LoRA name, (multimodal identifier, offset) of inputs in the block, the cache_salt "
                "(first block only), a SHA-256 of prompt embeddings",
                V_UTILS + " (generate_block_hash_extra_keys)",
            ),
            C(
                "the hash function is --prefix-caching-hash-algo: sha256 (pickle, the default), sha256_cbor, "
                "xxhash, xxhash_cbor",
                V + "vllm/config/cache.py (CacheConfig.prefix_caching_hash_algo)",
            ),
        ),
        (
            C(
                "no block hash for matching: the tree is keyed by token ids (RadixKey.token_ids) with extra_key "
                "(e.g. lora_id, cache_salt) as a separate namespace",
                S_RADIX + " (RadixKey, RadixCache.match_prefix)",
            ),
            C(
                "per-page SHA-256 chain (hash_value) kept on nodes for host storage and KV events",
                S_RADIX + " (compute_node_hash_values)",
            ),
        ),
        (
            C(
                "vLLM names a block by a hash of its prefix and warns the key 'is not 100% collision free'; "
                "SGLang compares the token ids themselves along the tree",
                V_DOC + " (Note 2)",
            ),
            C(
                "SGLang's match walks token ids (key_match_fn) -- no hash decides a hit",
                S_RADIX + " (_key_match_paged)",
            ),
        ),
    ),
    Concept(
        "evictable (free-block) cache, LRU",
        "3, 7",
        ("paged_edu.core.block_pool:BlockPool", "paged_edu.core.allocator:BlockAllocator.is_evictable"),
        (
            C(
                "FreeKVCacheBlockQueue: a doubly linked free list in eviction order, LRU first; a freed request's "
                "blocks are appended in reverse so a chain's tail goes first",
                V_UTILS + " (FreeKVCacheBlockQueue)",
            ),
            C(
                "cached_block_hash_to_block maps a hash to cached blocks (in use or free); allocating a cached "
                "free block evicts it",
                V + "vllm/v1/core/block_pool.py (BlockPool._maybe_evict_cached_block)",
            ),
        ),
        (
            C(
                "RadixCache.evict frees unlocked leaves; eviction_policy lru, lfu, fifo, mru, filo or priority",
                S_RADIX + " (RadixCache.__init__, EvictionStrategy)",
            ),
            C(
                "--radix-eviction-policy lru (default), lfu, slru, priority in a newer server_args",
                S_ARGS + " (ServerArgs.radix_eviction_policy)",
            ),
        ),
        (
            C(
                "vLLM evicts single blocks off one queue; SGLang evicts tree leaves, so a prefix shrinks from its end",
                S_RADIX + " (RadixCache.evict)",
            ),
        ),
    ),
    Concept(
        "prefix-cache metrics",
        "3",
        ("paged_edu.core.block_pool:PrefixCacheStats",),
        (
            C(
                "Prometheus counters vllm:prefix_cache_queries ('Prefix cache queries, in terms of number of queried "
                "tokens') and vllm:prefix_cache_hits ('... number of cached tokens'); vllm:num_preemptions beside them",
                V + "vllm/v1/metrics/loggers.py",
            ),
        ),
        (
            C(
                "a gauge sglang:cache_hit_rate, 'The prefix cache hit rate'",
                S + "python/sglang/srt/metrics/collector.py",
            ),
        ),
        (
            C(
                "vLLM exports two token counters (the rate is their ratio over a window); SGLang a ready-made rate",
                V + "vllm/v1/metrics/loggers.py",
            ),
        ),
    ),
    Concept(
        "copy-on-write",
        "3",
        ("paged_edu.core.allocator:BlockAllocator.take_copies",),
        (
            C(
                "not found in vllm/v1/core: 'we only cache full blocks', and a partly filled block is never "
                "shared -- each of n samples is its own request (ParentRequest, child ids f'{index}_{request_id}', "
                "n = 1 each) that meets the others' prompt blocks through the prefix cache",
                V + "vllm/v1/engine/parallel_sampling.py (ParentRequest.get_child_info)",
            ),
            C("Note 1: 'We only cache full blocks.'", V_DOC),
        ),
        (
            C(
                "not found: sharing is only through the tree, at page granularity (match_prefix truncates keys to "
                "whole pages)",
                S_RADIX + " (RadixCache.match_prefix)",
            ),
        ),
    ),
    Concept(
        "fork (parallel sampling, beam search)",
        "3",
        (
            "paged_edu.core.allocator:BlockAllocator.fork",
            "paged_edu.sched.scheduler:Scheduler.fork",
            "paged_edu.sched.parallel_sampling:ParallelSamples",
        ),
        (
            C(
                "n > 1: ParentRequest fans a request out into n child requests and gathers their outputs",
                V + "vllm/v1/engine/parallel_sampling.py (ParentRequest)",
            ),
            C(
                "beam search re-submits each beam as a new prompt of its tokens (BeamSearchSequence.get_prompt); "
                "a FIXME notes num_computed_tokens is 0 on each new request",
                V + "vllm/beam_search.py (BeamSearchSequence)",
            ),
        ),
        (
            C(
                "parallel sampling first sends each prompt with max_new_tokens = 0 ('Cache the common prefix for "
                "parallel sampling'), then the n samples",
                S + "python/sglang/srt/managers/tokenizer_manager.py (TokenizerManager, the parallel-sampling path)",
            ),
        ),
    ),
    Concept(
        "preemption (recompute)",
        "6",
        ("paged_edu.sched.scheduler:Scheduler.schedule",),
        (
            C(
                "_preempt_request frees the request's blocks, sets PREEMPTED, num_computed_tokens = 0 and puts it "
                "at the front of the waiting queue; under FCFS the victim is self.running.pop()",
                V_SCHED + " (Scheduler._preempt_request, Scheduler.schedule)",
            ),
            C(
                "'--preemption-mode is not supported by the V1 Engine'; maintainer: 'I believe that the V1 "
                "behaviour is that recompute is always used'",
                "https://github.com/vllm-project/vllm/issues/18115",
            ),
        ),
        (
            C(
                "ScheduleBatch.retract_decode: when a decode step lacks memory, retract requests with the fewest "
                "output tokens (then the longest inputs) first, free their uncached slots, dec_lock_ref, "
                "reset_for_retract: recomputed later, the cached part hit in the tree",
                S_BATCH + " (ScheduleBatch.retract_decode)",
            ),
            C(
                "--retraction-policy length (default: 'retracts short-output, long-input requests first') or priority",
                S_ARGS + " (ServerArgs.retraction_policy)",
            ),
        ),
    ),
    Concept(
        "swap space (CPU)",
        "6",
        ("paged_edu.sched.swap:SwapSpace",),
        (
            C(
                "v0's CacheConfig.swap_space = 4 'Size of the CPU swap space per GPU (in GiB)'; the stored "
                "vllm/config/cache.py has no swap_space, and CPU memory serves KV offloading instead: "
                "kv_offloading_size (GiB) with kv_offloading_backend native | lmcache",
                V + "vllm/config/cache.py (CacheConfig.kv_offloading_size)",
            ),
        ),
        (
            C(
                "hierarchical cache: a tree node may also hold host_value (KV in host memory) and is 'backuped'; "
                "HiRadixCache(RadixCache) runs it",
                S_RADIX
                + " (TreeNode.host_value); "
                + S
                + "python/sglang/srt/mem_cache/hiradix_cache.py (HiRadixCache)",
            ),
            C("SchedulePolicy takes enable_hierarchical_cache", S_POLICY + " (SchedulePolicy.__init__)"),
        ),
        (
            C(
                "both move cached *prefixes* to host memory rather than swapping a preempted request in and out",
                V + "vllm/config/cache.py (kv_offloading_backend)",
            ),
        ),
    ),
    Concept(
        "chunked prefill",
        "5",
        ("paged_edu.sched.scheduler:Scheduler.schedule",),
        (
            C(
                "SchedulerConfig.enable_chunked_prefill (True in the stored version): prefills chunked to the "
                "remaining max_num_batched_tokens; max_num_partial_prefills, long_prefill_token_threshold",
                V + "vllm/config/scheduler.py (SchedulerConfig)",
            ),
        ),
        (
            C(
                "--chunked-prefill-size: 'The maximum number of tokens in a chunk for the chunked prefill. Setting "
                "this to -1 means disabling chunked prefill'; --enable-mixed-chunk mixes prefill and decode in a batch",
                S_ARGS + " (ServerArgs.chunked_prefill_size, enable_mixed_chunk)",
            ),
        ),
    ),
    Concept(
        "paged decode kernel",
        "4",
        ("paged_edu.kernels:paged_attention_decode", "paged_edu.kernels.triton_decode:paged_attention_triton"),
        (
            C("the paper's CUDA kernels", V + "csrc/attention/paged_attention_v1.cu"),
            C(
                "v1 runs attention backends over the block table, e.g. FlashAttention",
                V + "vllm/v1/attention/backends/flash_attn.py",
            ),
        ),
        (
            C(
                "a Triton decode kernel among several backends",
                S + "python/sglang/srt/layers/attention/triton_ops/decode_attention.py",
            ),
        ),
    ),
    Concept(
        "CUDA graphs",
        "5",
        ("paged_edu.engine.cuda_graphs:DecodeCudaGraphs", "paged_edu.engine.cuda_graphs:MixedCudaGraphs"),
        (
            C(
                "CompilationConfig's CUDAGraphMode: NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE",
                V + "vllm/config/compilation.py (CUDAGraphMode)",
            ),
        ),
        (
            C(
                "CudaGraphRunner.capture records one graph per batch size in capture_bs; replay pads a batch up to "
                "the next captured size (bisect over capture_bs)",
                S + "python/sglang/srt/model_executor/cuda_graph_runner.py (CudaGraphRunner.capture, replay_prepare)",
            ),
        ),
    ),
    Concept(
        "prefix-aware scheduling (LPM)",
        "7",
        ("paged_edu.sched.policy:LongestPrefixFirst",),
        (
            C(
                "SchedulerConfig.policy is 'fcfs' or 'priority': no cache-aware order found",
                V + "vllm/config/scheduler.py (SchedulerPolicy)",
            ),
        ),
        (
            C(
                "CacheAwarePolicy LPM, DFS_WEIGHT; CacheAgnosticPolicy FCFS, LOF, RANDOM (newer versions add more)",
                S_POLICY + " (CacheAwarePolicy, CacheAgnosticPolicy)",
            ),
            C(
                "above 128 waiting requests LPM falls back to FCFS",
                S_POLICY + " (SchedulePolicy._determine_active_policy)",
            ),
            C(
                "--schedule-policy: lpm, random, fcfs, dfs-weight, lof, priority, routing-key; default fcfs",
                S_ARGS + " (ServerArgs.schedule_policy)",
            ),
        ),
    ),
    Concept(
        "radix tree",
        "7",
        ("paged_edu.core.radix_tree:RadixTree", "paged_edu.core.radix_cache:RadixAllocator"),
        (C("none: 'vLLM chooses a hash-based approach'", V_DOC),),
        (
            C("on by default: --disable-radix-cache defaults to False", S_ARGS + " (ServerArgs.disable_radix_cache)"),
            C(
                "RadixCache(BasePrefixCache) over TreeNode (children, key, value = KV indices, lock_ref, "
                "last_access_time, hit_count); match_prefix splits a node where a match ends inside an edge; "
                "cache_finished_req inserts a finished request",
                S_RADIX + " (RadixCache, TreeNode)",
            ),
        ),
    ),
    Concept(
        "KV budget (gpu_memory_utilization)",
        "1, 6",
        ("paged_edu.cache.sizing:available_kv_cache_memory",),
        (
            C(
                "CacheConfig.gpu_memory_utilization (0.92 in the stored version, 0.9 in older ones), 'a per-instance "
                "limit'; kv_cache_memory_bytes, when set, sizes the cache per GPU and ignores it",
                V + "vllm/config/cache.py (CacheConfig)",
            ),
        ),
        (
            C(
                "--mem-fraction-static: 'The fraction of the memory used for static allocation (model weights and KV "
                "cache memory pool)'; --max-total-tokens caps the pool",
                S_ARGS + " (ServerArgs.mem_fraction_static)",
            ),
        ),
        (
            C(
                "SGLang's fraction is of weights plus KV pool; vLLM's is of the GPU memory 'to be used for the model "
                "executor', of which the KV cache gets what the profiled forward pass leaves",
                V + "vllm/config/cache.py (CacheConfig.gpu_memory_utilization)",
            ),
        ),
    ),
    Concept(
        "KV-cache dtype (fp8)",
        "1, 8",
        ("paged_edu.core.hardware:ModelGeometry.per_gpu",),
        (
            C(
                "--kv-cache-dtype: auto (the model's dtype), float16, bfloat16, fp8 (= fp8_e4m3), fp8_e5m2 and more",
                V + "vllm/config/cache.py (CacheConfig.cache_dtype)",
            ),
        ),
        (
            C(
                "--kv-cache-dtype: auto, fp8_e5m2, fp8_e4m3, mxfp8, bf16, nvfp4 and more",
                S_ARGS + " (ServerArgs.kv_cache_dtype)",
            ),
        ),
    ),
    Concept(
        "KV heads under tensor parallelism",
        "8",
        ("paged_edu.core.hardware:kv_heads_per_rank", "paged_edu.core.hardware:ModelGeometry.per_gpu"),
        (
            C(
                "get_num_kv_heads: max(1, total_num_kv_heads // tensor_parallel_size), replicated when fewer "
                "heads than ranks; 1 for MLA",
                V
                + "vllm/config/model.py (ModelConfig.get_num_kv_heads); "
                + V
                + "vllm/config.py (ModelConfig.get_num_kv_heads, before the config split)",
            ),
            C(
                "QKVParallelLinear: num_kv_head_replicas = divide(tp_size, total_num_kv_heads) when tp >= heads",
                V + "vllm/model_executor/layers/linear.py (QKVParallelLinear)",
            ),
        ),
        (
            C(
                "get_num_kv_heads: max(1, total_num_kv_heads // tensor_parallel_size)",
                S + "python/sglang/srt/configs/model_config.py (ModelConfig.get_num_kv_heads)",
            ),
            C(
                "MLA: MLATokenToKVPool caches kv_lora_rank + qk_rope_head_dim per token and layer",
                S_POOL + " (MLATokenToKVPool)",
            ),
        ),
    ),
)


def resolve(path: str):
    """The object ``"module:qualname"`` names (a ``ValueError`` naming what is missing). A Triton kernel
    module where Triton is not installed is read instead of imported
    (:func:`~paged_edu.labs.kernel_ladder.source_of`): its functions resolve to their source text."""
    from paged_edu.labs.kernel_ladder import source_of

    module_name, _, qualname = path.partition(":")
    if not qualname:
        raise ValueError(f"{path!r} is not 'module:qualname'")
    try:
        obj = source_of(module_name)
    except ImportError as exc:
        raise ValueError(f"{path!r}: module {module_name!r} does not import ({exc})") from None
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{path!r}: {part!r} not found")
        obj = getattr(obj, part)
    return obj


def _cell(claims: tuple[Claim, ...]) -> tuple[str, str]:
    return " ".join(c.text + "." for c in claims), "; ".join(c.source for c in claims)


def concept_table(concepts: tuple[Concept, ...] = CONCEPTS) -> list[dict]:
    """One dict per concept: concept, lessons, paged_edu, vllm, vllm_source, sglang, sglang_source, differs,
    differs_source."""
    rows = []
    for c in concepts:
        (vt, vs), (st, ss), (dt, ds) = _cell(c.vllm), _cell(c.sglang), _cell(c.differs)
        rows.append(
            {
                "concept": c.concept,
                "lessons": c.lessons,
                "paged_edu": ", ".join(c.paged_edu),
                "vllm": vt,
                "vllm_source": vs,
                "sglang": st,
                "sglang_source": ss,
                "differs": dt,
                "differs_source": ds,
            }
        )
    return rows


_HEAD = ("concept", "lessons", "paged_edu", "vLLM v1", "SGLang", "what differs")


def concept_table_markdown(concepts: tuple[Concept, ...] = CONCEPTS) -> str:
    """A markdown table; each claim is followed by its source in brackets."""

    def cell(claims):
        return "<br>".join(f"{c.text} [`{c.source}`]" for c in claims).replace("|", "\\|")

    lines = ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
    for c in concepts:
        ours = "<br>".join(f"`{p}`" for p in c.paged_edu)
        lines.append(f"| {c.concept} | {c.lessons} | {ours} | {cell(c.vllm)} | {cell(c.sglang)} | {cell(c.differs)} |")
    return "\n".join(lines)


def concept_table_html(concepts: tuple[Concept, ...] = CONCEPTS) -> str:
    """An HTML table (for ``IPython.display.HTML``); sources in small print under each claim."""
    wrap = "style='word-break:break-all'"

    def cell(claims):
        return "".join(
            f"<p>{html.escape(c.text)}<br><small><code {wrap}>{html.escape(c.source)}</code></small></p>"
            for c in claims
        )

    widths = (9, 4, 16, 26, 26, 19)  # percent, one per column of _HEAD
    cols = "".join(f"<col style='width:{w}%'>" for w in widths)
    head = "".join(f"<th style='text-align:left'>{h}</th>" for h in _HEAD)
    body = []
    for c in concepts:
        ours = "<br>".join(f"<code {wrap}>{html.escape(p)}</code>" for p in c.paged_edu)
        body.append(
            f"<tr style='vertical-align:top'><td><b>{html.escape(c.concept)}</b></td><td>{c.lessons}</td>"
            f"<td>{ours}</td><td>{cell(c.vllm)}</td><td>{cell(c.sglang)}</td><td>{cell(c.differs)}</td></tr>"
        )
    return (
        f"<table style='table-layout:fixed;width:100%;font-size:12px'><colgroup>{cols}</colgroup>"
        f"<tr>{head}</tr>{''.join(body)}</table>"
    )

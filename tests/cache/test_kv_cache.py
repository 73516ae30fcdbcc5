"""The paged KV cache obeys the allocator: store / copy-on-write / swap / gather round trips,
address translation against the tensor's real memory, sizing, and every error."""

from __future__ import annotations

import pytest
import torch

from paged_edu.core.allocator import BlockAllocator

from allocator_helpers import append_token
from paged_edu.kernels import paged_attention_decode, triton_available, triton_interpreting
from paged_edu.cache.kv_cache import PagedKVCache
from paged_edu.cache.sizing import available_kv_cache_memory, bytes_per_block, num_blocks_for_budget

L, NB, B, H_KV, D = 2, 12, 4, 2, 8
STORE_IMPLS = ["torch"] + (["triton"] if triton_available() and triton_interpreting() else [])


def fill(cache: PagedKVCache, alloc: BlockAllocator, prompts: dict, impl: str = "torch", seed: int = 0):
    """Allocate every prompt, store random K/V for each token; return the K/V per sequence and layer."""
    g = torch.Generator().manual_seed(seed)
    truth = {}
    for seq_id, tokens in prompts.items():
        alloc.allocate(seq_id, tokens)
        slots = alloc.slot_mapping(seq_id)
        for layer in range(cache.num_layers):
            k = torch.randn(len(tokens), cache.num_kv_heads, cache.head_dim, generator=g).to(cache.dtype)
            v = torch.randn(len(tokens), cache.num_kv_heads, cache.head_dim, generator=g).to(cache.dtype)
            cache.store(layer, k, v, slots, impl=impl)
            truth[seq_id, layer] = (k, v)
    return truth


@pytest.mark.parametrize("impl", STORE_IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_then_gather_round_trip(impl, dtype):
    cache = PagedKVCache(L, NB, B, H_KV, D, dtype=dtype)
    alloc = BlockAllocator(NB, B, enable_prefix_caching=False)
    truth = fill(cache, alloc, {"a": list(range(7)), "b": list(range(100, 109)), "c": [5]}, impl)
    for (seq_id, layer), (k, v) in truth.items():
        gk, gv = cache.gather(layer, alloc.block_table(seq_id), len(k))
        assert torch.equal(gk, k) and torch.equal(gv, v)
    # Independent check of the layout: slot s is k_caches[layer].view(-1, H_kv, D)[s].
    k, _ = truth["b", 1]
    flat = cache.k_caches[1].view(-1, H_KV, D)
    assert torch.equal(flat[alloc.slot_mapping("b")], k)


@pytest.mark.parametrize("impl", STORE_IMPLS)
def test_store_skips_slot_minus_one(impl):
    cache = PagedKVCache(1, 2, B, H_KV, D, dtype=torch.float32)
    k = torch.ones(3, H_KV, D)
    cache.store(0, k, 2 * k, torch.tensor([5, -1, 0]), impl=impl)
    flat_k, flat_v = cache.k_caches[0].view(-1, H_KV, D), cache.v_caches[0].view(-1, H_KV, D)
    written = torch.zeros(2 * B, dtype=torch.bool)
    written[[0, 5]] = True
    assert (flat_k[written] == 1).all() and (flat_v[written] == 2).all()
    assert (flat_k[~written] == 0).all() and (flat_v[~written] == 0).all()


def test_copy_on_write_copies_follow_the_allocator():
    cache = PagedKVCache(L, NB, B, H_KV, D, dtype=torch.float32)
    alloc = BlockAllocator(NB, B)
    truth = fill(cache, alloc, {"parent": list(range(6))})  # 6 tokens: last block half full
    alloc.fork("parent", "child")
    append_token(alloc, "child", 99)  # writes into the shared last block: copy-on-write
    copies = alloc.take_copies()
    assert len(copies) == 1
    before = [c.clone() for c in cache.k_caches + cache.v_caches]
    cache.copy_blocks(copies)
    src, dst = copies[0]
    for c, old in zip(cache.k_caches + cache.v_caches, before):
        assert torch.equal(c[dst], old[src])
        untouched = torch.ones(NB, dtype=torch.bool)
        untouched[dst] = False
        assert torch.equal(c[untouched], old[untouched])
    # The child's first 6 tokens read back exactly the parent's K/V through its own table.
    for layer in range(L):
        k, v = truth["parent", layer]
        gk, gv = cache.gather(layer, alloc.block_table("child"), 6)
        assert torch.equal(gk, k) and torch.equal(gv, v)


def test_swap_out_and_in_round_trip():
    cache = PagedKVCache(L, NB, B, H_KV, D, dtype=torch.float16, num_cpu_blocks=4)
    alloc = BlockAllocator(NB, B, enable_prefix_caching=False)
    truth = fill(cache, alloc, {"a": list(range(8))})  # blocks of "a": 2
    table = alloc.block_table("a")
    cache.swap_out([(table[0], 3), (table[1], 0)])
    for c in cache.k_caches + cache.v_caches:
        c.zero_()  # the device copy is gone
    new_table = [7, 2]
    cache.swap_in([(3, new_table[0]), (0, new_table[1])])
    for layer in range(L):
        k, v = truth["a", layer]
        gk, gv = cache.gather(layer, new_table, 8)
        assert torch.equal(gk, k) and torch.equal(gv, v)


def test_decode_through_the_cache_matches_attention_on_the_original_tensors():
    cache = PagedKVCache(1, 16, B, 2, 16, dtype=torch.float32)
    alloc = BlockAllocator(16, B, enable_prefix_caching=False)
    prompts = {0: list(range(9)), 1: list(range(3)), 2: list(range(20))}
    truth = fill(cache, alloc, prompts)
    q = torch.randn(3, 4, 16)
    tables = torch.full((3, 5), -1, dtype=torch.int32)
    for i in prompts:
        tables[i, : len(alloc.block_table(i))] = torch.tensor(alloc.block_table(i))
    lens = torch.tensor([9, 3, 20], dtype=torch.int32)
    out = paged_attention_decode(q, *cache.layer(0), tables, lens)  # auto: Triton under the interpreter
    for i in prompts:
        k, v = truth[i, 0]  # (s, 2, 16): the tensors before they went into the pool
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # (s, 4, 16) per query head
        p = torch.softmax(torch.einsum("hd,shd->hs", q[i], k) / 4.0, dim=-1)
        assert torch.allclose(out[i], torch.einsum("hs,shd->hd", p, v), atol=1e-5)


def test_address_matches_real_memory():
    cache = PagedKVCache(L, NB, B, H_KV, D, dtype=torch.bfloat16)
    table = [9, 2, 5]
    strides = cache.strides_bytes()
    assert strides == {"S_block": B * H_KV * D * 2, "S_token": H_KV * D * 2, "S_head": D * 2}
    for which, caches in (("k", cache.k_caches), ("v", cache.v_caches)):
        for t in (0, 3, 4, 11):
            for h in range(H_KV):
                expected = caches[1][table[t // B], t % B, h].data_ptr()
                assert cache.address(1, table, t, h, which=which) == expected
    with pytest.raises(ValueError, match="covers 12 tokens"):
        cache.address(0, table, 12)


def test_sizing_from_a_byte_budget():
    per_block = bytes_per_block(L, B, H_KV, D, torch.float16)
    assert per_block == 2 * L * B * H_KV * D * 2
    cache = PagedKVCache.from_byte_budget(10 * per_block + per_block - 1, L, B, H_KV, D)
    assert cache.num_blocks == 10 and cache.nbytes == 10 * per_block
    with pytest.raises(ValueError, match=f"holds 0 blocks of {per_block:,} bytes"):
        PagedKVCache.from_byte_budget(per_block - 1, L, B, H_KV, D)


def test_budget_by_vllms_rule_names_the_numbers():
    gib = 2**30
    assert available_kv_cache_memory(10 * gib, 0.9, gib) == int(9 * gib) - gib
    with pytest.raises(
        ValueError, match=r"gpu_memory_utilization=0.5 of 4.00 GiB total is 2.00 GiB.*3.00 GiB that is not"
    ):
        available_kv_cache_memory(4 * gib, 0.5, 3 * gib)
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        available_kv_cache_memory(gib, 1.5, 0)
    with pytest.raises(ValueError, match="fewer than the 100 needed"):
        num_blocks_for_budget(gib, 2**25, min_blocks=100)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA device"):
            PagedKVCache.from_gpu_memory_utilization(L, B, H_KV, D, device="cpu")


def test_bad_input_is_refused_and_leaves_the_cache_unchanged():
    cache = PagedKVCache(L, NB, B, H_KV, D, dtype=torch.float32, num_cpu_blocks=2)
    cache.k_caches[0].normal_()
    snapshot = [c.clone() for c in cache.k_caches + cache.v_caches + cache.cpu_k_caches]
    k = torch.randn(2, H_KV, D)
    cases = [
        (ValueError, "layer must be", lambda: cache.store(L, k, k, [0, 1])),
        (ValueError, "key must be", lambda: cache.store(0, k[:, :1], k, [0, 1])),
        (TypeError, "dtype", lambda: cache.store(0, k.half(), k.half(), [0, 1])),
        (ValueError, "2 entries for 2 tokens|entries for", lambda: cache.store(0, k, k, [0])),
        (ValueError, r"slot_mapping values must be in \[-1, 48\)", lambda: cache.store(0, k, k, [0, 48])),
        (ValueError, "impl must be", lambda: cache.store(0, k, k, [0, 1], impl="cuda")),
        (ValueError, "outside", lambda: cache.copy_blocks([(0, 1), (2, NB)])),
        (ValueError, "appears twice", lambda: cache.copy_blocks([(0, 1), (2, 1)])),
        (TypeError, "must be ints", lambda: cache.copy_blocks([(0.5, 1)])),
        (ValueError, "outside", lambda: cache.swap_out([(0, 2)])),
        (ValueError, "outside", lambda: cache.swap_in([(0, -1)])),
        (ValueError, "seq_len must be", lambda: cache.gather(0, [0], 0)),
        (ValueError, "covers 4 tokens", lambda: cache.gather(0, [0], 5)),
        (ValueError, "outside", lambda: cache.gather(0, [NB], 1)),
        (TypeError, "num_layers must be an int", lambda: PagedKVCache(2.0, NB, B, H_KV, D)),
        (TypeError, "dtype must be", lambda: PagedKVCache(L, NB, B, H_KV, D, dtype=torch.int8)),
    ]
    for exc, words, call in cases:
        with pytest.raises(exc, match=words):
            call()
    for c, old in zip(cache.k_caches + cache.v_caches + cache.cpu_k_caches, snapshot):
        assert torch.equal(c, old)


# ----------------------------------------------------------------------------------------------
# On a GPU: the compiled store kernel, device copies, pinned swap space, sizing by vLLM's rule
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_store_kernel_matches_torch_and_round_trips(dtype):
    torch.manual_seed(0)
    a = PagedKVCache(2, 64, 16, 8, 128, dtype=dtype, device="cuda", num_cpu_blocks=8)
    b = PagedKVCache(2, 64, 16, 8, 128, dtype=dtype, device="cuda")
    slots = torch.randperm(64 * 16, device="cuda")[:300]
    slots[::7] = -1
    k = torch.randn(300, 8, 128, device="cuda", dtype=dtype)
    v = torch.randn(300, 8, 128, device="cuda", dtype=dtype)
    a.store(1, k, v, slots, impl="triton")
    b.store(1, k, v, slots, impl="torch")
    assert torch.equal(a.k_caches[1], b.k_caches[1]) and torch.equal(a.v_caches[1], b.v_caches[1])
    a.copy_blocks([(int(slots[1]) // 16, 0)])
    assert torch.equal(a.k_caches[1][0], b.k_caches[1][int(slots[1]) // 16])
    a.swap_out([(0, 5)])
    a.swap_in([(5, 63)])
    assert torch.equal(a.k_caches[1][63], a.k_caches[1][0]) and a.cpu_k_caches[0].is_pinned()


@pytest.mark.gpu
def test_gpu_sizing_by_vllms_rule():
    _, total = torch.cuda.mem_get_info()
    allocated = torch.cuda.memory_allocated()
    cache = PagedKVCache.from_gpu_memory_utilization(4, 16, 8, 128, gpu_memory_utilization=0.05)
    assert 0 < cache.nbytes <= 0.05 * total - allocated
    with pytest.raises(ValueError, match="does not fit"):
        PagedKVCache.from_gpu_memory_utilization(4, 16, 8, 128, gpu_memory_utilization=0.01, min_blocks=10**9)


@pytest.mark.parametrize("slots, words", [([0, 2.7], "float 2.7"), ([True, 1], "bool True"), (["3", 1], "str")])
def test_store_refuses_non_integer_slot_lists_and_writes_nothing(slots, words):
    cache = PagedKVCache(1, 2, B, H_KV, D, dtype=torch.float32)
    k = torch.ones(2, H_KV, D)
    with pytest.raises(TypeError, match=words):
        cache.store(0, k, k, slots)
    assert (cache.k_caches[0] == 0).all() and (cache.v_caches[0] == 0).all()


# ----------------------------------------------------------------------------------------------
# One store path; one kernel probe; the kernel wrapper's scale and head_dim checks
# ----------------------------------------------------------------------------------------------


def test_the_model_and_the_cache_store_through_one_function_that_skips_minus_one():
    """``store_kv`` is what PagedLlama's attention calls and what PagedKVCache.store calls after
    its checks: called directly (the model's way), slot -1 is skipped on the CPU path too."""
    import paged_edu.models.llama as llama
    from paged_edu.cache import kv_cache

    assert llama.store_kv is kv_cache.store_kv
    k_cache, v_cache = torch.zeros(2, B, H_KV, D), torch.zeros(2, B, H_KV, D)
    k = torch.arange(3 * H_KV * D, dtype=torch.float32).view(3, H_KV, D) + 1
    kv_cache.store_kv(k, -k, k_cache, v_cache, torch.tensor([5, -1, 0]))
    flat_k, flat_v = k_cache.view(-1, H_KV, D), v_cache.view(-1, H_KV, D)
    assert torch.equal(flat_k[5], k[0]) and torch.equal(flat_k[0], k[2]) and torch.equal(flat_v[0], -k[2])
    untouched = [s for s in range(2 * B) if s not in (0, 5)]
    assert (flat_k[untouched] == 0).all() and (flat_v[untouched] == 0).all()  # row 1 went nowhere


@pytest.mark.parametrize("impl", STORE_IMPLS)
def test_store_refuses_a_slot_twice_in_one_call_and_writes_nothing(impl):
    cache = PagedKVCache(1, 2, B, H_KV, D, dtype=torch.float32)
    k = torch.ones(3, H_KV, D)
    with pytest.raises(ValueError, match="slot 5 more than once"):
        cache.store(0, k, k, [5, 1, 5], impl=impl)
    assert (cache.k_caches[0] == 0).all() and (cache.v_caches[0] == 0).all()
    cache.store(0, k, k, [-1, 1, -1], impl=impl)  # padding rows may repeat -1
    assert (cache.k_caches[0].view(-1, H_KV, D)[1] == 1).all()


def test_one_probe_says_which_kernels_run_here():
    from paged_edu.kernels import kernel_support

    cpu = kernel_support("cpu")
    if triton_interpreting():  # this machine: every kernel runs, interpreted; auto uses it for decode only
        assert cpu.decode and cpu.prefill and cpu.store and cpu.interpreted
        assert cpu.use_triton("decode") and not cpu.use_triton("prefill") and not cpu.use_triton("store")
    elif not triton_available():
        assert not (cpu.decode or cpu.prefill or cpu.store)
    meta = kernel_support(torch.device("meta"))
    assert not (meta.decode or meta.prefill or meta.store) and not meta.use_triton("decode")
    assert kernel_support("cpu") is cpu  # asked once per device type


def _decode_inputs(head_dim=8):
    cache = PagedKVCache(1, 4, B, 2, max(head_dim, 1), dtype=torch.float32)
    k_cache, v_cache = cache.layer(0)
    if head_dim == 0:
        k_cache, v_cache = k_cache[..., :0], v_cache[..., :0]
    q = torch.randn(2, 4, head_dim)
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    lens = torch.tensor([5, 3], dtype=torch.int32)
    return q, k_cache, v_cache, tables, lens


@pytest.mark.parametrize(
    "impl", ["torch", "loop"] + (["triton"] if triton_available() and triton_interpreting() else [])
)
def test_kernel_wrapper_refuses_head_dim_zero_and_bad_scales(impl):
    import numpy as np

    with pytest.raises(ValueError, match="head_dim"):
        paged_attention_decode(*_decode_inputs(head_dim=0), impl=impl)
    args = _decode_inputs()
    for scale in (float("nan"), float("inf"), 0.0, -0.5, np.float64("nan")):
        with pytest.raises(ValueError, match="scale must be a finite number > 0"):
            paged_attention_decode(*args, scale=scale, impl=impl)
    for scale in (True, "0.5", torch.tensor(0.5)):
        with pytest.raises(TypeError, match="scale must be a float"):
            paged_attention_decode(*args, scale=scale, impl=impl)
    want = paged_attention_decode(*args, scale=0.25, impl=impl)
    for scale in (np.float32(0.25), np.float64(0.25), 0.25):  # any real number, numpy's included
        torch.testing.assert_close(paged_attention_decode(*args, scale=scale, impl=impl), want)


def test_numpy_integers_are_integers_everywhere_in_the_cache():
    """numpy ints are accepted wherever ints are (as the allocator's ids come out of numpy code);
    bools and floats are refused, naming the argument."""
    import numpy as np

    cache = PagedKVCache(
        np.int64(L), np.int32(NB), np.int64(B), H_KV, D, dtype=torch.float32, num_cpu_blocks=np.int64(2)
    )
    assert type(cache.num_blocks) is int and cache.nbytes == NB * bytes_per_block(L, B, H_KV, D, torch.float32)
    k = torch.randn(5, H_KV, D)
    cache.store(np.int64(1), k, k, [0, 1, 2, 3, 4])
    gk, _ = cache.gather(np.int64(1), [np.int64(0), 1], np.int64(5))
    assert torch.equal(gk, k)
    assert cache.address(np.int64(1), [0, 1], np.int64(4), np.int64(1)) == cache.k_caches[1][1, 0, 1].data_ptr()
    for call, words in (
        (lambda: cache.layer(True), "layer must be an int"),
        (lambda: cache.gather(0, [0], 2.0), "seq_len must be an int"),
        (lambda: cache.address(0, [0], 1, kv_head=1.0), "kv_head must be an int"),
        (lambda: PagedKVCache(L, NB, B, H_KV, D, num_cpu_blocks=True), "num_cpu_blocks"),
    ):
        with pytest.raises(TypeError, match=words):
            call()

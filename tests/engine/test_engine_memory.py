"""An engine gives its memory back: when dropped (no reference cycle keeps its pool or its CUDA
graphs alive, so a weak reference dies without ``gc.collect()``), and at once on ``close()`` or at
the end of ``with Engine(...) as engine:``; a closed engine refuses to run. The pool check counts
what torch's caching allocator holds for reuse, and says which figure it used. The oracle: weak
references to the engine and to its KV cache's tensors, and on a GPU ``torch.cuda.memory_allocated``."""

from __future__ import annotations

import gc
import weakref
from contextlib import contextmanager

import pytest
import torch

from paged_edu.cache import sizing
from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.validation import FieldValueError
from paged_edu.engine import Engine
from paged_edu.engine.sampling import SamplingParams
from paged_edu.labs.engine_lab import tiny_model

PROMPTS = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14, 15]]
PARAMS = [SamplingParams(max_tokens=5), SamplingParams(max_tokens=4, temperature=1.0, seed=2, n=2)] + [
    SamplingParams(max_tokens=6)
]


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3, vocab_size=300)


@contextmanager
def no_gc():
    """The collector off: only reference counts free anything."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("extra", [{}, {"record_timeline": True, "preemption_mode": "swap"}])
def test_a_dropped_engine_is_freed_by_reference_counts(model, async_scheduling, extra):
    with no_gc():
        engine = Engine(model, num_blocks=32, block_size=4, async_scheduling=async_scheduling, **extra)
        engine.subscribe(lambda event: None)
        engine.run(PROMPTS, PARAMS)
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=8))  # and one still live when dropped
        engine.step()
        refs = [weakref.ref(engine), weakref.ref(engine.kv_cache.k_caches[0]), weakref.ref(engine.runner)]
        del engine
        assert [r() is None for r in refs] == [True, True, True]


def test_close_gives_the_memory_back_and_a_closed_engine_refuses_to_run(model):
    allocator = BlockAllocator(32, 4, True, cache_when_computed=True)  # a learner's: left with no sequence
    engine = Engine(model, num_blocks=32, block_size=4, allocator=allocator)
    engine.run(PROMPTS, PARAMS)
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=8))
    engine.step()
    k_cache = weakref.ref(engine.kv_cache.k_caches[0])
    steps = engine.step_count
    engine.close()
    assert engine.closed and k_cache() is None  # freed while the engine itself is still held
    assert allocator.num_used_blocks == 0 and allocator.seq_ids == []
    for call in (
        lambda: engine.step(),
        lambda: engine.add_request([1, 2]),
        lambda: engine.generate([[1, 2]]),
        lambda: engine.run([[1, 2]]),
        lambda: engine.abort_request(rid),
        lambda: engine.reset(),
        lambda: engine.__enter__(),
    ):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    assert engine.step_count == steps and engine.stats()["step"] == steps  # still readable
    engine.close()  # twice: nothing


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_with_closes_at_the_end_of_the_block_even_on_an_error(model, async_scheduling):
    with Engine(model, num_blocks=32, block_size=4, async_scheduling=async_scheduling) as engine:
        want = engine.generate(PROMPTS, max_new_tokens=4)
        k_cache = weakref.ref(engine.kv_cache.k_caches[0])
    assert engine.closed and k_cache() is None
    assert Engine(model, num_blocks=32, block_size=4).generate(PROMPTS, max_new_tokens=4) == want
    with pytest.raises(KeyError):
        with Engine(model, num_blocks=32, block_size=4) as engine:
            raise KeyError("a failing cell")
    assert engine.closed


def test_the_pool_check_counts_what_torchs_allocator_holds_for_reuse(monkeypatch):
    """A dropped engine's pool stays reserved in torch's caching allocator; the check adds it to the
    driver's free memory, and its message says which figures it used."""
    GiB = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 * GiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 50 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 10 * GiB)
    cuda = torch.device("cuda", 0)
    sizing.check_blocks_fit("num_blocks", 40, GiB, cuda)  # 40 GiB: 1 free + 40 reserved, unused
    with pytest.raises(FieldValueError, match="num_blocks") as err:
        sizing.check_blocks_fit("num_blocks", 42, GiB, cuda)
    message = str(err.value)
    assert "41.00 GiB" in message and "1.00 GiB free on the device" in message and "40.00 GiB reserved" in message
    assert "at most 41 fit now" in message


def test_the_pool_check_collects_a_dropped_engine_held_by_a_cycle(monkeypatch):
    """Before refusing, the check runs the collector: a pool held only by a reference cycle is freed."""
    free = {"bytes": 10}
    monkeypatch.setattr(sizing, "available_bytes", lambda device: (free["bytes"], "test figure"))
    monkeypatch.setattr(gc, "collect", lambda *a: free.update(bytes=100))
    sizing.check_blocks_fit("num_blocks", 50, 1, torch.device("cpu"))  # fits once collected
    free["bytes"] = 10
    monkeypatch.setattr(gc, "collect", lambda *a: None)
    with pytest.raises(FieldValueError, match="test figure"):
        sizing.check_blocks_fit("num_blocks", 50, 1, torch.device("cpu"))


# ----------------------------------------------------------------------------------------------
# On a GPU: the CUDA graphs too, and a pool of 60 % of the card three times in a row
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_gpu_a_dropped_engine_frees_its_pool_and_graphs_without_gc(graphs, async_scheduling):
    """A 1 GiB pool (and the graphs' pool) back to torch as the last reference goes. A small engine of
    the same settings runs first, so what a first run keeps for good (a cuBLAS workspace per stream --
    64 MiB on the H200 for the capture stream --, Triton's state) is held before ``before`` is read;
    the slack left is then tens of MiB, not the pool."""
    model = tiny_model(device="cuda", seed=3, vocab_size=300)
    c = model.config
    num_blocks = 2**30 // sizing.bytes_per_block(c.num_layers, 16, c.num_kv_heads, c.head_dim, model.dtype)
    settings = dict(
        block_size=16, max_num_seqs=8, cuda_graphs=graphs, mixed_graphs=graphs, async_scheduling=async_scheduling
    )
    with Engine(model, num_blocks=64, **settings) as warm:
        warm.run(PROMPTS, PARAMS)
    torch.cuda.synchronize()
    with no_gc():
        before = torch.cuda.memory_allocated()
        engine = Engine(model, num_blocks=num_blocks, **settings)
        assert engine.graph_error is None
        engine.run(PROMPTS, PARAMS)
        assert (engine.num_graph_steps > 0) == graphs
        held = torch.cuda.memory_allocated() - before
        refs = [weakref.ref(engine), weakref.ref(engine.kv_cache.k_caches[0])]
        del engine
        torch.cuda.synchronize()
        left = torch.cuda.memory_allocated() - before
        assert [r() for r in refs] == [None, None]
        assert held >= 2**30 and left < 64 * 2**20, (held, left)


@pytest.mark.gpu
def test_gpu_three_engines_of_60_percent_of_the_card_in_a_row():
    """Each pool is 60 % of the card: the second and third fit only if the one before gave its memory
    back -- dropped (async, graphs on), closed (sync), and at the end of a ``with`` block."""
    model = tiny_model(device="cuda", seed=3, vocab_size=300)
    c = model.config
    block_bytes = sizing.bytes_per_block(c.num_layers, 16, c.num_kv_heads, c.head_dim, model.dtype)
    num_blocks = int(0.6 * torch.cuda.mem_get_info()[1]) // block_bytes
    kw = dict(num_blocks=num_blocks, block_size=16, max_num_seqs=8)
    want = Engine(model, num_blocks=256, block_size=16, max_num_seqs=8).generate(PROMPTS, max_new_tokens=4)

    first = Engine(model, **kw, async_scheduling=True, cuda_graphs=True)
    assert first.generate(PROMPTS, max_new_tokens=4) == want
    del first
    second = Engine(model, **kw)
    assert second.generate(PROMPTS, max_new_tokens=4) == want
    second.close()
    with Engine(model, **kw, async_scheduling=True) as third:
        assert third.generate(PROMPTS, max_new_tokens=4) == want

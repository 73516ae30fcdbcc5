"""The paged KV cache on real tensors: the pool that the allocator's block tables point into.

Per layer, one K and one V tensor of shape ``(num_blocks, B, num_kv_heads, head_dim)`` -- the
seed's layout, also vLLM's. Block ``b`` is ``k_cache[b]``, a ``(B, num_kv_heads, head_dim)`` slab
of ``S_block`` bytes. Token ``t`` of a sequence with block table ``B(.)`` lives at

    address(K[t], head h) = BasePtr_K + B(t // B) * S_block + (t mod B) * S_token + h * S_head

with ``S_block = B * N_kv * d_head * sizeof``, ``S_token = N_kv * d_head * sizeof`` and
``S_head = d_head * sizeof``. (The seed writes ``(t mod B) * d_head``, which holds only for one KV
head: with several, a token's row holds all of them.) :meth:`PagedKVCache.address` computes this
from the tensor's real strides and ``data_ptr()``, so a lesson can check it against
``k_cache[b, o, h].data_ptr()``.

What the cache does, each as one method:

* :meth:`store` -- write new tokens' K/V to their slots (``BlockAllocator.slot_mapping``): a small
  Triton kernel on CUDA, a PyTorch scatter elsewhere. It checks its input, then calls
  :func:`store_kv`, the one store path: the model's attention layers call it too;
* :meth:`copy_blocks` -- apply copy-on-write copies ``(src, dst)`` from
  ``BlockAllocator.take_copies()``, on the device;
* :meth:`swap_out` / :meth:`swap_in` -- move blocks to and from a CPU pool (preemption by swapping);
* :meth:`gather` -- one sequence's K/V as contiguous ``(s, num_kv_heads, head_dim)`` tensors;
* sizing: :meth:`PagedKVCache.from_byte_budget` and, on a GPU,
  :meth:`PagedKVCache.from_gpu_memory_utilization`.

Every method validates its input and raises ``ValueError``/``TypeError`` before touching a tensor,
so bad input leaves the cache as it was.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from paged_edu.core.validation import as_int, integer
from paged_edu.cache.sizing import available_kv_cache_memory, bytes_per_block, format_gib, num_blocks_for_budget
from paged_edu.kernels import kernel_support
from paged_edu.kernels.checks import check_impl

__all__ = ["PagedKVCache", "store_kv"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------------------------
# The cache
# ----------------------------------------------------------------------------------------------


class PagedKVCache:
    """Per-layer K/V pools of ``num_blocks`` blocks of ``block_size`` token slots.

    ``k_caches[layer]`` and ``v_caches[layer]``: ``(num_blocks, B, num_kv_heads, head_dim)`` on
    ``device``; ``cpu_k_caches`` / ``cpu_v_caches``: the same with ``num_cpu_blocks`` blocks on the
    host (pinned when the device is CUDA), the swap space.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float16,
        device: str | torch.device = "cpu",
        num_cpu_blocks: int = 0,
    ) -> None:
        num_layers, num_blocks, block_size, num_kv_heads, head_dim = (
            integer(name, value, low=1)
            for name, value in (
                ("num_layers", num_layers),
                ("num_blocks", num_blocks),
                ("block_size", block_size),
                ("num_kv_heads", num_kv_heads),
                ("head_dim", head_dim),
            )
        )
        num_cpu_blocks = integer("num_cpu_blocks", num_cpu_blocks, low=0)
        if dtype not in _FLOAT_DTYPES:
            raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.num_cpu_blocks = num_cpu_blocks

        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # Zeros, not empty: a lesson that looks at a never-written slot sees 0, not old memory.
        self.k_caches: list[torch.Tensor] = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]
        self.v_caches: list[torch.Tensor] = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]
        self.device = self.k_caches[0].device  # "cuda" becomes "cuda:0": compare like with like
        cpu_shape = (num_cpu_blocks, block_size, num_kv_heads, head_dim)
        pin = self.device.type == "cuda"
        self.cpu_k_caches: list[torch.Tensor] = [
            torch.zeros(cpu_shape, dtype=dtype, pin_memory=pin) for _ in range(num_layers)
        ]
        self.cpu_v_caches: list[torch.Tensor] = [
            torch.zeros(cpu_shape, dtype=dtype, pin_memory=pin) for _ in range(num_layers)
        ]

    # -- sizing ----------------------------------------------------------------------------------
    @classmethod
    def from_byte_budget(
        cls,
        budget_bytes: int,
        num_layers: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float16,
        device: str | torch.device = "cpu",
        num_cpu_blocks: int = 0,
        min_blocks: int = 1,
    ) -> PagedKVCache:
        """As many blocks as ``budget_bytes`` holds (all layers, K and V)."""
        for name, value in (
            ("num_layers", num_layers),
            ("block_size", block_size),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            integer(name, value, low=1)
        block_bytes = bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype)
        num_blocks = num_blocks_for_budget(budget_bytes, block_bytes, min_blocks=min_blocks)
        return cls(
            num_layers,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
            dtype=dtype,
            device=device,
            num_cpu_blocks=num_cpu_blocks,
        )

    @classmethod
    def from_gpu_memory_utilization(
        cls,
        num_layers: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        gpu_memory_utilization: float = 0.9,
        reserve_bytes: int = 0,
        dtype: torch.dtype = torch.float16,
        device: str | torch.device = "cuda",
        num_cpu_blocks: int = 0,
        min_blocks: int = 1,
    ) -> PagedKVCache:
        """Size the pool by vLLM's rule -- call it after the model is loaded.

        ``budget = gpu_memory_utilization * total - (allocated + reserve_bytes)`` (see
        :func:`available_kv_cache_memory`): ``allocated`` is what this process's tensors hold now
        (``torch.cuda.memory_allocated``: the weights), ``reserve_bytes`` what the forward pass will
        still need (activations). The budget must also fit in what is free now (another process may
        hold memory inside the fraction): like vLLM's start-up check, it is refused otherwise. Raises
        ``ValueError`` naming free and total memory, the fraction, the reserve and the block size when
        fewer than ``min_blocks`` blocks fit.
        """
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            raise ValueError(f"from_gpu_memory_utilization needs a CUDA device, got {device}; use from_byte_budget")
        free, total = torch.cuda.mem_get_info(device)
        allocated = torch.cuda.memory_allocated(device)
        budget = available_kv_cache_memory(total, gpu_memory_utilization, allocated + reserve_bytes)
        if budget > free:
            raise ValueError(
                f"the KV cache does not fit: gpu_memory_utilization={gpu_memory_utilization} of {format_gib(total)} "
                f"total leaves {format_gib(budget)} for the KV cache, but {device} has only {format_gib(free)} free "
                f"(other processes hold memory); lower gpu_memory_utilization or free the device"
            )
        block_bytes = bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype)
        what = (
            f"{device} has {format_gib(free)} free of {format_gib(total)}; gpu_memory_utilization={gpu_memory_utilization} "
            f"of the total minus {format_gib(allocated)} allocated and {format_gib(reserve_bytes)} reserved gives "
        )
        num_blocks = num_blocks_for_budget(budget, block_bytes, min_blocks=min_blocks, what=what)
        return cls(
            num_layers,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
            dtype=dtype,
            device=device,
            num_cpu_blocks=num_cpu_blocks,
        )

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over all layers, K and V."""
        return bytes_per_block(self.num_layers, self.block_size, self.num_kv_heads, self.head_dim, self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the device pool (all layers, K and V)."""
        return self.num_blocks * self.block_bytes

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(num_layers={self.num_layers}, num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, dtype={self.dtype}, "
            f"device={self.device}, num_cpu_blocks={self.num_cpu_blocks}, nbytes={self.nbytes:,})"
        )

    # -- checks ----------------------------------------------------------------------------------
    def _layer(self, layer: int) -> int:
        return integer("layer", layer, low=0, high=self.num_layers - 1)

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_cache, v_cache)`` of one layer, each ``(num_blocks, B, num_kv_heads, head_dim)``."""
        layer = self._layer(layer)
        return self.k_caches[layer], self.v_caches[layer]

    @staticmethod
    def _block_ids(name: str, ids, limit: int) -> list[int]:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        out = []
        for b in ids:
            b = as_int(b, f"{name}: block ids must be ints")
            if not 0 <= b < limit:
                raise ValueError(f"{name}: block id {b} is outside [0, {limit})")
            out.append(b)
        return out

    def _pairs(
        self, pairs: Sequence[tuple[int, int]], src_limit: int, dst_limit: int, what: str
    ) -> tuple[list[int], list[int]]:
        try:
            pairs = [tuple(p) for p in pairs]
        except TypeError:
            raise TypeError(f"{what}: expected a list of (src, dst) pairs, got {type(pairs).__name__}") from None
        if any(len(p) != 2 for p in pairs):
            raise ValueError(f"{what}: every item must be a (src, dst) pair, got {pairs!r}")
        src = self._block_ids(f"{what} source", [p[0] for p in pairs], src_limit)
        dst = self._block_ids(f"{what} destination", [p[1] for p in pairs], dst_limit)
        if len(set(dst)) != len(dst):
            raise ValueError(f"{what}: a destination block appears twice in {pairs!r}")
        return src, dst

    # -- writing new tokens ----------------------------------------------------------------------
    def store(
        self,
        layer: int,
        key: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
        value: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
        slot_mapping,  # (num_tokens,) ints: slot = block_id * B + offset, -1 = skip
        *,
        impl: str = "auto",
    ) -> None:
        """Write each token's K/V to its slot. ``impl``: ``"triton"``, ``"torch"`` or ``"auto"``
        (Triton on CUDA when available, PyTorch otherwise -- the interpreted kernel is for tests)."""
        layer = self._layer(layer)
        check_impl(impl, ("auto", "triton", "torch"))
        expected = (self.num_kv_heads, self.head_dim)
        for name, t in (("key", key), ("value", value)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 3 or tuple(t.shape[1:]) != expected:
                raise ValueError(f"{name} must be (num_tokens, {expected[0]}, {expected[1]}), got {tuple(t.shape)}")
            if t.dtype != self.dtype:
                raise TypeError(f"{name} dtype {t.dtype} differs from the cache's {self.dtype}")
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device}, the cache on {self.device}")
        if key.shape[0] != value.shape[0]:
            raise ValueError(f"key has {key.shape[0]} tokens, value {value.shape[0]}")
        if not isinstance(slot_mapping, torch.Tensor):
            # Checked one by one: torch.tensor(..., dtype=int64) would silently truncate 3.7 to 3.
            slots = [as_int(x, "slot_mapping entries must be ints") for x in slot_mapping]
            slot_mapping = torch.tensor(slots, dtype=torch.int64, device=self.device)
        if slot_mapping.dtype not in (torch.int32, torch.int64) or slot_mapping.dim() != 1:
            raise TypeError(
                f"slot_mapping must be a 1-D int32/int64 tensor, got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
            )
        if slot_mapping.shape[0] != key.shape[0]:
            raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens")
        if slot_mapping.device != self.device:
            slot_mapping = slot_mapping.to(self.device)
        capturing = slot_mapping.is_cuda and torch.cuda.is_current_stream_capturing()
        if slot_mapping.numel() and not capturing:
            self._check_slots(slot_mapping)
        store_kv(key, value, self.k_caches[layer], self.v_caches[layer], slot_mapping, impl)

    def _check_slots(self, slot_mapping: torch.Tensor) -> None:
        """Every slot in ``[-1, num_slots)`` and none twice (two rows racing for one slot would
        leave whichever the hardware wrote last)."""
        num_slots = self.num_blocks * self.block_size
        lo, hi = int(slot_mapping.min()), int(slot_mapping.max())
        if lo < -1 or hi >= num_slots:
            raise ValueError(f"slot_mapping values must be in [-1, {num_slots}), got [{lo}, {hi}]")
        used = slot_mapping[slot_mapping >= 0]
        values, counts = used.unique(return_counts=True)
        if bool((counts > 1).any()):
            raise ValueError(f"slot_mapping holds slot {int(values[counts > 1][0])} more than once")

    # -- copy-on-write ---------------------------------------------------------------------------
    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Apply ``(src, dst)`` block copies in every layer, on the device (copy-on-write).

        All sources are read before any destination is written, as if the copies happened at once.
        Pass ``allocator.take_copies()``.
        """
        src, dst = self._pairs(copies, self.num_blocks, self.num_blocks, "copy_blocks")
        if not src:
            return
        src_t = torch.tensor(src, dtype=torch.long, device=self.device)
        dst_t = torch.tensor(dst, dtype=torch.long, device=self.device)
        for cache in (*self.k_caches, *self.v_caches):
            cache.index_copy_(0, dst_t, cache.index_select(0, src_t))  # (n, B, H_kv, D) moved on the device

    # -- swapping --------------------------------------------------------------------------------
    def swap_out(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy device blocks to the CPU pool: ``pairs`` of ``(gpu_block, cpu_block)``, every layer."""
        src, dst = self._pairs(pairs, self.num_blocks, self.num_cpu_blocks, "swap_out")
        if not src:
            return
        src_t = torch.tensor(src, dtype=torch.long, device=self.device)
        dst_t = torch.tensor(dst, dtype=torch.long)
        for gpu, cpu in zip((*self.k_caches, *self.v_caches), (*self.cpu_k_caches, *self.cpu_v_caches)):
            cpu.index_copy_(0, dst_t, gpu.index_select(0, src_t).cpu())

    def swap_in(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy CPU blocks back to the device: ``pairs`` of ``(cpu_block, gpu_block)``, every layer."""
        src, dst = self._pairs(pairs, self.num_cpu_blocks, self.num_blocks, "swap_in")
        if not src:
            return
        src_t = torch.tensor(src, dtype=torch.long)
        dst_t = torch.tensor(dst, dtype=torch.long, device=self.device)
        for gpu, cpu in zip((*self.k_caches, *self.v_caches), (*self.cpu_k_caches, *self.cpu_v_caches)):
            gpu.index_copy_(0, dst_t, cpu.index_select(0, src_t).to(self.device))

    # -- reading ---------------------------------------------------------------------------------
    def _table(self, block_table, seq_len: int) -> list[int]:
        seq_len = integer("seq_len", seq_len, low=1)
        if isinstance(block_table, torch.Tensor):
            block_table = block_table.tolist()
        needed = -(-seq_len // self.block_size)
        if len(block_table) < needed:
            raise ValueError(
                f"block table of {len(block_table)} blocks covers {len(block_table) * self.block_size} tokens, "
                f"fewer than seq_len={seq_len}"
            )
        return self._block_ids("block_table", block_table[:needed], self.num_blocks)

    def gather(self, layer: int, block_table, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's K and V as contiguous ``(seq_len, num_kv_heads, head_dim)`` tensors."""
        layer = self._layer(layer)
        table = self._table(block_table, seq_len)
        idx = torch.tensor(table, dtype=torch.long, device=self.device)
        k = self.k_caches[layer][idx].reshape(-1, self.num_kv_heads, self.head_dim)[:seq_len]  # (s, H_kv, D)
        v = self.v_caches[layer][idx].reshape(-1, self.num_kv_heads, self.head_dim)[:seq_len]  # (s, H_kv, D)
        return k.contiguous(), v.contiguous()

    # -- address translation ---------------------------------------------------------------------
    def strides_bytes(self) -> dict[str, int]:
        """``S_block``, ``S_token`` and ``S_head`` in bytes, read off the tensor's real strides."""
        cache = self.k_caches[0]
        es = cache.element_size()
        return {"S_block": cache.stride(0) * es, "S_token": cache.stride(1) * es, "S_head": cache.stride(2) * es}

    def address(self, layer: int, block_table, t: int, kv_head: int = 0, *, which: str = "k") -> int:
        """Byte address of token ``t``'s K (or V) row for ``kv_head``:

        ``BasePtr + B(t // B) * S_block + (t mod B) * S_token + kv_head * S_head``.
        Equal to ``cache[B(t // B), t % B, kv_head].data_ptr()``: a lesson can check it.
        """
        layer = self._layer(layer)
        if which not in ("k", "v"):
            raise ValueError(f"which must be 'k' or 'v', got {which!r}")
        t = integer("token position t", t, low=0)
        kv_head = integer("kv_head", kv_head, low=0, high=self.num_kv_heads - 1)
        table = self._table(block_table, t + 1)
        cache = (self.k_caches if which == "k" else self.v_caches)[layer]
        strides = self.strides_bytes()
        B = self.block_size
        return (
            cache.data_ptr()
            + table[t // B] * strides["S_block"]
            + (t % B) * strides["S_token"]
            + kv_head * strides["S_head"]
        )


def store_kv(
    key: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    value: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim), contiguous
    v_cache: torch.Tensor,  # (num_blocks, B, num_kv_heads, head_dim), contiguous
    slot_mapping: torch.Tensor,  # (num_tokens,) int: slot = block_id * B + offset; -1 = skip
    impl: str = "auto",
) -> None:
    """The one K/V store: row ``i`` of ``key``/``value`` goes to slot ``slot_mapping[i]``.

    Slot ``-1`` is skipped on every path (padding rows of a captured CUDA graph carry it).
    ``impl="auto"`` takes the Triton kernel where :func:`paged_edu.kernels.kernel_support` says it
    runs compiled, the PyTorch scatter elsewhere. No checks: the model calls this with slots the
    runner built; :meth:`PagedKVCache.store` checks a caller's input first, then calls this.
    """
    if impl == "triton" or (impl == "auto" and kernel_support(key.device).use_triton("store")):
        from paged_edu.kernels.triton_store import store_kv_triton

        store_kv_triton(key, value, k_cache, v_cache, slot_mapping)
        return
    keep = slot_mapping >= 0  # (num_tokens,)
    if not bool(keep.all()):  # padding rows: drop them (the Triton kernel skips them in place)
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    slots = slot_mapping.long()
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, key)  # (num_blocks * B, H_kv, D)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value)

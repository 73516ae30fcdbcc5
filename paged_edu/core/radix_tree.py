"""The radix tree of SGLang's RadixAttention, over token ids, whose edges own KV blocks.

Each node below the root holds an edge: ``key`` (token ids, a whole number of blocks of ``B``
tokens) and ``blocks`` (the physical block holding each ``B`` of them). A path from the root spells
a prefix; the blocks along it hold that prefix's K/V. Children are found by their edge's first
block of tokens, so a lookup walks one edge per step and compares the whole edge, block by block.
At ``B = 1`` the tree is token-granular, as SGLang's default ``page_size=1``.

* ``lock_ref`` -- how many live sequences use the node (and so its ancestors): SGLang's
  ``inc_lock_ref`` / ``dec_lock_ref`` walk from a node to the root. A locked node is never evicted.
* ``last_access`` -- a logical clock, for least-recently-used eviction of unlocked *leaves*
  (SGLang's ``evict`` builds a heap of the leaves by ``last_access_time`` at each call; here one
  heap is kept, with stale entries skipped). A leaf loses blocks from its tail, one block at a
  time, so eviction frees exactly what is needed.
* a node is split when a lookup or an insertion ends inside its edge (SGLang's ``_split_node``).
* a salted request's prefixes live below its own child of the root, a *namespace* node with an
  empty edge (TensorRT-LLM mixes ``cache_salt_id`` into the radix root the same way), so requests
  with different salts never meet in the tree. A namespace node is removed with its last child.

Source read: sgl-project/sglang, ``python/sglang/srt/mem_cache/radix_cache.py`` (``TreeNode``,
``match_prefix``, ``insert``, ``_split_node``, ``evict``, ``inc_lock_ref``). Written anew, plainly;
plain Python, no torch.
"""

from __future__ import annotations

import heapq
from array import array

__all__ = ["RadixNode", "RadixTree", "edge_match"]


class RadixNode:
    __slots__ = ("key", "blocks", "children", "parent", "lock_ref", "last_access")

    def __init__(self, key: array, blocks: list[int], parent: RadixNode | None) -> None:
        self.key = key  # len(key) == len(blocks) * B
        self.blocks = blocks
        self.children: dict[bytes, RadixNode] = {}  # first block's tokens (as bytes) -> child
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0


def edge_match(key: array, packed: array, start: int, limit: int, block_size: int) -> int:
    """How many leading blocks of the edge ``key`` equal ``packed``'s blocks from block ``start``,
    at most ``limit``: the whole edge is compared, block by block."""
    B = block_size
    m, num = 0, min(len(key) // B, limit)
    while m < num and key[m * B : (m + 1) * B] == packed[(start + m) * B : (start + m + 1) * B]:
        m += 1
    return m


class RadixTree:
    """The tree and its evictable-block count; the caller (:class:`~paged_edu.core.radix_cache.RadixAllocator`)
    keeps the blocks' reference counts."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.root = RadixNode(array("q"), [], None)
        self.root.lock_ref = 1  # the root is never evicted
        self.num_evictable = 0  # blocks in unlocked nodes: freeable by evicting leaves
        self.clock = 0
        # Eviction candidates, (last_access, id, node), pushed whenever a node becomes an unlocked
        # leaf; an entry gone stale (the node got children, was locked, touched or removed) is
        # skipped when popped -- so evicting costs O(log n) per block, not a walk over the tree.
        # When stale entries outnumber the nodes the heap is rebuilt from the live ones, so it holds
        # at most ``2 * num_nodes + 64`` entries however many requests touch the tree.
        self._candidates: list[tuple[int, int, RadixNode]] = []
        self.num_nodes = 0  # below the root
        self._namespace_names: dict[int, bytes] = {}  # id(namespace node) -> its key in root.children

    def namespace(self, root: bytes, create: bool = False) -> RadixNode | None:
        """The node prefixes of the salt root ``root`` hang below: the tree's root for
        ``ROOT_HASH`` (b""), else a child of the root with an empty edge -- made if ``create``, else
        None when the tree holds nothing of that salt. Its key (``b"salt:" + root``) is never a
        block's token bytes (those are a multiple of 8 bytes long)."""
        if not root:
            return self.root
        name = b"salt:" + root
        node = self.root.children.get(name)
        if node is None and create:
            node = RadixNode(array("q"), [], self.root)
            self.root.children[name] = node
            self._namespace_names[id(node)] = name
        return node

    def _child_key(self, packed: array, block: int) -> bytes:
        B = self.block_size
        return packed[block * B : (block + 1) * B].tobytes()

    def match(self, packed: array, max_blocks: int, below: RadixNode | None = None) -> list[tuple[RadixNode, int]]:
        """The path of the longest cached prefix of ``packed`` (at most ``max_blocks`` blocks) below
        ``below`` (the root by default): ``[(node, blocks of its edge matched), ...]``; only the last
        may be matched in part. Changes nothing."""
        path, node, pos = [], below or self.root, 0
        while pos < max_blocks:
            child = node.children.get(self._child_key(packed, pos))
            if child is None:
                break
            m = edge_match(child.key, packed, pos, max_blocks - pos, self.block_size)
            if m == 0:
                break
            path.append((child, m))
            pos += m
            if m < len(child.blocks):
                break
            node = child
        return path

    def split(self, node: RadixNode, m: int) -> RadixNode:
        """Cut ``node``'s edge after ``m`` blocks; the new upper node is returned, ``node`` keeps the
        rest (so sequences that lock ``node`` still lock the whole path)."""
        B = self.block_size
        upper = RadixNode(node.key[: m * B], node.blocks[:m], node.parent)
        upper.lock_ref, upper.last_access = node.lock_ref, node.last_access
        self.num_nodes += 1
        node.parent.children[upper.key[:B].tobytes()] = upper
        node.key, node.blocks, node.parent = node.key[m * B :], node.blocks[m:], upper
        upper.children[node.key[:B].tobytes()] = node
        return upper

    def settle(self, path: list[tuple[RadixNode, int]]) -> RadixNode:
        """Split the last node of a :meth:`match` path where the match ended; return the deepest node."""
        if not path:
            return self.root
        node, m = path[-1]
        return self.split(node, m) if m < len(node.blocks) else node

    def insert(
        self, packed: array, blocks: list[int], below: RadixNode | None = None
    ) -> tuple[RadixNode, list[int], list[tuple[int, int]]]:
        """Add the prefix ``packed`` (``len(blocks)`` blocks) held in ``blocks``, below the node
        ``below`` (the root by default: then ``packed`` continues the prefix ``below`` spells).

        Where the tree already holds these tokens in other blocks (the same prefix computed twice),
        the tree's blocks stay and the caller is told to use them instead (SGLang frees the
        duplicate the same way in ``cache_finished_req``). Returns ``(the deepest node, the blocks
        newly adopted by the tree, [(position, the tree's block) to use instead of the caller's]``."""
        self.clock += 1
        node, pos, n, replaced = below or self.root, 0, len(blocks), []
        while pos < n:
            self._stamp(node)
            child = node.children.get(self._child_key(packed, pos))
            if child is None:
                B = self.block_size
                leaf = RadixNode(packed[pos * B : n * B], blocks[pos:], node)
                leaf.last_access = self.clock
                node.children[leaf.key[:B].tobytes()] = leaf
                self.num_nodes += 1
                self.num_evictable += n - pos  # unlocked until the caller locks it
                self._push(leaf)
                return leaf, blocks[pos:], replaced
            m = edge_match(child.key, packed, pos, n - pos, self.block_size)
            if m < len(child.blocks):
                child = self.split(child, m)
            replaced += [(pos + j, b) for j, b in enumerate(child.blocks) if b != blocks[pos + j]]
            pos += m
            node = child
        self._stamp(node)
        return node, [], replaced

    def touch(self, node: RadixNode) -> None:
        """A hit ended at ``node`` (after :meth:`settle`): stamp it and its ancestors used now --
        the matched half of a split edge, never the unused tail below it."""
        self.clock += 1
        while node is not self.root:
            self._stamp(node)
            node = node.parent

    def _stamp(self, node: RadixNode) -> None:
        """Mark ``node`` used now; an unlocked leaf's old heap entry goes stale, so push a new one."""
        node.last_access = self.clock
        if node.lock_ref == 0 and not node.children and node is not self.root:
            self._push(node)

    def lock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.num_evictable -= len(node.blocks)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.num_evictable += len(node.blocks)
                if not node.children:
                    self._push(node)
            node = node.parent

    def _push(self, node: RadixNode) -> None:
        heap = self._candidates
        if len(heap) >= 2 * self.num_nodes + 64:  # mostly stale: keep one live entry per candidate
            live = {entry[1]: entry for entry in heap if self._is_candidate(entry)}
            heap[:] = live.values()
            heapq.heapify(heap)
        heapq.heappush(heap, (node.last_access, id(node), node))

    def _is_candidate(self, entry: tuple[int, int, RadixNode]) -> bool:
        last_access, _, node = entry
        return (
            node.parent is not None
            and not node.children
            and node.lock_ref == 0
            and node.blocks != []
            and node.last_access == last_access
        )

    def evict(self, num_blocks: int) -> list[int]:
        """Free ``num_blocks`` (``<= num_evictable``) blocks from unlocked leaves, least recently
        used first, each leaf from its tail; returns them."""
        heap = self._candidates
        freed: list[int] = []
        B = self.block_size
        while len(freed) < num_blocks:
            entry = heapq.heappop(heap)
            if not self._is_candidate(entry):
                continue
            leaf = entry[2]
            k = min(num_blocks - len(freed), len(leaf.blocks))
            edge = leaf.key[:B].tobytes()
            freed += leaf.blocks[len(leaf.blocks) - k :]
            leaf.blocks = leaf.blocks[: len(leaf.blocks) - k]
            leaf.key = leaf.key[: len(leaf.blocks) * B]
            if not leaf.blocks:
                parent = leaf.parent
                del parent.children[edge]
                leaf.parent = None  # removed: its stale entries are skipped
                self.num_nodes -= 1
                if not parent.children and parent.lock_ref == 0 and parent is not self.root:
                    if parent.blocks:
                        self._push(parent)
                    else:  # an empty namespace: nothing below it can be locked any more
                        del self.root.children[self._namespace_names.pop(id(parent))]
                        parent.parent = None
            else:
                self._push(leaf)  # what is left of it stays a candidate
        self.num_evictable -= len(freed)
        return freed

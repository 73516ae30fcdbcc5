"""The allocator contract, checked against a brute-force model of the KV memory.

Any block allocator that an engine can run on must keep four promises, whatever its data
structures:

1. a sequence of ``n`` tokens holds ``ceil(n / B)`` blocks, and reference counts equal the number
   of live block tables that hold each block (free blocks = blocks nobody holds);
2. every sequence reads back *its own* K/V through its block table: attention makes the K/V of
   token ``p`` a function of every token up to ``p``, so the model writes ``prefix(p) =
   tuple(tokens[: p + 1])`` into a slot whenever the allocator says a token is computed there,
   and copies slots when it asks for copy-on-write (``take_copies``). A position-blind block
   hash, a stale cache entry after eviction or a missing copy-on-write each make some sequence
   read another prefix's K/V;
3. prefix-cache hits are whole blocks and never the prompt's last token
   (``num_cached_tokens % B == 0`` and ``< n``);
4. a call that raises :class:`~paged_edu.core.block_pool.OutOfBlocksError` changes nothing.

:class:`ContractModel` is that oracle, one allocator and one dict from slot to prefix; its
operations check as they go and :meth:`ContractModel.check` checks the invariants, raising
:class:`ContractViolation` (an ``AssertionError``) that says what differs. Two drivers use it:
``tests/core/test_allocator_stateful.py`` (hypothesis' stateful testing, which also shrinks a failure
to a short example) and :func:`check_contract` here (seeded random operations, plain Python, so a
lesson can check a learner's allocator without hypothesis installed).

Decoding is driven as a scheduler drives it, by counts: :meth:`ContractModel.reserve` asks
``append_slots(seq_id)`` for the slot of a token not sampled yet (a placeholder), and
:meth:`ContractModel.resolve` samples it, writes its K/V and tells the allocator with
``mark_computed(seq_id, n, [token_id])``; :meth:`ContractModel.append` does both at once. A
block published before its ids arrive, or under ids other than the ones given, makes a later
prompt read K/V that is not its own.

The allocator needs: ``allocate(seq_id, token_ids)``, ``append_slots(seq_id) -> [slot]``,
``mark_computed(seq_id, num_computed_tokens, token_ids)``, ``fork(parent_id, child_id)``,
``free(seq_id)``, ``take_copies()``, ``block_table``, ``num_tokens``, ``num_cached_tokens``,
``slot``, ``ref_count``, ``num_free_blocks`` and ``seq_ids``. Plain Python, no torch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from paged_edu.core.block_pool import OutOfBlocksError

__all__ = [
    "B",
    "NUM_BLOCKS",
    "PREFIXES",
    "ContractModel",
    "ContractReport",
    "ContractViolation",
    "check_contract",
    "observable",
]

B = 4
NUM_BLOCKS = 14
# Prompts share these heads, so prefix caching (when the allocator has it) gets hits and misses.
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 7, 7, 7, 7], [5, 6, 7, 8, 1, 2, 3, 4], [9, 9]]


class ContractViolation(AssertionError):
    """The allocator broke a promise of the contract; the message says which and where."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ContractViolation(message)


def observable(a) -> tuple:
    """Everything a caller can see of an allocator, to check that a failed call changed nothing.

    Block hashes and prefix-cache statistics are included when the allocator has them.
    """
    seqs = list(a.seq_ids)
    hashes = [a.block_hash(b) for b in range(a.num_blocks)] if hasattr(a, "block_hash") else None
    stats = getattr(a, "stats", None)
    return (
        a.num_free_blocks,
        {s: (list(a.block_table(s)), a.num_tokens(s)) for s in seqs},
        [a.ref_count(b) for b in range(a.num_blocks)],
        hashes,
        (stats.queried_tokens, stats.hit_tokens) if stats is not None else None,
    )


class ContractModel:
    """One allocator under test and the brute-force memory it must agree with."""

    def __init__(self, allocator) -> None:
        self.a = allocator
        self.block_size = allocator.block_size
        self.num_blocks = allocator.num_blocks
        self.memory: dict[int, tuple] = {}  # slot -> the prefix whose K/V it holds
        self.tokens: dict[int, list[int]] = {}  # the model's own record of each live sequence
        self.placeholders: set[int] = set()  # sequences holding a slot for a token not sampled yet
        self.next_id = 0
        self.ops = 0  # operations run
        self.history: list[str] = []  # what was done, for a readable failure

    # -- the oracle's bookkeeping ------------------------------------------------------------
    def _write(self, seq_id, start: int) -> None:
        tokens = self.tokens[seq_id]
        for p in range(start, len(tokens)):
            self.memory[self.a.slot(seq_id, p)] = tuple(tokens[: p + 1])

    def _apply_copies(self) -> None:
        Bs = self.block_size
        for src, dst in self.a.take_copies():
            for j in range(Bs):
                if src * Bs + j in self.memory:
                    self.memory[dst * Bs + j] = self.memory[src * Bs + j]

    def _unchanged(self, before, what: str) -> None:
        _require(
            observable(self.a) == before,
            f"{what} raised OutOfBlocksError but changed the allocator (a failed call must change nothing)",
        )

    # -- operations (each checks what it can at once) -----------------------------------------
    def allocate(self, tokens: list[int]):
        """Admit a prompt; returns its id, or None when the pool is full (and nothing changed)."""
        self.ops += 1
        seq_id = self.next_id
        before = observable(self.a)
        try:
            self.a.allocate(seq_id, list(tokens))
        except OutOfBlocksError:
            self._unchanged(before, f"allocate({seq_id}, {len(tokens)} tokens)")
            return None
        self.history.append(f"allocate({seq_id}, {tokens})")
        self.next_id += 1
        cached = self.a.num_cached_tokens(seq_id)
        _require(
            cached % self.block_size == 0 and cached < len(tokens),
            f"sequence {seq_id}: {cached} cached tokens of a {len(tokens)}-token prompt; a hit must be whole "
            f"blocks of {self.block_size} and leave the last token to compute",
        )
        self.tokens[seq_id] = list(tokens)
        self._check_table(seq_id)  # before writing through the table
        self._write(seq_id, cached)  # the cached head must already hold these prefixes: check() sees it
        return seq_id

    def append(self, seq_id, token: int) -> bool:
        """One decode step: reserve the next token's slot (unless a placeholder holds it already),
        then resolve it to ``token``; False when the pool is full (and nothing changed)."""
        if seq_id not in self.tokens:
            self.ops += 1
            return False
        if seq_id not in self.placeholders and not self.reserve(seq_id):
            return False
        return self.resolve(seq_id, token)

    def reserve(self, seq_id) -> bool:
        """``append_slots``: a slot for the sequence's next token, whose id does not exist yet; False
        when the pool is full (nothing changed) or the sequence holds a placeholder already."""
        self.ops += 1
        if seq_id not in self.tokens or seq_id in self.placeholders:
            return False
        before = observable(self.a)
        try:
            [slot] = self.a.append_slots(seq_id)
        except OutOfBlocksError:
            self._unchanged(before, f"append_slots({seq_id})")
            return False
        self.history.append(f"append_slots({seq_id})")
        self._apply_copies()
        self.placeholders.add(seq_id)
        self._check_table(seq_id)
        position = len(self.tokens[seq_id])
        _require(
            slot == self.a.slot(seq_id, position),
            f"append_slots({seq_id}) returned slot {slot}, but the block table puts token {position} in slot "
            f"{self.a.slot(seq_id, position)}",
        )
        return True

    def resolve(self, seq_id, token: int) -> bool:
        """The placeholder's token is sampled: write its K/V and ``mark_computed`` it with its id."""
        self.ops += 1
        if seq_id not in self.placeholders:
            return False
        self.placeholders.discard(seq_id)
        self.tokens[seq_id].append(token)
        position = len(self.tokens[seq_id]) - 1
        self._write(seq_id, position)
        self.a.mark_computed(seq_id, position + 1, [token])
        self.history.append(f"mark_computed({seq_id}, {position + 1}, [{token}])")
        return True

    def fork(self, parent):
        """A child sharing every block of ``parent``; returns its id (None for an unknown parent)."""
        self.ops += 1
        if parent not in self.tokens or parent in self.placeholders:  # a scheduler forks after a sample
            return None
        child = self.next_id
        self.next_id += 1
        table = list(self.a.fork(parent, child))
        self.history.append(f"fork({parent} -> {child})")
        _require(
            table == list(self.a.block_table(parent)),
            f"fork({parent} -> {child}) returned {table}, not the parent's table {self.a.block_table(parent)}",
        )
        self.tokens[child] = list(self.tokens[parent])
        return child

    def free(self, seq_id) -> None:
        self.ops += 1
        if seq_id not in self.tokens:
            return
        self.a.free(seq_id)
        self.history.append(f"free({seq_id})")
        del self.tokens[seq_id]
        self.placeholders.discard(seq_id)

    # -- invariants -----------------------------------------------------------------------------
    def check_ref_counts(self) -> None:
        holders = [0] * self.num_blocks
        for s in self.tokens:
            for b in self.a.block_table(s):
                holders[b] += 1
        counts = [self.a.ref_count(b) for b in range(self.num_blocks)]
        for b in range(self.num_blocks):
            _require(
                holders[b] == counts[b],
                f"block {b} has ref_count {counts[b]} but {holders[b]} live block tables hold it",
            )
        _require(
            self.a.num_free_blocks == holders.count(0),
            f"num_free_blocks is {self.a.num_free_blocks}, but {holders.count(0)} blocks are held by nobody",
        )

    def _check_table(self, s) -> None:
        n = len(self.tokens[s]) + (s in self.placeholders)  # a placeholder holds a slot too
        n_blocks = len(self.a.block_table(s))
        _require(
            n_blocks == math.ceil(n / self.block_size),
            f"sequence {s} has {n} tokens but {n_blocks} blocks (expected ceil(n/B) = "
            f"{math.ceil(n / self.block_size)})",
        )
        _require(
            self.a.num_tokens(s) == n, f"sequence {s}: num_tokens is {self.a.num_tokens(s)}, {n} slots were reserved"
        )

    def check_tables(self) -> None:
        for s in self.tokens:
            self._check_table(s)

    def check_reads(self) -> None:
        for s, tokens in self.tokens.items():
            for p in range(len(tokens)):
                got = self.memory.get(self.a.slot(s, p))
                _require(
                    got == tuple(tokens[: p + 1]),
                    f"sequence {s} position {p}: slot {self.a.slot(s, p)} holds the K/V of {list(got) if got else got}, "
                    f"expected {tokens[: p + 1]} (another sequence wrote there)",
                )

    def check(self) -> None:
        self.check_ref_counts()
        self.check_tables()
        self.check_reads()


@dataclass(slots=True)
class ContractReport:
    """What :func:`check_contract` ran and the first violation (``error``), if any."""

    ok: bool
    num_runs: int
    num_ops: int
    error: str | None = None
    history: list[str] = field(default_factory=list)  # the failing run's operations, last ones

    def __bool__(self) -> bool:
        return self.ok


def check_contract(
    factory: Callable[[int, int], object], *, num_runs: int = 60, steps: int = 40, seed: int = 0
) -> ContractReport:
    """Run ``num_runs`` seeded random sequences of ``steps`` operations on ``factory(NUM_BLOCKS, B)``.

    The same rules as the stateful test: allocate a prompt (one of :data:`PREFIXES`, maybe cut,
    plus a random suffix), append a token (now and then reserving its slot one operation before
    its id is sampled), fork, free; :meth:`ContractModel.check` after each. The
    first violation or exception stops the check and is reported with the operations that led to it.
    """
    ops = 0
    for run in range(num_runs):
        rng = random.Random(seed * 100_003 + run)
        model = ContractModel(factory(NUM_BLOCKS, B))
        live: list = []
        try:
            for _ in range(steps):
                kind = rng.choices(("allocate", "append", "fork", "free"), weights=(3, 5, 1, 2))[0]
                if kind == "allocate" or not live:
                    prefix = rng.choice(PREFIXES)
                    tokens = prefix[: max(1, len(prefix) - rng.randrange(9) % 3)] + [
                        rng.randrange(4) for _ in range(rng.randrange(7))
                    ]
                    seq_id = model.allocate(tokens)
                    if seq_id is not None:
                        live.append(seq_id)
                elif kind == "append":
                    seq_id = rng.choice(live)
                    if rng.random() < 0.3:  # the slot of a token still being sampled
                        model.reserve(seq_id)
                    else:
                        model.append(seq_id, rng.randrange(4))
                elif kind == "fork":
                    child = model.fork(rng.choice(live))
                    if child is not None:
                        live.append(child)
                else:
                    model.free(live.pop(rng.randrange(len(live))))
                model.check()
        except Exception as exc:  # a violation, or a bug in the allocator: a report, not a crash
            message = str(exc) if isinstance(exc, ContractViolation) else f"{type(exc).__name__}: {exc}"
            return ContractReport(False, run + 1, ops + model.ops, message, model.history[-8:])
        ops += model.ops
    return ContractReport(True, num_runs, ops)

"""Lesson 5's exercises, checked against the engine itself: blocks held while decoding, the step in
which a request finishes, and your own block allocator under the real scheduler."""

from __future__ import annotations

import functools
import math

from paged_edu.core.allocator import BlockAllocator
from paged_edu.core.block_pool import OutOfBlocksError
from paged_edu.core.contract import check_contract
from paged_edu.lessons.exercises.framework import NOT_ANSWERED, Verdict, check_function, compare, register
from paged_edu.lessons.my_allocator import MyAllocator

# ----------------------------------------------------------------------------------------------
# 5.1  Blocks held after k decode steps
# ----------------------------------------------------------------------------------------------


def blocks_held(prompt_len, block_size, k):
    """After its prefill step and k decode steps, a request holds ceil((prompt_len + k) / B) blocks.

    The prefill step computes the prompt and samples token 1; each decode step first places the
    token sampled last (allocator.append_slots) and computes it. So k decode steps placed k tokens; the
    token sampled in the k-th one has no slot yet.
    """
    return math.ceil((prompt_len + k) / block_size)


def blocks_held_stub(prompt_len, block_size, k):
    raise NotImplementedError("Exercise 5.1: return the blocks a request holds after its prefill and k decode steps")


@functools.lru_cache(maxsize=1)
def _tiny():
    from paged_edu.labs.engine_lab import tiny_model

    return tiny_model()


def engine_blocks_held(prompt_len, block_size, k):
    """The engine's answer: run one request for 1 + k steps and read its block table's length."""
    from paged_edu.engine import Engine, SamplingParams

    engine = Engine(_tiny(), num_blocks=64, block_size=block_size, enable_prefix_caching=False)
    engine.add_request([3 + t % 400 for t in range(prompt_len)], SamplingParams(max_tokens=k + 2))
    for _ in range(1 + k):
        engine.step()
    (seq,) = engine.scheduler.running
    return len(engine.allocator.block_table(seq.seq_id))


CASES_5_1 = [
    (1, 4, 0),
    (4, 4, 0),
    (4, 4, 1),
    (7, 4, 1),
    (8, 4, 3),
    (9, 4, 3),
    (16, 16, 0),
    (16, 16, 1),
    (30, 16, 2),
    (30, 16, 3),
    (40, 16, 8),
    (33, 16, 15),
]


@register(
    "5.1",
    "Write blocks_held(prompt_len, block_size, k): how many blocks a request holds after its "
    "prefill step and k decode steps (checked against the engine).",
    blocks_held,
    kind="function",
)
def _check_5_1(fn) -> Verdict:
    verdict = check_function("blocks_held", fn, CASES_5_1, engine_blocks_held)
    if verdict.ok or NOT_ANSWERED in str(verdict):
        return verdict
    for wrong, meaning in WRONG_5_1.items():
        if all(_agrees(fn, wrong, case) for case in CASES_5_1):
            verdict.lines.append(f"    You computed {meaning}")
            break
    return verdict


def _agrees(fn, wrong, case) -> bool:
    try:
        return fn(*case) == wrong(*case)
    except Exception:
        return False


# Tempting wrong answers of 5.1 (prompt_len p, block_size B, k decode steps), with what differs.
WRONG_5_1 = {
    lambda p, B, k: math.ceil(
        (p + k + 1) / B
    ): "ceil((p + k + 1) / B): a slot for every sampled token, the k-th decode step's too. That token has no slot "
    "yet: a decode step first places the token sampled LAST (allocator.append_slots), computes it, and samples the "
    "next one, which gets its slot only in the following step. After k decode steps the request holds p + k "
    "tokens' slots.",
    lambda p, B, k: (
        math.ceil(p / B) + k
    ): "a new block per decode step: a step adds one token, and a new block only when the last one is full",
    lambda p, B, k: math.ceil(p / B): "the prompt's blocks only: each decode step places one more token",
}


# ----------------------------------------------------------------------------------------------
# 5.2  The step in which a request finishes
# ----------------------------------------------------------------------------------------------

MAX_TOKENS_5_2 = (5, 3, 8, 2, 6, 4)  # six requests, arriving together, short prompts
MAX_NUM_SEQS_5_2 = 2


def engine_finish_steps(max_tokens=MAX_TOKENS_5_2, max_num_seqs=MAX_NUM_SEQS_5_2) -> list[int]:
    """Run the requests through the engine; the step (from 0) in which each one finishes."""
    from paged_edu.engine import Engine, SamplingParams

    engine = Engine(_tiny(), num_blocks=64, block_size=4, max_num_seqs=max_num_seqs)
    ids = [engine.add_request([5 + i, 6 + i, 7 + i], SamplingParams(max_tokens=m)) for i, m in enumerate(max_tokens)]
    finished: dict[int, int] = {}
    while engine.has_unfinished():
        step = engine.step_count
        for out in engine.step():
            finished[out.request_id] = step
    return [finished[i] for i in ids]


def static_finish_steps(max_tokens=MAX_TOKENS_5_2, batch=MAX_NUM_SEQS_5_2) -> list[int]:
    """Static batching's answer: batches of ``batch`` run to their longest request."""
    steps, start = [], 0
    for i in range(0, len(max_tokens), batch):
        group = max_tokens[i : i + batch]
        steps += [start + max(group) - 1] * len(group)
        start += max(group)
    return steps


def _static_answers() -> set[int]:
    """What static batching would say for the last request: its batch's end, or its own end inside
    its batch (both also counted from 1)."""
    batch_end = static_finish_steps()[-1]
    last_batch_start = batch_end - max(MAX_TOKENS_5_2[-MAX_NUM_SEQS_5_2:]) + 1
    own_end = last_batch_start + MAX_TOKENS_5_2[-1] - 1
    return {batch_end, batch_end + 1, own_end, own_end + 1}


FINISH_STEP_5_2 = 14  # r0, r1 from step 0; r1 ends in 2, r2 starts in 3 (ends 10); r0 ends in 4, r3 runs 5-6;
# r4 starts in 7 (ends 12); r5 starts in 11 and its 4 tokens end in step 14.


@register(
    "5.2",
    f"Six requests with max_tokens {list(MAX_TOKENS_5_2)} (short prompts) arrive together; "
    f"max_num_seqs = {MAX_NUM_SEQS_5_2}. Counting steps from 0, in which step does the last one "
    "(request 5) finish?",
    FINISH_STEP_5_2,
)
def _check_5_2(answer) -> Verdict:
    expected = engine_finish_steps()[-1]
    verdict = compare("step in which request 5 finishes", answer, expected)
    if verdict.ok or answer is None:
        return verdict
    if answer == expected + 1:
        verdict.lines.append("    Steps count from 0 here: the first step (which prefills the first two) is step 0.")
    elif answer in _static_answers():
        verdict.lines.append(
            "    That is static batching (each pair runs to its longest request). Continuous batching "
            "admits a waiting request in the step after any running one finishes."
        )
    elif answer == expected - 1 or answer == expected - 2:
        verdict.lines.append(
            "    A freed place is taken in the *next* step: a request finishes in a step's update, and "
            "the step after it admits (prefills) the next waiting request."
        )
    return verdict


# ----------------------------------------------------------------------------------------------
# 5.3  Bring your own allocator
# ----------------------------------------------------------------------------------------------


class PlainAllocator(MyAllocator):
    """The reference: MyAllocator's four operations written out (no prefix cache)."""

    def allocate(self, seq_id, token_ids, *, record_stats=True):
        if seq_id in self.block_tables:
            raise ValueError(f"sequence id {seq_id!r} already exists")
        tokens = [int(t) for t in token_ids]
        if not tokens:
            raise ValueError("cannot allocate an empty prompt")
        needed = math.ceil(len(tokens) / self.block_size)
        if needed > len(self.free_block_ids):  # check first: a failed call changes nothing
            raise OutOfBlocksError(f"{seq_id!r} needs {needed} blocks, {len(self.free_block_ids)} free")
        table = [self.free_block_ids.popleft() for _ in range(needed)]
        for b in table:
            self.ref_counts[b] = 1
        self.block_tables[seq_id] = table
        self.lengths[seq_id] = len(tokens)
        return list(table)

    def append_slots(self, seq_id, num_tokens=1):
        table, B = self._table(seq_id), self.block_size
        t = self.lengths[seq_id]
        copy = t % B != 0 and self.ref_counts[table[-1]] > 1  # shared and partly filled: copy-on-write
        needed = math.ceil(max(num_tokens - (-t % B), 0) / B) + copy
        if needed > len(self.free_block_ids):  # check first: a failed call changes nothing
            raise OutOfBlocksError(
                f"{seq_id!r} needs {needed} blocks for {num_tokens} slots, {len(self.free_block_ids)} free"
            )
        if copy:
            block = self.free_block_ids.popleft()
            self.ref_counts[block] = 1
            self.ref_counts[table[-1]] -= 1
            self.copies.append((table[-1], block))
            table[-1] = block
        for _ in range(needed - copy):  # a new block each time the last one is full
            block = self.free_block_ids.popleft()
            self.ref_counts[block] = 1
            table.append(block)
        self.lengths[seq_id] = t + num_tokens
        return [table[p // B] * B + p % B for p in range(t, t + num_tokens)]

    def fork(self, parent_id, child_id):
        table = self._table(parent_id)
        if child_id in self.block_tables:
            raise ValueError(f"sequence id {child_id!r} already exists")
        for b in table:
            self.ref_counts[b] += 1
        self.block_tables[child_id] = list(table)
        self.lengths[child_id] = self.lengths[parent_id]
        return list(table)

    def free(self, seq_id):
        table = self._table(seq_id)
        del self.block_tables[seq_id], self.lengths[seq_id]
        for b in table:
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_block_ids.append(b)


def engine_agreement(allocator_cls, model=None, *, num_blocks: int = 12, block_size: int = 4) -> dict:
    """Run the same requests on an engine over ``allocator_cls`` and over the reference allocator.

    Greedy requests plus one of ``n = 3`` seeded samples (fork and copy-on-write), in a pool small
    enough to preempt. Returns both outputs and whether every block came back.
    """
    from paged_edu.engine import SamplingParams
    from paged_edu.labs.engine_lab import engine_on

    model = _tiny() if model is None else model
    vocab = model.config.vocab_size
    prompts = [[(7 * i + 3 * t) % (vocab - 3) + 3 for t in range(5 + 3 * i)] for i in range(5)]
    params = [SamplingParams(max_tokens=10)] * 4 + [SamplingParams(max_tokens=8, temperature=1.0, seed=5, n=3)]
    results = {}
    for name, cls in (("yours", allocator_cls), ("reference", BlockAllocator)):
        allocator = (
            cls(num_blocks, block_size)
            if cls is not BlockAllocator
            else BlockAllocator(num_blocks, block_size, enable_prefix_caching=False)
        )
        engine = engine_on(model, allocator)
        outs = engine.run(prompts, params)
        results[name] = [o.outputs for o in outs]
        results[f"{name}_leaked_blocks"] = allocator.num_blocks - allocator.num_free_blocks
        results[f"{name}_preemptions"] = engine.scheduler.num_preemptions
    return results


@register(
    "5.3",
    "Bring your own allocator: fill in MyAllocator's allocate, append_slots, fork and free "
    "(paged_edu/lessons/my_allocator.py); it must keep the allocator contract and give the engine "
    "token-identical output to the reference allocator.",
    PlainAllocator,
    kind="class",
)
def _check_5_3(cls) -> Verdict:
    if cls is None:
        return Verdict(False, ["[ ] allocator: not answered yet -- pass your allocator class"])
    report = check_contract(cls)
    if not report.ok:
        if report.error.startswith("NotImplementedError"):
            return Verdict(
                False, [f"[ ] allocator: not answered yet -- not written yet: {report.error.split(': ', 1)[-1]}"]
            )
        lines = [
            f"[ ] allocator contract: broken in random run {report.num_runs} after {report.num_ops} operations:",
            f"    {report.error}",
            "    the operations just before it:",
        ]
        lines += [f"      {op}" for op in report.history]
        return Verdict(False, lines)
    lines = [f"[x] allocator contract: kept over {report.num_ops:,} random operations in {report.num_runs} runs"]
    try:
        got = engine_agreement(cls)
    except Exception as exc:  # a learner's bug under the scheduler is a verdict, not a crash
        return Verdict(False, lines + [f"[ ] engine on your allocator raised {type(exc).__name__}: {exc}"])
    bad = [i for i, (a, b) in enumerate(zip(got["yours"], got["reference"])) if a != b]
    if bad:
        i = bad[0]
        return Verdict(
            False,
            lines
            + [
                f"[ ] engine output differs from the reference allocator's in request {i}: "
                f"{got['yours'][i]} vs {got['reference'][i]}"
            ],
        )
    if got["yours_leaked_blocks"]:
        return Verdict(
            False, lines + [f"[ ] the engine finished but {got['yours_leaked_blocks']} blocks were never freed"]
        )
    n_tokens = sum(len(s) for out in got["yours"] for s in out)
    lines.append(
        f"[x] engine on your allocator: {len(got['yours'])} requests ({n_tokens} tokens, "
        f"{got['yours_preemptions']} preemptions, a fork of 3 samples) token-identical to the reference"
    )
    return Verdict(True, lines)

"""Parallel sampling's record (:mod:`paged_edu.sched.parallel_sampling`) against a brute-force model,
and a check that the ``n > 1`` mechanism lives in that one module.

The model keeps one state per sample index -- ``"to_fork"``, ``"live"``, ``"finished"`` or
``"aborted"`` -- and the index of the sequence that forks the others, and applies the rules the
record's docstring states, written out case by case: random forks, finishes and aborts (of one sample
or all, before and after the fork, valid and not) must leave the record saying what the model says.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from paged_edu.sched.parallel_sampling import ParallelSamples
from paged_edu.sched.sequence import Sequence, SequenceStatus

ROOT = Path(__file__).resolve().parents[2]
STATUSES = (SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.SWAPPED)


class Model:
    """The brute-force truth: a state per sample index, the forking sequence's index, the sequences."""

    def __init__(self, n: int, parent: Sequence) -> None:
        self.state = {i: ("live" if i == 0 else "to_fork") for i in range(n)}
        self.parent_index = 0
        self.seq_of = {0: parent}  # sample index -> its sequence (live or finished)

    def indices(self, state: str) -> list[int]:
        return sorted(i for i, s in self.state.items() if s == state)


def check(record: ParallelSamples, model: Model) -> None:
    to_fork, live = model.indices("to_fork"), model.indices("live")
    assert record.num_tokens_to_sample == 1 + len(to_fork)
    if to_fork:
        assert live == [model.parent_index]
        parent = model.seq_of[model.parent_index]
        assert parent.sample_index == model.parent_index
        assert record.sample_indices(parent) == (model.parent_index, *to_fork)
    for i in live:
        seq = model.seq_of[i]
        others = any(model.seq_of[j].holds_blocks for j in live if j != i)
        assert record.shares_blocks(seq) == (bool(to_fork) or others)
    assert [record.has_ended(i) for i in range(len(model.state))] == [
        s in ("finished", "aborted") for _, s in sorted(model.state.items())
    ]
    assert record.done == (not to_fork and not live)
    if record.done:
        expected = [model.seq_of[i] if s == "finished" else None for i, s in sorted(model.state.items())]
        assert all(a is b for a, b in zip(record.in_order(), expected, strict=True))


def stop(record: ParallelSamples, seqs: list[Sequence]) -> None:
    """What Scheduler.abort does with the sequences the record says to stop."""
    for seq in seqs:
        seq.finish_reason = "abort"
        seq.status = SequenceStatus.FINISHED
        record.finish(seq)


def run_one(rng: random.Random, n: int) -> None:
    parent = Sequence(0, [1, 2, 3], 4, num_samples=n)
    parent.status = rng.choice(STATUSES)
    record, model = parent.samples, Model(n, parent)
    next_id = 1
    check(record, model)
    while not record.done:
        to_fork, live = model.indices("to_fork"), model.indices("live")
        op = rng.choice(["fork", "finish", "abort", "abort", "abort_all", "abort_ended", "abort_bad"])
        if op == "fork" and to_fork:  # the prompt's last chunk emits: one token per sample
            tokens = [100 + j for j in range(1 + len(to_fork))]
            own, forks = record.take_forks(model.seq_of[model.parent_index], tokens)
            assert (own, forks) == (100, [(i, 101 + j) for j, i in enumerate(to_fork)])
            for i, _ in forks:
                child = Sequence(next_id, [1, 2, 3], 4, request_id=0, sample_index=i)
                child.status = rng.choice(STATUSES)
                next_id += 1
                record.add(child)
                assert child.samples is record
                model.state[i], model.seq_of[i] = "live", child
        elif op == "fork":  # nothing left to fork: a wrong token count is refused, nothing changes
            with pytest.raises(ValueError, match="takes 1 token"):
                record.take_forks(model.seq_of[live[0]], [7, 8])
        elif op == "finish" and live and not to_fork:  # a sample ends (a sequence cannot end before its fork)
            i = rng.choice(live)
            model.seq_of[i].finish_reason = "length"
            record.finish(model.seq_of[i])
            model.state[i] = "finished"
        elif op == "abort" and (to_fork or live):
            i = rng.choice(to_fork + live)
            assert record.check_live(i) == i
            if model.state[i] == "to_fork":  # never forked: ends empty, stops nothing
                expected, model.state[i] = [], "aborted"
            elif to_fork:  # the forking sequence's own sample: it goes on as the next one to fork
                seq = model.seq_of.pop(i)
                model.state[i], model.parent_index = "aborted", to_fork[0]
                model.state[to_fork[0]], model.seq_of[to_fork[0]] = "live", seq
                expected = []
            else:
                expected, model.state[i] = [model.seq_of[i]], "finished"
            got = record.abort(i)
            assert got == expected
            stop(record, got)
        elif op == "abort_all":
            assert record.check_live(None) is None
            expected = [model.seq_of[i] for i in live]
            got = record.abort(None)
            assert sorted(got, key=id) == sorted(expected, key=id)
            stop(record, got)
            for i in to_fork:
                model.state[i] = "aborted"
            for i in live:
                model.state[i] = "finished"
        elif op == "abort_ended" and (ended := model.indices("finished") + model.indices("aborted")):
            with pytest.raises(ValueError, match="already finished"):
                record.check_live(rng.choice(ended))
        elif op == "abort_bad":
            with pytest.raises(ValueError, match="sample_index"):
                record.check_live(rng.choice([-1, n, n + 3]))
        check(record, model)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_the_record_agrees_with_a_brute_force_model_of_forks_finishes_and_aborts(n):
    rng = random.Random(n)
    for _ in range(300):
        run_one(rng, n)


def test_completed_names_each_request_once_when_several_samples_finish_in_one_step():
    a, b = Sequence(0, [1], 2, num_samples=2), Sequence(5, [1], 2)
    assert a.samples.take_forks(a, [3, 4]) == (3, [(1, 4)])
    child = Sequence(1, [1], 2, request_id=0, sample_index=1)
    a.samples.add(child)
    assert ParallelSamples.completed([a]) == []  # one of two samples finished... not yet booked
    for seq in (a, child, b):
        seq.samples.finish(seq)
    assert ParallelSamples.completed([a, child, b]) == [a.samples, b.samples]
    assert [r.request_id for r in ParallelSamples.completed([b, child, a])] == [5, 0]


def test_beam_branches_count_as_samples_but_are_never_forked_at_the_prompts_end():
    beam = Sequence(0, [1], 4, num_pending_forks=2)
    assert (beam.samples.n, beam.samples.num_tokens_to_sample, beam.max_num_running_seqs) == (3, 1, 3)
    branch = Sequence(1, [1], 4, request_id=0, sample_index=2)  # built to be forked: nothing of its own to fork
    assert (branch.samples.num_tokens_to_sample, branch.max_num_running_seqs) == (1, 1)


# -- n > 1 lives in one module ------------------------------------------------------------------
RECORD_MODULE = Path("paged_edu/sched/parallel_sampling.py")
PRIVATE = {"_to_fork", "_live_samples", "_finished_samples", "_aborted_samples"}
GONE = {"fork_indices"}  # the old per-sequence list of samples to fork


def outside_the_record(root: Path) -> list[str]:
    """Every place outside the record's module that touches its internals, assigns a sequence's
    ``sample_index`` (which the record renumbers on an abort before the fork), or builds a record
    anywhere but in ``Sequence``."""
    found = []
    for path in sorted((root / "paged_edu").rglob("*.py")):
        rel = path.relative_to(root)
        if rel == RECORD_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{rel}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE | GONE:
                found.append(f"{where} touches .{node.attr}")
            elif isinstance(node, ast.Attribute) and node.attr == "sample_index" and isinstance(node.ctx, ast.Store):
                found.append(f"{where} assigns .sample_index")
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "ParallelSamples"
                and rel != Path("paged_edu/sched/sequence.py")
            ):
                found.append(f"{where} builds a ParallelSamples")
    return found


def test_n_greater_than_one_is_handled_in_one_module():
    assert outside_the_record(ROOT) == []


@pytest.mark.parametrize(
    "source",
    [
        "def f(seq):\n    return seq.fork_indices\n",  # the old engine and scheduler
        "def f(seq):\n    seq.sample_index = 2\n",  # the old Engine._abort renumbering
        "def f(r):\n    return r._to_fork\n",
        "def f(seq):\n    return ParallelSamples(seq, 3)\n",
    ],
)
def test_the_one_module_check_fails_on_n_logic_elsewhere(tmp_path, source):
    (tmp_path / "paged_edu" / "engine").mkdir(parents=True)
    (tmp_path / "paged_edu" / "engine" / "engine.py").write_text(source)
    assert len(outside_the_record(tmp_path)) == 1

"""The one validation module: integers, token lists, seeds.

Expected outcomes are stated from the rule ("an integer is anything with __index__ except bool;
a token list is an ordered collection of integers in [0, 2**63)"), not read back from the code.
"""

from array import array

import numpy as np
import pytest

from paged_edu.core import validation as check


# -- as_int / integer ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3), np.int32(3)])
def test_integers_of_any_integer_type_are_python_ints(value):
    assert check.as_int(value, "n must be an integer") == 3
    assert type(check.integer("n", value)) is int


@pytest.mark.parametrize("value", [True, False, np.True_, 3.0, np.float64(3), "3", None, [3]])
def test_bools_floats_and_strings_are_not_integers(value):
    with pytest.raises(TypeError, match="^n must be an integer, got"):
        check.integer("n", value)


def test_integer_bounds_are_inclusive_and_named():
    assert check.integer("n", 1, low=1, high=5) == 1 and check.integer("n", 5, low=1, high=5) == 5
    with pytest.raises(ValueError, match=r"n must be >= 1, got 0"):
        check.integer("n", 0, low=1)
    with pytest.raises(ValueError, match=r"n must be in \[1, 5\], got 6"):
        check.integer("n", 6, low=1, high=5)
    with pytest.raises(ValueError, match=r"n must be <= 5, got 6"):
        check.integer("n", 6, high=5)


# -- fraction / choice --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 0.5, np.float32(0.25), np.int64(1), 1e-9])
def test_fractions_are_real_numbers_in_0_to_1(value):
    assert check.fraction("u", value) == float(value)


@pytest.mark.parametrize(
    "value, exc",
    [
        (0, ValueError),
        (1.5, ValueError),
        (float("nan"), ValueError),
        (-0.1, ValueError),
        (True, TypeError),
        ("0.5", TypeError),
        (None, TypeError),
    ],
)
def test_bad_fractions_are_refused_naming_the_field(value, exc):
    with pytest.raises(exc, match=r"^u must be (in \(0, 1\]|a real number), got") as info:
        check.fraction("u", value)
    assert info.value.field == "u" and isinstance(info.value, ValueError)  # a wrong kind is a ValueError too


def test_a_choice_is_one_of_the_names_and_the_message_lists_them():
    assert check.choice("mode", "swap", ("recompute", "swap")) == "swap"
    for bad in ("drop", None, 1, ["swap"]):
        with pytest.raises(ValueError, match=r"^unknown mode .*: mode must be one of 'recompute', 'swap'$") as info:
            check.choice("mode", bad, ("recompute", "swap"))
        assert info.value.field == "mode"


# -- seed ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 2**64 - 1, np.uint64(2**64 - 1), np.int64(7)])
def test_seeds_are_integers_in_0_to_2_pow_64(value):
    assert check.seed("seed", value) == int(value)


@pytest.mark.parametrize(
    "value, exc",
    [
        (2**64, ValueError),
        (-1, ValueError),
        (True, TypeError),
        (1.0, TypeError),
        ("1", TypeError),
        (None, TypeError),
    ],
)
def test_bad_seeds_are_refused_naming_the_argument(value, exc):
    with pytest.raises(exc, match="^seed must"):
        check.seed("seed", value)


# -- token lists ---------------------------------------------------------------------------------


def _gen(values):
    yield from values


@pytest.mark.parametrize(
    "value",
    [
        [1, 2, 3],
        (1, 2, 3),
        range(1, 4),
        np.array([1, 2, 3]),
        np.array([1, 2, 3], dtype=np.uint16),
        [np.int64(1), np.int32(2), 3],
        array("q", [1, 2, 3]),
        _gen([1, 2, 3]),
        iter([1, 2, 3]),
    ],
)
def test_any_ordered_collection_of_integers_is_a_token_list(value):
    tokens = check.token_list("prompt", value)
    assert tokens == [1, 2, 3] and all(type(t) is int for t in tokens)
    assert check.token_array("prompt", [1, 2, 3]) == array("q", [1, 2, 3])


def test_the_empty_list_is_a_token_list_and_the_largest_int64_is_a_token():
    assert check.token_list("prompt", []) == []
    assert check.token_list("prompt", [2**63 - 1]) == [2**63 - 1]


@pytest.mark.parametrize(
    "value",
    [
        b"abcdefgh",
        bytearray(b"abcdefgh"),
        memoryview(b"abcdefgh"),
        "abc",
        {1, 2},
        frozenset({1}),
        {1: 2},
        5,
        None,
        2.5,
        np.array(3),
    ],
)
def test_bytes_strings_unordered_collections_and_scalars_are_refused(value):
    # array('q', b"abcdefgh") would read the 8 bytes as ONE token, 7523094288207667809.
    with pytest.raises(TypeError, match="^prompt must be a sequence of integer token ids, got"):
        check.token_list("prompt", value)


@pytest.mark.parametrize(
    "value, position, kind",
    [
        ([np.int64(1), 2.5], 1, "float"),  # the float is to blame, not the numpy int before it
        ([1, 2, True], 2, "bool"),
        ((1, False), 1, "bool"),
        (_gen([1, 2, True]), 2, "bool"),  # a generator is read once, then checked like a list
        ([0, 1, np.True_], 2, "bool"),
        ([2**40, False], 1, "bool"),  # a list is scanned for 0 and 1 first: False equals 0
        ([np.int64(7), True], 1, "bool"),  # and True equals 1
        (np.array([True, False]), 0, "bool"),
        ([1, "2"], 1, "str"),
        ([1, None], 1, "NoneType"),
        ([1, [2]], 1, "list"),
        (np.array([1.0, 2.0]), 0, "float"),
        (np.array([[1, 2]]), 0, "ndarray"),
    ],
)
def test_the_first_element_that_is_not_an_integer_is_named_with_its_position(value, position, kind):
    with pytest.raises(TypeError, match=rf"^prompt must be a sequence of integers: element {position} is {kind}"):
        check.token_list("prompt", value)


@pytest.mark.parametrize(
    "value, position, words",
    [
        ([1, -2, -3], 1, "non-negative"),
        ([2**40, np.int64(-1)], 1, "non-negative"),
        ([5, 2**63], 1, "64 bits"),
        ([2**70], 0, "64 bits"),
        ([np.uint64(2**63)], 0, "64 bits"),
        (_gen([3, -1]), 1, "non-negative"),
    ],
)
def test_out_of_range_token_ids_are_named_with_their_position(value, position, words):
    with pytest.raises(ValueError, match=rf"{words}.*element {position} is"):
        check.token_list("prompt", value)


@pytest.mark.parametrize(
    "value, exc",
    [(5, None), (np.int64(5), None), (True, TypeError), (5.0, TypeError), (-1, ValueError), (2**63, ValueError)],
)
def test_one_token_id(value, exc):
    if exc is None:
        assert check.token_id("token id", value) == 5
    else:
        with pytest.raises(exc, match="^token id must"):
            check.token_id("token id", value)


def test_the_seed_range_is_stated_as_a_power_of_two():
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\), got 18446744073709551616"):
        check.seed("seed", 2**64)


# -- settings refused naming their field, at every entry of the scheduler and the simulator ------


def _settings_cases():
    from paged_edu.core.allocator import BlockAllocator
    from paged_edu.sched.policy import LongestPrefixFirst
    from paged_edu.sched.scheduler import Scheduler
    from paged_edu.sched.sequence import Sequence
    from paged_edu.sched.swap import SwapSpace
    from paged_edu.sim.managers import make_manager
    from paged_edu.sim.request import Request
    from paged_edu.sim.results import SimConfig
    from paged_edu.sim.simulator import simulate

    pool = lambda: BlockAllocator(8, 4, cache_when_computed=True)  # noqa: E731
    one = [Request(0.0, 10, 5)]
    return [
        # (what, call, the error's field, its kind)
        ("Sequence max_new_tokens=True", lambda: Sequence(0, [1], True), "max_new_tokens", TypeError),
        ("Sequence num_samples=True", lambda: Sequence(0, [1], 2, num_samples=True), "num_samples", TypeError),
        (
            "Sequence num_pending_forks=True",
            lambda: Sequence(0, [1], 2, num_pending_forks=True),
            "num_pending_forks",
            TypeError,
        ),
        ("Sequence max_new_tokens=0", lambda: Sequence(0, [1], 0), "max_new_tokens", ValueError),
        ("Sequence empty prompt", lambda: Sequence(0, [], 2), "prompt_token_ids", ValueError),
        ("SwapSpace True", lambda: SwapSpace(True), "num_cpu_blocks", TypeError),
        ("LongestPrefixFirst window=0", lambda: LongestPrefixFirst(window=0), "window", ValueError),
        ("Scheduler max_num_seqs=True", lambda: Scheduler(pool(), max_num_seqs=True), "max_num_seqs", TypeError),
        ("Scheduler preemption_mode", lambda: Scheduler(pool(), preemption_mode="drop"), "preemption_mode", ValueError),
        (
            "Scheduler swap without blocks",
            lambda: Scheduler(pool(), preemption_mode="swap"),
            "num_cpu_blocks",
            ValueError,
        ),
        (
            "Scheduler chunked prefill 'no'",
            lambda: Scheduler(pool(), enable_chunked_prefill="no"),
            "enable_chunked_prefill",
            TypeError,
        ),
        ("admission: the pool", lambda: Scheduler(pool()).make_sequence([1] * 30, 3), "num_blocks", ValueError),
        (
            "admission: max_num_seqs",
            lambda: Scheduler(pool(), max_num_seqs=1).make_sequence([1], 2, num_samples=2),
            "max_num_seqs",
            ValueError,
        ),
        (
            "admission: max_model_len",
            lambda: Scheduler(pool(), max_model_len=4).make_sequence([1] * 4, 2),
            "max_model_len",
            ValueError,
        ),
        ("SimConfig manager", lambda: SimConfig(manager="buddy"), "manager", ValueError),
        ("SimConfig sample_every=True", lambda: SimConfig(sample_every=True), "sample_every", TypeError),
        (
            "SimConfig gpu_memory_utilization",
            lambda: SimConfig(gpu_memory_utilization=1.5),
            "gpu_memory_utilization",
            ValueError,
        ),
        ("make_manager block_size", lambda: make_manager("paged", 100, block_size=0), "block_size", ValueError),
        ("make_manager one block", lambda: make_manager("paged", 10, block_size=16), "num_kv_slots", ValueError),
        ("simulate num_kv_slots=1e4", lambda: simulate(one, SimConfig(num_kv_slots=1e4)), "num_kv_slots", TypeError),
        ("simulate max_seq_len", lambda: simulate(one, SimConfig(max_seq_len=8)), "max_seq_len", ValueError),
        (
            "simulate max_num_seqs",
            lambda: simulate([Request(0.0, 10, 5, n=4)], SimConfig(max_num_seqs=2)),
            "max_num_seqs",
            ValueError,
        ),
    ]


@pytest.mark.parametrize("index", range(22))
def test_settings_are_refused_with_their_field(index):
    """The field names the setting (what a command line maps to its flag); a wrong kind is a TypeError,
    and -- as every bad setting -- a ValueError too."""
    what, call, field, kind = _settings_cases()[index]
    with pytest.raises(kind) as info:
        call()
    assert info.value.field == field, what
    assert isinstance(info.value, ValueError), what


def test_the_case_list_is_what_the_test_runs():
    assert len(_settings_cases()) == 22


# -- integer fields refuse floats and bools alike, wherever they are read (issue 44 item 8) ---------


def _integer_field_cases():
    """``(what, call(value), the field its message names)``: each call takes ``value`` where an
    integer belongs; 1 would be accepted there."""
    from paged_edu.core.allocator import BlockAllocator
    from paged_edu.core.hardware import MODELS
    from paged_edu.core.memory import kv_bytes, max_requests_contiguous, max_requests_paged
    from paged_edu.sched.scheduler import Scheduler
    from paged_edu.sched.sequence import Sequence
    from paged_edu.sim import prefix_workloads, workloads
    from paged_edu.sim.costmodel import CostModel, StepShape
    from paged_edu.sim.managers import ContiguousManager

    model = MODELS["llama-3-8b"]

    def allocator():
        a = BlockAllocator(8, 4)
        a.allocate("s", [1, 2, 3])
        return a

    def contiguous():
        m = ContiguousManager(100, "max", 10)
        m.allocate("s", [1, 2])
        return m

    def sampled(token):
        scheduler = Scheduler(BlockAllocator(8, 4, cache_when_computed=True))
        seq = scheduler.make_sequence([1, 2], 3)
        scheduler.update(scheduler.schedule(), {seq.seq_id: token})

    return [
        ("BlockAllocator.append_slots", lambda v: allocator().append_slots("s", v), "num_tokens"),
        ("ContiguousManager.append_slots", lambda v: contiguous().append_slots("s", v), "num_tokens"),
        ("kv_bytes", lambda v: kv_bytes(model, v), "num_tokens"),
        ("max_requests_contiguous", lambda v: max_requests_contiguous(v, model, 100), "budget_bytes"),
        ("max_requests_paged", lambda v: max_requests_paged(v, model, 100), "budget_bytes"),
        ("ModelGeometry.block_bytes", lambda v: model.block_bytes(v), "block_size"),
        ("Sequence sample_index", lambda v: Sequence(0, [1], 2, sample_index=v), "sample_index"),
        ("Scheduler.update, a sampled token", sampled, "token"),
        ("CostModel block_size", lambda v: CostModel(block_size=v), "block_size"),
        ("CostModel.decode_step_time batch", lambda v: CostModel().decode_step_time(v, 100), "batch"),
        ("StepShape.add", lambda v: StepShape().add(v, 1, True), "start"),
        ("workloads.sharegpt seed", lambda v: workloads.sharegpt(3, seed=v), "seed"),
        ("prefix_workloads.multiturn seed", lambda v: prefix_workloads.multiturn(3, seed=v), "seed"),
    ]


@pytest.mark.parametrize("value", [1.0, True, np.float64(1.0), np.True_], ids=["1.0", "True", "np1.0", "npTrue"])
@pytest.mark.parametrize("index", range(13))
def test_integer_fields_refuse_floats_and_bools_alike(index, value):
    """``append_slots(seq, 1.0)`` and ``append_slots(seq, True)`` were taken as 1 (2.0 was refused):
    every integer field goes through ``validation.integer``, which refuses both."""
    what, call, field = _integer_field_cases()[index]
    with pytest.raises(TypeError, match=field) as info:
        call(value)
    assert "integer" in str(info.value), what


def test_the_integer_field_cases_are_what_the_test_runs():
    assert len(_integer_field_cases()) == 13

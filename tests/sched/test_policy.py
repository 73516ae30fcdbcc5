"""Cache-aware admission (LPM) and its starvation bound; the prefix workloads; paged-radix in the CLI."""

import json
from collections import deque
from types import SimpleNamespace

import pytest

from paged_edu import BlockAllocator
from paged_edu.core.radix_cache import RadixAllocator
from paged_edu.sched.policy import LongestPrefixFirst
from paged_edu.sched.scheduler import Scheduler
from paged_edu.sim import prefix_workloads
from paged_edu.cli import main

SHARED = list(range(100, 132))  # 32 tokens: 2 blocks of 16


def _run(scheduler, until_done):
    """Step the scheduler, sampling token 1 for every emitting chunk; return admission order."""
    order = []
    for _ in range(500):
        out = scheduler.schedule()
        order += [
            item.seq.seq_id
            for item in out.scheduled
            if item.start == item.seq.num_cached_tokens and item.seq.seq_id not in order
        ]
        scheduler.update(out, {item.seq.seq_id: 1 for item in out.scheduled if item.emits_token})
        if not scheduler.has_unfinished() or until_done(order):
            return order
    raise AssertionError("did not finish")


@pytest.mark.parametrize(
    "make",
    [
        lambda: BlockAllocator(64, 16, cache_when_computed=True),
        lambda: RadixAllocator(64, 16, cache_when_computed=True),
    ],
)
@pytest.mark.parametrize("policy, expected", [("fcfs", ["cold", "warm"]), ("lpm", ["warm", "cold"])])
def test_lpm_admits_the_request_whose_prefix_is_cached_first(make, policy, expected):
    s = Scheduler(make(), max_num_seqs=1, policy=policy)
    first = s.make_sequence(SHARED + [7], 2)
    _run(s, lambda order: False)  # computes and caches SHARED, then finishes
    assert first.is_finished
    cold = s.make_sequence(list(range(500, 540)), 2)
    warm = s.make_sequence(SHARED + [8, 9], 2)
    names = {cold.seq_id: "cold", warm.seq_id: "warm"}
    order = _run(s, lambda order: len(order) == 2)
    assert [names[i] for i in order] == expected
    assert warm.num_cached_tokens == 32 and cold.num_cached_tokens == 0


def _starved_round(max_wait_rounds, rounds):
    """One request with no cached prefix, and each round a new request with a cached one arrives and
    the head of the queue is admitted. The round in which the cold request is admitted (None: never)."""
    policy = LongestPrefixFirst(max_wait_rounds=max_wait_rounds)
    cached = {}
    manager = SimpleNamespace(num_cached_tokens_for=lambda tokens: cached[tuple(tokens)])
    cold = SimpleNamespace(seq_id=0, token_ids=[0])
    cached[(0,)] = 0
    waiting = deque([cold])
    for r in range(1, rounds + 1):
        warm = SimpleNamespace(seq_id=r, token_ids=[r])
        cached[(r,)] = 64
        waiting.append(warm)
        policy.order(waiting, manager)
        if waiting.popleft() is cold:
            return r
    return None


@pytest.mark.parametrize("k", [1, 3, 10])
def test_starvation_is_bounded_by_max_wait_rounds(k):
    """Admitted in round k + 1 exactly: the bound is tight, and without aging it would starve."""
    assert _starved_round(k, 50) == k + 1
    assert _starved_round(1000, 50) is None


def test_policy_is_validated_and_fcfs_is_the_default():
    assert Scheduler(BlockAllocator(8, 4, cache_when_computed=True)).policy == "fcfs"
    with pytest.raises(ValueError, match="policy"):
        Scheduler(BlockAllocator(8, 4, cache_when_computed=True), policy="lifo")
    with pytest.raises(ValueError, match="before their K/V is computed"):  # the radix cache too
        Scheduler(RadixAllocator(8, 4, cache_when_computed=False))
    with pytest.raises(ValueError, match="max_wait_rounds"):
        LongestPrefixFirst(max_wait_rounds=0)


def test_multiturn_prompts_hold_the_whole_conversation_so_far():
    reqs = prefix_workloads.multiturn(12, num_turns=3)
    convs = 4
    for i in range(convs, 12):
        earlier, now = reqs[i - convs].prompt, reqs[i].prompt
        assert now[: len(earlier)] == earlier and len(now) == len(earlier) + 96 + 64


@pytest.mark.parametrize("manager", ["paged-prefix", "paged-radix"])
def test_a_second_turn_hits_the_blocks_of_the_first_turns_reply(manager):
    """Issue 21: the simulator generates the reply the next turn's prompt quotes, so the cache holds it.

    One conversation of two turns, the second arriving long after the first finished, a roomy pool.
    Turn 1 stores its prompt and all but its last sampled token (64 + 96 - 1 = 159 tokens: 9 full
    blocks of 16); turn 2's prompt (64 + 96 + 64 = 224 tokens) starts with all of them, so it hits
    144 tokens. With made-up reply ids it would hit only turn 1's prompt (64).
    """
    from paged_edu.sim.results import SimConfig
    from paged_edu.sim.simulator import simulate

    reqs = prefix_workloads.multiturn(2, num_turns=2)
    assert reqs[1].prompt[: 64 + 96] == reqs[0].prompt + reqs[0].output  # the prompt quotes the reply
    reqs[1].arrival_time = 1000.0  # long after turn 1 finished
    result = simulate(reqs, SimConfig(manager=manager, block_size=16, num_kv_slots=4096))
    block = 16
    hit = (64 + 96 - 1) // block * block
    assert hit == 144
    assert result.prefix_hit_rate == pytest.approx(hit / (64 + 224))


def test_a_reply_named_in_a_trace_round_trips_and_is_checked(tmp_path):
    from paged_edu.sim.request import Request, load_trace, save_trace

    reqs = [Request(0.0, 3, 2, prompt=[1, 2, 3], output=[7, 8])]
    save_trace(reqs, tmp_path / "t.jsonl")
    assert load_trace(tmp_path / "t.jsonl")[0].output == [7, 8]
    with pytest.raises(ValueError, match="output_len 3 disagrees with the 2 output tokens"):
        Request(0.0, 3, 3, prompt=[1, 2, 3], output=[7, 8])
    with pytest.raises(ValueError, match="names one sample"):
        Request(0.0, 3, 2, prompt=[1, 2, 3], output=[7, 8], n=2)


def test_fewshot_and_agent_prompts_share_exactly_their_declared_heads():
    few = prefix_workloads.fewshot(30, seed=1)
    heads = {tuple(r.prompt[:128]) for r in few}
    assert len(heads) == 1 and all(len(r.prompt) == 128 + 4 * 96 + 32 for r in few)
    orders = {tuple(r.prompt[128 : 128 + 96]) for r in few}
    assert len(orders) > 1  # the first example varies
    calls = prefix_workloads.agents(40, seed=2, num_tasks=1)
    assert len({tuple(r.prompt[:256]) for r in calls}) == 1
    assert len({tuple(r.prompt[-16:]) for r in calls}) == 40  # every call's own instruction is fresh
    with pytest.raises(ValueError, match="shots"):
        prefix_workloads.fewshot(4, shots=9, num_examples=8)


def test_cli_simulates_both_prefix_caches_with_lpm(tmp_path, capsys):
    out = tmp_path / "sim.json"
    argv = [
        "simulate",
        "--workload",
        "multiturn",
        "--num-requests",
        "60",
        "--seed",
        "0",
        "--managers",
        "paged,paged-prefix,paged-radix",
        "--block-sizes",
        "16",
        "--policy",
        "lpm",
        "--no-progress",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    records = json.loads(out.read_text())
    assert [(r["manager"], r["policy"]) for r in records] == [
        ("paged", "lpm"),
        ("paged-prefix", "lpm"),
        ("paged-radix", "lpm"),
    ]
    assert records[0]["prefix_hit_rate"] == 0 < records[1]["prefix_hit_rate"]
    assert records[2]["prefix_hit_rate"] == pytest.approx(records[1]["prefix_hit_rate"], rel=0.2)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--policy", "longest"])
    assert exc.value.code == 2 and "--policy" in capsys.readouterr().err

"""Lesson 6's experiments: an engine on more requests than its KV pool holds.

* :func:`pressure_prompts` -- seeded prompts of one length (a workload that arrives all at once);
* :func:`run_under_pressure` -- run them through an :class:`~paged_edu.engine.Engine` of
  ``num_blocks`` blocks in one preemption mode and record every step's event: who was preempted
  (and whether swapped or recomputed), who was scheduled, the blocks swapped each way, and every
  request's tokens and inter-token latencies -- a :class:`PressureRun`;
* :func:`blocks_needed` -- the pool that holds every request at its full length at once (no preemption);
* :func:`output_mismatches` -- the requests whose tokens differ between two runs (the check that
  preemption changes nothing a learner can see);
* :func:`victim_rule_violations` -- every preemption checked against vLLM's rule, "the most recently
  admitted running sequence goes first", recomputed from the event stream alone.

The victim rule is the scheduler's (:meth:`paged_edu.sched.scheduler.Scheduler.schedule`); this
module only observes it.
"""

from __future__ import annotations

import bisect
import statistics
import time
from dataclasses import dataclass, field

import torch

from paged_edu.engine import Engine, SamplingParams
from paged_edu.engine.outputs import RequestMetrics, StepMetrics

__all__ = [
    "PressureRun",
    "blocks_needed",
    "output_mismatches",
    "pressure_prompts",
    "remedy_rows",
    "run_under_pressure",
    "victim_rule_violations",
]


def pressure_prompts(num_requests: int, prompt_len: int, vocab_size: int, *, seed: int = 0) -> list[list[int]]:
    """``num_requests`` prompts of ``prompt_len`` random token ids below ``vocab_size`` (seeded)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (num_requests, prompt_len), generator=g).tolist()


def blocks_needed(prompts: list[list[int]], max_new_tokens: int, block_size: int) -> int:
    """Blocks that hold every request at its full length at the same time: no preemption can happen."""
    return sum(-(-(len(p) + max_new_tokens) // block_size) for p in prompts)


@dataclass
class PressureRun:
    """One run: its settings, every step's event, every request's output and metrics, and its cost."""

    mode: str
    num_blocks: int
    block_size: int
    settings: dict
    outputs: dict[int, list[int]]  # request id -> new tokens
    steps: list[StepMetrics]
    requests: dict[int, RequestMetrics]
    finished_at: dict[int, int]  # request id -> step in which it finished
    wall_time: float  # seconds for the whole run
    block_bytes: int  # one block over all layers, K and V
    blocks_swapped_out: int
    blocks_swapped_in: int
    token_times: dict[int, list[float]] = field(default_factory=dict)  # request id -> time of each token

    @property
    def num_preemptions(self) -> int:
        return sum(len(s.preempted) for s in self.steps)

    @property
    def preemptions(self) -> list[dict]:
        """Every preemption in order: step, time, request, how (swap / recompute)."""
        return [
            {"step": s.step, "time": s.time, "request_id": rid, "seq_id": sid, "how": how}
            for s in self.steps
            for rid, sid, how in s.preempted
        ]

    def resumptions(self) -> list[dict]:
        """For every preemption, the next step that computed tokens for that request again."""
        out = []
        for p in self.preemptions:
            nxt = next(
                (s for s in self.steps if s.step > p["step"] and p["request_id"] in s.scheduled_request_ids), None
            )
            out.append(
                {
                    **p,
                    "resumed_step": None if nxt is None else nxt.step,
                    "resumed_time": None if nxt is None else nxt.time,
                }
            )
        return out

    @property
    def bytes_moved(self) -> int:
        """KV bytes copied between GPU and CPU memory (both directions)."""
        return (self.blocks_swapped_out + self.blocks_swapped_in) * self.block_bytes

    @property
    def prefill_tokens(self) -> int:
        """Prompt (and recomputed) tokens the model computed: recompute preemption adds to these."""
        return sum(s.num_prefill_tokens for s in self.steps)

    @property
    def itls(self) -> list[float]:
        return [x for m in self.requests.values() for x in m.inter_token_latencies]

    def itl_summary(self) -> dict[str, float]:
        """Median, p99 and max inter-token latency (seconds) and max / median: the spike factor."""
        itl = sorted(self.itls)
        median = statistics.median(itl)
        p99 = itl[min(len(itl) - 1, int(0.99 * len(itl)))]
        return {"median": median, "p99": p99, "max": itl[-1], "spike": itl[-1] / median}

    def itl_steps(self) -> dict[int, list[int]]:
        """Per request, the engine steps between consecutive tokens (1 = no stall; deterministic)."""
        ends = [s.time for s in self.steps]
        out = {}
        for rid, times in self.token_times.items():
            idx = [bisect.bisect_left(ends, t) for t in times]
            out[rid] = [b - a for a, b in zip(idx, idx[1:])]
        return out

    def first_victim(self) -> int | None:
        """The request preempted first (None when nothing was)."""
        p = self.preemptions
        return p[0]["request_id"] if p else None


def run_under_pressure(
    model,
    prompts: list[list[int]],
    num_blocks: int,
    mode: str = "recompute",
    *,
    max_new_tokens: int = 32,
    block_size: int = 8,
    num_cpu_blocks: int | None = None,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 2048,
) -> PressureRun:
    """Greedy-decode ``prompts`` (all queued at once) on an engine of ``num_blocks`` GPU blocks."""
    settings = {
        "num_cpu_blocks": num_cpu_blocks,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_new_tokens": max_new_tokens,
    }
    with Engine(
        model,
        num_blocks=num_blocks,
        block_size=block_size,
        enable_prefix_caching=False,
        preemption_mode=mode,
        num_cpu_blocks=num_cpu_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    ) as engine:
        steps: list[StepMetrics] = []
        requests: dict[int, RequestMetrics] = {}
        finished_at: dict[int, int] = {}

        def on_event(event) -> None:
            if isinstance(event, StepMetrics):
                steps.append(event)
            else:
                requests[event.request_id] = event
                finished_at[event.request_id] = steps[-1].step if steps else 0

        engine.subscribe(on_event)
        engine.add_requests(prompts, [SamplingParams(max_tokens=max_new_tokens) for _ in prompts])
        outputs: dict[int, list[int]] = {}
        token_times: dict[int, list[float]] = {}
        t0 = time.perf_counter()
        while engine.has_unfinished():
            for out in engine.step():
                outputs[out.request_id] = out.outputs[0]
        wall = time.perf_counter() - t0
        for rid, m in requests.items():  # token times from the first token and the gaps after it
            times = [m.first_token_time]
            for gap in m.inter_token_latencies:
                times.append(times[-1] + gap)
            token_times[rid] = times
        return PressureRun(
            mode,
            num_blocks,
            block_size,
            settings,
            outputs,
            steps,
            requests,
            finished_at,
            wall,
            engine.kv_cache.block_bytes,
            engine.num_blocks_swapped_out,
            engine.num_blocks_swapped_in,
            token_times,
        )


def output_mismatches(run: PressureRun, reference: PressureRun) -> list[int]:
    """Request ids whose tokens differ between ``run`` and ``reference`` (empty: token-identical)."""
    ids = sorted(set(run.outputs) | set(reference.outputs))
    return [rid for rid in ids if run.outputs.get(rid) != reference.outputs.get(rid)]


def admission_steps(run: PressureRun) -> dict[int, list[int]]:
    """For every request, the steps at which it (re)started running: its first scheduled step, and
    the first step that scheduled it after each preemption."""
    admitted: dict[int, list[int]] = {}
    out_since: dict[int, bool] = {}
    for s in run.steps:
        for rid in s.scheduled_request_ids:
            if rid not in admitted or out_since.get(rid):
                admitted.setdefault(rid, []).append(s.step)
                out_since[rid] = False
        for rid, _, _ in s.preempted:
            out_since[rid] = True
    return admitted


def victim_rule_violations(run: PressureRun) -> list[str]:
    """Preemptions that broke "most recently admitted first", from the event stream alone.

    A victim at step k must have been (re)admitted no earlier than every request that kept running
    through step k (ran in step k-1, did not finish there, was not preempted at k).
    """
    admitted = admission_steps(run)
    by_step = {s.step: s for s in run.steps}
    problems = []
    for s in run.steps:
        if not s.preempted or s.step - 1 not in by_step:
            continue
        before = by_step[s.step - 1]
        victims = {rid for rid, _, _ in s.preempted}
        kept = [r for r in before.scheduled_request_ids if run.finished_at.get(r) != before.step and r not in victims]

        def last_admission(rid: int) -> int:
            return max(a for a in admitted[rid] if a < s.step)

        for rid in victims:
            if rid not in before.scheduled_request_ids:
                continue  # preempted again before it ran (a swap-in fallback); nothing to compare
            younger = [r for r in kept if last_admission(r) > last_admission(rid)]
            if younger:
                problems.append(
                    f"step {s.step}: request {rid} (admitted at step {last_admission(rid)}) was preempted "
                    f"while {younger} (admitted later) kept running"
                )
    return problems


def remedy_rows(
    model, prompts, num_blocks: int, cases: dict[str, dict], *, max_new_tokens: int = 32, block_size: int = 8
) -> list[dict]:
    """One run per case (``{label: {"mode": ..., engine knobs...}}``) on the same requests and pool:
    preemptions, the longest stall in steps, ITL median / p99 / max (ms), KV bytes moved, recomputed
    prompt tokens and wall time."""
    rows = []
    base_prefill = sum(len(p) for p in prompts)
    for label, knobs in cases.items():
        knobs = dict(knobs)
        mode = knobs.pop("mode", "recompute")
        run = run_under_pressure(
            model, prompts, num_blocks, mode, max_new_tokens=max_new_tokens, block_size=block_size, **knobs
        )
        itl = run.itl_summary()
        gaps = [g for v in run.itl_steps().values() for g in v]
        rows.append(
            {
                "case": label,
                "preemptions": run.num_preemptions,
                "max_gap_steps": max(gaps),
                "itl_median_ms": 1e3 * itl["median"],
                "itl_p99_ms": 1e3 * itl["p99"],
                "itl_max_ms": 1e3 * itl["max"],
                "bytes_moved": run.bytes_moved,
                "recomputed_tokens": run.prefill_tokens - base_prefill,
                "wall_s": run.wall_time,
                "run": run,
            }
        )
    return rows

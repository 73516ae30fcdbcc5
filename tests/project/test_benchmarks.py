"""The benchmark scripts run (tiny settings on the CPU) and write their records; speed targets are
not asserted here -- they live in the benchmarks' own output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_record_names_the_command_the_commit_and_the_machine(monkeypatch):
    from record import provenance

    monkeypatch.delenv("PAGED_EDU_COMMIT", raising=False)
    rec = provenance("bench_x.py", ["--quick"])
    assert rec["command"] == "python benchmarks/bench_x.py --quick"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert rec["commit"].split("+")[0] == head and "commit_as_reported" not in rec
    assert rec["machine"]["cpu_count"] >= 1 and rec["machine"]["python"]
    # A tree copied to the GPU machine: the sender's commit wins over the copy's git, which is kept beside it
    # (at 96e4ae5 a copy's stale .git named 7c7913f+dirty in bench_serve_vs_offline's record).
    monkeypatch.setenv("PAGED_EDU_COMMIT", "0123abc")
    rec = provenance("bench_x.py", [])
    assert rec["commit"] == "0123abc" and rec["commit_as_reported"].split("+")[0] == head


def test_bench_host_pool_holds_every_sequence_to_its_end():
    from bench_host import BLOCK_SIZE, EXTRA_TOKENS, pool_blocks

    # 512 running, 200 steps, 157-token prompts: 421 tokens = 27 blocks each; the old fixed 8,192 held 16.
    assert pool_blocks(512, 200, 157) == 512 * 27 > 8192
    assert pool_blocks(1, 0, 1) * BLOCK_SIZE >= 1 + EXTRA_TOKENS


@pytest.mark.slow
def test_bench_host_running_512_times_full_steps(tmp_path):
    """Its own documented example: the fixed 8,192-block pool preempted from the ~100th step on."""
    from bench_host import main

    out = tmp_path / "host.json"
    rec = main(["--running", "512", "--steps", "110", "--out", str(out)])
    assert rec["running"] == 512 and rec["num_blocks"] == pool_blocks_for(512, 110)
    assert json.loads(out.read_text())[
        "command"
    ] == "python benchmarks/bench_host.py --running 512 --steps 110 --out " + str(out)


def test_bench_host_serves_bench_engines_workload_to_its_last_token():
    """``--workload sharegpt``: the stub engine serves every request to its full length (no early stop
    changes the schedule), and the groups by concurrency hold every decode step."""
    from bench_host import measure_sharegpt

    from paged_edu.labs.batching import sharegpt_requests
    from paged_edu.models.config import smollm2_config

    rec = measure_sharegpt(num_requests=12, graph_path=True, async_scheduling=True)
    _, outputs = sharegpt_requests(12, 0, smollm2_config().vocab_size)
    assert rec["num_generated_tokens"] == sum(outputs)
    assert sum(r["steps"] for r in rec["decode_by_concurrency"]) == rec["num_decode_steps"] < rec["num_steps"]
    assert rec["num_steps"] >= max(outputs)  # one token a step at most, per sequence
    assert rec["host_ms_per_decode_step"] > 0 and rec["num_steps_near_256_running"] == 0


def pool_blocks_for(running, steps):
    from bench_host import pool_blocks

    return pool_blocks(running, steps, 157)


@pytest.mark.slow
def test_profile_engine_runs_on_a_cpu_and_writes_its_table(tmp_path):
    from profile_engine import main

    rec = main(["--tiny", "--steps", "3", "--num-requests", "6", "--device", "cpu", "--out", str(tmp_path / "prof")])
    text = (tmp_path / "prof.txt").read_text()
    assert "roofline (full efficiency, per-chunk shapes, LM head included)" in text and "aten::" in text
    assert len(rec["steps"]) == 3 and rec["steps"][0]["prompt_tokens"] > 0  # the first step carries prompts
    assert all(r["roofline_ms"] > 0 for r in rec["steps"])
    assert json.loads((tmp_path / "prof.json").read_text())["steps"] == rec["steps"]


def test_nanovllm_workload_is_the_one_nano_vllms_readme_reports():
    """nano-vllm's bench.py requests: its README's sums, 142,827 prompt and 133,966 output tokens."""
    from nanovllm_workload import nanovllm_requests

    prompts, outputs = nanovllm_requests()
    assert len(prompts) == len(outputs) == 256
    assert sum(map(len, prompts)) == 142_827 and sum(outputs) == 133_966
    assert all(100 <= len(p) <= 1024 for p in prompts) and all(100 <= o <= 1024 for o in outputs)
    assert min(map(min, prompts)) >= 0 and max(map(max, prompts)) <= 10000


def test_qwen3_geometry_prices_what_its_model_card_says():
    """Qwen3-0.6B: "0.44B" non-embedding parameters, 0.6B with the (tied) embedding; 112 KiB of KV a token."""
    import torch
    from nanovllm_workload import qwen3_0_6b_config

    from paged_edu.cache.sizing import dtype_name

    config = qwen3_0_6b_config()
    spec = config.geometry(dtype_name(torch.bfloat16))
    embedding = config.vocab_size * config.hidden_size
    assert round(spec.matmul_params / 1e9, 2) == 0.44 and round(spec.num_params / 1e9, 1) == 0.6
    assert spec.kv_bytes_per_token == 112 * 1024
    assert spec.lm_head_bytes == 2 * embedding  # tied: the head's bf16 read, which P leaves out


@pytest.mark.slow
def test_bench_engine_nanovllm_smoke_writes_its_share_of_the_roofline(tmp_path):
    """The --workload nanovllm path on a tiny model: the record's share is the measured tokens/s over the
    roofline's, the pool never preempts, and the roofline's P is the weights the model really has."""
    from bench_engine import main

    argv = ["--workload", "nanovllm", "--smoke", "--num-requests", "5", "--out", str(tmp_path / "nv")]
    rec = main(argv)
    assert json.loads((tmp_path / "nv.json").read_text()) == json.loads(json.dumps(rec))
    assert rec["command"] == "python benchmarks/bench_engine.py " + " ".join(argv) and rec["complete"]
    eng, yard, work = rec["engine"], rec["yardstick"], rec["workload"]
    assert work["num_requests"] == 5 and work["ignore_eos"] and eng["useful_tokens"] == work["output_tokens"]
    assert eng["num_preemptions"] == 0 and rec["kv_budget"]["num_blocks"] >= eng["useful_tokens"] // 16
    # The timeline run (record_timeline=True, outside the timed window): the same steps as the timed run.
    tl = eng["recorded_timeline"]
    assert (tl["num_steps"], tl["num_decode_steps"]) == (eng["num_steps"], eng["num_decode_steps"])
    assert eng["gpu_idle_between_decode_steps_ms_median"] == tl["gpu_idle_between_decode_steps_ms_median"] >= 0
    assert rec["model"]["matmul_params_counted"] == rec["model"]["cost_model_spec"]["matmul_params"]
    assert rec["model"]["qk_norm"]["implemented"] is False and "omitted" in rec["model"]["qk_norm"]["note"]
    # The share from the two measured figures: useful tokens over the wall time, and over the roofline's time.
    tokens_per_s = eng["useful_tokens"] / eng["seconds"]
    roofline_tokens_per_s = eng["useful_tokens"] / eng["roofline_run_s_by_gpu"]["h200"]
    assert yard["share_of_roofline"] == pytest.approx(tokens_per_s / roofline_tokens_per_s, rel=1e-9)
    assert yard["roofline_run_s"] == pytest.approx(eng["roofline_run_s"], abs=1e-4)  # the table's rounded figure
    vllm = yard["peers"][0]
    assert vllm["system"].startswith("vLLM") and vllm["share_of_roofline"] == pytest.approx(
        eng["roofline_run_s_by_gpu"]["a100-80gb"] / 15.60
    )


def test_bench_gemm_smoke_times_both_paths_checks_them_and_sweeps(tmp_path):
    """Its --smoke mode (the Triton interpreter, shapes 8-16x smaller) on two shapes: every row and
    sweep entry checked against an fp32 matmul, the record written with its command."""
    from paged_edu.kernels import triton_interpreting

    if not triton_interpreting():
        pytest.skip("--smoke runs in the Triton interpreter (a CPU machine)")
    from bench_gemm import main

    argv = ["--smoke", "--shapes", "o_proj,down", "--out", str(tmp_path / "gemm.json")]
    rec = main(argv)
    assert json.loads((tmp_path / "gemm.json").read_text()) == json.loads(json.dumps(rec))
    assert rec["command"] == "python benchmarks/bench_gemm.py " + " ".join(argv)
    assert [(r["shape"], r["M"]) for r in rec["rows"]] == [("o_proj", 1), ("o_proj", 3), ("down", 1), ("down", 3)]
    assert all(r["ok"] and r["cublas_rel_err"] < 1e-2 and r["config"]["SPLIT_K"] > 1 for r in rec["rows"])
    assert len(rec["sweep"]) == 6 and all(e["ok"] for e in rec["sweep"])
    assert set(rec["best"]) == {"o_proj/M=1", "down/M=1"}
    # Whole decode steps of a 2-layer toy, projections and LM head by F.linear and by the skinny GEMM.
    assert [s["batch"] for s in rec["steps"]] == [1, 3] and all(s["ok"] for s in rec["steps"])


def test_bench_layer_ab_smoke_times_each_switch_against_the_base(tmp_path):
    """``bench_layer.py --ab swiglu_gemm,fuse_decode_store --smoke`` (2 small layers, the Triton interpreter): the
    base step and the step with each switch flipped, each batch, rounds interleaved, the same greedy tokens; the
    record with its command and commit. An unknown switch is refused."""
    from paged_edu.kernels import triton_interpreting

    if not triton_interpreting():
        pytest.skip("--smoke runs in the Triton interpreter (a CPU machine)")
    from bench_layer import main

    argv = ["--ab", "swiglu_gemm,fuse_decode_store", "--smoke", "--out", str(tmp_path / "ab.json")]
    assert main(argv) == 0
    rec = json.loads((tmp_path / "ab.json").read_text())
    assert rec["command"] == "python benchmarks/bench_layer.py " + " ".join(argv) and rec["commit"]
    assert rec["switches"] == ["swiglu_gemm", "fuse_decode_store"]
    assert rec["base"]["swiglu_gemm"] is True and rec["base"]["fuse_decode_store"] is True
    assert [r["batch"] for r in rec["rows"]] == [1, 3]
    for r in rec["rows"]:
        assert set(r["variants"]) == {"base", "swiglu_gemm", "fuse_decode_store"}
        for switch in rec["switches"]:
            flipped = r["variants"][switch]
            assert flipped["kernels"][switch] is False  # the switch, and only it, flipped
            assert {k: v for k, v in flipped["kernels"].items() if k != switch} == {
                k: v for k, v in r["variants"]["base"]["kernels"].items() if k != switch
            }
            assert flipped["argmax_agree_base"] == 1.0
            assert flipped["logits_rel_err_base"] < 1e-5  # fp32: the sums' order only
        assert all(v["us"] > 0 and len(v["us_rounds"]) == rec["rounds"] for v in r["variants"].values())
    assert main(["--ab", "norm_gemm", "--smoke", "--out", str(tmp_path / "x.json")]) == 1
    assert not (tmp_path / "x.json").exists()


H200_ENGINE_RUNS = [
    "benchmarks/records/h200/engine_bench_decode_tables.json",
    "benchmarks/records/h200/engine_bench_decode_tables_2.json",
    "benchmarks/records/h200/engine_bench_decode_tables_3.json",
    "benchmarks/records/h200/engine_bench_0298cf0.json",
    "benchmarks/records/h200/engine_bench_0298cf0_2.json",
]


def test_engine_report_splits_the_decode_time_of_stored_h200_runs():
    """The per-concurrency sums agree with the record's own mean decode step (an independent field), the
    GPU time is the timeline's per-step figure times the step count, and the table has a row per record."""
    from engine_report import decode_time_split, runs_table

    for name in H200_ENGINE_RUNS:
        rec = json.loads((ROOT / name).read_text())
        eng = rec["engine"]
        r = decode_time_split(rec)
        assert r["decode_timed_s"] == pytest.approx(
            eng["num_decode_steps"] * eng["mean_decode_step_ms"] / 1e3, rel=2e-3
        )
        assert r["decode_gpu_s"] == pytest.approx(
            eng["num_decode_steps"] * eng["recorded_timeline"]["device_ms_per_decode_step"] / 1e3
        )
        assert r["held_up_s"] == max(0.0, r["decode_timed_s"] - r["decode_gpu_s"]) and r["held_up_s"] < eng["seconds"]
    table = runs_table([str(ROOT / n) for n in H200_ENGINE_RUNS]).splitlines()
    assert len(table) == 2 + len(H200_ENGINE_RUNS) and "| 0298cf0 | 52,454 | 1,833 | 28.6x |" in table[5]
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine_report.py"), *H200_ENGINE_RUNS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip().splitlines() == [line.replace(str(ROOT) + "/", "") for line in table]

"""The figure and the markdown table of ``bench_engine.py``, from its result dict; and, over several of its
records, where their time went:

    python benchmarks/engine_report.py benchmarks/records/h200/engine_bench_0298cf0.json benchmarks/records/h200/engine_bench_0298cf0_2.json
"""

from __future__ import annotations

import json
import sys


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eng, hf = result["engine"], result["transformers"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    same = result["engine_on_hf_requests"]  # the engine on the requests generate served: like for like
    bars = ax.bar(
        ["transformers\nstatic batch", "paged engine"],
        [hf["tokens_per_s"], same["tokens_per_s"]],
        color=["#999999", "#1f77b4"],
    )
    ax.bar_label(bars, fmt="{:,.0f}")
    ax.set_ylabel("useful output tokens / s")
    ax.set_title(f"Throughput, same requests ({result['speedup_same_requests']:.1f}x)")
    ax = axes[1]
    tl = eng["timeline"]
    ax.plot(tl["time"], tl["running"], color="#1f77b4", label="paged engine: running sequences")
    ax.axhline(hf["concurrency"], color="#999999", ls="--", label=f"transformers: batch of {hf['concurrency']}")
    ax.set_xlabel("seconds")
    ax.set_ylabel("sequences in the batch")
    ax.set_title(f"Concurrency at the same KV budget ({result['concurrency_ratio']:.1f}x peak)")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[2]
    labels = ["transformers\nvs L_max", "transformers\nvs grown cache", "engine\nvs allocated", "engine\nvs pool"]
    vals = [hf["kv_use_vs_lmax"], hf["kv_use_vs_grown_cache"], eng["kv_use_vs_allocated"], eng["kv_use_vs_pool"]]
    bars = ax.bar(labels, [100 * v for v in vals], color=["#999999", "#bbbbbb", "#1f77b4", "#6fa8dc"])
    ax.bar_label(bars, fmt="{:.0f}%")
    ax.set_ylim(0, 105)
    ax.set_ylabel("KV slots holding a live token (%)")
    ax.set_title("KV memory used by tokens")
    fig.suptitle(
        f"{result['workload']['num_requests']} ShareGPT-like requests, SmolLM2-135M geometry "
        f"(random weights, {result['dtype']}), {result['device_name']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(result, args, log):
    """The markdown tables the README shows."""
    eng = result["engine"]
    fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)  # noqa: E731
    log("")
    spec = result.get("roofline_spec", "table")  # older records: every run priced on the H200
    how = {"table": "", "measured": ", measured on this card", "assumed": ", assumed: no GPU in this run"}
    log(
        f"roofline: {eng['roofline']} on the {eng['roofline_gpu']}{how.get(spec, f', {spec}')} "
        f"({eng['roofline_bandwidth'] / 1e12:.2f} TB/s, peak FLOP/s); whole run {eng['roofline_run_s']:.3f} s"
    )
    log(
        "| system | useful tokens/s | mean decode step (ms) | roofline (full efficiency, per-chunk shapes, LM head "
        "included) (ms) | host ms/step | graph steps | engine speed-up |"
    )
    log("|---|---:|---:|---:|---:|---:|---:|")
    log(
        f"| paged_edu Engine{', async scheduling' if eng.get('async_scheduling') else ''} | "
        f"{eng['tokens_per_s']:,.0f} | {fmt(eng['mean_decode_step_ms'])} | "
        f"{fmt(eng['roofline_decode_step_ms'])} | {fmt(eng['host_ms_per_step'], '{:.3f}')} | "
        f"{100 * eng['share_of_steps_with_graph']:.0f}% | |"
    )
    for name, label in (
        ("transformers_cb_graphs", "transformers CB, CUDA graphs"),
        ("transformers_cb_default", "transformers CB, defaults"),
    ):
        r = result.get(name)
        if r and "error" not in r:
            log(
                f"| {label} ({r['attn_implementation']}) | {r['tokens_per_s']:,.0f} | | | | | {r['engine_speedup']:.1f}x |"
            )
        elif r:
            log(f"| {label} | failed: {r['error'][:80]} | | | | | |")
    hf_res = result.get("transformers")
    if hf_res:  # the ratio on the same requests: the engine's run over generate's batches
        same = result["engine_on_hf_requests"]
        log(
            f"| transformers generate, static batch {args.hf_batch} ({hf_res['num_requests']} requests) | "
            f"{hf_res['tokens_per_s']:,.0f} | | | | | {result['speedup_same_requests']:.1f}x (vs the engine on the same "
            f"{same['num_requests']} requests, {same['tokens_per_s']:,.0f} tok/s) |"
        )
    log(
        f"\nmixed prefill/decode steps: {fmt(eng['mean_mixed_step_ms'])} ms vs {eng['roofline']} "
        f"{fmt(eng['roofline_mixed_step_ms'])} ms ({eng['num_mixed_steps']} steps); host ms at ~256 running: "
        f"{fmt(eng['host_ms_at_256_running'], '{:.3f}')}; peak {eng['peak_concurrency']} running, "
        f"{eng['num_preemptions']} preemptions"
    )
    tl = eng.get("recorded_timeline")
    if tl:
        log(
            "\n| timeline run (record_timeline=True) | host ms / decode step | device ms / decode step | "
            "GPU idle between decode steps, median (ms; target <= 0.1) | tok/s vs the timed run |"
        )
        log("|---|---:|---:|---:|---:|")
        log(
            f"| paged_edu Engine | {fmt(tl['host_ms_per_decode_step'], '{:.3f}')} | "
            f"{fmt(tl['device_ms_per_decode_step'], '{:.3f}')} | "
            f"{fmt(tl['gpu_idle_between_decode_steps_ms_median'], '{:.3f}')} | {tl['tokens_per_s_vs_timed_run']:.3f} |"
        )


# ----------------------------------------------------------------------------------------------
# Several runs: the GPU's time against the timed run's
# ----------------------------------------------------------------------------------------------


def decode_time_split(record: dict) -> dict:
    """The decode steps' seconds in a record's timed run (``sum(steps x step_ms)`` over its
    ``decode_by_concurrency``) beside the GPU time of the same steps in its untimed timeline run
    (``num_decode_steps x device_ms_per_decode_step``, from CUDA events): where the first exceeds the
    second the host held the GPU up; where the runs of one code differ in the first but not the
    second, the host (or the peer) is what moved."""
    eng = record["engine"]
    timed = sum(r["steps"] * r["step_ms"] for r in eng["decode_by_concurrency"]) / 1e3
    gpu = eng["num_decode_steps"] * eng["recorded_timeline"]["device_ms_per_decode_step"] / 1e3
    cb = record.get("transformers_cb_graphs") or {}
    return {
        "commit": record.get("commit"),
        "tokens_per_s": eng["tokens_per_s"],
        "cb_tokens_per_s": cb.get("tokens_per_s"),
        "speedup": cb.get("engine_speedup"),
        "seconds": eng["seconds"],
        "host_ms_at_256_running": eng["host_ms_at_256_running"],
        "decode_timed_s": timed,
        "decode_gpu_s": gpu,
        "held_up_s": max(0.0, timed - gpu),
    }


def runs_table(paths: list[str]) -> str:
    """:func:`decode_time_split` of each record, as a markdown table."""
    lines = [
        "| record | commit | engine tok/s | CB tok/s | engine / CB | window, s | host at ~256, ms | "
        "decode steps, timed, s | their GPU time, s | held up by the host, s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for path in paths:
        with open(path) as f:
            r = decode_time_split(json.load(f))
        cb = "-" if r["cb_tokens_per_s"] is None else f"{r['cb_tokens_per_s']:,.0f}"
        x = "-" if r["speedup"] is None else f"{r['speedup']:.1f}x"
        lines.append(
            f"| {path} | {r['commit']} | {r['tokens_per_s']:,.0f} | {cb} | {x} | {r['seconds']:.3f} | "
            f"{r['host_ms_at_256_running']:.2f} | {r['decode_timed_s']:.3f} | {r['decode_gpu_s']:.3f} | "
            f"{r['held_up_s']:.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python benchmarks/engine_report.py RECORD.json [RECORD.json ...]")
    print(runs_table(sys.argv[1:]))

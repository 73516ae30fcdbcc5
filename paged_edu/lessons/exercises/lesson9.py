"""Lesson 9's exercises: what overlap buys (predict, then measure), the roofline of a decode step from its
bytes, why a decode step of small kernels wants a graph -- and three to build: the async schedule on the
step-timeline model (checked against the engine's own recorded timeline), a fused residual-add + RMSNorm
Triton kernel (checked under Triton's interpreter on a CPU), and the host time a CUDA graph saves."""

from __future__ import annotations

import math
import random

from paged_edu.core.hardware import GPUS, MODELS
from paged_edu.labs import speed_ladder as sl
from paged_edu.labs import step_timeline as st
from paged_edu.lessons.exercises.framework import Verdict, compare, describe, raised, register
from paged_edu.sim.costmodel import CostModel, StepShape

# Exercise 9.2's decode step: SmolLM2-135M (bf16) on the H200, 256 sequences of 512 cached tokens each.
BATCH, CONTEXT = 256, 512
GRAPH_BATCH = 32  # exercise 9.6's batch size


def split() -> dict:
    """9.1's inputs: a synchronous decode step's host and device ms on the H200 (``source`` says which run)."""
    return sl.stored_decode_split()


def overlap_step_ms() -> float:
    """9.1's reference: with the host one step ahead, a step costs the longer of the two, not their sum."""
    s = split()
    return max(s["host_ms"], s["device_ms"])


@register(
    "9.1",
    "A synchronous decode step measured ex9.split()['host_ms'] of host work and ex9.split()['device_ms'] "
    "of device work. With the host one step ahead (async scheduling), what step time (ms) do you predict?",
    overlap_step_ms,
)
def _check_9_1(answer) -> Verdict:
    s = split()
    host, device = s["host_ms"], s["device_ms"]
    return compare(
        "decode step with overlap (ms)",
        answer,
        max(host, device),
        sig_figs=3,
        hints={
            host + device: "the sum: the synchronous step, host then device; overlapped they run side by side",
            min(host, device): "the shorter of the two: the longer one still has to finish every step",
            s["step_ms"]: "the measured synchronous step, not a prediction with overlap",
            abs(host - device): "the difference; overlapped, a step lasts as long as the longer side",
        },
    )


def decode_shape() -> StepShape:
    """9.2's step: ``BATCH`` decodes (one new token each) on ``CONTEXT`` cached tokens each."""
    return StepShape.of_chunks([CONTEXT] * BATCH, [1] * BATCH, BATCH)


def roofline_decode_ms() -> float:
    """9.2's reference: the cost model's roofline for the step, in ms (at the H200's copy ceiling)."""
    return 1e3 * CostModel(model=MODELS["smollm2-135m"]).roofline().step_time(decode_shape())


@register(
    "9.2",
    "SmolLM2-135M in bf16 decodes 256 sequences of 512 cached tokens on the H200. It reads every matmul "
    "weight once, the tied LM head once, and the K/V of every token in context plus the new one. At the "
    "roofline's bandwidth -- the copy ceiling measured on the H200, GPUS['h200'].hbm_bandwidth -- how many "
    "ms does the step take at least?",
    roofline_decode_ms,
)
def _check_9_2(answer) -> Verdict:
    m, gpu = MODELS["smollm2-135m"], GPUS["h200"]
    bw = gpu.hbm_bandwidth
    weights, head, kv = m.matmul_weight_bytes, m.lm_head_bytes, m.kv_bytes_per_token * BATCH * (CONTEXT + 1)
    right = roofline_decode_ms()
    sheet = right * bw / gpu.datasheet_bandwidth
    return compare(
        "roofline decode step (ms)",
        answer,
        right,
        sig_figs=3,
        hints={
            1e3 * (weights + head) / bw: "the weights only: every sequence also reads its K/V",
            1e3 * kv / bw: "the K/V only: the weights are read once per step too",
            1e3 * (weights + kv) / bw: "without the LM head's read (the tied embedding matrix, read for the logits)",
            1e3 * (weights + head + m.kv_bytes_per_token * BATCH * CONTEXT) / bw: "without the new tokens' K/V",
            sheet: f"the datasheet's bandwidth ({gpu.datasheet_bandwidth / 1e12:.2f} TB/s, GPUS['h200']."
            f"datasheet_bandwidth): the roofline uses what a device copy reaches, the measured copy ceiling "
            f"({bw / 1e12:.2f} TB/s, GPUS['h200'].hbm_bandwidth) -- no kernel streams faster than a copy",
            right / 0.85: "at 85 % of the bandwidth: the roofline is full efficiency",
            right / 1e3: "seconds; the question asks for ms",
        },
    )


def kernels() -> dict:
    """9.3's inputs: one decode step at batch 1 on the H200 (``layer_bench.json``)."""
    return sl.stored_decode_kernels(batch=1)


def us_per_kernel() -> float:
    """9.3's reference: the GPU's busy time per kernel of the fused decode step at batch 1, in us."""
    k = kernels()
    return k["fused_busy_us"] / k["fused_kernels"]


@register(
    "9.3",
    "At batch 1 the fused decode step runs ex9.kernels()['fused_kernels'] kernels, the GPU busy for "
    "ex9.kernels()['fused_busy_us'] us in all. How long does the GPU spend on one kernel, on average (us)?",
    us_per_kernel,
)
def _check_9_3(answer) -> Verdict:
    k = kernels()
    return compare(
        "GPU time per kernel (us)",
        answer,
        us_per_kernel(),
        sig_figs=3,
        hints={
            k["unfused_busy_us"] / k["unfused_kernels"]: "the unfused step's kernels (PyTorch ops); the question "
            "is about the fused step",
            k["fused_us"] / k["fused_kernels"]: "the step's wall time per kernel; use the GPU's busy time",
            k["roofline_us"] / k["fused_kernels"]: "the roofline per kernel: what a kernel would take at full speed",
            k["fused_kernels"] / k["fused_busy_us"]: "kernels per us: inverted",
        },
    )


# ----------------------------------------------------------------------------------------------
# 9.4: the async schedule, checked on made-up steps and on the engine's own recorded timeline
# ----------------------------------------------------------------------------------------------


def async_schedule_stub(pre, device, post):
    raise NotImplementedError("Exercise 9.4: return [(host_start, device_start, device_end)] for every step")


def _schedule_cases() -> list[tuple[list, list, list]]:
    rng = random.Random(9)
    cases = [
        ([1.0] * 5, [3.0] * 5, [0.5] * 5),  # device-bound: the host keeps ahead
        ([3.0] * 5, [1.0] * 5, [0.5] * 5),  # host-bound: the device waits
        ([1.0], [2.0], [1.0]),  # one step
        ([0.0] * 4, [1.0] * 4, [0.0] * 4),  # no host work at all
    ]
    for n in (6, 9):
        cases.append(tuple([round(rng.uniform(0.1, 3.0), 3) for _ in range(n)] for _ in range(3)))
    return cases


def recorded_steps(card: str = "h200") -> dict:
    """9.4's recorded timeline: consecutive decode steps of the stored ladder's ``+ overlap`` rung, as the
    engine recorded them (``Engine(..., record_timeline=True)``, :mod:`paged_edu.engine.timeline`).
    Per step: ``pre`` (its host work up to the launch: ``host_end - host_start``), ``device`` (the device's
    span), ``post`` (the host's update of it: the engine's ``update`` phase, booked to the call after it;
    a record without phases gives the rung's mean host time less the mean ``pre``), and the ``gaps`` the
    device idled before each step after the first (all ms)."""
    ladder = sl.load_stored_ladder(card)
    if ladder is None:
        raise LookupError(f"no stored ladder for {card!r}")
    rung = next(r for r in ladder["rungs"] if r["rung"] == "+ overlap")
    win = rung["window"]
    start = next((i for i in range(len(win)) if all(w["decode"] for w in win[i:])), len(win))
    win = win[start:] if len(win) - start >= 8 else [w for w in win if w["decode"]]
    pre = [w["host_ms"][1] - w["host_ms"][0] for w in win]
    device = [w["device_ms"][1] - w["device_ms"][0] for w in win]
    if all(w.get("phases_ms") for w in win):  # call k updates step k-1 (async): its update is step k-1's post
        post = [w["phases_ms"]["update"] for w in win[1:]] + [win[-1]["phases_ms"]["update"]]
        how = "each step's update phase, as the engine booked it"
    else:
        mean_pre = sum(pre) / len(pre)
        post = [max(0.0, rung["host_ms_per_decode_step"] - mean_pre)] * len(win)
        how = "the rung's mean host time per decode step less the mean pre (the record has no phases)"
    gaps = [b["device_ms"][0] - a["device_ms"][1] for a, b in zip(win, win[1:])]
    return dict(
        pre=pre,
        device=device,
        post=post,
        gaps=gaps,
        steps=[w["step"] for w in win],
        post_source=how,
        source=f"{sl.STORED_LADDERS.get(card)}: rung '+ overlap', steps {win[0]['step']}-{win[-1]['step']} "
        f"({ladder['device_name']}, commit {str(ladder['commit'])[:7]})",
    )


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def _predicted_gaps(times) -> list[float]:
    return [b[1] - a[2] for a, b in zip(times, times[1:])]


def _same_times(got, expected, tol: float = 1e-6) -> bool:
    try:
        if len(got) != len(expected):
            return False
        for g, e in zip(got, expected):
            g = tuple(float(v) for v in g)
            if len(g) != 3 or any(not math.isfinite(v) or abs(v - w) > tol * max(1.0, abs(w)) for v, w in zip(g, e)):
                return False
        return True
    except (TypeError, ValueError):
        return False


def _too_far_ahead(pre, device, post):
    """The host never waits for a step's tokens: it runs as far ahead as it likes."""
    out, host, free = [], 0.0, 0.0
    for k in range(len(pre)):
        d0 = max(host + pre[k], free)
        free = d0 + device[k]
        out.append((host, d0, free))
        host = host + pre[k] + post[k]
    return out


def _two_on_the_device(pre, device, post):
    """The async order, but step k's device work starts at its launch even while step k-1 still runs."""
    out, host = [], 0.0
    for k in range(len(pre)):
        d0 = host + pre[k]
        out.append((host, d0, d0 + device[k]))
        host = d0 if k == 0 else max(d0, out[k - 1][2]) + post[k - 1]
    return out


def _no_update(pre, device, post):
    return st.async_schedule(pre, device, [0.0] * len(post))


_SCHEDULE_MISTAKES = (
    (
        st.sync_schedule,
        "the synchronous order: your host reads step N's tokens before it starts step N+1, so the device "
        "idles through every step's host work; overlapped, the host launches N+1 first, then reads N",
    ),
    (
        _too_far_ahead,
        "a host that never waits for any step's tokens: it must read step N-1's tokens (wait for its device "
        "end) and update it before it starts step N+1 -- one step ahead, never more",
    ),
    (
        _two_on_the_device,
        "two steps on the device at once: step N+1's device work can start only once step N's has ended",
    ),
    (_no_update, "the update is missing: after reading step N-1's tokens the host updates it (post) before step N+1"),
)


@register(
    "9.4",
    "Write async_schedule(pre, device, post): per step the host's work up to the launch, the device's work "
    "and the host's update once its tokens are read; return [(host_start, device_start, device_end)] with the "
    "host one step ahead (it launches step N+1, then reads step N's tokens and updates it).",
    st.async_schedule,
    kind="function",
)
def _check_9_4(fn) -> Verdict:
    rec = recorded_steps()
    cases = _schedule_cases() + [(rec["pre"], rec["device"], rec["post"])]
    for args in cases:
        expected = st.async_schedule(*args)
        try:
            got = fn(*[list(a) for a in args])
        except NotImplementedError as exc:
            return raised("async_schedule", exc, "your function")
        except Exception as exc:
            return Verdict(False, [f"[ ] async_schedule: raised {type(exc).__name__}: {exc} on pre={_short(args[0])}"])
        if _same_times(got, expected):
            continue
        line = f"[ ] async_schedule{_short(args)}: got {_short(got)}, expected {_short(expected)}"
        for mistake, meaning in _SCHEDULE_MISTAKES:
            if _same_times(got, mistake(*args)):
                return Verdict(False, [line, f"    -- that is {meaning}"] + _against_record(fn, rec, mistake))
        if not isinstance(got, (list, tuple)):
            return Verdict(
                False,
                [
                    f"[ ] async_schedule: returned {describe(got)}; return a list of "
                    "(host_start, device_start, device_end) tuples, one per step"
                ],
            )
        return Verdict(False, [line])
    return Verdict(True, ["[x] async_schedule: every case matches"] + _against_record(fn, rec, st.async_schedule))


def _against_record(fn, rec, schedule) -> list[str]:
    """What the schedule predicts for the engine's recorded steps, beside what the engine recorded."""
    try:
        predicted = _median(_predicted_gaps(schedule(rec["pre"], rec["device"], rec["post"])))
    except Exception:
        return []
    return [
        f"    on the engine's recorded steps ({rec['source']}): the device idles {predicted:.3f} ms before a "
        f"step (median) by this schedule; the engine recorded {_median(rec['gaps']):.3f} ms"
    ]


def _short(x, limit: int = 70) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------------------------
# 9.5: a fused residual-add + RMSNorm Triton kernel
# ----------------------------------------------------------------------------------------------


def add_rms_norm(x, residual, weight, eps):
    """9.5's reference: the library's one-kernel residual add + RMSNorm, ``(y, r')``."""
    from paged_edu.kernels.triton_fused import add_rms_norm_triton

    return add_rms_norm_triton(x, weight, eps, residual)


def add_rms_norm_stub(x, residual, weight, eps):
    raise NotImplementedError("Exercise 9.5: launch your kernel; return (y, x + residual)")


def kernel_device():
    """Where 9.5's kernels run: the CPU under Triton's interpreter, else the GPU."""
    import torch

    from paged_edu.kernels.triton_fused import INTERPRETING

    return torch.device("cpu" if INTERPRETING or not torch.cuda.is_available() else "cuda")


def _norm_cases():
    import torch

    g = torch.Generator().manual_seed(95)
    cases = []
    for T, N in ((3, 64), (2, 48), (4, 100)):  # N = 48, 100: not a power of two -- the mask matters
        x, r = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
        w = 1.0 + 0.5 * torch.randn(N, generator=g)
        cases.append((x, r, w, 1e-6))
    z = torch.zeros(2, 32)  # a zero row: only eps keeps it finite
    z[1] = torch.randn(32, generator=g)
    cases.append((z, torch.zeros(2, 32), torch.ones(32), 1e-5))
    dev = kernel_device()
    return [(x.to(dev), r.to(dev), w.to(dev), eps) for x, r, w, eps in cases]


def _plain(x, r, w, eps, *, weight=True, residual=True, centre=False):
    """The PyTorch oracle (fp32) and its tempting variants."""
    import torch

    s = x + r if residual else x
    c = s - s.mean(-1, keepdim=True) if centre else s
    y = c * torch.rsqrt((c * c).mean(-1, keepdim=True) + eps)
    return (w * y if weight else y), (x + r)


def _norm_mistakes(x, r, w, eps):
    import torch

    right_y, right_r = _plain(x, r, w, eps)
    return (
        ((_plain(x, r, w, eps, weight=False)[0], right_r), "y without the weight: multiply the normalised row by w"),
        ((_plain(x, r, w, eps, residual=False)[0], right_r), "x normalised alone: normalise r' = x + residual"),
        ((_plain(x, r, w, eps, centre=True)[0], right_r), "a centred row (LayerNorm): RMSNorm subtracts no mean"),
        ((right_y, x), "the second output is x; return r' = x + residual, the stream the next layer adds to"),
        ((right_r, right_y), "the two outputs swapped: (y, r')"),
        ((w * (x + r) / torch.sqrt(((x + r) ** 2).mean(-1, keepdim=True)), right_r), "eps is missing under the root"),
    )


def _close(a, b) -> bool:
    import torch

    try:
        return bool(torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5, equal_nan=False))
    except Exception:
        return False


@register(
    "9.5",
    "Write the Triton kernel of a residual add + RMSNorm in one pass over each row, and a function "
    "my_add_rms_norm(x, residual, weight, eps) -> (y, r') that launches it: r' = x + residual, "
    "y = weight * r' / sqrt(mean(r'^2) + eps).",
    add_rms_norm,
    kind="function",
    needs_triton=True,
)
def _check_9_5(fn) -> Verdict:
    import torch

    for case in _norm_cases():
        x, r, w, eps = case
        expected = add_rms_norm(x, r, w, eps)
        try:
            got = fn(x.clone(), r.clone(), w.clone(), eps)
        except NotImplementedError as exc:
            return raised("my_add_rms_norm", exc, "your function")
        except Exception as exc:  # a compile error of the kernel lands here too
            return Verdict(False, [f"[ ] my_add_rms_norm: raised {type(exc).__name__}: {str(exc)[:300]}"])
        shape = f"x of shape {tuple(x.shape)}"
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            return Verdict(False, [f"[ ] my_add_rms_norm: returned {describe(got)}; return two tensors (y, r')"])
        if tuple(got[0].shape) != tuple(x.shape) or tuple(got[1].shape) != tuple(x.shape):
            return Verdict(
                False,
                [
                    f"[ ] my_add_rms_norm: for {shape} got shapes {tuple(got[0].shape)} and "
                    f"{tuple(got[1].shape)}; both outputs are (T, N) like x"
                ],
            )
        if _close(got[0], expected[0]) and _close(got[1], expected[1]):
            continue
        if not torch.isfinite(got[0]).all():
            where = "a row of zeros" if not x.abs().sum(-1).all() else shape
            return Verdict(
                False,
                [
                    f"[ ] my_add_rms_norm: y holds NaN or inf for {where} -- is eps under the "
                    "square root, and is every lane past N masked (other=0.0)?"
                ],
            )
        for (my, mr), meaning in _norm_mistakes(x, r, w, eps):
            if _close(got[0], my) and _close(got[1], mr):
                return Verdict(False, [f"[ ] my_add_rms_norm: for {shape} that is {meaning}"])
        err = max(float((got[0].float() - expected[0]).abs().max()), float((got[1].float() - expected[1]).abs().max()))
        hint = " -- N is not a power of two here: mask the lanes past N" if x.shape[1] & (x.shape[1] - 1) else ""
        return Verdict(
            False, [f"[ ] my_add_rms_norm: for {shape} the outputs differ from the reference by up to {err:.3g}{hint}"]
        )
    return Verdict(
        True,
        [
            f"[x] my_add_rms_norm: all {len(_norm_cases())} cases match the reference (rtol 1e-4), "
            "a zero row and rows whose width is not a power of two among them"
        ],
    )


# ----------------------------------------------------------------------------------------------
# 9.6: what a CUDA graph saves the host
# ----------------------------------------------------------------------------------------------


def launch_costs(batch: int = GRAPH_BATCH, card: str = "h200") -> dict:
    """9.6's inputs, from the stored ladder of ``card``: at ``batch`` sequences, the eager step's kernel
    launches (``launches``), the host's time per launch (``launch_us``, the eager rung's probes) and the
    graph replay's one call (``graph_launch_us``, the CUDA-graph rung's probes)."""
    ladder = sl.load_stored_ladder(card)
    by = {r["rung"]: r for r in ladder["rungs"] if "skipped" not in r}
    eager = st.costs_for_rung(ladder, by["eager"])
    graph = st.costs_for_rung(ladder, by["+ CUDA graphs"])
    probes = by["eager"].get("profile", {}).get("batches", {})
    if probes:  # measured launch counts: the probe nearest the batch
        near = min(probes, key=lambda b: abs(int(b) - batch))
        launches, how = probes[near]["launches_per_step"], f"the eager rung's probe at batch {near}"
    else:
        launches, how = len(eager.kernels(batch)), "layer_bench.json's unfused kernel count (no probe stored)"
    return dict(
        batch=batch,
        launches=float(launches),
        launch_us=eager.launch_us,
        graph_launch_us=graph.graph_launch_us,
        device_name=ladder["device_name"],
        commit=ladder["commit"],
        source=f"{sl.STORED_LADDERS[card]}: launches from {how}; {eager.source.get('launch')}; the graph's replay "
        "call from the CUDA-graph rung",
    )


def graph_saving_ms() -> float:
    """9.6's reference: the host's launch time eagerly less the graph's one replay call, in ms."""
    c = launch_costs()
    return (c["launches"] * c["launch_us"] - c["graph_launch_us"]) / 1e3


@register(
    "9.6",
    "At batch 32 an eager decode step makes ex9.launch_costs()['launches'] kernel launches of "
    "ex9.launch_costs()['launch_us'] us of host time each; a CUDA graph replays them all with one call of "
    "ex9.launch_costs()['graph_launch_us'] us. How many ms of host time does the graph save per step?",
    graph_saving_ms,
)
def _check_9_6(answer) -> Verdict:
    c = launch_costs()
    n, each, graph = c["launches"], c["launch_us"], c["graph_launch_us"]
    right = graph_saving_ms()
    return compare(
        "host time a graph saves per decode step (ms)",
        answer,
        right,
        sig_figs=3,
        hints={
            n * each / 1e3: "every launch, but the graph's own replay call costs host time too: subtract it",
            (n * each - graph): "microseconds; the question asks for ms",
            (n - 1) * each / 1e3: "n - 1 launches; the graph replaces all of them with its one call",
            n * each / 1e6: "seconds; the question asks for ms",
            graph / 1e3: "the replay call alone: the saving is what the launches cost beyond it",
        },
    )


def measured_graph_saving(rungs: list[dict], batch: int = GRAPH_BATCH) -> dict | None:
    """9.6, measured: from a live ladder's probes at ``batch`` (``run_ladder(..., probe_batches=(batch,))``
    on a GPU), the eager step's launch phase and launch count, the CUDA-graph step's launch phase (its
    replay call), and their difference (ms). None without those probes (a CPU runs no graph rung)."""
    by = {r["rung"]: r for r in rungs if "skipped" not in r}
    try:
        eager = by["eager"]["profile"]["batches"][str(batch)]
        graph = by["+ CUDA graphs"]["profile"]["batches"][str(batch)]
    except KeyError:
        return None
    return dict(
        batch=batch,
        launches=eager.get("launches_per_step"),
        eager_launch_ms=eager["host_ms"]["forward"],
        graph_launch_ms=graph["host_ms"]["forward"],
        saving_ms=eager["host_ms"]["forward"] - graph["host_ms"]["forward"],
    )


def time_norms(fn, rows: int = 256, width: int = 576, dtype=None) -> dict:
    """9.5 on a GPU: median microseconds (``triton.testing.do_bench``) of ``fn`` (yours), the library's
    kernel, and the two-kernel path (the residual add, then PyTorch's ``rms_norm``) on a decode step's
    activations (``rows`` x ``width``: SmolLM2's hidden size), each checked against the plain PyTorch oracle."""
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    dtype = dtype or torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    x, r = (torch.randn(rows, width, device="cuda", generator=g, dtype=dtype) for _ in range(2))
    w = torch.randn(width, device="cuda", generator=g, dtype=dtype)
    eps = 1e-5

    def two_kernels(x, r, w, eps):
        s = x + r
        return F.rms_norm(s, (width,), w, eps), s

    truth = _plain(x.float(), r.float(), w.float(), eps)
    out = {}
    for name, f in (("yours", fn), ("library", add_rms_norm), ("two kernels", two_kernels)):
        try:
            y, s = f(x, r, w, eps)
        except NotImplementedError:
            out[name] = dict(us=None, max_abs_err=None, note="not written yet")
            continue
        err = float((y.float() - truth[0]).abs().max())
        out[name] = dict(us=1e3 * do_bench(lambda f=f: f(x, r, w, eps)), max_abs_err=err)
    return out

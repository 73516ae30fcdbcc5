"""The peers of ``bench_engine.py``: transformers' static-batch ``generate`` and its own continuous
batching (``ContinuousBatchingManager``), on the requests, weights and KV budget the engine gets."""

from __future__ import annotations

import time

import numpy as np
import torch

from paged_edu.labs.timing import frozen_heap

FIRST_COMPARED = 8  # requests whose greedy tokens are compared between the systems
STALL_S = 120  # give up on transformers' continuous batching after this long without a finished request


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------------
# transformers, static batching
# ----------------------------------------------------------------------------------------------


@torch.inference_mode()
def run_hf(hf, prompts, outputs, batch_size, num_batches, l_max, device, log):
    results = []
    for k in range(num_batches):
        idx = list(range(k * batch_size, min((k + 1) * batch_size, len(prompts))))
        if not idx:
            break
        batch_prompts = [prompts[i] for i in idx]
        batch_out = [outputs[i] for i in idx]
        p_max = max(len(p) for p in batch_prompts)
        ids = torch.zeros(len(idx), p_max, dtype=torch.long)
        mask = torch.zeros(len(idx), p_max, dtype=torch.long)
        for row, p in enumerate(batch_prompts):  # left padding, as decoder-only generation needs
            ids[row, p_max - len(p) :] = torch.tensor(p)
            mask[row, p_max - len(p) :] = 1
        steps = max(batch_out)
        if (
            k == 0
        ):  # untimed: the same batch for a few tokens (cuBLAS heuristics, lazy inits); eager, nothing to capture
            hf.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=4,
                min_new_tokens=4,
                do_sample=False,
                pad_token_id=0,
            )
        with frozen_heap():
            sync(device)
            t0 = time.perf_counter()
            hf.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=steps,
                min_new_tokens=steps,
                do_sample=False,
                pad_token_id=0,
            )
            sync(device)
            dt = time.perf_counter() - t0
        # KV use per decode step t = 1..steps: live tokens vs the L_max reservation and vs the grown cache.
        lens_p = np.array([len(p) for p in batch_prompts])
        lens_o = np.array(batch_out)
        t = np.arange(1, steps + 1)
        live = np.minimum(lens_p[None, :] + t[:, None], (lens_p + lens_o)[None, :]).sum(1)  # (steps,)
        use_lmax = float((live / (len(idx) * l_max)).mean())
        use_grown = float((live / (len(idx) * (p_max + t))).mean())
        useful = int(lens_o.sum())
        results.append(
            dict(
                batch=k,
                num_requests=len(idx),
                seconds=dt,
                steps=steps,
                useful_tokens=useful,
                computed_tokens=steps * len(idx),
                kv_use_vs_lmax=use_lmax,
                kv_use_vs_grown_cache=use_grown,
                peak_kv_bytes=len(idx) * (p_max + steps),
            )
        )
        log(
            f"  transformers batch {k}: {len(idx)} requests, {steps} steps, {dt:.1f} s, {useful / dt:,.0f} useful tok/s"
        )
    secs = sum(r["seconds"] for r in results)
    useful = sum(r["useful_tokens"] for r in results)
    computed = sum(r["computed_tokens"] for r in results)
    return dict(
        batches=results,
        seconds=secs,
        useful_tokens=useful,
        tokens_per_s=useful / secs,
        wasted_fraction=1 - useful / computed,
        concurrency=batch_size,
        kv_use_vs_lmax=float(np.mean([r["kv_use_vs_lmax"] for r in results])),
        kv_use_vs_grown_cache=float(np.mean([r["kv_use_vs_grown_cache"] for r in results])),
        num_requests=sum(r["num_requests"] for r in results),
    )


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ----------------------------------------------------------------------------------------------
# transformers, continuous batching (its ContinuousBatchingManager, driven like generate_batch)
# ----------------------------------------------------------------------------------------------


def cb_config(num_blocks: int, block_size: int, max_batch_tokens: int, max_requests: int, use_cuda_graph: bool | None):
    """A ``ContinuousBatchingConfig`` for the installed transformers: the field names moved between
    versions (``block_size`` became ``page_size`` in 5.17), so only the ones it has are set."""
    import dataclasses

    try:
        from transformers import ContinuousBatchingConfig
    except ImportError:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    names = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    kw = dict(num_blocks=num_blocks, max_batch_tokens=max_batch_tokens, max_requests_per_batch=max_requests)
    kw["page_size" if "page_size" in names else "block_size"] = block_size
    if use_cuda_graph is not None:
        kw["use_cuda_graph"] = use_cuda_graph
    if "auto_switch_to_flash" in names:
        kw["auto_switch_to_flash"] = False  # stay on the attention asked for
    return ContinuousBatchingConfig(**{k: v for k, v in kw.items() if k in names})


@torch.no_grad()  # as generate_batch: tensors made under inference_mode break its generation thread (5.17)
def run_hf_cb(
    hf, prompts, outputs, num_blocks, block_size, max_batch_tokens, max_requests, use_cuda_graph, log, warm_same=True
):
    """transformers' continuous batching: init, warm-up, start, one ``add_request`` per request with
    its own ``max_new_tokens`` and ``eos_token_id=-1`` (so each generates exactly its length),
    collect, stop -- what ``generate_batch`` does, with per-request lengths. Warm-up is excluded
    from the time: the manager's own ``warmup()``, then (``warm_same``) the same requests served
    once untimed through the started manager, so that the graphs it captures lazily for each new
    shape are captured before the timed window; ``graph_captures_in_window`` counts those it still
    captured inside (every ``torch.cuda.CUDAGraph`` capture in the process)."""
    from transformers import GenerationConfig

    from paged_edu.labs.timing import graph_capture_counter

    count_graphs = graph_capture_counter()

    original = hf.config._attn_implementation
    errors = []
    for attn in ("paged|sdpa", "sdpa"):  # 5.17 takes "paged|sdpa"; later versions only "sdpa"
        try:
            hf.set_attn_implementation(attn)
            gen = GenerationConfig(do_sample=False, max_new_tokens=max(outputs), eos_token_id=-1, pad_token_id=0)
            manager = hf.init_continuous_batching(
                generation_config=gen,
                continuous_batching_config=cb_config(
                    num_blocks, block_size, max_batch_tokens, max_requests, use_cuda_graph
                ),
            )
            if hasattr(manager, "warmup"):
                manager.warmup()
            manager.start()
            break
        except Exception as exc:  # try the next name; report all if none works
            errors.append(f"{attn}: {type(exc).__name__}: {exc}")
    else:
        hf.set_attn_implementation(original)
        raise RuntimeError("transformers continuous batching would not start: " + "; ".join(errors))

    def serve(batch_prompts, batch_outputs, prefix):
        for i, (p, o) in enumerate(zip(batch_prompts, batch_outputs)):
            manager.add_request(list(p), request_id=f"{prefix}{i}", max_new_tokens=int(o), eos_token_id=-1)
        done, last = {}, time.perf_counter()
        while len(done) < len(batch_prompts):
            r = manager.get_result(timeout=1)
            if r is None:
                if not manager.is_running():
                    raise RuntimeError(f"the generation thread stopped with {len(done)}/{len(batch_prompts)} done")
                if time.perf_counter() - last > STALL_S:  # a hung peer must not eat the whole GPU call
                    raise RuntimeError(f"no result for {STALL_S} s with {len(done)}/{len(batch_prompts)} done")
                continue
            last = time.perf_counter()
            if r.is_finished():
                if getattr(r, "error", None):
                    raise RuntimeError(f"request {r.request_id} failed: {r.error}")
                done[r.request_id] = r
        return [done[f"{prefix}{i}"].generated_tokens for i in range(len(batch_prompts))]

    try:
        t = time.perf_counter()
        if warm_same:  # untimed: every shape the timed run meets
            serve(prompts, outputs, "warm")
        else:
            serve(prompts[:8], [min(o, 16) for o in outputs[:8]], "warm")
        sync(hf.device)
        warm_s, graphs_before = time.perf_counter() - t, count_graphs()
        with frozen_heap():  # as the engine's window (paged_edu.labs.timed_run)
            t0 = time.perf_counter()
            tokens = serve(prompts, outputs, "r")
            sync(hf.device)
            dt = time.perf_counter() - t0
        graphs_in_window = count_graphs() - graphs_before
    finally:
        manager.stop(block=True, timeout=30)  # generate_batch stops it so too (timeout=5)
        if hasattr(manager, "destroy"):
            manager.destroy()
        hf.set_attn_implementation(original)
    useful = sum(min(len(t), o) for t, o in zip(tokens, outputs))
    log(
        f"  transformers CB ({attn}, use_cuda_graph={use_cuda_graph}): {len(prompts)} requests, {dt:.1f} s, "
        f"{useful / dt:,.0f} useful tok/s; warm-up {warm_s:.1f} s, {graphs_in_window} CUDA graphs captured in the "
        f"timed window"
    )
    return dict(
        seconds=dt,
        useful_tokens=useful,
        tokens_per_s=useful / dt,
        num_requests=len(prompts),
        warm_same_requests=warm_same,
        warm_s=warm_s,
        graph_captures_in_window=graphs_in_window,
        attn_implementation=attn,
        use_cuda_graph=use_cuda_graph,
        attn_errors=errors,
        generated_exactly=all(len(t) == o for t, o in zip(tokens, outputs)),
        first_outputs=[list(t) for t in tokens[:FIRST_COMPARED]],
    )

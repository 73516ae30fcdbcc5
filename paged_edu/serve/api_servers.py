"""``paged-edu serve --api-server-count N``: N API server processes on one port, one engine core.

What you will learn
-------------------
Why one API process can hold a fast engine back, and how several share a port and an engine.

**Why.** The engine core runs apart (:mod:`~paged_edu.serve.core`), but one API process still parses
every request, tokenizes it, and writes every token of every stream: at 512 requests arriving at once
on an H100 it took ~0.7 ms a request while streaming the admitted ones' tokens, so the last requests
reached the engine ~0.35 s late (``benchmarks/records/h100/serve_vs_offline_25729d9.json``: client
TTFT p50 161 ms against the engine's own ~32 ms). vLLM's answer is ``--api-server-count``
(``run_multi_api_server`` in ``vllm/entrypoints/cli/serve.py``): the main process binds the socket and
starts the engine core, then N API server processes (``APIServerProcessManager``, ``vllm/v1/utils.py``)
serve the one socket they inherit, each with its own ``client_index`` towards the core.

**Measured.** Not yet on a GPU (the session that built it had no device time left). On the project's
2-core CPU (``bench_serve_vs_offline.py --smoke --num-prompts 256 --length-scale 0.25``, four interleaved
rounds) N = 2 won the two busy rounds and lost the two quiet ones (served / offline 0.94 -> 0.60-0.68): two
API processes, the core and the client then share 2 cores, and the core waits for one. Whether it
lifts a GPU host's ratio is open; the A/B is the same command with ``--api-server-count 1`` and ``2``.

**How, here** (:func:`run_multi_api_server`, in the process ``paged-edu serve`` started):

1. the socket is bound and listening: connections queue in the kernel until an API server accepts
   them -- whichever process's event loop wakes first takes it (one listening socket, no
   ``SO_REUSEPORT``, as vLLM's);
2. the engine core is started by this process's :class:`~paged_edu.serve.client.EngineClient` on
   channel N of N + 1: it keeps that channel to send ``stop`` at the end;
3. N API servers are started (``python -m paged_edu.serve.launch SPEC``:
   :func:`~paged_edu.serve.launch.run_api_server`, each a fresh
   interpreter like the core), each given the socket's file descriptor, its channel k < N in the
   server's private folder, the core's pid, and its slot of the metrics file
   (:mod:`~paged_edu.serve.metrics` says how a scrape sums the slots); each one's client binds its
   channel and takes the core's ``ready`` (queued by ZeroMQ until it binds);
4. once every API server has said it serves (a byte on a pipe), ``ready on URL`` is printed.

Stopping: SIGTERM or Ctrl+C here sends SIGTERM to every API server (their own process groups: a
terminal's Ctrl+C reaches this process alone, and each API server gets one signal -- a second would be
uvicorn's forced exit). Each finishes or aborts its requests within ``--timeout-graceful-shutdown``
and exits; then the core is told to stop, and the exit status is 0. An API server or a core that
dies on its own is reported (which one, its pid, its exit status), the others are stopped the same
way, and the exit status is 1. Each API server prints how many requests it sent to the core as it
stops (``API server K (pid P): R requests``) -- the tests read it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

from paged_edu.serve.process import ROOT, die_with_parent

__all__ = ["run_multi_api_server"]

POLL_S = 0.1  # how often the supervisor looks at its children


def _own_group_dying_with_parent() -> None:
    """In an API server's process: a process group of its own (a terminal's Ctrl+C reaches the supervisor
    only, which passes it on once), and SIGTERM when the supervisor dies."""
    os.setpgrp()
    die_with_parent()


def run_multi_api_server(args, sock: socket.socket, url: str) -> int:
    """Serve ``args`` with ``args.api_server_count`` API servers on the bound ``sock``; the exit status."""
    from paged_edu.serve.client import EngineClient
    from paged_edu.serve.metrics import shared_slots
    from paged_edu.serve.process import http_stack, stopped

    count = args.api_server_count
    flags = dict(vars(args))
    sock.listen(2048)
    core = EngineClient(flags, channel=count, num_channels=count + 1)
    try:
        info = core.start()
    except (ValueError, RuntimeError) as exc:  # a flag the model or the pool cannot meet, a core that died
        sock.close()
        print(f"paged-edu serve: error: {exc}", file=sys.stderr)
        return 2
    metrics_path = os.path.join(core.directory, "metrics")
    shared_slots(metrics_path, count, create=True).flush()
    read_ready, write_ready = os.pipe()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    workers: list[subprocess.Popen] = []
    for k in range(count):
        spec = {"flags": flags, "fd": sock.fileno(), "ready_fd": write_ready, "directory": core.directory,
                "index": k, "count": count, "core_pid": core.process.pid, "metrics": metrics_path}  # fmt: skip
        workers.append(
            subprocess.Popen(
                [sys.executable, "-m", "paged_edu.serve.launch", json.dumps(spec)],  # launch.run_api_server
                env=env,
                pass_fds=(sock.fileno(), write_ready),
                preexec_fn=_own_group_dying_with_parent if sys.platform == "linux" else None,
            )
        )
    os.close(write_ready)
    sock.close()  # the API servers hold it now

    stops: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stops.append(signum))
    failure = _wait_ready(workers, core, read_ready, stops)
    if failure is None and not stops:
        http, loop = http_stack()
        print(f"paged-edu serve: {info['model_name']} {info['description']}; engine core: process "
              f"{core.process.pid}; {count} API servers: processes {', '.join(str(w.pid) for w in workers)}"
              + (f", KV events on {info['kv_events_endpoint']}" if info["kv_events_endpoint"] else ""), flush=True)  # fmt: skip
        print(f"paged-edu serve: HTTP by {http}, event loop {loop}", flush=True)
        print(f"paged-edu serve: ready on {url}", flush=True)
        while failure is None and not stops:
            time.sleep(POLL_S)
            failure = _failure(workers, core)
    if failure is not None:
        print(f"paged-edu serve: error: {failure}; stopping", file=sys.stderr, flush=True)
    _stop(workers, args.timeout_graceful_shutdown + 30.0)
    if failure is None:  # stopped as asked: each API server should have exited 0
        failure = next((f"API server {k} (process {w.pid}) exited with status {w.returncode}"
                        for k, w in enumerate(workers) if w.returncode != 0), None)  # fmt: skip
        if failure is not None:
            print(f"paged-edu serve: error: {failure}", file=sys.stderr, flush=True)
    core.close()
    os.close(read_ready)
    print(stopped(stops), flush=True)
    return 0 if failure is None else 1


def _failure(workers: list[subprocess.Popen], core) -> str | None:
    """Which child ended on its own, if one did."""
    for k, w in enumerate(workers):
        if w.poll() is not None:
            return f"API server {k} (process {w.pid}) exited with status {w.returncode}"
    if core.process.poll() is not None:
        return f"the engine core (process {core.process.pid}) exited with status {core.process.returncode}"
    return None


def _wait_ready(workers, core, read_ready: int, stops: list[int]) -> str | None:
    """Until every API server has written its byte; a failure (a child that ended, or the timeout) if one came."""
    deadline = time.monotonic() + core.startup_timeout
    seen = 0
    while seen < len(workers) and not stops:
        failure = _failure(workers, core)
        if failure is not None:
            return failure
        if time.monotonic() > deadline:
            return f"the API servers did not start within {core.startup_timeout:g} s"
        try:
            readable, _, _ = select.select([read_ready], [], [], POLL_S)
        except InterruptedError:
            continue
        if readable:
            seen += len(os.read(read_ready, 64))
    return None


def _stop(workers: list[subprocess.Popen], timeout: float) -> None:
    """SIGTERM to every API server still running, then wait for each (SIGKILL past ``timeout``)."""
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for w in workers:
        try:
            w.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()

"""``paged-edu serve`` as a child process on a free local port: what a notebook, a test or a benchmark
starts, talks to over HTTP, and stops -- also when something fails in between.

    with ServerProcess(["--model", "tiny-random"]) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        ...
    # stopped here: SIGTERM (in-flight requests finish or are aborted), then SIGKILL if it hangs

The port is the kernel's choice (``--port 0``): the server prints ``ready on http://127.0.0.1:PORT``
once it accepts requests, and that line is the only thing waited for. The child's output is kept
(:attr:`ServerProcess.lines`); a server that fails to start raises with its last lines.

A child must not outlive whoever started it: besides :meth:`ServerProcess.stop` (and the ``with``
block), it is stopped when this process exits (``atexit``: a notebook's kernel shut down after a
failed cell), and on Linux the kernel sends it SIGTERM if this process dies without exiting
(``PR_SET_PDEATHSIG``). The server's engine core, its own child process, dies with it the same way.
"""

from __future__ import annotations

import atexit
import gc
import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

__all__ = ["ServerProcess", "die_with_parent", "freeze_startup_heap", "http_stack", "stopped"]

ROOT = Path(__file__).resolve().parents[2]
# The line the engine core logs as it stops (EngineCore.run)
_CORE_REPORT = re.compile(
    r"engine core: (\d+) steps; engine\.step ([\d.]+) ms/step \(CPU ([\d.]+)\); "
    r"the loop's own work ([\d.]+) ms/step \(CPU ([\d.]+)\)"
)

# The line each API server of several logs as it stops (api_servers.run_api_server)
_API_SERVER_REPORT = re.compile(r"API server (\d+) \(pid \d+\): (\d+) requests")


class ServerProcess:
    """A ``paged-edu serve ARGV`` child; :attr:`url` once it is ready. ``timeout``: seconds to wait
    for it to start (loading a model) and to stop."""

    def __init__(
        self, argv: list[str], *, host: str = "127.0.0.1", timeout: float = 600.0, env=None, program=None
    ) -> None:
        self.argv = ["--host", host, "--port", "0", *argv]
        # What the interpreter runs, before "serve ARGV": paged_edu's command line, or a script that takes
        # the same arguments (a benchmark that times the API process from inside, bench_ttft_hops.py)
        self.program = ["-m", "paged_edu.cli"] if program is None else list(program)
        self.timeout = timeout
        self.env = dict(os.environ if env is None else env)
        # The child imports the same paged_edu as this process (a checkout that is not installed too).
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), self.env.get("PYTHONPATH")) if p)
        self.lines: deque[str] = deque(maxlen=2000)
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> ServerProcess:
        self.proc = subprocess.Popen(
            [sys.executable, *self.program, "serve", *self.argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        atexit.register(self.stop)
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                if "ready on " in line and self.url is None:
                    self.url = line.split("ready on ", 1)[1].strip()
                    ready.set()
            ready.set()  # the child ended

        self._reader = threading.Thread(target=read, name="paged-edu-serve-output", daemon=True)
        self._reader.start()
        if not ready.wait(self.timeout) or self.url is None:
            status = self.stop()
            tail = "\n".join(list(self.lines)[-30:])
            raise RuntimeError(f"paged-edu serve did not start (exit status {status}); its last lines:\n{tail}")
        return self

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if it has not stopped within ``timeout``; the exit status."""
        if self.proc is None:
            return None
        atexit.unregister(self.stop)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(self.timeout)
        if self._reader is not None:
            self._reader.join(self.timeout)  # every line it printed, its last one included
        return self.proc.returncode

    @property
    def kv_events_endpoint(self) -> str | None:
        """Where the server publishes its KV events (``--kv-events-endpoint``, the port it bound), if it does."""
        for line in self.lines:
            if "KV events on " in line:
                return line.split("KV events on ", 1)[1].strip()
        return None

    def engine_core_report(self) -> dict | None:
        """What the server's engine core said when it stopped (:mod:`~paged_edu.serve.core`): its steps, and
        per step the milliseconds in ``engine.step()`` and in its own work around it, wall-clock and CPU
        (``step_ms``, ``step_cpu_ms``, ``loop_ms``, ``loop_cpu_ms``); None before it has stopped."""
        for line in reversed(self.lines):
            m = _CORE_REPORT.search(line)
            if m:
                keys = ("step_ms", "step_cpu_ms", "loop_ms", "loop_cpu_ms")
                return {"steps": int(m[1]), **{k: float(v) for k, v in zip(keys, m.groups()[1:])}}
        return None

    def api_server_requests(self) -> list[int] | None:
        """With ``--api-server-count N > 1``: the requests each API server sent to the engine core (the line it
        prints as it stops, :mod:`~paged_edu.serve.api_servers`), in order; None before they stopped, or with one."""
        found = {int(m[1]): int(m[2]) for line in self.lines if (m := _API_SERVER_REPORT.search(line))}
        return [found[k] for k in sorted(found)] or None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def die_with_parent() -> None:
    """In a child process: SIGTERM when its parent dies (Linux's ``PR_SET_PDEATHSIG``; elsewhere nothing).
    The server's own child, the engine core, calls it too."""
    if sys.platform != "linux":
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # no glibc: the atexit stop still holds
        pass


def freeze_startup_heap() -> None:
    """In a server's process, once it has started: every object alive now (the imported modules, torch's,
    the model, the app) leaves the garbage collector's view for good (``gc.freeze``, after a collection so
    that no garbage is frozen), so the collections that the requests' objects trigger no longer walk them.
    vLLM does the same in both its processes (``freeze_gc_heap``, ``vllm/utils/gc_utils.py``, called in
    the API server's lifespan and in ``EngineCore.__init__``). What it buys in the API process, whose requests'
    objects live long enough to reach the oldest generation: a completion's CPU
    (:class:`~paged_edu.serve.app.OpenAIRoutes`'s measurement, 512 at a time) 194 / 194 -> 121 / 112 us; later,
    154 -> 90 us, of which the full collections (8 in 10,000 requests, each walking the 195k objects of the
    startup heap) had been 54 us a request, 2 us frozen. In the engine core a run of 512 requests triggered no
    full collection (tiny model, CPU): there it spares a long-running server the rare one. Objects frozen are
    still freed when their last reference goes; only a reference cycle among them would stay (a server process
    builds them once, at start)."""
    gc.collect()
    gc.freeze()


def http_stack() -> tuple[str, str]:
    """uvicorn's defaults ("auto") parse HTTP with httptools (C) and run uvloop's event loop where they are
    installed (the serve extra), else h11 (pure Python) and asyncio's loop. 512 streams on the tiny model,
    this 2-core CPU, interleaved runs: the API process's CPU 3.29 / 3.98 s with them against 4.35 / 4.70
    without (tests/serve pass on both)."""
    from importlib.util import find_spec

    return ("httptools" if find_spec("httptools") else "h11"), ("uvloop" if find_spec("uvloop") else "asyncio")


def stopped(stops: list[int]) -> str:
    """The line a server prints as it stops."""
    return f"paged-edu serve: stopped{' on ' + signal.Signals(stops[0]).name if stops else ''}"

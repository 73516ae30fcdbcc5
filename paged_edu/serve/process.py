"""``paged-edu serve`` as a child process on a free local port: what a notebook, a test or a benchmark
starts, talks to over HTTP, and stops -- also when something fails in between.

    with ServerProcess(["--model", "tiny-random"]) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        ...
    # stopped here: SIGTERM (in-flight requests finish or are aborted), then SIGKILL if it hangs

The port is the kernel's choice (``--port 0``): the server prints ``ready on http://127.0.0.1:PORT``
once it accepts requests, and that line is the only thing waited for. The child's output is kept
(:attr:`ServerProcess.lines`); a server that fails to start raises with its last lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

__all__ = ["ServerProcess"]

ROOT = Path(__file__).resolve().parents[2]


class ServerProcess:
    """A ``paged-edu serve ARGV`` child; :attr:`url` once it is ready. ``timeout``: seconds to wait
    for it to start (loading a model) and to stop."""

    def __init__(self, argv: list[str], *, host: str = "127.0.0.1", timeout: float = 600.0, env=None) -> None:
        self.argv = ["--host", host, "--port", "0", *argv]
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
            [sys.executable, "-m", "paged_edu.cli", "serve", *self.argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
        )
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

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

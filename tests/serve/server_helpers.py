"""A real server for a test, on 127.0.0.1 and a free port: in a thread of the test's process (the test
can read its engine), or as a ``paged-edu serve`` subprocess (the command line itself). Both are
stopped by the test that started them; every wait is bounded by the hang guard."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]


class ThreadServer:
    """``paged-edu serve ARGV`` built in this process and run by uvicorn in a thread."""

    def __init__(self, argv: list[str]) -> None:
        import uvicorn

        from paged_edu.cli import _build_parser
        from paged_edu.serve.launch import asgi, build_server

        self.args = _build_parser().parse_args(["serve", *argv])
        self.server = build_server(self.args)
        self.engine = self.server.engine
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        app = asgi(self.server, self.args.max_body_bytes)
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + HANG_GUARD_S
        while not self.uvicorn.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the in-thread server did not start")
            time.sleep(0.02)

    def call(self, fn):
        """``fn(engine)`` on the engine loop's thread, between two steps."""
        return self.server.loop.call(fn).result(timeout=HANG_GUARD_S)

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(HANG_GUARD_S)
        self.server.close()
        self.sock.close()


class ProcessServer:
    """``python -m paged_edu.cli serve ARGV --port 0`` in a subprocess; ``base_url`` once it says it is ready."""

    def __init__(self, argv: list[str], tmp_path: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.log = tmp_path / "server.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "paged_edu.cli", "serve", "--port", "0", *argv],
            stdout=subprocess.PIPE,
            stderr=open(self.log, "w"),
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                if "ready on " in line:
                    ready.set()
            ready.set()  # the process ended

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(HANG_GUARD_S) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"paged-edu serve did not start: {self.lines} {self.log.read_text()[-2000:]}")
        self.base_url = next(line.split("ready on ", 1)[1] for line in self.lines if "ready on " in line)

    def stop(self) -> int:
        """End the process (SIGTERM, then SIGKILL if it does not stop); its exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(HANG_GUARD_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(HANG_GUARD_S)
        return self.proc.returncode

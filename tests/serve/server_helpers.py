"""A real server for a test, on 127.0.0.1 and a free port: its API server in a thread of the test's process
(the test can ask its engine core for the engine's state between two steps), or as a ``paged-edu serve``
subprocess (the command line itself). Both are stopped by the test that started them; every wait is
bounded by the hang guard."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

from hang_guard import HANG_GUARD_S

from paged_edu.serve.process import ServerProcess

ROOT = Path(__file__).resolve().parents[2]


class ThreadServer:
    """``paged-edu serve ARGV`` built in this process and run by uvicorn in a thread."""

    def __init__(self, argv: list[str]) -> None:
        import uvicorn

        from paged_edu.cli import _build_parser
        from paged_edu.serve.launch import asgi, build_server

        self.args = _build_parser().parse_args(["serve", "--device", "cpu", *argv])  # the CPU suite, on any machine
        self.server = build_server(self.args)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # (as launch.main)
        self.sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        app = asgi(
            self.server, self.args.max_body_bytes, lambda: setattr(self, "event_loop", asyncio.get_running_loop())
        )
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

    def state(self) -> dict:
        """The engine's state, read by its core between two steps (``EngineCore.snapshot``)."""
        call = self.server.client.call("snapshot")
        return asyncio.run_coroutine_threadsafe(call, self.event_loop).result(timeout=HANG_GUARD_S)

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(HANG_GUARD_S)
        self.server.close()
        self.sock.close()


def stream_all_at_once(base_url: str, prompts: list, max_tokens: int, sampled=()) -> list[tuple[list[int], str]]:
    """Every prompt as a streaming completion, all at once, by ``openai.AsyncOpenAI``: greedy, or sampled at
    temperature 0.9 with seed ``k`` for the ``k`` in ``sampled``; each one's token ids and finish reason."""
    import openai

    async def main():
        c = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=HANG_GUARD_S)

        async def one(k):
            extra = {"ignore_eos": True, "return_token_ids": True}
            how = {"temperature": 0.9, "seed": k} if k in sampled else {"temperature": 0}
            stream = await c.completions.create(
                model="tiny-random", prompt=prompts[k], max_tokens=max_tokens, stream=True, **how, extra_body=extra
            )
            ids, finish = [], None
            async for chunk in stream:
                for ch in chunk.choices:
                    ids += ch.model_extra.get("token_ids") or []
                    finish = ch.finish_reason or finish
            return ids, finish

        try:
            return await asyncio.gather(*(one(k) for k in range(len(prompts))))
        finally:
            await c.close()

    return asyncio.run(main())


class ProcessServer(ServerProcess):
    """``paged-edu serve ARGV`` as a subprocess (:class:`paged_edu.serve.process.ServerProcess`), started."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__(["--device", "cpu", *argv], timeout=HANG_GUARD_S)
        self.start()
        self.base_url = self.url

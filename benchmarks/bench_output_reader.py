"""How fast the API process's event loop hands an engine-core message to its handler: a task awaiting
``zmq.asyncio.Socket.poll()`` (how :class:`paged_edu.serve.client.EngineClient` read the core's messages
until 6f328db) against a callback on the socket's descriptor (``loop.add_reader``, how it reads them now).

    python benchmarks/bench_output_reader.py            # 300 messages 3 ms apart, 40 messages 0.2 s apart

A child process stands for the engine core: it sends, over a ZeroMQ PUSH socket on an ``ipc://`` path as
the core does, small messages that carry their send time (``time.perf_counter``, one clock for both
processes); this process reads them on uvloop (uvicorn's loop in ``paged-edu serve``) one way or the
other, and reports the median from send to handler, per way, interleaved, three rounds. Messages 3 ms
apart are a decode stream; 0.2 s apart, a lone request on an idle server (both processes run cold).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import struct
import tempfile
import time

DRAIN = 64  # as paged_edu.serve.client


def _core(address: str, n: int, gap: float) -> None:
    import zmq

    context = zmq.Context()
    socket = context.socket(zmq.PUSH)
    socket.connect(address)
    for k in range(n + 1):
        time.sleep(gap)
        socket.send(struct.pack("d", time.perf_counter()) if k < n else b"end")
    socket.close(linger=1000)
    context.term()


async def _by_poll(socket, delays: list[float]) -> None:
    """The task: await the poll's future, read what is there, let the others run."""
    import zmq
    import zmq.asyncio

    reader = zmq.asyncio.Socket.from_socket(socket)
    while True:
        await reader.poll()
        for _ in range(DRAIN):
            try:
                raw = socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if raw == b"end":
                return
            delays.append(time.perf_counter() - struct.unpack("d", raw)[0])
        await asyncio.sleep(0)


async def _by_callback(socket, delays: list[float]) -> None:
    """The callback: run by the loop in the iteration that finds the descriptor readable."""
    import zmq

    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def readable() -> None:
        for _ in range(DRAIN):
            try:
                raw = socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if raw == b"end":
                done.set_result(None)
                return
            delays.append(time.perf_counter() - struct.unpack("d", raw)[0])
        loop.call_soon(readable)

    fd = socket.getsockopt(zmq.FD)
    loop.add_reader(fd, readable)
    loop.call_soon(readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)


def measure(way: str, n: int, gap: float) -> float:
    """Median microseconds from send to handler, ``way`` "poll" or "callback"."""
    import uvloop
    import zmq

    with tempfile.TemporaryDirectory(prefix="paged-edu-reader-") as folder:
        address = f"ipc://{folder}/output"
        context = zmq.Context()
        socket = context.socket(zmq.PULL)
        socket.bind(address)
        core = mp.get_context("spawn").Process(target=_core, args=(address, n, gap))
        core.start()
        delays: list[float] = []
        uvloop.run((_by_poll if way == "poll" else _by_callback)(socket, delays))
        core.join()
        socket.close(linger=0)
        context.term()
    return 1e6 * statistics.median(delays[3:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    for n, gap in ((300, 0.003), (40, 0.2)):
        for r in range(args.rounds):
            ways = ("poll", "callback") if r % 2 == 0 else ("callback", "poll")
            got = {way: measure(way, n, gap) for way in ways}
            print(
                f"{n} messages {gap * 1e3:g} ms apart: send -> handler median {got['poll']:.0f} us awaiting "
                f"zmq.asyncio poll(), {got['callback']:.0f} us in a reader callback",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Download the wheels ``paged-edu serve``, ``bench-serve`` and lesson 11 need on a GPU box with no registry.

    python scripts/serve_wheels.py .whl_serve     # ~12 MB, the versions of constraints.txt

The GPU machine the project is lent (``../shared/guides/gpu.md``: CPython 3.12, torch, triton, transformers,
aiohttp, requests and their needs; no registry) has no FastAPI stack. The notebook wheels (papermill,
nbval, ipykernel, plotly, pyzmq, ...: ``../shared/tools/device-wheels.sh``) do not bring it either. This
script fetches what is missing there, at the versions ``constraints.txt`` pins (the CPU's tested set),
for CPython 3.12 on x86-64 Linux, without dependencies: the list below is the closure, checked on an
H100 lease (2026-12-07). Two of its members came to light as failures there -- fastapi 0.165 imports
``opentelemetry`` at import time, and openai 3.63's client is ``httpx2`` on ``httpcore2`` and
``truststore`` -- each a lesson-11 run lost. Install there, beside the notebook wheels::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl .whl_serve/*.whl
    export PYTHONPATH=/tmp/site:$PWD
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The serve extra's closure minus what the GPU image has (pyzmq comes with the notebook wheels).
WANTED = (
    "fastapi", "starlette", "annotated-doc", "opentelemetry-api",  # the server's framework
    "pydantic", "pydantic-core", "annotated-types", "typing-inspection",  # its request models
    "anyio", "sniffio", "h11", "uvicorn", "httptools", "uvloop",  # the ASGI server, its C parser and loop
    "prometheus-client", "msgpack",  # /metrics, the KV events
    "httpx", "httpcore",  # bench-serve's scrapes
    "openai", "httpx2", "httpcore2", "truststore", "jiter",  # the client lesson 11 and the tests drive it with
    "gguf",  # the model extra's GGUF reader (SmolLM2's weights, where they are installed)
)  # fmt: skip


def pinned(names: tuple[str, ...], constraints: Path) -> list[str]:
    """``name==version`` for each name, as constraints.txt pins it (the first pin of a name)."""
    pins: dict[str, str] = {}
    for line in constraints.read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.-]+)==([^\s;]+)", line)
        if m:
            pins.setdefault(m.group(1).lower().replace("_", "-"), m.group(2))
    missing = [n for n in names if n not in pins]
    if missing:
        sys.exit(f"constraints.txt pins no version of: {', '.join(missing)}")
    return [f"{n}=={pins[n]}" for n in names]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    platforms = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
                 "manylinux1_x86_64", "any")  # fmt: skip
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "-d", argv[0]]  # fmt: skip
    for p in platforms:
        cmd += ["--platform", p]
    return subprocess.run([*cmd, *pinned(WANTED, ROOT / "constraints.txt")]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

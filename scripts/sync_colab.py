"""Rewrite every lesson's "Open in Colab" badge and Colab install cell from ``REPO_URL``.

    python scripts/sync_colab.py          # after pointing paged_edu.lessons.setup.REPO_URL at a fork

The badge is the line under the title (the first markdown cell's line holding ``colab-badge.svg``),
the install cell the first code cell; both come from :mod:`paged_edu.lessons.setup`
(:func:`colab_badge`, :func:`colab_cell_source`). Nothing else in a notebook changes, and both cells
carry no outputs, so the notebooks stay clean.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402

from paged_edu.lessons.setup import colab_badge, colab_cell_source  # noqa: E402


def sync(path: Path) -> bool:
    """Rewrite ``path``'s badge and install cell; True if anything changed."""
    nb = nbformat.read(path, as_version=4)
    title = nb.cells[0]
    lines = title.source.split("\n")
    (at,) = [i for i, line in enumerate(lines) if "colab-badge.svg" in line]
    lines[at] = colab_badge(path.name)
    install = next(c for c in nb.cells if c.cell_type == "code")
    before = (title.source, install.source)
    title.source, install.source = "\n".join(lines), colab_cell_source(path.name)
    if (title.source, install.source) == before:
        return False
    nbformat.write(nb, path)
    return True


def main() -> int:
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        print(f"{path.name}: {'rewritten' if sync(path) else 'already in sync'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

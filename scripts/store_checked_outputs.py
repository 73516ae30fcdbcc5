"""Re-execute lesson notebooks on the CPU and store only their checked outputs (maintainers' tool).

    .venv/bin/python scripts/store_checked_outputs.py [notebooks/02_*.ipynb ...]

Every cell tagged ``keep_output`` (the cells tagged ``nbval-check-output``) keeps what it printed and
its execution count (nbval needs one); every other output and count, and any widget state, are
stripped with nbstripout's own rules, so the result passes ``nbstripout --keep-count --verify``
and ``tests/lessons/test_notebooks_clean.py``. Run it after a
change that alters a checked number, then review the diff: it is the numbers nbval will enforce.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbstripout import strip_output

ROOT = Path(__file__).resolve().parents[1]
EXTRA_KEYS = [
    "metadata.signature",
    "metadata.widgets",
    "cell.metadata.collapsed",
    "cell.metadata.ExecuteTime",
    "cell.metadata.execution",
    "cell.metadata.heading_collapsed",
    "cell.metadata.hidden",
    "cell.metadata.scrolled",
]


def store(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(
        nb,
        kernel_name="python3",
        timeout=600,
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=False,
    ).execute()
    seconds = time.perf_counter() - start
    for cell in nb.cells:  # no lesson cell raises: one that shows a failure catches it and prints it
        if cell.cell_type == "code" and any(o.get("output_type") == "error" for o in cell.outputs):
            raise RuntimeError(f"{path.name}: a cell raised:\n{cell.source}")
    # nbval refuses stored outputs without an execution count, so checked cells keep theirs;
    # every other cell loses its count (and its outputs).
    for cell in nb.cells:
        if cell.cell_type == "code" and "keep_output" not in cell.metadata.get("tags", []):
            cell.execution_count = None
    strip_output(nb, keep_output=False, keep_count=True, keep_id=False, extra_keys=EXTRA_KEYS)
    nbformat.write(nb, path)
    return seconds


def main(argv: list[str]) -> int:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # checked outputs are the CPU's (nbval runs on the CPU)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    paths = [Path(p) for p in argv] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for path in paths:
        print(f"{path.name}: {store(path):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

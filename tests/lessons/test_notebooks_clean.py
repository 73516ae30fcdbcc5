"""The lesson notebooks are stored clean: small diffs, no widget state, only checked outputs.

Policy (``scripts/store_checked_outputs.py`` produces exactly this):

* a notebook equals what ``nbstripout --keep-count`` makes of it (outputs stripped except in cells
  tagged ``keep_output``, widget state and volatile metadata gone, cell ids ``"0", "1", ...``);
* the cells that keep outputs are exactly the cells tagged ``nbval-check-output`` (nbval's tag: no
  harness comment in the code a learner reads); each has an execution
  count (nbval needs one) and small plain-text outputs; every other cell has neither;
* no cell is tagged ``raises-exception``: papermill 2.7 fails a run on any raised exception whatever
  the tag, so a cell that shows a failure catches it and prints it;
* every lesson has a ``parameters`` cell with ``device = "auto"`` and ``seed``, a Colab cell that
  never installs torch, an Open-in-Colab badge for its own file, and "Your turn" checks.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import nbformat
import pytest
from nbstripout import strip_output

from paged_edu.lessons.setup import PARAMETERS, REPO_URL, colab_badge, colab_cell_source

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHECK = "nbval-check-output"  # the cell tag that makes nbval compare a cell's output
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
MAX_OUTPUT_CHARS = 3000  # per checked cell
MAX_FILE_BYTES = 80_000


def problems(nb: nbformat.NotebookNode, name: str) -> list[str]:
    """Everything that makes a stored notebook unclean (empty when it is clean)."""
    found = []
    stripped = strip_output(copy.deepcopy(nb), keep_output=False, keep_count=True, keep_id=False, extra_keys=EXTRA_KEYS)
    if stripped != nb:
        found.append("differs from `nbstripout --keep-count` output (run scripts/store_checked_outputs.py)")
    if "widgets" in nb.metadata:
        found.append("notebook metadata holds widget state")
    for k, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.get("tags", [])
        checked = CHECK in tags
        if "NBVAL_" in cell.source:
            found.append(f"cell {k}: a '# NBVAL_...' comment in the code; use nbval's cell tags instead")
        if "raises-exception" in tags:  # papermill fails the run whatever the tag
            found.append(f"cell {k}: tagged raises-exception; a cell that shows a failure catches it and prints it")
        if checked != ("keep_output" in tags):
            found.append(f"cell {k}: the tags '{CHECK}' and 'keep_output' must go together")
        if not checked:
            if cell.outputs:
                found.append(f"cell {k}: stored outputs in a cell that is not checked")
            if cell.execution_count is not None:
                found.append(f"cell {k}: execution count {cell.execution_count} on a cell that is not checked")
            continue
        if not cell.outputs or cell.execution_count is None:
            found.append(f"cell {k}: a checked cell needs its stored output and execution count")
        size = 0
        for out in cell.outputs:
            kind = out.get("output_type")
            if kind == "stream" and out.get("name") == "stdout":
                size += len(out.get("text", ""))
            elif kind == "execute_result" and set(out.get("data", {})) == {"text/plain"}:
                size += len(out["data"]["text/plain"])
            elif (
                kind == "display_data"
                and set(out.get("data", {})) == {"text/markdown", "text/plain"}
                and out["data"]["text/markdown"] == out["data"]["text/plain"]
            ):
                size += len(out["data"]["text/plain"])  # a sentence rendered by paged_edu.lessons.prose.say
            else:
                found.append(f"cell {k}: output of type {kind} {sorted(out.get('data', {}))} is not plain text")
        if size > MAX_OUTPUT_CHARS:
            found.append(f"cell {k}: {size} characters of checked output (> {MAX_OUTPUT_CHARS})")
    size = len(json.dumps(nb, indent=1))
    if size > MAX_FILE_BYTES:
        found.append(f"{size} bytes (> {MAX_FILE_BYTES})")
    return found


def test_the_lessons_are_numbered_from_01_without_gaps():
    assert [p.name[:3] for p in LESSONS] == [f"{k:02d}_" for k in range(1, len(LESSONS) + 1)]
    assert len(LESSONS) >= 3


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_first_code_cell_is_exactly_the_colab_cell(path):
    """REPO_URL lives in one place: every lesson's install cell is generated from it."""
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source == colab_cell_source(path.name), "run: python scripts/sync_colab.py"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_the_colab_badge_is_generated_from_the_one_address(path):
    """The badge under each title opens this very lesson from REPO_URL, and says when that is a placeholder."""
    title = nbformat.read(path, as_version=4).cells[0].source
    assert colab_badge(path.name) in title.splitlines(), "run: python scripts/sync_colab.py"
    assert f"{REPO_URL.removeprefix('https://github.com/')}/blob/main/notebooks/{path.name})" in title


def test_sync_colab_rewrites_a_stale_badge_and_install_cell(tmp_path, monkeypatch):
    """``scripts/sync_colab.py`` (run after REPO_URL changes) puts back exactly the generated cells."""
    import shutil
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import sync_colab

    path = tmp_path / LESSONS[0].name
    shutil.copy(LESSONS[0], path)
    assert not sync_colab.sync(path)  # the stored lesson is in sync
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].source = nb.cells[0].source.replace("paged-edu/paged_edu", "someone/else")
    next(c for c in nb.cells if c.cell_type == "code").source = "# stale"
    nbformat.write(nb, path)
    assert sync_colab.sync(path)
    nb = nbformat.read(path, as_version=4)
    assert colab_badge(path.name) in nb.cells[0].source.splitlines() and "someone/else" not in nb.cells[0].source
    assert next(c for c in nb.cells if c.cell_type == "code").source == colab_cell_source(path.name)
    assert nbformat.read(path, as_version=4) == nbformat.read(LESSONS[0], as_version=4)
    sys.modules.pop("sync_colab", None)


def test_the_colab_check_can_fail():
    nb = nbformat.read(LESSONS[0], as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source.replace("paged-edu/paged_edu", "someone/else") != colab_cell_source(LESSONS[0].name)


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_every_parameter_is_checked_by_the_setup_call(path):
    """Each name the parameters cell defines has a rule and is handed to ``setup(...)``."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    params = next(c for c in code if "parameters" in c.metadata.get("tags", []))
    names = re.findall(r"^(\w+)\s*=", params.source, re.M)
    call = next(c.source for c in code if "= setup(device" in c.source)
    for name in names:
        assert name == "device" or name in PARAMETERS, f"no rule for parameter {name!r} in PARAMETERS"
        if name != "device":
            assert re.search(rf"\b{name}={name}\b", call), f"setup(...) does not check {name}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_notebook_is_stored_clean(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert problems(nb, path.name) == []


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_notebook_has_parameters_colab_cell_and_exercises(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    assert re.search(r'^device = "auto"', params[0].source, re.M) and re.search(r"^seed = \d+", params[0].source, re.M)
    colab = code[0].source
    assert "google.colab" in colab and "enable_custom_widget_manager" in colab
    for line in colab.splitlines():
        if "pip install" in line:
            assert "torch" not in line and ("--no-deps" in line or "paged_edu" not in line)
    assert f"notebooks/{path.name})" in nb.cells[0].source and "colab-badge.svg" in nb.cells[0].source
    assert sum("ex.check(" in c.source for c in code) >= 3
    assert sum(CHECK in c.metadata.get("tags", []) for c in code) >= 3


def test_the_policy_catches_a_dirty_notebook():
    nb = nbformat.read(LESSONS[0], as_version=4)
    dirty = copy.deepcopy(nb)
    plain = next(c for c in dirty.cells if c.cell_type == "code" and CHECK not in c.metadata.get("tags", []))
    plain.execution_count = 3
    plain.outputs = [nbformat.v4.new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {}})]
    dirty.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    plain.source = "# NBVAL_IGNORE_OUTPUT\n" + plain.source
    plain.metadata["tags"] = ["raises-exception"]
    found = problems(dirty, "dirty")
    assert any("tagged raises-exception" in p for p in found)
    assert any("not checked" in p for p in found) and any("widget state" in p for p in found)
    assert any("'# NBVAL_...' comment" in p for p in found)
    unchecked = copy.deepcopy(nb)
    checked = next(c for c in unchecked.cells if c.cell_type == "code" and CHECK in c.metadata.get("tags", []))
    checked.outputs = []
    assert any("needs its stored output" in p for p in problems(unchecked, "unchecked"))

"""Every cell of lessons 1-3 is safe to run again after any widget interaction.

A learner plays with a widget -- frees every request, fills the pool, forks, switches presets --
and then re-runs the cells below it. Each lesson is executed in-process (on the CPU), its widgets
are driven into those hostile states through their own buttons, and every later code cell that
does not rebuild that widget is run again: none may raise.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from paged_edu.viz.widgets import BlockTableWidget, KVMemoryCalculator, PrefixSharingWidget

ROOT = Path(__file__).resolve().parents[2]
LESSONS = [
    ROOT / "notebooks" / n
    for n in ("01_kv_cache_memory.ipynb", "02_paged_virtual_memory.ipynb", "03_prefix_sharing_and_cow.ipynb")
]
WIDGETS = (BlockTableWidget, PrefixSharingWidget, KVMemoryCalculator)


def _cells(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    transform = TransformerManager().transform_cell
    return [transform(c.source) for c in nb.cells if c.cell_type == "code"]


def _run(source: str, ns: dict, where: str) -> None:
    try:
        exec(compile(source, where, "exec"), ns)
    except Exception as exc:  # name the cell in the failure
        raise AssertionError(f"{where} raised {type(exc).__name__}: {exc}\n--- cell ---\n{source}") from exc


def _hostile(widget) -> None:
    """Drive a widget, through its buttons, into the states a later cell is least ready for."""
    if isinstance(widget, KVMemoryCalculator):
        widget.layers.value = 3  # the preset turns "custom"
        widget.gpu.value = "T4 (16 GB)"
        widget.batch.value = 512
        return
    for seq in list(widget.allocator.seq_ids):  # everything freed ...
        widget.seq.value = seq
        widget.free_button.click()
    add = widget.add_button if isinstance(widget, BlockTableWidget) else widget.chat_button
    for _ in range(2 * widget.allocator.num_blocks):  # ... then the pool filled (the last clicks are refused)
        add.click()
    if isinstance(widget, PrefixSharingWidget):
        widget.fork_button.click()
        widget.append_button.click()
        widget.dynamic.value = "start"
    else:
        widget.append_button.click()


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name[:2])
def test_every_cell_runs_again_after_the_widgets_were_played_with(path, capsys):
    cells = _cells(path)
    from IPython.display import display

    ns: dict = {"__name__": "__main__", "display": display}  # a kernel's builtins give cells display()
    first_widget = None
    for k, source in enumerate(cells):
        _run(source, ns, f"{path.name} cell {k}")
        if k == 1:
            ns["device"] = "cpu"  # the parameters cell: this test runs on the CPU
        if first_widget is None and any(isinstance(v, WIDGETS) for v in ns.values()):
            first_widget = k
    widgets = {name: w for name, w in ns.items() if isinstance(w, WIDGETS) and not name.startswith("_")}
    assert widgets and first_widget is not None
    for w in widgets.values():
        _hostile(w)
    rebuilds = re.compile(r"^(%s)\s*=" % "|".join(map(re.escape, widgets)), re.M)
    rerun = [k for k in range(first_widget + 1, len(cells)) if not rebuilds.search(cells[k])]
    assert rerun, "no cell after the widget to run again"
    for k in rerun:
        _run(cells[k], ns, f"{path.name} cell {k} (run again)")
    capsys.readouterr()

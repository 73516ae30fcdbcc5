"""Where Triton is not installed (macOS, Windows, Linux without the ``kernels`` extra) the lessons still
run: the kernel source they read comes from the file, a cell that needs Triton says what it skips, and
``setup`` says the kernel cells run the PyTorch reference. Checked in a subprocess where ``import
triton`` fails (``sys.modules["triton"] = None``: Python's own way to make an import fail), against
the same reads in this process, where Triton is installed. Every lesson run without Triton installed
at all: tests/project/test_packaging.py::test_every_lesson_runs_from_the_installed_wheel_without_triton.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WITHOUT_TRITON = """
import json, sys
sys.modules["triton"] = None   # import triton -> ModuleNotFoundError
from paged_edu.kernels import triton_available
from paged_edu.labs.kernel_ladder import source_between, source_of
from paged_edu.lessons.setup import needs_triton, setup
from paged_edu.lessons.where_it_lives import CONCEPTS, resolve

tutorial = source_of("paged_edu.kernels.decode.tutorial")
pieces = source_of("paged_edu.kernels.decode.pieces")
try:
    resolve("paged_edu.kernels.triton_decode:no_such_kernel")
    wrong = "resolved"
except ValueError as exc:
    wrong = str(exc)
setup("cpu")
from paged_edu.lessons import exercises as ex
from paged_edu.lessons.setup import triton_modules

triton, tl = triton_modules()


@triton.jit
def kernel(x_ptr, N: tl.constexpr):  # a learner's kernel: defined without Triton
    tl.store(x_ptr + tl.arange(0, N), 0)


try:
    kernel[(1,)](None, N=4)
    launched = "ran"
except RuntimeError as exc:
    launched = str(exc)
verdict = ex.check("10.1", lambda *args: None)
print(json.dumps({
    "launched": launched,
    "verdict": verdict.ok,
    "available": triton_available(),
    "needs": needs_triton("the split-KV kernel"),
    "excerpt": source_between(tutorial.paged_decode_kernel, "q_ptrs = ", "bt_row_ptr = "),
    "merge": pieces.merge_splits,
    "resolved": [type(resolve(p)).__name__ for c in CONCEPTS for p in c.paged_edu],
    "wrong": wrong,
}))
"""


@pytest.fixture(scope="module")
def without_triton():
    pytest.importorskip("triton")  # the oracle: the same reads where Triton is installed
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRITON], capture_output=True, text=True, env=env, cwd=ROOT, check=True
    )
    *printed, result = out.stdout.strip().splitlines()
    return printed, json.loads(result)


def test_kernel_source_is_read_from_the_file_as_the_lesson_shows_it(without_triton):
    import inspect

    from paged_edu.kernels.decode import pieces, tutorial
    from paged_edu.labs.kernel_ladder import source_between

    _, got = without_triton
    assert not got["available"]
    assert got["excerpt"] == source_between(tutorial.paged_decode_kernel, "q_ptrs = ", "bt_row_ptr = ")
    assert got["merge"] == inspect.getsource(pieces.merge_splits.fn).rstrip("\n")  # decorator included
    assert got["merge"].startswith("@triton.jit")


def test_setup_and_a_cell_that_needs_triton_say_so_in_one_line(without_triton):
    printed, got = without_triton
    assert got["needs"] is False
    assert printed[0] == "device: cpu, dtype: torch.float32"
    assert printed[1].startswith("note: the kernel cells run the PyTorch reference here. Triton is not installed")
    assert printed[2].startswith("[ ] 10.1 needs Triton to be checked: Triton is not installed here")
    assert printed[3].startswith("the split-KV kernel: skipped. Triton is not installed")
    assert len(printed) == 4


def test_a_kernel_is_defined_without_triton_and_its_launch_and_its_exercise_say_why_not(without_triton):
    _, got = without_triton
    assert got["launched"].startswith("the kernel kernel: Triton is not installed here") and got["verdict"] is False


def test_lesson8s_names_resolve_without_triton_and_a_wrong_one_still_fails(without_triton):
    from paged_edu.lessons.where_it_lives import CONCEPTS

    _, got = without_triton
    assert len(got["resolved"]) == sum(len(c.paged_edu) for c in CONCEPTS)
    assert "str" in got["resolved"]  # a Triton kernel, as its source text
    assert got["wrong"] == "'paged_edu.kernels.triton_decode:no_such_kernel': 'no_such_kernel' not found"


def test_a_module_that_fails_for_another_reason_is_not_read_instead(tmp_path, monkeypatch):
    from paged_edu.labs.kernel_ladder import source_of

    (tmp_path / "needs_numpyy.py").write_text("import numpyy\n\ndef f():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="numpyy"):
        source_of("needs_numpyy")

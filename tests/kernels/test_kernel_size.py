"""No ``@triton.jit`` function in ``paged_edu/kernels/`` has more than 30 parameters or 120 lines.

A kernel that grows past that is a kernel a reader can no longer follow: split it into named
``@triton.jit`` pieces (``paged_edu/kernels/decode/pieces.py`` shows how) or group what belongs
together. Read from the source with ``ast``, so any decorator form counts: ``@triton.jit``,
``@triton.jit(...)``, ``@jit``, ``@tl.core.jit``...
"""

from __future__ import annotations

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "paged_edu" / "kernels"
MAX_PARAMS = 30
MAX_LINES = 120  # from the ``def`` line to the last line of the body


def _is_jit(decorator: ast.expr) -> bool:
    """``jit`` as the decorator's last name, called or not (``triton.jit``, ``jit``, ``triton.jit(...)``)."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
    return name == "jit"


def jit_functions(root: Path = KERNELS):
    """``(path, name, parameters, lines)`` of every ``@...jit``-decorated function under ``root``."""
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(map(_is_jit, node.decorator_list)):
                a = node.args
                params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None)
                params += a.kwarg is not None
                yield path.relative_to(root.parents[1]), node.name, params, node.end_lineno - node.lineno + 1


def oversized(functions) -> list[str]:
    """One line per function over a limit, naming it and what it is over."""
    return [
        f"{path}:{name}: {params} parameters (max {MAX_PARAMS}), {lines} lines (max {MAX_LINES})"
        for path, name, params, lines in functions
        if params > MAX_PARAMS or lines > MAX_LINES
    ]


def test_no_triton_kernel_over_30_parameters_or_120_lines():
    found = list(jit_functions())
    assert len(found) >= 10, found  # the walk sees the kernels (decode, prefill, store, fused, GEMM, pdl)
    assert not oversized(found), "\n".join(oversized(found))


def test_the_walk_finds_every_decorator_form_and_names_what_is_too_big(tmp_path):
    """The check itself can fail: a made-up module with each decorator form and one kernel too big."""
    many = ", ".join(f"a{i}" for i in range(31))
    body = "\n".join(f"    x{i} = {i}" for i in range(121))
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text(
        "import triton\nfrom triton import jit\nimport triton.language as tl\n\n"
        f"@triton.jit\ndef wide({many}):\n    pass\n\n"
        f"@triton.jit(do_not_specialize=['a'])\ndef long(a):\n{body}\n\n"
        "@jit\ndef bare(a, B: tl.constexpr):\n    pass\n\n"
        "@tl.core.jit\ndef dotted(*args, **kwargs):\n    pass\n\n"
        "def plain(" + many + "):\n    pass\n"
    )
    found = {name: (params, lines) for _, name, params, lines in jit_functions(tmp_path / "kernels")}
    assert found == {"wide": (31, 2), "long": (1, 122), "bare": (2, 2), "dotted": (2, 2)}
    report = oversized(jit_functions(tmp_path / "kernels"))
    assert len(report) == 2 and "wide: 31 parameters" in report[0] and "long: 1 parameters" in report[1]

"""Every wait in the tests is bounded by the one hang guard, ``tests/hang_guard.py``'s ``HANG_GUARD_S``.

A ``timeout=`` given a number is a guess at how fast the machine is (``wait_for_selector(...,
timeout=30_000)`` waited 30 s for a plot, issue 44): on a slow or shared machine it fails a test that
was only slow, and it hides from the one place that says how long the suite may wait. The scan reads
every test module's calls from the source.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _is_number(node: ast.AST) -> bool:
    """A number written out: ``30``, ``30_000``, ``0.5``, ``-1``, ``60 * 1000`` (no name in it)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left) and _is_number(node.right)
    return False


def literal_timeouts(root: Path) -> list[str]:
    """``path:line keyword=value`` for every call under ``root/tests`` whose ``*timeout`` keyword is a number."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            for keyword in node.keywords:
                if keyword.arg and keyword.arg.endswith("timeout") and _is_number(keyword.value):
                    rel = path.relative_to(root)
                    found.append(f"{rel}:{node.lineno} {keyword.arg}={ast.unparse(keyword.value)}")
    return found


def test_no_wait_in_the_tests_has_a_literal_bound():
    assert literal_timeouts(ROOT) == []


def test_the_scan_finds_a_literal_bound(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "page.wait_for_selector('.plot', timeout=30_000)\n"
        "urlopen(url, timeout=10)\n"
        "run(cmd, execution_timeout=2 * 60)\n"
        "page.wait_for_selector('.plot', timeout=HANG_GUARD_S * 1000)\n"
        "urlopen(url, timeout=HANG_GUARD_S)\n"
    )
    assert literal_timeouts(tmp_path) == [
        "tests/test_x.py:1 timeout=30000",
        "tests/test_x.py:2 timeout=10",
        "tests/test_x.py:3 execution_timeout=2 * 60",
    ]

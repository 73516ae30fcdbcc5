"""Orientation: every package's docstring names each of its modules and subpackages, and no
docstring or comment under ``paged_edu/`` cites an issue of a tracker a reader doesn't have.
(``paged_edu/kernels/`` is held to the same by its own tests.)"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "paged_edu"
PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py") if "kernels" not in p.relative_to(PACKAGE).parts)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_a_package_docstring_lists_its_modules(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    parts = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
    parts += [p.name for p in package.iterdir() if (p / "__init__.py").exists()]
    if package.name == "exercises":  # one module per lesson, named by pattern
        parts = [p for p in parts if not re.fullmatch(r"lesson\d+", p)]
        assert ":mod:`.lesson1`" in doc
    missing = [m for m in parts if not re.search(rf"\b{m}\b", doc)]
    assert not missing, f"{package.name}/__init__.py does not name {missing}"


def comments_and_docstrings(path: Path):
    text = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield getattr(node, "lineno", 1), doc


ISSUE = re.compile(r"\bissues?\s*#?\d+|(?<![\w/.-])#\d+\b", re.I)  # "issue 14", "issue #3", a bare "#17"


def test_no_docstring_or_comment_cites_an_issue_number():
    hits = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {ISSUE.search(text).group(0)}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if "kernels" not in path.relative_to(PACKAGE).parts
        for line, text in comments_and_docstrings(path)
        if ISSUE.search(text)
    ]
    assert not hits, hits


def test_the_issue_pattern_catches_what_it_should():
    assert ISSUE.search("(issue 23, item 4)") and ISSUE.search("see #17") and ISSUE.search("Issue #5")
    assert not ISSUE.search("vllm-project/vllm#17045") and not ISSUE.search("a 6-char #1a2b3c colour")

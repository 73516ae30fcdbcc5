"""docs/design.md's "library in one screen" runs as printed: every statement executes, and every
``# -> value`` comment is the value of its line (the oracle is the doc itself)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def one_screen() -> str:
    text = DESIGN.read_text()
    section = text[text.index("## The library in one screen") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def expected_value(comment: str):
    """The longest prefix of the text after ``-> `` that is a Python literal (the rest is prose)."""
    text = comment.split("-> ", 1)[1]
    for end in range(len(text), 0, -1):
        try:
            return ast.literal_eval(text[:end].strip())
        except (ValueError, SyntaxError):
            continue
    raise AssertionError(f"no value after '->' in {comment!r}")


def checked_lines(code: str) -> list[tuple[str, object]]:
    """``(expression, expected value)`` for each line with a ``# -> value`` comment."""
    out = []
    for line in code.splitlines():
        if "# -> " in line:
            expr, comment = line.split("#", 1)
            out.append((expr.strip(), expected_value(comment)))
    return out


def test_the_one_screen_example_runs_and_says_what_it_returns():
    code = one_screen()
    checks = checked_lines(code)
    assert len(checks) >= 6  # the example says what its calls return
    namespace: dict = {}
    for node in ast.parse(code).body:  # in order: each check sees the state the lines before it left
        statement = ast.get_source_segment(code, node)
        if isinstance(node, ast.Expr):
            value = eval(compile(ast.Expression(node.value), "<design.md>", "eval"), namespace)
            for expr, want in checks:
                if expr == statement:
                    assert value == want, (statement, value, want)
        else:
            exec(compile(ast.Module([node], []), "<design.md>", "exec"), namespace)


def test_a_wrong_value_in_the_doc_would_fail():
    """The checker itself can fail: a comment that disagrees with its line is caught."""
    code = "x = [1, 2]\nlen(x)   # -> 3: wrong on purpose\n"
    ((expr, want),) = checked_lines(code)
    namespace: dict = {}
    exec("x = [1, 2]", namespace)
    with pytest.raises(AssertionError):
        assert eval(expr, namespace) == want

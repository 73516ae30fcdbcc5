"""The package's layers import in one direction only, and no module imports itself round a circle.

Every import in ``paged_edu`` is read from the source (the AST: imports at the top, inside functions
and under ``if``, relative ones, and ``importlib.import_module("...")`` with a literal name), so a
lazy import counts as much as an eager one. The order, lowest first, is :data:`LAYERS`: a module may
import its own layer and the layers before it, never one after it. The first three are plain Python
(:data:`TORCH_FREE`): the core install -- the allocators, the scheduler, the simulator -- runs with
neither torch nor the notebook stack.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The one statement of the layer order (paste-ready for the README). `paged_edu` itself (the package's
# __init__, the names it re-exports) sits above every layer; nothing in the package imports it.
LAYERS = [
    "data",
    "core",
    "sched",
    "sim",
    "kernels",
    "cache",
    "models",
    "engine",
    "serve",
    "labs",
    "viz",
    "lessons",
    "cli",
]
TORCH_FREE = LAYERS[: LAYERS.index("kernels")]
HEAVY = ("torch", "triton", "plotly", "ipywidgets", "anywidget", "transformers")
TOP = "paged_edu"


def modules(root: Path, package: str = TOP) -> dict[str, Path]:
    """Every module of ``package`` under ``root``, by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(name: str, is_package: bool, node: ast.AST, known: set[str]) -> list[str]:
    """The dotted names ``node`` imports (a ``from`` import names a submodule where there is one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            here = name.split(".") if is_package else name.split(".")[:-1]
            here = here[: len(here) - (node.level - 1)]
            base = ".".join(here + ([base] if base else []))
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, (ast.Attribute, ast.Name))
        and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return [node.args[0].value]
    return []


def import_graph(root: Path, package: str = TOP) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(graph, external)``: per module, the package's modules it imports, and the top-level names
    of everything else it imports."""
    found = modules(root, package)
    known = set(found)
    graph: dict[str, set[str]] = {m: set() for m in found}
    external: dict[str, set[str]] = {m: set() for m in found}
    for name, path in found.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            for target in _imported(name, is_package, node, known):
                if target != package and not target.startswith(package + "."):
                    external[name].add(target.split(".")[0])
                    continue
                while target not in known and "." in target:  # `from pkg.mod import name`
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    graph[name].add(target)
    return graph, external


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else TOP


def rank(module: str, layers: list[str]) -> int:
    layer = layer_of(module)
    return len(layers) if layer == TOP else layers.index(layer)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def violations(root: Path, layers: list[str] = LAYERS, package: str = TOP) -> list[str]:
    """Every broken rule, one line each: a module outside the layers, an import that runs up the
    layer order (or into the package's own ``__init__``), a circle, heavy imports in the torch-free
    layers."""
    graph, external = import_graph(root, package)
    problems = [f"{m}: not in any layer of {layers}" for m in graph if layer_of(m) != TOP and layer_of(m) not in layers]
    if problems:
        return problems
    for m, targets in sorted(graph.items()):
        for t in sorted(targets):
            if rank(t, layers) > rank(m, layers) or (t == package and m != package):
                problems.append(f"{m} ({layer_of(m)}) imports {t} ({layer_of(t)}): upward")
        if layer_of(m) in layers[: layers.index("kernels")]:
            for name in sorted(external[m] & set(HEAVY)):
                problems.append(f"{m} ({layer_of(m)}, torch-free) imports {name}")
    problems += [f"circle: {' -> '.join(c)}" for c in circles(graph)]
    return problems


def test_every_import_runs_down_the_layers_and_none_goes_round():
    assert violations(ROOT) == []


def test_the_graph_sees_the_imports_that_matter():
    """The walk finds real edges (lazy ones too), so an empty violation list means something."""
    graph, external = import_graph(ROOT)
    assert "paged_edu.core.block_pool" in graph["paged_edu.sched.scheduler"]  # its OutOfBlocksError
    assert "paged_edu.sched.scheduler" in graph["paged_edu.sim.simulator"]
    assert "paged_edu.labs.kv_view" in graph["paged_edu.viz.widgets.base"]
    assert "torch" in external["paged_edu.cache.kv_cache"]
    assert len(graph) > 90


# ------------------------------------------------------------------------------------------------
# The checker itself must fail on what it exists to catch.
# ------------------------------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in {
        "paged_edu/__init__.py": "",
        "paged_edu/core/__init__.py": "",
        "paged_edu/viz/__init__.py": "",
        **files,
    }.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checker_accepts_a_downward_import(tmp_path):
    root = _tree(tmp_path, {"paged_edu/core/a.py": "", "paged_edu/viz/v.py": "from paged_edu.core import a\n"})
    assert violations(root) == []


@pytest.mark.parametrize(
    "source",
    [
        "from paged_edu.viz.v import draw\n",
        "import paged_edu.viz.v\n",
        "def f():\n    from paged_edu.viz import v\n    return v\n",  # a lazy import counts
        "from ..viz import v\n",  # so does a relative one
        "import importlib\nV = importlib.import_module('paged_edu.viz.v')\n",
        "from paged_edu import thing\n",  # the package's facade
    ],
)
def test_the_checker_fails_on_an_upward_import(tmp_path, source):
    root = _tree(tmp_path, {"paged_edu/core/a.py": source, "paged_edu/viz/v.py": "def draw(): pass\n"})
    (problem,) = violations(root)
    assert "paged_edu.core.a (core) imports" in problem and "upward" in problem


def test_the_checker_fails_on_a_circle_inside_one_layer(tmp_path):
    root = _tree(
        tmp_path,
        {
            "paged_edu/core/a.py": "from paged_edu.core import b\n",
            "paged_edu/core/b.py": "def f():\n    from paged_edu.core.a import x\n",
        },
    )
    assert violations(root) == ["circle: paged_edu.core.a -> paged_edu.core.b"]


def test_the_checker_fails_on_torch_in_a_torch_free_layer_and_on_an_unknown_layer(tmp_path):
    root = _tree(tmp_path, {"paged_edu/core/a.py": "def f():\n    import torch\n"})
    assert violations(root) == ["paged_edu.core.a (core, torch-free) imports torch"]
    root = _tree(tmp_path, {"paged_edu/shims.py": ""})
    assert violations(root) == [f"paged_edu.shims: not in any layer of {LAYERS}"]


def test_the_readme_states_the_layer_order_this_test_holds():
    """The README's one line of layers is :data:`LAYERS`, in order: change one, change both."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    lines = [ln for ln in readme.splitlines() if ln.startswith("`data` < ")]
    assert len(lines) == 1, "the README states the layer order once, on a line starting with `data` <"
    assert [part.strip().strip("`") for part in lines[0].split("<")] == LAYERS

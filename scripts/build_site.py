"""Build the course as a static website: every lesson executed and rendered (``python3 dev.py site``).

    python scripts/build_site.py [--device auto|cpu|cuda] [--force] [--out build/site]

1. **Execute.** Each ``notebooks/[0-9][0-9]_*.ipynb`` is executed by ``scripts/run_lessons.py``
   into ``build/lessons/`` -- unless the copy there (from ``python3 dev.py lessons`` or an earlier
   build) ran without error, with the default parameters, from the notebook, library and kernel
   start-up file as they are now (the hash in its run record), and (with ``--device cpu|cuda``) on
   that device: then it is reused, and the build says so. ``--device auto`` (the default) runs on
   the GPU when there is one.
2. **Prepare** ``build/site-src/``, a Sphinx project: the README as the landing page (its links to
   the notebooks turned into links to the lesson pages), one page per executed lesson in
   order, whose plotly figures and widgets become what ``scripts/lesson_outputs.py`` makes of them
   (figures drawn by the bundled plotly.js, widgets as static views of their final state with a
   note to run the lesson to interact), every exercise gets its solution (from
   ``ex.solution``) folded in a ``<details>``, and a header links to Colab (from
   ``paged_edu.lessons.setup.REPO_URL``) and to the clean notebook, and says which device ran it;
   and ``docs/*.md`` as pages of their own. Links to ``figures/``, ``benchmarks/records/``,
   ``docs/`` and the lessons stay in the site (those files are copied in); links to other files of
   the repository go to it on GitHub once it is published (``REPO_PUBLISHED``) and are plain text
   until then, so no link leads to the placeholder address -- which the Colab place of each lesson
   page names once, instead of a link.
   The test harness stays out of the pages (:func:`course_cells`): papermill's injected-parameters
   cell is dropped, the harness's cell tags (nbval's, papermill's, the stored-output policy's) are
   taken off the cells, and the Colab install cell is folded; progress-bar widgets are left out.
3. **Render** with Sphinx + MyST-NB (furo theme, MathJax and plotly.js inside the site) into
   ``build/site/``; serve it with any file server, e.g. ``python -m http.server -d build/site``.

The stored notebooks are only read; everything written lies under ``build/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "build" / "lessons"
SRC = ROOT / "build" / "site-src"
DOCTREES = ROOT / "build" / "site-doctrees"
CONFIG = Path(__file__).resolve().parent / "site"

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_lessons  # noqa: E402  (scripts/ is not a package)
from lesson_outputs import site_outputs  # noqa: E402

WIDGET_STATE_MIME = run_lessons.WIDGET_STATE_MIME
COLAB_BADGE = re.compile(r"\[!\[Open [Ii]n Colab\]\([^)]*\)\]\([^)]*\)[^\n]*\n?")  # the badge's whole line
# Folders of the repository copied into the site as they are: links to their files stay in the site.
SITE_FOLDERS = ("figures", "benchmarks/records")
EXERCISE = re.compile(r"""ex\.check\(\s*["']([^"']+)["']""")
# The cell tags of the test and run harness (nbval's ``nbval-*``, papermill's ``parameters`` and
# ``raises-exception``, nbclient's ``skip-execution``, the stored-output policy's ``keep_output``):
# MyST-NB would write each into the page as a ``tag_...`` class; a reader needs none of them.
HARNESS_TAG = re.compile(r"^(nbval-[a-z-]+|parameters|raises-exception|skip-execution|keep_output)$")
COLAB_CELL = '"google.colab" in sys.modules'  # the install cell's test, in every lesson's first code cell


# ----------------------------------------------------------------------------------------------
# 1. Execute (or reuse) the lessons
# ----------------------------------------------------------------------------------------------


def lessons() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def why_execute(notebook: Path, record: dict | None, device: str) -> str | None:
    """Why the executed copy cannot be reused, or None when it can: its run (by ``dev.py lessons``
    or an earlier build) ran clean, depended on exactly what is here now
    (:func:`run_lessons.source_hash` of the notebook, the library, the kernels' start-up file and
    the default parameters) and, for an explicit ``--device``, ran there."""
    if record is None or not (EXECUTED / notebook.name).exists():
        return "no run yet"
    if not record.get("ok"):
        return "its last run failed"
    if device != "auto" and not str(record.get("device", "")).startswith(device):
        return f"it ran on {record.get('device')}, not {device}"
    if record.get("source_hash") != run_lessons.source_hash(notebook, {"device": device}):
        return "notebook, library or parameters changed since its run"
    return None


def execute(device: str, timeout: int, force: bool) -> list[dict]:
    """The run record of every lesson, executing only those without a reusable copy."""
    EXECUTED.mkdir(parents=True, exist_ok=True)
    previous = {}
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        previous = {r["lesson"]: r for r in json.loads((EXECUTED / "summary.json").read_text())}
    records = []
    for notebook in lessons():
        record = previous.get(notebook.stem)
        why = "--force" if force else why_execute(notebook, record, device)
        if why:
            print(f"{notebook.stem}: executing ({why}) ...", flush=True)
            record = run_lessons.run(notebook, EXECUTED, {"device": device}, timeout, progress=True)
            how = f"executed in {record['seconds']:.1f} s"
            run_lessons.write_summary(EXECUTED, [record])
        else:
            how = f"reused the run of {record.get('executed_at', '?')} ({record['seconds']:.1f} s)"
        status = "ok" if record["ok"] else f"FAILED ({record['error']})"
        print(f"{notebook.stem:<32} device={record['device']:<5} {how}  {status}", flush=True)
        records.append(record)
    return records


# ----------------------------------------------------------------------------------------------
# 2. Prepare the Sphinx project
# ----------------------------------------------------------------------------------------------


def solution_markdown(name: str) -> str:
    """The reference solution of exercise ``name`` (``ex.solution``), folded until clicked."""
    from paged_edu.lessons import exercises as ex

    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            ex.solution(name)
    except Exception as exc:  # an exercise without a printable solution: say so, do not break the page
        return f"*(No solution to show for exercise {name}: {type(exc).__name__}.)*"
    source = buffer.getvalue().strip("\n")
    return (
        f'<details class="solution"><summary>Solution to exercise {html.escape(name)} (click to show)</summary>\n\n'
        f"```python\n{source}\n```\n\n</details>"
    )


def colab_markdown(notebook: Path) -> str:
    """The lesson's Colab place in its header: a link once the repository is published; until then one
    line saying so, and no link to the placeholder address."""
    from paged_edu.lessons import setup

    if setup.REPO_PUBLISHED:
        return f'<a class="button colab" href="{setup.colab_url(notebook.name)}">Open in Colab</a>'
    return (
        '<span class="colab-pending">Colab: not yet -- the course\'s repository is not published '
        "(the README says how to open the lessons from a fork)</span>"
    )


def header_markdown(notebook: Path, record: dict) -> str:
    where = (
        f"Executed on <b>{html.escape(record.get('device', '?'))}</b> ({html.escape(record.get('machine', '?'))}), "
        f"{record.get('seconds', 0):.1f} s, {html.escape(record.get('executed_at', '?'))}"
    )
    if not record.get("ok"):
        where += f" -- <b>the run failed</b>: {html.escape(str(record.get('error')))}"
    return (
        f'<div class="lesson-meta">{colab_markdown(notebook)} '
        f'<a class="button download" href="../notebooks/{notebook.name}" download>Download notebook</a> '
        f'<span class="device">{where}</span></div>'
    )


def _markdown_cell(cell_id: str, source: str) -> dict:
    return {"cell_type": "markdown", "id": re.sub(r"[^A-Za-z0-9_-]", "-", cell_id), "metadata": {}, "source": source}


def course_cells(cells: list[dict]) -> list[dict]:
    """The cells a reader of the course sees: papermill's injected-parameters cell dropped (the
    lesson's own ``parameters`` cell stays), the harness's tags (:data:`HARNESS_TAG`) taken off every
    cell, and the Colab install cell folded into a ``<details>`` (it does nothing off Colab)."""
    shown = []
    for cell in cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags:
            continue
        cell = copy.deepcopy(cell)
        if tags:
            cell["metadata"]["tags"] = [t for t in tags if not HARNESS_TAG.match(t)]
            if not cell["metadata"]["tags"]:
                del cell["metadata"]["tags"]
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and COLAB_CELL in source:
            shown.append(
                _markdown_cell(
                    cell.get("id", "colab-install"),
                    '<details class="colab-install"><summary>On Colab, the first cell installs paged_edu '
                    "(click to show)</summary>\n\n```python\n" + source.strip("\n") + "\n```\n\n</details>",
                )
            )
            continue
        shown.append(cell)
    return shown


def site_notebook(notebook: Path, record: dict) -> dict:
    """The executed copy as its page shows it (the stored notebook is never touched)."""
    nb = json.loads((EXECUTED / notebook.name).read_text())
    widgets = nb.get("metadata", {}).pop("widgets", {})
    models = widgets.get(WIDGET_STATE_MIME, {}).get("state", {})
    cells, has_header = [], False
    for cell in course_cells(nb["cells"]):
        if cell["cell_type"] == "markdown":
            text = COLAB_BADGE.sub("", "".join(cell["source"]))  # the header offers Colab (and says if not yet)
            cell["source"] = repository_links(text, NOTEBOOKS, IN_SITE)
        if cell["cell_type"] == "code":
            cell["outputs"] = site_outputs(cell.get("outputs", []), models)
        cells.append(cell)
        if cell["cell_type"] == "markdown" and not has_header:  # right under the title
            cells.append(_markdown_cell("site-header", header_markdown(notebook, record)))
            has_header = True
        if cell["cell_type"] == "code":
            for name in dict.fromkeys(EXERCISE.findall("".join(cell["source"]))):
                cells.append(_markdown_cell(f"site-solution-{name}", solution_markdown(name)))
    nb["cells"] = cells
    return nb


IN_SITE = ("notebooks/", "docs/", *(f"{folder}/" for folder in SITE_FOLDERS))  # what the site holds


def repository_links(text: str, base: Path, in_site: tuple[str, ...]) -> str:
    """Point markdown links to files of the repository that are not part of the site (code,
    benchmarks, tests) at the repository on GitHub -- once it is published (``REPO_PUBLISHED``);
    until then such a link becomes its plain text, so that none leads to the placeholder address."""
    from paged_edu.lessons.setup import REPO_PUBLISHED, REPO_URL

    def link(match: re.Match) -> str:
        label, target = match.group(1), match.group(2)
        path = (base / target.split("#")[0]).resolve()
        if re.match(r"^[a-z]+:|#", target) or not path.is_relative_to(ROOT) or not path.exists():
            return match.group(0)
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(in_site):
            return match.group(0)
        if not REPO_PUBLISHED:
            return label
        kind = "tree" if path.is_dir() else "blob"
        return f"[{label}]({REPO_URL.removesuffix('.git')}/{kind}/main/{rel})"

    return re.sub(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)", link, text)


def lesson_links(text: str, to_notebooks: str, to_lessons: str = "lessons/") -> str:
    """Links to the lesson notebooks (``<to_notebooks>NN_name.ipynb``) turned into links to their pages."""
    return re.sub(rf"\]\({re.escape(to_notebooks)}([0-9][0-9]_[^)]+\.ipynb)\)", rf"]({to_lessons}\1)", text)


def docs_pages() -> dict[str, str]:
    """``docs/*.md`` as site pages (``docs/NAME.md`` -> text), their links mended as the README's are."""
    return {
        f"docs/{path.name}": lesson_links(
            repository_links(path.read_text(), path.parent, IN_SITE), "../notebooks/", "../lessons/"
        )
        for path in sorted((ROOT / "docs").glob("*.md"))
    }


def landing_page(records: list[dict]) -> str:
    """The README, with links to the notebooks pointing at the lesson pages, and where each page was run."""
    text = lesson_links(repository_links((ROOT / "README.md").read_text(), ROOT, IN_SITE), "notebooks/")
    rows = "\n".join(
        f"| [{r['lesson']}](lessons/{r['lesson']}.ipynb) | {r['device']} | {r.get('machine', '?')} | "
        f"{r['seconds']:.1f} s | {r.get('executed_at', '?')} | {'ok' if r['ok'] else 'failed'} |"
        for r in records
    )
    return (
        text.rstrip() + "\n\n## About this site\n\nBuilt by `python3 dev.py site` (Sphinx + MyST-NB from the "
        "executed lessons; plotly.js and MathJax are part of the site). Each lesson page was produced on:\n\n"
        "| lesson | device | machine | seconds | executed | status |\n|---|---|---|---:|---|---|\n" + rows + "\n"
    )


def write_if_changed(path: Path, text: str) -> None:
    """Leave unchanged sources untouched, so Sphinx rebuilds only the pages that changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def copy_if_changed(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists() or dst.read_bytes() != src.read_bytes():
        shutil.copy2(src, dst)


def prepare(records: list[dict]) -> None:
    import plotly

    for path in CONFIG.rglob("*"):
        if path.is_file():
            copy_if_changed(path, SRC / path.relative_to(CONFIG))
    copy_if_changed(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", SRC / "_static" / "plotly.min.js")
    for folder in SITE_FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file():
                copy_if_changed(path, SRC / folder / path.relative_to(ROOT / folder))
    docs = docs_pages()
    for name, text in docs.items():
        write_if_changed(SRC / name, text)
    names = set()
    for record, notebook in zip(records, lessons()):
        copy_if_changed(notebook, SRC / "_extra" / "notebooks" / notebook.name)
        if (EXECUTED / notebook.name).exists():
            write_if_changed(
                SRC / "lessons" / notebook.name, json.dumps(site_notebook(notebook, record), indent=1) + "\n"
            )
            names.add(notebook.name)
    for stale in (SRC / "lessons").glob("*.ipynb"):  # a lesson renamed or removed since the last build
        if stale.name not in names:
            stale.unlink()
    toc = "\n".join(f"lessons/{Path(n).stem}" for n in sorted(names))
    more = "\n".join(name.removesuffix(".md") for name in docs)
    write_if_changed(
        SRC / "index.md",
        landing_page(records)
        + f"\n```{{toctree}}\n:hidden:\n:caption: Lessons\n:maxdepth: 1\n\n{toc}\n```\n"
        + f"\n```{{toctree}}\n:hidden:\n:caption: More\n:maxdepth: 1\n\n{more}\n```\n",
    )


# ----------------------------------------------------------------------------------------------
# 3. Render
# ----------------------------------------------------------------------------------------------


def render(out: Path) -> int:
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-d", str(DOCTREES), str(SRC), str(out)]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


def build(device: str = "auto", *, force: bool = False, out: Path = ROOT / "build" / "site", timeout: int = 600) -> int:
    """Execute (or reuse) the lessons, prepare the Sphinx sources and render; 0 when all went well."""
    start = time.perf_counter()
    records = execute(device, timeout, force)
    executed_s = time.perf_counter() - start
    prepare(records)
    code = render(out)
    print(
        f"site: {len(records)} lessons, execution {executed_s:.1f} s, total {time.perf_counter() - start:.1f} s "
        f"-> {out}/index.html (serve it: python -m http.server -d {out})",
        flush=True,
    )
    failed = [r["lesson"] for r in records if not r["ok"]]
    if failed:
        print(f"lessons that failed (their pages show the error): {', '.join(failed)}", file=sys.stderr)
    return code or (1 if failed else 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (default: the GPU when there is one), cpu or cuda")
    parser.add_argument("--force", action="store_true", help="execute every lesson again")
    parser.add_argument("--out", default=str(ROOT / "build" / "site"))
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    args = parser.parse_args(argv)
    # This checkout's library, in this process and in the kernels that run the lessons.
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return build(args.device, force=args.force, out=Path(args.out).resolve(), timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())

"""Run every lesson notebook headless with papermill and summarise (the README's main job).

    python scripts/run_lessons.py [--device auto|cpu|cuda] [--only 02] [--out build/lessons] [-p NAME VALUE ...]

Executes each ``notebooks/[0-9][0-9]_*.ipynb`` with papermill's Python API (kernel ``python3``,
widget state not stored, so an executed copy stays small) into ``build/lessons/``, prints one line
per lesson -- lesson, device, seconds, ok -- writes ``build/lessons/summary.json``, and exits
non-zero when any lesson failed. ``--device auto`` lets each notebook pick CUDA when there is a GPU
and the CPU (with Triton's interpreter) otherwise; the line reports what it picked.

``-p NAME VALUE`` sets a lesson parameter, as papermill's own ``-p`` does (the value is read as an
int, then a float, else kept as a string). Papermill only *warns* about a name the notebook's
``parameters`` cell does not define and runs the lesson with its default -- a typo that silently
measures something else -- so here an unknown name is an error (exit 2) before anything runs.
The lesson itself checks every value (``paged_edu.lessons.setup.check_parameters``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def lesson_device(executed: Path) -> str:
    """The device the notebook reported in its set-up cell (``device: cuda, dtype: ...``)."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            match = re.search(r"device: (\S+?),", out.get("text", ""))
            if match:
                return match.group(1)
    return "?"


def unexpected_errors(executed: Path) -> list[str]:
    """Error outputs of cells not tagged ``raises-exception`` in an executed notebook."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    return [f"{o.ename}: {o.evalue}" for c in nb.cells if c.cell_type == "code"
            and "raises-exception" not in c.metadata.get("tags", [])
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


def drop_error_banners(executed: Path) -> None:
    """Remove the "An Exception was encountered" cells papermill adds when a cell raises: for a cell
    that is meant to raise (tagged ``raises-exception``) they would tell a reader the lesson broke."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    nb.cells = [c for c in nb.cells if "papermill-error-cell-tag" not in c.metadata.get("tags", [])]
    nbformat.write(nb, executed)


def parse_value(text: str):
    """papermill's ``-p`` reading of a value: an int, else a float, else the string itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def unknown_parameters(path: Path, parameters: dict) -> tuple[list[str], list[str]]:
    """``(unknown, known)``: names in ``parameters`` the notebook's ``parameters`` cell does not
    define, and the names it does."""
    import papermill

    known = sorted(papermill.inspect_notebook(str(path)))
    return sorted(set(parameters) - set(known)), known


def run(path: Path, out_dir: Path, parameters: dict | str, timeout: int, *, store_widget_state: bool = False) -> dict:
    """Execute one lesson into ``out_dir`` with ``parameters`` (a dict, or just the device name);
    ``store_widget_state=True`` keeps the widgets' final state in the copy's metadata (the site
    renders a static view of each widget from it)."""
    if isinstance(parameters, str):
        parameters = {"device": parameters}
    import papermill

    dst = out_dir / path.name
    start = time.perf_counter()
    record = {"lesson": path.stem, "notebook": _rel(path), "output": _rel(dst),
              "device": "?", "seconds": 0.0, "ok": False, "error": None}
    try:
        papermill.execute_notebook(
            str(path), str(dst), parameters=parameters, kernel_name="python3", cwd=str(path.parent),
            execution_timeout=timeout, progress_bar=False, log_output=False,
            store_widget_state=store_widget_state,
        )
        record["ok"] = True
    except Exception as exc:  # one failed lesson must not stop the others
        record["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        # papermill runs on past a cell tagged raises-exception (as nbclient does) but still raises at the
        # end: a lesson whose only errors are in such cells -- meant to fail, e.g. lesson 4 -- ran fine.
        if type(exc).__name__ == "PapermillExecutionError" and dst.exists() and not unexpected_errors(dst):
            record["ok"], record["error"] = True, None
            drop_error_banners(dst)
    record["seconds"] = round(time.perf_counter() - start, 2)
    if dst.exists():
        record["device"] = lesson_device(dst)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    parser.add_argument("--only", default="", help="run only lessons whose file name contains this")
    parser.add_argument("--dir", default=str(ROOT / "notebooks"), help="folder holding the NN_*.ipynb lessons")
    parser.add_argument("--out", default=str(ROOT / "build" / "lessons"), help="where executed copies go")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="set a lesson parameter (repeatable); an unknown name is an error")
    args = parser.parse_args(argv)

    lessons = [p for p in sorted(Path(args.dir).resolve().glob("[0-9][0-9]_*.ipynb")) if args.only in p.name]
    if not lessons:
        print(f"no lesson notebooks match {args.only!r} under {args.dir}", file=sys.stderr)
        return 2
    parameters = {"device": args.device}
    parameters.update({name: parse_value(value) for name, value in args.parameter})
    for path in lessons:
        unknown, known = unknown_parameters(path, parameters)
        if unknown:
            print(f"{path.name}: unknown parameter(s) {', '.join(unknown)}; its parameters cell defines "
                  f"{', '.join(known)}", file=sys.stderr)
            return 2
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")

    records = []
    for path in lessons:
        record = run(path, out_dir, parameters, args.timeout)
        records.append(record)
        status = "ok" if record["ok"] else f"FAILED ({record['error']})"
        print(f"{record['lesson']:<32} device={record['device']:<5} {record['seconds']:7.1f} s  {status}", flush=True)
    (out_dir / "summary.json").write_text(json.dumps(records, indent=2) + "\n")
    failed = [r["lesson"] for r in records if not r["ok"]]
    print(f"{len(records) - len(failed)}/{len(records)} lessons ok; executed copies and summary.json in {out_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

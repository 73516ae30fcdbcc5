"""Run every lesson notebook headless with papermill and summarise (the README's main job).

    python scripts/run_lessons.py [--device auto|cpu|cuda] [--only 02] [--out build/lessons]

Executes each ``notebooks/[0-9][0-9]_*.ipynb`` with papermill's Python API (kernel ``python3``,
widget state not stored, so an executed copy stays small) into ``build/lessons/``, prints one line
per lesson -- lesson, device, seconds, ok -- writes ``build/lessons/summary.json``, and exits
non-zero when any lesson failed. ``--device auto`` lets each notebook pick CUDA when there is a GPU
and the CPU (with Triton's interpreter) otherwise; the line reports what it picked.
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


def run(path: Path, out_dir: Path, device: str, timeout: int, *, store_widget_state: bool = False) -> dict:
    """Execute one lesson into ``out_dir``; ``store_widget_state=True`` keeps the widgets' final state
    in the copy's metadata (the site renders a static view of each widget from it)."""
    import papermill

    dst = out_dir / path.name
    start = time.perf_counter()
    record = {"lesson": path.stem, "notebook": _rel(path), "output": _rel(dst),
              "device": "?", "seconds": 0.0, "ok": False, "error": None}
    try:
        papermill.execute_notebook(
            str(path), str(dst), parameters={"device": device}, kernel_name="python3", cwd=str(path.parent),
            execution_timeout=timeout, progress_bar=False, log_output=False,
            store_widget_state=store_widget_state,
        )
        record["ok"] = True
    except Exception as exc:  # one failed lesson must not stop the others
        record["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
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
    args = parser.parse_args(argv)

    lessons = [p for p in sorted(Path(args.dir).resolve().glob("[0-9][0-9]_*.ipynb")) if args.only in p.name]
    if not lessons:
        print(f"no lesson notebooks match {args.only!r} under {args.dir}", file=sys.stderr)
        return 2
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")

    records = []
    for path in lessons:
        record = run(path, out_dir, args.device, args.timeout)
        records.append(record)
        status = "ok" if record["ok"] else f"FAILED ({record['error']})"
        print(f"{record['lesson']:<32} device={record['device']:<5} {record['seconds']:7.1f} s  {status}", flush=True)
    (out_dir / "summary.json").write_text(json.dumps(records, indent=2) + "\n")
    failed = [r["lesson"] for r in records if not r["ok"]]
    print(f"{len(records) - len(failed)}/{len(records)} lessons ok; executed copies and summary.json in {out_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

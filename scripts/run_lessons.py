"""Run every lesson notebook headless with papermill and summarise (the README's main job).

    python scripts/run_lessons.py [--device auto|cpu|cuda] [--only 02] [--out build/lessons] [-p NAME VALUE ...]

Executes each ``notebooks/[0-9][0-9]_*.ipynb`` with papermill's Python API (kernel ``python3``)
into ``build/lessons/``: a line when a lesson starts, papermill's progress bar while it runs, and
one line when it ends -- lesson, device, seconds, ok; writes ``build/lessons/summary.json`` and
exits non-zero when any lesson failed. ``--device auto`` lets each notebook pick CUDA when there is
a GPU and the CPU (with Triton's interpreter) otherwise; the line reports what it picked.

The executed copies are the ones the website renders (``scripts/build_site.py`` reuses them): they
keep the widgets' final state (without the widgets' JavaScript), and each run record holds a hash
of what the run depended on (:func:`source_hash`), so the site re-executes only a lesson whose
notebook, library or parameters changed since. The kernels run with
``scripts/site_kernel_startup.py`` (plotly FigureWidgets save their current figure into the state).

The kernel process's own log (its stderr, not a cell's) goes to ``build/lessons/NN_*.kernel.log``,
named in the summary only when the lesson failed: a clean run prints nothing from it. Its transport
is CurveZMQ-encrypted where pyzmq and the kernel support it (ipykernel >= 7.3; constraints.txt holds
6.31.0, which neither encrypts nor warns: see there).

``-p NAME VALUE`` sets a lesson parameter, as papermill's own ``-p`` does (the value is read as an
int, then a float, else kept as a string). Papermill only *warns* about a name the notebook's
``parameters`` cell does not define and runs the lesson with its default -- a typo that silently
measures something else -- so here an unknown name is an error (exit 2) before anything runs.
The lesson itself checks every value (``paged_edu.lessons.setup.check_parameters``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "paged_edu"
KERNEL_STARTUP = Path(__file__).resolve().parent / "site_kernel_startup.py"
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"


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


def drop_widget_code(executed: Path) -> None:
    """Keep the widgets' state but not anywidget's JavaScript bundles (about 5 MB per plotly
    FigureWidget, in ``_plotly_esm`` for paged_edu's): the site draws a static view from the state
    and never loads the widget code."""
    nb = json.loads(executed.read_text())
    state = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE_MIME, {}).get("state", {})
    for model in state.values():
        for key in ("_esm", "_css", "_plotly_esm"):
            if isinstance(model.get("state", {}).get(key), str):
                model["state"][key] = ""
    executed.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def source_hash(notebook: Path, parameters: dict) -> str:
    """What an executed copy depends on: the notebook, every file of the library, the kernels'
    start-up file and the parameters other than ``device`` (checked on its own: ``auto`` may pick
    either). Equal hashes mean executing again would run the same code on the same input."""
    digest = hashlib.sha256()
    files = [
        notebook,
        KERNEL_STARTUP,
        *sorted(p for p in LIBRARY.rglob("*") if p.is_file() and "__pycache__" not in p.parts),
    ]
    for path in files:
        digest.update(_rel(path).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(json.dumps({k: v for k, v in parameters.items() if k != "device"}, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def machine(device: str) -> str:
    """Which hardware a device string means here, e.g. ``NVIDIA H200`` or ``AMD EPYC 7B13, 2 cores``."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    model = platform.processor() or "CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores"


@contextlib.contextmanager
def lesson_kernels(out_dir: Path):
    """Kernels started inside run with scripts/site_kernel_startup.py (FigureWidgets save their
    current figure into the widget state), from a throw-away IPYTHONDIR next to the copies."""
    ipython_dir = out_dir / ".ipython"
    startup = ipython_dir / "profile_default" / "startup" / KERNEL_STARTUP.name
    startup.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(KERNEL_STARTUP, startup)
    before = os.environ.get("IPYTHONDIR")
    os.environ["IPYTHONDIR"] = str(ipython_dir)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("IPYTHONDIR")
        else:
            os.environ["IPYTHONDIR"] = before


def kernel_manager_class(log_path: Path):
    """A kernel manager whose kernel process writes its own stdout and stderr (ipykernel's log, not
    cell output) to ``log_path``, over CurveZMQ-encrypted sockets where pyzmq has Curve.

    Two messages a clean run used to print come from there: ipykernel 7 warns that it "is running
    over TCP without encryption" whenever the manager provisions no CurveZMQ keys (jupyter_client's
    ``transport_encryption`` defaults to ``disabled``), and jupyter_client's ``shutdown_kernel``
    sends SIGINT before its shutdown request, which a kernel still inside a message handler logs
    as "KeyboardInterrupt caught in kernel" (a race at the end of the run, not the lesson's code:
    papermill's ``execute`` ends with a ``kernel_info_request`` and shuts the kernel down on its reply,
    before the kernel has left that request's handler)."""
    import zmq
    from jupyter_client.manager import AsyncKernelManager

    class LessonKernelManager(AsyncKernelManager):
        async def _async_pre_start_kernel(self, **kw):
            if zmq.has("curve"):
                kw.setdefault("transport_encryption", "auto")
            return await super()._async_pre_start_kernel(**kw)

        async def _async_launch_kernel(self, kernel_cmd, **kw):
            with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
                kw["stdout"] = kw["stderr"] = log
                await super()._async_launch_kernel(kernel_cmd, **kw)

    return LessonKernelManager


def write_summary(out_dir: Path, records: list[dict]) -> None:
    """``summary.json``: these records, and the earlier ones of lessons not run this time."""
    path = out_dir / "summary.json"
    merged = {}
    if path.exists():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            merged = {r["lesson"]: r for r in json.loads(path.read_text())}
    merged.update({r["lesson"]: r for r in records})
    path.write_text(json.dumps([merged[k] for k in sorted(merged)], indent=2) + "\n")


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


def run(path: Path, out_dir: Path, parameters: dict | str, timeout: int, *, progress: bool = False) -> dict:
    """Execute one lesson into ``out_dir`` with ``parameters`` (a dict, or just the device name),
    keeping its widgets' final state; ``progress`` shows papermill's progress bar (on stderr)."""
    if isinstance(parameters, str):
        parameters = {"device": parameters}
    import papermill

    dst = out_dir / path.name
    log = out_dir / f"{path.stem}.kernel.log"
    log.unlink(missing_ok=True)
    start = time.perf_counter()
    record = {
        "lesson": path.stem,
        "notebook": _rel(path),
        "output": _rel(dst),
        "device": "?",
        "machine": "?",
        "seconds": 0.0,
        "ok": False,
        "error": None,
        "executed_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "parameters": parameters,
        "source_hash": source_hash(path, parameters),
        "kernel_log": _rel(log),
    }
    bar = {"desc": f"  {path.stem}", "leave": False, "mininterval": 1.0 if sys.stderr.isatty() else 30.0}
    try:
        with lesson_kernels(out_dir):
            papermill.execute_notebook(
                str(path),
                str(dst),
                parameters=parameters,
                kernel_name="python3",
                cwd=str(path.parent),
                execution_timeout=timeout,
                progress_bar=bar if progress else False,
                log_output=False,
                store_widget_state=True,
                kernel_manager_class=kernel_manager_class(log),
            )
        record["ok"] = True
    except Exception as exc:  # one failed lesson must not stop the others
        # Any raised exception fails the lesson, as it fails plain papermill: a cell that shows a failure
        # catches it and prints it (no lesson cell is tagged raises-exception: test_notebooks_clean.py).
        record["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
    record["seconds"] = round(time.perf_counter() - start, 2)
    if dst.exists():
        drop_widget_code(dst)
        record["device"] = lesson_device(dst)
        record["machine"] = machine(record["device"]) if record["device"] != "?" else "?"
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (default), cpu or cuda")
    parser.add_argument("--only", default="", help="run only lessons whose file name contains this")
    parser.add_argument("--dir", default=str(ROOT / "notebooks"), help="folder holding the NN_*.ipynb lessons")
    parser.add_argument("--out", default=str(ROOT / "build" / "lessons"), help="where executed copies go")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    parser.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="set a lesson parameter (repeatable); an unknown name is an error",
    )
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
            print(
                f"{path.name}: unknown parameter(s) {', '.join(unknown)}; its parameters cell defines "
                f"{', '.join(known)}",
                file=sys.stderr,
            )
            return 2
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")

    records = []
    for k, path in enumerate(lessons, 1):
        print(f"[{k}/{len(lessons)}] {path.stem} ...", flush=True)
        record = run(path, out_dir, parameters, args.timeout, progress=True)
        records.append(record)
        status = "ok" if record["ok"] else f"FAILED ({record['error']}; kernel log: {record['kernel_log']})"
        print(f"{record['lesson']:<32} device={record['device']:<5} {record['seconds']:7.1f} s  {status}", flush=True)
        write_summary(out_dir, records)
    failed = [r["lesson"] for r in records if not r["ok"]]
    print(f"{len(records) - len(failed)}/{len(records)} lessons ok; executed copies and summary.json in {out_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

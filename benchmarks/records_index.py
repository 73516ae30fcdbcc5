"""The index of ``benchmarks/records/``: one line per record -- its date, commit, card, command and
headline figure, each read from the record itself.

    python benchmarks/records_index.py           # rewrite benchmarks/records/README.md
    python benchmarks/records_index.py --check   # exit 1 naming each record the index misses or lists in vain

A record is any file under ``benchmarks/records/<card>/`` (``h200``, ``h100``, ``cpu`` ...: the machine
it ran on, as :func:`record.card` names it): a benchmark's JSON, a run's printed log, a test or lesson
run's output. The fields come from the JSON (``command``, ``commit``, ``date_utc``, the figures a
benchmark of its kind reports); a log beside a JSON of the same run (``X_log.txt``, ``X.log``,
``X.txt`` beside ``X.json``) takes its fields from it; what a record does not say is taken from the
file (a ``# ...`` first line, a commit in its name) or from git (the day it was committed, marked
``committed``), else left ``–``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "records"
INDEX = RECORDS / "README.md"
CARDS = ("h200", "h100", "cpu")  # the order of the index's sections; a new card folder is listed after them
NONE = "–"
COMMIT_IN_NAME = re.compile(r"_([0-9a-f]{7})(?=[_.])")

HEADER = """# Benchmark records

Every record a benchmark, a test run or a lesson run wrote, by the card it ran on (`h200/`, `h100/`,
`cpu/`): JSON records (`benchmarks/record.py`'s `provenance()` block at the top: command, commit, date,
machine) and the printed logs of the same runs. New records land here by default
(`record.record_path(name)`, the card from `torch.cuda.get_device_name`). `docs/benchmarks.md` says
which record holds each current figure; the lessons' stored records are package data in
`paged_edu/data/`.

This index is generated: `python benchmarks/records_index.py` rewrites it from the records (date,
commit and command as each record states them; `committed` marks the day git first stored a record
that states no date); `--check` (run by `tests/project/test_records.py`) fails when a record is missing
from it or it lists a file that is not there.
"""


# -- reading a record -------------------------------------------------------------------------------------


def records(root: Path = RECORDS) -> list[Path]:
    """Every record under ``root``, sorted: each file but the README of the folder and of each card's
    folder (a probe's own README, deeper, is one of its records)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and not _is_folder_readme(p, root))


def _is_folder_readme(path: Path, root: Path = RECORDS) -> bool:
    return path.name == "README.md" and len(path.relative_to(root).parts) <= 2


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None


def _companion(path: Path) -> Path | None:
    """The JSON of the same run as the log ``path`` (``X_log.txt``, ``X.log`` or ``X.txt`` beside ``X.json``)."""
    if path.suffix == ".json":
        return None
    stem = path.name.removesuffix("_log.txt").removesuffix(".log").removesuffix(".txt")
    found = path.with_name(stem + ".json")
    return found if found.is_file() else None


def _first(rec, *keys: str):
    """The first of ``keys`` a record states, at its top or one level down (a lessons list: its first item)."""
    if isinstance(rec, list):
        rec = rec[0] if rec and isinstance(rec[0], dict) else {}
    if not isinstance(rec, dict):
        return None
    for key in keys:
        if rec.get(key) not in (None, "", "None"):
            return rec[key]
    for value in rec.values():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            value = value[0]
        if isinstance(value, dict):
            for key in keys:
                if value.get(key) not in (None, "", "None"):
                    return value[key]
    return None


def _short_commit(commit: str) -> str:
    """``3c39cf4...+dirty (note)`` -> ``3c39cf4+dirty``: the hash's first 7 digits and what follows it at once."""
    m = re.match(r"([0-9a-f]{7})[0-9a-f]*(\+dirty)?", commit.strip())
    return (m.group(1) + (m.group(2) or "")) if m else commit.strip().split()[0][:40]


# -- headline figures, by kind of record -------------------------------------------------------------------


def _engine(rec: dict) -> str | None:
    e = rec.get("engine")
    if not isinstance(e, dict) or "tokens_per_s" not in e:
        return None
    out = f"{e['tokens_per_s']:,.0f} tok/s"
    if e.get("roofline_run_s") and e.get("seconds") and "yardstick" in rec:
        out += f", {e['roofline_run_s'] / e['seconds']:.1%} of its roofline"
    if e.get("mean_decode_step_ms"):
        out += f", decode step {e['mean_decode_step_ms']:.2f} ms"
    cb = rec.get("transformers_cb_graphs") or {}
    if cb.get("engine_speedup"):
        out += f", {cb['engine_speedup']:.1f}x transformers CB ({cb['tokens_per_s']:,.0f} tok/s)"
    elif isinstance(rec.get("speedup"), (int, float)):
        out += f", {rec['speedup']:.1f}x transformers"
    return out


def _layer(rec: dict) -> str | None:
    rows = rec.get("rows")
    if not (isinstance(rows, list) and rows and isinstance(rows[0], dict) and "fused_us" in rows[0]):
        return None
    return "decode step (fused) " + ", ".join(f"b{r['batch']} {r['fused_us']:,.0f} us" for r in rows)


def _kernels(rec: dict) -> str | None:
    cases = rec.get("cases")
    if not (isinstance(cases, list) and cases and isinstance(cases[0], dict)):
        return None
    if "summary" in cases[0]:  # bench_prefill
        return "Triton prefill vs SDPA flash: " + ", ".join(
            f"{c['case']} {c['summary']['vs_sdpa_flash']:.2f}x" for c in cases if c["summary"].get("vs_sdpa_flash")
        )
    if "impls" in cases[0] and all("triton" in c["impls"] for c in cases):  # bench_kernels
        return "Triton decode " + ", ".join(f"{c['case']} {c['impls']['triton']['us']:.1f} us" for c in cases)
    return None


def _gemm(rec: dict) -> str | None:
    rows = rec.get("rows")
    if not (isinstance(rows, list) and rows and isinstance(rows[0], dict) and "cublas_us" in rows[0]):
        return None
    ups = [r["speedup"] for r in rows if r.get("speedup")]
    return f"skinny GEMM / cuBLAS {min(ups):.2f}-{max(ups):.2f}x over {len(rows)} shapes x rows"


def _lessons(rec) -> str | None:
    runs = rec if isinstance(rec, list) else rec.get("lessons") if isinstance(rec, dict) else None
    if not (isinstance(runs, list) and runs and isinstance(runs[0], dict) and "lesson" in runs[0]):
        return None
    ok = sum(1 for r in runs if r.get("ok"))
    seconds = sum(r.get("seconds") or 0 for r in runs)
    return f"{ok}/{len(runs)} lessons ok, {seconds:,.0f} s"


def _host(rec: dict) -> str | None:
    if "host_ms_per_decode_step" in rec:
        return (
            f"host {rec['host_ms_per_decode_step']:.3f} ms / decode step, "
            f"{rec['host_ms_at_256_running']:.3f} ms at ~256 running"
        )
    if "ms_per_step" in rec and "running" in rec:
        return f"host {rec['ms_per_step']:.3f} ms / step at {rec['running']} running"
    return None


def _rows_of(rec: dict) -> str | None:
    rows = rec.get("rows")
    if not (isinstance(rows, list) and rows and isinstance(rows[0], dict)):
        return None
    r = rows[0]
    if "appends_per_s" in r:  # bench_allocator
        return f"{r['appends_per_s'] / 1e6:.2f} M appends/s, {r['admissions_per_s'] / 1e3:.1f} k admissions/s ({r['label']})"
    if "us_per_token" in r:  # bench_simulator
        return f"{r['us_per_token']:.2f} us per simulated token ({r['case']})"
    if "wall_ttft_ms_median" in r:  # bench_side_channel
        return "TTFT median " + ", ".join(f"{x['case']} {x['wall_ttft_ms_median']:.1f} ms" for x in rows)
    if "base_us" in r and "M" in r:  # a GEMM sweep
        return f"M={r['M']}: base {r['base_us']:.1f} us"
    if "norm_kernel_then_qkv_cublas_us" in r:
        return f"M={r['M']}: norm + qkv (cuBLAS) {r['norm_kernel_then_qkv_cublas_us']:.2f} us"
    if "outputs_unlike_two_launch" in r:  # probe_fp_fusion
        return f"{r['outputs_unlike_two_launch']:,} of {r['outputs']:,} outputs differ from two launches"
    return None


def _other(rec: dict) -> str | None:
    if "num_leaks" in rec:  # soak_engine
        return f"{rec['num_requests']:,} requests, {rec['num_leaks']} leaks, {rec['seconds']:.0f} s"
    if "continuous_over_static" in rec:  # bench_batching
        return f"continuous / static batching {rec['continuous_over_static']:.2f}x"
    if "device_events_per_step" in rec:  # profile_engine
        return f"{rec['device_events_per_step']:.0f} device events per step"
    if "us" in rec and isinstance(rec["us"], dict):  # an interleaved A/B: each variant's best round at batch 1
        return "batch 1, us: " + ", ".join(f"{k} {min(v['1']):.0f}" for k, v in rec["us"].items())
    if "splits" in rec:
        return f"{len(rec['splits'])} (batch, context) points of the decode split sweep"
    if "latency_vs_rate" in rec:  # paged-edu figures-sim
        return f"the simulator's figures: {rec['num_requests']:,} requests, seed {rec['seed']}"
    if "dev_py_lessons_seconds" in rec:
        return f"dev.py lessons {rec['dev_py_lessons_seconds']} s"
    if "median_cpu_s" in rec and isinstance(rec["median_cpu_s"], dict):  # an interleaved before/after A/B on the CPU
        return (
            "median CPU s, " + ", ".join(f"{k} {v:.2f}" for k, v in rec["median_cpu_s"].items()) + f" ({rec['case']})"
        )
    summary = rec.get("summary")
    if isinstance(summary, dict) and "ttft_in_T" in summary:  # bench_ttft_hops
        return (
            f"lone request TTFT {summary['ttft_us'] / 1e3:.2f} ms = {summary['ttft_in_T']:.2f} T, "
            f"{summary['outside_step_us'] / 1e3:.2f} ms of it outside the step"
        )
    medians = rec.get("medians")
    if isinstance(medians, dict) and "ttft_in_T" in medians.get("before", {}):  # bench_ttft_hops, interleaved A/B
        b, a = medians["before"], medians["after"]
        return f"lone request TTFT {b['ttft_us'] / 1e3:.2f} -> {a['ttft_us'] / 1e3:.2f} ms ({b['ttft_in_T']:.2f} -> {a['ttft_in_T']:.2f} T)"
    if isinstance(medians, dict) and all({"before", "after"} <= set(v) for v in medians.values()):  # host A/B
        first, m = next(iter(medians.items()))
        key = "ms_per_step" if "ms_per_step" in m["before"] else next(iter(m["before"]))
        return f"{first}: host {key} {m['before'][key]:.3f} -> {m['after'][key]:.3f} (medians)"
    if "runs" in rec and isinstance(rec["runs"], dict) and {"on", "off"} <= set(rec["runs"]):
        per_step = {k: ", ".join(f"{r['per_decode_step']:.2f}" for r in v) for k, v in rec["runs"].items()}
        return "host ms per decode step, " + "; ".join(f"{k}: {v}" for k, v in per_step.items())
    return None


JSON_HEADLINES: tuple[Callable, ...] = (_engine, _layer, _kernels, _gemm, _lessons, _host, _rows_of, _other)

# A log's headline: the last line that says how a test or lesson run ended, else the first line of figures.
LOG_HEADLINES = (
    re.compile(r"\d+ (passed|failed)\b.*"),
    re.compile(r"(\d+)/(\d+) lessons ok"),
    re.compile(r"^engine( \(.*?\))?: .*tok/s.*"),
    re.compile(r"^batch \d+: .*"),
)


def _json_headline(rec) -> str:
    for headline in JSON_HEADLINES:
        try:
            found = headline(rec)
        except (AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError):
            found = None
        if found:
            return found
    return NONE


def _ending(text: str) -> str | None:
    """How a test or lessons run ended: every pytest summary line of the log, or its lessons lines summed."""
    lines = [line.strip() for line in text.splitlines()]
    found = [m.group(0).strip("= ") for line in lines if (m := LOG_HEADLINES[0].search(line))]
    if found:
        return "; ".join(found)
    runs = [(int(m.group(1)), int(m.group(2))) for line in lines if (m := LOG_HEADLINES[1].search(line))]
    if runs:
        ok, total = sum(r[0] for r in runs), sum(r[1] for r in runs)
        return f"{ok}/{total} lessons ok" + (f" ({len(runs)} runs)" if len(runs) > 1 else "")
    return None


def _log_headline(text: str) -> str | None:
    """How the run ended, else its first line of figures; ``None`` when it has neither."""
    if (ending := _ending(text)) is not None:
        return ending
    lines = [line.strip() for line in text.splitlines()]
    for pattern in LOG_HEADLINES[2:]:
        found = [line for line in lines if pattern.search(line)]
        if found:
            return found[0]
    return None


def _first_line(text: str) -> str:
    return next((line.lstrip("#= ").strip() for line in text.splitlines() if line.strip()), "") or NONE


# -- the index ---------------------------------------------------------------------------------------------


def _committed_days() -> dict[str, str]:
    """Each path git ever added under figures/ or benchmarks/records/, with the day it was first added."""
    try:
        out = subprocess.run(
            [
                "git",
                "log",
                "--format=@%as",
                "--name-only",
                "--no-renames",
                "--diff-filter=A",
                "--",
                "figures",
                "benchmarks/records",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    days: dict[str, str] = {}
    day = ""
    for line in out.splitlines():
        if line.startswith("@"):
            day = line[1:]
        elif line:
            days[line] = day  # git log runs newest first: the last day seen is the first addition
    return days


def describe(path: Path, days: dict[str, str] | None = None) -> dict:
    """The index line of one record: ``name`` (its path under records/), ``card``, ``date``, ``commit``,
    ``command``, ``headline``."""
    rel = path.relative_to(RECORDS).as_posix()
    card = rel.split("/")[0]
    rec = _json(path) if path.suffix == ".json" else None
    companion = _companion(path)
    source = rec if rec is not None else _json(companion) if companion else None
    text = "" if rec is not None else path.read_text(encoding="utf-8", errors="replace")
    date = _first(source, "date_utc", "date", "executed_at")
    date = str(date)[:10] if date else None
    commit = _first(source, "commit")
    command = _first(source, "command")
    if command is None and text.startswith("#") and path.suffix != ".md":
        first = text.splitlines()[0]
        command = first[first.index("python") :] if "python" in first else first.lstrip("# ")
    if commit is None and (m := COMMIT_IN_NAME.search(path.name)):
        commit = m.group(1)
    if date is None and days:
        name = rel.split("/", 1)[1]
        for old in (f"figures/{card}/{name}", f"figures/{name}", f"benchmarks/records/{rel}"):
            if old in days:
                date = f"{days[old]} committed"
                break
    if rec is not None:
        headline = _json_headline(rec)
    elif path.suffix == ".md":  # a probe's README: its title
        headline = _first_line(text)
    else:  # a log: how it ended, else its companion's figure, else its first line
        headline = _ending(text) or (_json_headline(source) if source is not None else None)
        headline = headline if headline not in (None, NONE) else _log_headline(text) or _first_line(text)
    return {
        "name": rel,
        "card": card,
        "date": date or NONE,
        "commit": _short_commit(str(commit)) if commit else NONE,
        "command": str(command) if command else NONE,
        "headline": headline,
    }


def _cell(text: str, limit: int) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def index_text(lines: list[dict]) -> str:
    """The README: the header, then a table per card."""
    cards = [*CARDS, *sorted({x["card"] for x in lines} - set(CARDS))]
    out = [HEADER]
    for card in cards:
        rows = [x for x in lines if x["card"] == card]
        out.append(f"\n## {card} ({len(rows)} records)\n")
        if not rows:
            out.append(f"None yet: a benchmark run on this card writes its record to `{card}/`.")
            continue
        out += ["| record | date | commit | command | headline |", "|---|---|---|---|---|"]
        for x in rows:
            out.append(
                f"| [{x['name'].split('/', 1)[1]}]({x['name']}) | {x['date']} | {x['commit']} | "
                f"{_cell(x['command'], 140)} | {_cell(x['headline'], 160)} |"
            )
    return "\n".join(out) + "\n"


LINK = re.compile(r"\]\(([^)\s]+)\)")


def listed(text: str) -> set[str]:
    """The records an index lists: its links into the records folder (a card folder's path first)."""
    return {t for t in LINK.findall(text) if "/" in t and not t.startswith(("http", "#", ".."))}


def check(root: Path = RECORDS) -> tuple[list[str], list[str]]:
    """(records the index misses, listed files that do not exist)."""
    there = {p.relative_to(root).as_posix() for p in records(root)}
    index = root / "README.md"
    names = listed(index.read_text(encoding="utf-8")) if index.is_file() else set()
    return sorted(there - names), sorted(names - there)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check that the index lists every record, and only those")
    args = ap.parse_args(argv)
    if args.check:
        missing, extra = check()
        for name in missing:
            print(f"not in the index: {name}")
        for name in extra:
            print(f"listed, not there: {name}")
        print("the index lists every record" if not (missing or extra) else "run: python benchmarks/records_index.py")
        return 1 if missing or extra else 0
    days = _committed_days()
    lines = [describe(p, days) for p in records()]
    INDEX.write_text(index_text(lines), encoding="utf-8")
    print(f"wrote {INDEX.relative_to(ROOT)}: {len(lines)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())

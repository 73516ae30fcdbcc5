"""Benchmark records can be found: each lives in ``benchmarks/records/<card>/``, the index
(``benchmarks/records/README.md``) lists every one of them and nothing else, and ``figures/`` keeps
only images. Oracles: the file tree walked here (not through the index script), the index's links
parsed by a regular expression of this test, and hand-made record folders."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "benchmarks" / "records"
sys.path.insert(0, str(ROOT / "benchmarks"))

IMAGES = {".png", ".svg", ".html"}


def _links(index: Path) -> set[str]:
    return set(re.findall(r"\]\(((?:h100|h200|cpu|[a-z0-9-]+)/[^)\s]+)\)", index.read_text(encoding="utf-8")))


def _files(root: Path) -> set[str]:
    """Every file under root but the folder's README and each card folder's README."""
    out = set()
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if path.is_file() and not (path.name == "README.md" and len(rel.parts) <= 2):
            out.add(rel.as_posix())
    return out


def test_the_index_lists_every_record_and_only_records_that_exist():
    listed, there = _links(RECORDS / "README.md"), _files(RECORDS)
    assert there, "no records found"
    assert not there - listed, f"records missing from benchmarks/records/README.md: {sorted(there - listed)}"
    assert not listed - there, f"listed but not there: {sorted(listed - there)}"


def test_records_are_filed_by_card():
    cards = {p.name for p in RECORDS.iterdir() if p.is_dir()}
    assert {"h200", "h100", "cpu"} <= cards
    assert not [p.name for p in RECORDS.iterdir() if p.is_file() and p.name != "README.md"]


def test_figures_holds_only_images():
    others = [p.relative_to(ROOT).as_posix() for p in (ROOT / "figures").rglob("*") if p.is_file()]
    others = [p for p in others if Path(p).suffix not in IMAGES]
    assert not others, f"records under figures/ (they belong in benchmarks/records/<card>/): {others}"


def test_the_index_check_names_a_missing_and_a_vanished_record(tmp_path):
    from records_index import check

    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "engine_bench.json").write_text("{}")
    (tmp_path / "h200" / "README.md").write_text("# a card's README: not a record\n")
    (tmp_path / "README.md").write_text("| [gone.json](h200/gone.json) |\n")
    assert check(tmp_path) == (["h200/engine_bench.json"], ["h200/gone.json"])
    (tmp_path / "README.md").write_text("| [engine_bench.json](h200/engine_bench.json) |\n")
    assert check(tmp_path) == ([], [])


def test_an_index_line_reads_the_record_and_its_log(tmp_path, monkeypatch):
    import records_index

    monkeypatch.setattr(records_index, "RECORDS", tmp_path)
    (tmp_path / "h100").mkdir()
    rec = tmp_path / "h100" / "layer_bench_abc1234.json"
    rec.write_text(
        '{"command": "python benchmarks/bench_layer.py --batches 1,16", "commit": "0123456789abcdef+dirty",'
        ' "date_utc": "2026-12-05T10:00:00Z", "rows": [{"batch": 1, "fused_us": 612.4}, {"batch": 16, "fused_us": 700.0}]}'
    )
    log = tmp_path / "h100" / "layer_bench_abc1234_log.txt"
    log.write_text("batch 1: unfused 2000 us, fused 612 us\n")
    line = records_index.describe(rec)
    assert line == {
        "name": "h100/layer_bench_abc1234.json",
        "card": "h100",
        "date": "2026-12-05",
        "commit": "0123456+dirty",
        "command": "python benchmarks/bench_layer.py --batches 1,16",
        "headline": "decode step (fused) b1 612 us, b16 700 us",
    }
    assert records_index.describe(log) == {**line, "name": "h100/layer_bench_abc1234_log.txt"}
    pytest_log = tmp_path / "h100" / "pytest_gpu_fedcba9.txt"
    pytest_log.write_text("# the GPU suite\n....F\n1 failed, 4 passed in 3.00s\n")
    assert records_index.describe(pytest_log)["headline"] == "1 failed, 4 passed in 3.00s"
    assert records_index.describe(pytest_log)["commit"] == "fedcba9"


@pytest.mark.parametrize(
    "gpu, card",
    [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-40GB", "a100"), (None, "cpu")],
)
def test_a_record_lands_in_the_folder_of_the_card_it_ran_on(gpu, card):
    from record import card as card_of

    assert card_of(gpu) == card


def test_new_records_default_to_the_records_folder_of_this_machine():
    import torch
    from record import RECORDS as records_dir
    from record import record_path

    expected = "cpu" if not torch.cuda.is_available() else None
    path = record_path("x.json")
    assert path.parent.parent == records_dir == RECORDS and path.name == "x.json"
    assert expected is None or path.parent.name == expected

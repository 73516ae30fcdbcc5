"""Numbers in a lesson's prose come from the computation (issue 21): no markdown cell types a figure.

A sentence that states a measured or computed number is rendered in a code cell from the value
the lesson computed or loaded (``paged_edu.lessons.prose.say``), so it cannot drift from the
number on the screen. This test reads every lesson's markdown cells (code spans, maths, links and
exercise numbers left out) and fails on

* a **typed figure the lesson computes**: a number with thousands separators, with decimals or
  with a size unit (``GiB`` ...), whose value also appears -- at the precision it was typed --
  among the lesson's stored outputs (the checked cells) or in a stored record the lesson loads
  (``benchmarks/records/**.json`` named in its code); plain integers are left alone (block sizes, counts and
  other inputs);
* a **measured figure** at all: a time, a rate, a percentage or a speed-up typed in the prose,
  unless :data:`ALLOWED` names it with the reason it may be typed (an input the lesson sets, a
  figure from a cited paper, a hardware specification).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from paged_edu.lessons.prose import Prose, fmt, say

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

_NUM = r"(?<![\w.,/#=-])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
# units of a measurement: times, rates, shares, speed-ups (sizes count only when the lesson computes them)
_MEASURE_UNIT = r"(?:tok/s|tokens/s|req/s|ms|µs|us|ns|s|%|x|×|GB/s|TB/s|TFLOP/s)(?![\w/])"
_SIZE_UNIT = r"(?:GiB|GB|MiB|MB|KiB|KB)(?![\w/])"
MEASURED = re.compile(_NUM + r"\s?" + _MEASURE_UNIT)
SIZED = re.compile(_NUM + r"\s?" + _SIZE_UNIT)
FIGURE = re.compile(_NUM + r"(?![\w.,]*\d)")

# A typed figure a lesson may keep, with why: (lesson number, the figure as typed) -> reason.
ALLOWED: dict[tuple[str, str], str] = {
    ("01", "141 GB"): "the H200's memory as its vendor states it (an input)",
    ("01", "143,771 MiB"): "the H200's memory as nvidia-smi reports it (paged_edu.core.hardware, an input)",
    ("01", "90%"): "gpu_memory_utilization, an input",
    ("01", "90 %"): "gpu_memory_utilization, an input",
    ("01", "80 %"): "the seed's stated share, quoted",
    ("01", "28 %"): "the seed's claim, quoted to be checked",
    ("01", "2.62 GB"): "the seed's claim, quoted to be checked (the next cell finds its unit slip)",
    ("02", "8 GiB"): "the budget the next cell sets: 65,536 slots of Llama-3-8B's 128 KiB (an input)",
    ("01", "4×"): "a ratio of two inputs (fp32 vs fp8 bytes)",
    ("04", "128 x"): "128 x 8 programs: the case's shape (an input)",
    ("06", "143,771 MiB"): "the H200's memory as nvidia-smi reports it (paged_edu.core.hardware, an input)",
    ("06", "55 GB/s"): "the H200 host's PCIe bandwidth in paged_edu.core.hardware (an input of the cost model)",
    ("06", "512 MiB"): "an input of exercise 6.2 (the context it assumes)",
    ("06", "0.98"): "gpu_memory_utilization, an input",
    ("07", "40GB"): "the A100-40GB of the paper's table (a GPU's name)",
    ("07", "3 req/s"): "the table's request rate, an input",
    ("07", "30 req/s"): "the Alpaca table's request rate, an input",
    ("07", "2 req/s"): "the paper's Fig. 13a rate (its caption), an input",
    ("07", "2 ns"): "the per-block cost the second sweep assumes, an input",
    ("07", "10 %"): "the lesson's definition of 'reproduced' (a tolerance it sets)",
    ("07", "1 s"): "exercise 7.2's TTFT threshold, an input of the question",
    ("08", "4 GiB"): "vLLM's default --swap-space, a documented input",
    ("08", "70 GiB"): "an input of the flags example",
    ("08", "143,771 MiB"): "the H200's memory as nvidia-smi reports it (paged_edu.core.hardware, an input)",
    ("08", "28 %"): "the seed's claim, quoted to be checked",
    ("08", "0.9"): "gpu_memory_utilization, an input",
    ("08", "5 %"): "exercise 8.3's margin for 'LPM wins' (WIN_FACTOR 0.95), an input of the question",
    ("11", "0 %"): "the seed's troubleshooting 2 symptom (a hit rate of 0 %), quoted",
    ("11", "0.0 %"): "the seed's troubleshooting 2 symptom as the seed writes it, quoted",
    ("11", "20 ms"): "the seed's troubleshooting 3 symptom (20 -> 400 ms), quoted",
    ("11", "400 ms"): "the seed's troubleshooting 3 symptom (20 -> 400 ms), quoted",
    ("11", "0.0"): "exercise 11.1's value for an empty window, part of the question",
    ("11", "90 %"): "what p90 means (exercise 11.2's question), a definition",
}

# Numbers that are never figures: exercise numbers (**4.1**, exercise 6.2), model sizes (135M),
# years, arXiv ids, version numbers -- removed before the scan.
_NOT_FIGURES = [
    r"`[^`]*`",  # code spans
    r"\$\$.*?\$\$",
    r"\$[^$]*\$",  # maths (the formula's symbols, not measurements)
    r"\]\([^)]*\)",
    r"https?://\S+",  # link targets, addresses
    r"\*\*\d+\.\d+\b",  # **4.1**, **5.3 — ...**
    r"(?i)exercises? \d+\.\d+(?:\s*(?:and|,|-)\s*\d+\.\d+)*",  # exercise 6.2 (and 6.3)
    r"(?i)\bv\d+(?:\.\d+)*\b",
    r"(?i)vLLM \d+(?:\.\d+)+",  # versions
    r"(?i)arXiv:\d+\.\d+",
    r"\b\d+(?:\.\d+)?[MBK]\b",  # arXiv ids, 135M / 8B / 70B models
    r"(?i)\b(?:torch|triton|python|cuda|nbval|plotly) \d+(?:\.\d+)+",
]


def _prose(cell_source: str) -> str:
    text = cell_source
    for pattern in _NOT_FIGURES:
        text = re.sub(pattern, " ", text, flags=re.S)
    return text


def _value(figure: str) -> tuple[float, int]:
    """``'15,315'`` -> (15315.0, 0); ``'4.17'`` -> (4.17, 2): the value and the decimals it was typed with."""
    number = figure.replace(",", "")
    decimals = len(number.split(".")[1]) if "." in number else 0
    return float(number), decimals


def _numbers(text: str) -> set[float]:
    return {
        float(m.replace(",", ""))
        for m in re.findall(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:e-?\d+)?", text)
    }


def _is_input_size(figure: str) -> bool:
    """A power of two (``8,192``, ``1,024``): a context length, a block count or another size a lesson sets."""
    value, decimals = _value(figure)
    return decimals == 0 and value >= 1 and int(value) & (int(value) - 1) == 0


def _computed_numbers(nb: dict) -> set[float]:
    """Every number in the lesson's stored outputs and in the stored records its code names."""
    out: set[float] = set()
    code = ""
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        code += "".join(cell["source"]) + "\n"
        for o in cell.get("outputs", []):
            text = "".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
            text += "".join(o.get("data", {}).get("text/markdown", ""))
            out |= _numbers(text)
    for name in set(re.findall(r"benchmarks/records/[\w/]+\.json", code)):
        path = ROOT / name
        if path.exists():
            out |= _numbers(path.read_text())
    return out


def _matches(figure: str, computed: set[float]) -> bool:
    value, decimals = _value(figure)
    return any(round(c, decimals) == value for c in computed)


def typed_figures(nb: dict) -> list[tuple[int, str, str]]:
    """(cell index, figure, why it fails) for every typed figure the rules above refuse."""
    computed = _computed_numbers(nb)
    bad = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = _prose("".join(cell["source"]))
        for m in MEASURED.finditer(text):
            figure = m.group(0)
            if (nb["_lesson"], figure) not in ALLOWED:
                bad.append((i, figure, "a measured figure typed in the prose"))
        for m in FIGURE.finditer(text):
            figure = m.group(1)
            sized = SIZED.match(text, m.start())
            shown = sized.group(0) if sized else figure
            if (nb["_lesson"], shown) in ALLOWED or (nb["_lesson"], figure) in ALLOWED:
                continue
            if any(b[0] == i and b[1].startswith(figure) for b in bad):
                continue  # already refused as a measured figure
            if _is_input_size(figure) and not sized:
                continue
            if ("," in figure or "." in figure or sized) and _matches(figure, computed):
                bad.append((i, shown, "typed, and the lesson computes it"))
    return bad


def _load(path: Path) -> dict:
    nb = json.loads(path.read_text(encoding="utf-8"))
    nb["_lesson"] = path.name[:2]
    return nb


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name[:2] for p in NOTEBOOKS])
def test_no_lesson_types_a_figure_in_its_prose(path):
    nb = _load(path)
    bad = typed_figures(nb)
    assert not bad, (
        "render these from the computation (paged_edu.lessons.prose.say) or name their source:\n"
        + "\n".join(f"  cell {i}: {fig!r} ({why})" for i, fig, why in bad)
    )


def test_the_scan_finds_a_typed_figure_and_ignores_code_maths_and_exercise_numbers():
    nb = {
        "_lesson": "99",
        "cells": [
            {
                "cell_type": "markdown",
                "source": [
                    "The engine measured 15,315 tok/s; **4.1** asks `x = 2.5 ms`; "
                    "$\\lceil 56 / 8 \\rceil = 7$; SmolLM2-135M; exercise 6.2."
                ],
            },
            {"cell_type": "markdown", "source": ["Up to 1,739 of them, 4.49 on average."]},
            {
                "cell_type": "code",
                "source": ["print(x)"],
                "outputs": [{"output_type": "stream", "text": "1,739.2 and 4.486\n"}],
            },
        ],
    }
    assert typed_figures(nb) == [
        (0, "15,315 tok/s", "a measured figure typed in the prose"),
        (1, "1,739", "typed, and the lesson computes it"),
        (1, "4.49", "typed, and the lesson computes it"),
    ]


def test_say_renders_markdown_with_the_lessons_number_format():
    s = say("{a} tok/s, {b} of them, {c:.1%} hit, {d} and {e}", a=27096.4, b=1739, c=0.1992, d=4.4861, e=0.01234)
    assert isinstance(s, Prose) and s == "27,096 tok/s, 1,739 of them, 19.9% hit, 4.49 and 0.0123"
    assert s._repr_markdown_() == str(s) and repr(s) == str(s)
    assert fmt(float("nan")) == "nan" and fmt(True) == "True"
    with pytest.raises(KeyError, match="missing"):
        say("{missing} tokens")

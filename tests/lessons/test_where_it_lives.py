"""Lesson 8's "where each concept lives" table: every paged_edu name imports, every cell has a source."""

import re

import pytest

from paged_edu.lessons import where_it_lives as w

SOURCE = re.compile(r"^([\w.-]+/[\w.-]+:[\w./-]+( \(.+\))?|https?://\S+)$")


def test_every_paged_edu_entry_resolves_by_import():
    for concept in w.CONCEPTS:
        assert concept.paged_edu, concept.concept
        for path in concept.paged_edu:
            assert w.resolve(path) is not None


@pytest.mark.parametrize(
    "bad",
    [
        "paged_edu.core.allocator:BlockAllocator.block_tabel",
        "paged_edu.core.alocator:BlockAllocator",
        "paged_edu.core.allocator",
    ],
)
def test_resolve_fails_on_a_wrong_name(bad):
    with pytest.raises(ValueError):
        w.resolve(bad)


def test_every_row_has_cited_vllm_and_sglang_cells():
    assert len(w.CONCEPTS) >= 14
    names = {c.concept for c in w.CONCEPTS}
    for needed in (
        "block table",
        "slot mapping",
        "ref count",
        "block hash (chained)",
        "copy-on-write",
        "preemption (recompute)",
        "swap space (CPU)",
        "chunked prefill",
        "paged decode kernel",
        "CUDA graphs",
        "prefix-aware scheduling (LPM)",
        "radix tree",
    ):
        assert needed in names
    for c in w.CONCEPTS:
        assert c.vllm and c.sglang, c.concept
        for claim in c.vllm + c.sglang + c.differs:
            assert claim.text.strip(), c.concept
            for part in claim.source.split("; "):
                assert SOURCE.match(part), (c.concept, part)
            if claim in c.vllm:
                assert "vllm-project/vllm" in claim.source, (c.concept, claim.source)
            if claim in c.sglang:
                assert "sgl-project/sglang" in claim.source, (c.concept, claim.source)


def test_the_source_check_can_fail():
    assert not SOURCE.match("vllm somewhere")
    assert not SOURCE.match("kv_cache_utils.py")


def test_the_lessons_source_check_agrees_and_can_fail():
    """Issue 21: lesson 8's "every claim has a source" checks the cited place, not only a non-empty string."""
    assert all(not w.source_problems(c) for c in w.CONCEPTS), [p for c in w.CONCEPTS for p in w.source_problems(c)]
    good = w.CONCEPTS[0]
    bent = [
        w.Concept(good.concept, good.lessons, good.paged_edu, (w.Claim("x", "somewhere in vllm"),), good.sglang),
        w.Concept(good.concept, good.lessons, good.paged_edu, (w.Claim("x", "sgl-project/sglang:a.py"),), good.sglang),
        w.Concept(
            good.concept, good.lessons, good.paged_edu, (w.Claim("x", "vllm-project/vllm:vllm/v1"),), good.sglang
        ),
        w.Concept(good.concept, good.lessons, good.paged_edu, good.vllm, ()),
    ]
    assert [len(w.source_problems(c)) > 0 for c in bent] == [True] * 4
    for part in (p for c in w.CONCEPTS for cl in c.vllm + c.sglang + c.differs for p in cl.source.split("; ")):
        assert SOURCE.match(part)


def test_table_rows_and_renderers():
    rows = w.concept_table()
    assert len(rows) == len(w.CONCEPTS)
    assert set(rows[0]) == {
        "concept",
        "lessons",
        "paged_edu",
        "vllm",
        "vllm_source",
        "sglang",
        "sglang_source",
        "differs",
        "differs_source",
    }
    assert all(r["vllm_source"] and r["sglang_source"] for r in rows)
    md = w.concept_table_markdown()
    assert md.count("\n") == len(w.CONCEPTS) + 1 and "vllm/v1/core/kv_cache_utils.py" in md
    page = w.concept_table_html()
    assert page.startswith("<table") and page.count("<tr") == len(w.CONCEPTS) + 1
    assert "&#x27;we only cache full blocks&#x27;" in page  # claim text is escaped

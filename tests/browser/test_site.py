"""The course website in a real browser: build (or reuse) build/site/ from CPU-executed lessons with
``scripts/build_site.py``, serve it on 127.0.0.1 with a plain file server, and open every page in
headless Chromium (Playwright): no console errors, no request leaves the machine, every internal
link, anchor and image resolves, each lesson page draws plotly figures and typesets its math, a
plot answers a hover, solutions stay folded until clicked, search and next/previous work.
Screenshots of the landing page and a lesson go to ``build/site-shots/``.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from browser_helpers import HAS_CHROMIUM, SKIP_REASON, browser, free_port, new_page  # noqa: F401 (a fixture)
from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "build" / "site"
SHOTS = ROOT / "build" / "site-shots"
LESSONS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# pytest-timeout's limit for the tests that use ``site``: the first of them builds it (every lesson
# executed on the CPU, then Sphinx), longer than the per-test guard. Each cell's run is bounded by
# HANG_GUARD_S (papermill's execution timeout); this bounds the whole: one guard per lesson, one for Sphinx.
SITE_BUILD_GUARD_S = (len(LESSONS) + 1) * HANG_GUARD_S

sys.path.insert(0, str(ROOT / "scripts"))
try:
    import build_site
    import lesson_outputs
    import run_lessons
finally:
    sys.path.remove(str(ROOT / "scripts"))


def needs_chromium(test):
    """A test in the real browser: marked ``browser``, skipped where Chromium is absent."""
    return pytest.mark.browser(pytest.mark.skipif(not HAS_CHROMIUM, reason=SKIP_REASON)(test))


# ----------------------------------------------------------------------------------------------
# What the build turns outputs into (no browser)
# ----------------------------------------------------------------------------------------------


def _spec_of(html_text: str) -> dict:
    body = re.search(r'<script type="application/json">(.*?)</script>', html_text, re.S).group(1)
    return json.loads(body)


def test_a_plotly_figure_cannot_close_its_script_early():
    spec = {"data": [{"type": "bar", "y": [1, 2], "name": "</script><b>x</b>"}], "layout": {"title": {"text": "t"}}}
    out = lesson_outputs.plotly_html(spec)
    assert out.count("</script>") == 1 and _spec_of(out) == spec


def test_a_widget_becomes_a_static_view_of_its_state_and_never_a_placeholder():
    models = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_html", "IPY_MODEL_row", "IPY_MODEL_fig"]}},
        "html": {"model_name": "HTMLModel", "state": {"value": "<b>3 blocks in use</b>"}},
        "row": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_button", "IPY_MODEL_slider"]}},
        "button": {"model_name": "ButtonModel", "state": {"description": "add request"}},
        "slider": {"model_name": "IntSliderModel", "state": {"description": "len", "value": 6, "min": 1, "max": 9}},
        "fig": {
            "model_name": "AnyModel",
            "state": {
                "_widget_data": [{"type": "heatmap", "z": [[1]]}],
                "_widget_layout": {"height": 200},
                "_config": {},
            },
        },
    }
    view = {
        "output_type": "execute_result",
        "execution_count": 1,
        "metadata": {},
        "data": {lesson_outputs.WIDGET_VIEW_MIME: {"model_id": "box", "version_major": 2}, "text/plain": "VBox(...)"},
    }
    (shown,) = lesson_outputs.site_outputs([view], models)
    page = shown["data"]["text/html"]
    assert set(shown["data"]) == {"text/html"}
    assert "<b>3 blocks in use</b>" in page and '<button type="button" disabled>add request</button>' in page
    assert 'value="6"' in page and "to interact" in page
    assert _spec_of(page) == {"data": [{"type": "heatmap", "z": [[1]]}], "layout": {"height": 200}, "config": {}}
    view["data"][lesson_outputs.WIDGET_VIEW_MIME]["model_id"] = "gone"  # no saved state: the note alone
    (shown,) = lesson_outputs.site_outputs([view], models)
    assert "to interact" in shown["data"]["text/html"] and "plotly-figure" not in shown["data"]["text/html"]


def test_a_figure_widget_saves_the_figure_the_run_left_not_the_first_one(tmp_path):
    """Without the site's kernel start-up file the saved state keeps z = [[0, 0]] (plotly sends
    later changes as one-off messages); with it the static view shows z = [[5, 6]]."""
    papermill = pytest.importorskip("papermill")
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("plotly")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import plotly.graph_objects as go\nfig = go.FigureWidget(data=[go.Heatmap(z=[[0, 0]])])\nfig"
        ),
        nbformat.v4.new_code_cell("with fig.batch_update():\n    fig.data[0].z = [[5, 6]]"),
    ]
    nbformat.write(nb, tmp_path / "in.ipynb")
    with run_lessons.lesson_kernels(tmp_path):
        papermill.execute_notebook(
            str(tmp_path / "in.ipynb"),
            str(tmp_path / "out.ipynb"),
            kernel_name="python3",
            progress_bar=False,
            store_widget_state=True,
            start_timeout=HANG_GUARD_S,
            execution_timeout=HANG_GUARD_S,
        )
    executed = json.loads((tmp_path / "out.ipynb").read_text())
    models = executed["metadata"]["widgets"][build_site.WIDGET_STATE_MIME]["state"]
    (output,) = executed["cells"][0]["outputs"]
    (shown,) = lesson_outputs.site_outputs([output], models)
    assert _spec_of(shown["data"]["text/html"])["data"][0]["z"] == [[5, 6]]


def test_a_progress_bar_widget_is_left_out_of_the_page():
    """tqdm's notebook bar (an HBox of HTML, FloatProgress, HTML) meant something only during the run."""
    models = {
        "bar": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_label", "IPY_MODEL_progress"]}},
        "label": {"model_name": "HTMLModel", "state": {"value": "Loading weights: 100%"}},
        "progress": {"model_name": "FloatProgressModel", "state": {"value": 1.0, "max": 1.0}},
        "html": {"model_name": "HTMLModel", "state": {"value": "<b>kept</b>"}},
    }

    def view(model_id):
        return {
            "output_type": "display_data",
            "metadata": {},
            "data": {lesson_outputs.WIDGET_VIEW_MIME: {"model_id": model_id, "version_major": 2}},
        }

    shown = lesson_outputs.site_outputs([view("bar"), view("html")], models)
    assert len(shown) == 1 and "<b>kept</b>" in shown[0]["data"]["text/html"]


def test_the_page_drops_harness_tags_the_injected_cell_and_folds_the_colab_cell():
    nbformat = pytest.importorskip("nbformat")
    code, md = nbformat.v4.new_code_cell, nbformat.v4.new_markdown_cell
    cells = [
        md("# Lesson"),
        code('import sys\nif "google.colab" in sys.modules:\n    %pip install -q paged_edu'),
        code('device = "auto"', metadata={"tags": ["parameters"]}),
        code('# Parameters\ndevice = "cpu"\n', metadata={"tags": ["injected-parameters"]}),
        code("print(1)  # one\n", metadata={"tags": ["nbval-check-output", "keep_output"]}),
        code("x = 2\nx", metadata={"tags": ["nbval-ignore-output", "hide-input", "raises-exception"]}),
    ]
    shown = build_site.course_cells([dict(c) for c in cells])
    sources = ["".join(c["source"]) for c in shown]
    assert len(shown) == 5 and not any("# Parameters" in t for t in sources)
    assert sources[2] == 'device = "auto"' and sources[3] == "print(1)  # one\n" and sources[4] == "x = 2\nx"
    assert [c["metadata"].get("tags") for c in shown[2:]] == [None, None, ["hide-input"]]  # MyST-NB's own tag stays
    assert shown[1]["cell_type"] == "markdown" and sources[1].startswith('<details class="colab-install">')
    assert "%pip install -q paged_edu" in sources[1] and sources[1].rstrip().endswith("</details>")
    assert cells[4]["metadata"]["tags"] == ["nbval-check-output", "keep_output"]  # the executed copy is not touched


def test_the_site_reuses_what_the_lessons_run_executed_and_only_that(tmp_path, monkeypatch, capfd):
    """``dev.py lessons`` then ``dev.py site``: the site executes nothing; after a notebook changes it
    executes that one again. The lessons run prints neither the kernel's transport warning nor its log."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("papermill")
    notebooks, out = tmp_path / "notebooks", tmp_path / "lessons"
    notebooks.mkdir()
    for k in (1, 2):
        nb = nbformat.v4.new_notebook(
            metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
        )
        nb.cells = [
            nbformat.v4.new_code_cell('device = "auto"', metadata={"tags": ["parameters"]}),
            nbformat.v4.new_code_cell(f"print('device: cpu, dtype: float32'); {k}"),
        ]
        nbformat.write(nb, notebooks / f"0{k}_tiny.ipynb")
    assert run_lessons.main(["--dir", str(notebooks), "--out", str(out)]) == 0
    console = capfd.readouterr()
    assert "[1/2] 01_tiny" in console.out and "2/2 lessons ok" in console.out
    assert "without encryption" not in console.out + console.err and "IPKernelApp" not in console.out + console.err
    monkeypatch.setattr(build_site, "NOTEBOOKS", notebooks)
    monkeypatch.setattr(build_site, "EXECUTED", out)
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.ipynb")}
    records = build_site.execute("cpu", 60, force=False)
    assert [r["lesson"] for r in records] == ["01_tiny", "02_tiny"] and all(r["ok"] for r in records)
    assert capfd.readouterr().out.count("reused the run of") == 2
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.ipynb")} == before
    nb = nbformat.read(notebooks / "02_tiny.ipynb", as_version=4)
    nb.cells[1].source += " + 1"
    nbformat.write(nb, notebooks / "02_tiny.ipynb")
    build_site.execute("cpu", 60, force=False)
    printed = capfd.readouterr().out
    assert (
        "01_tiny" in printed
        and printed.count("reused the run of") == 1
        and "02_tiny: executing (notebook, library" in printed
    )
    assert (out / "01_tiny.ipynb").stat().st_mtime_ns == before["01_tiny.ipynb"]
    assert (out / "02_tiny.ipynb").stat().st_mtime_ns != before["02_tiny.ipynb"]
    assert build_site.why_execute(notebooks / "01_tiny.ipynb", records[0], "cuda") == "it ran on cpu, not cuda"


@pytest.mark.parametrize("published", [True, False])
def test_links_to_repository_files_leave_the_site_once_published_and_pages_stay(monkeypatch, published):
    """A link to a file the site does not hold goes to the repository on GitHub once it is published,
    and is plain text until then (no link to the placeholder address); links to what the site holds stay."""
    from paged_edu.lessons import setup

    monkeypatch.setattr(setup, "REPO_PUBLISHED", published)
    text = (
        "[a](paged_edu/core/allocator.py) [b](figures/utilisation.png) [c](#sources) "
        "[d](notebooks/01_kv_cache_memory.ipynb) [e](no/such/file.py) [f](https://x.org/y) [g](docs/design.md) "
        "![h](figures/utilisation.png)"
    )
    out = build_site.repository_links(text, ROOT, build_site.IN_SITE)
    linked = f"[a]({setup.REPO_URL}/blob/main/paged_edu/core/allocator.py)"
    assert (linked in out) == published and (out.startswith("a [b]") != published)
    for kept in (
        "[b](figures/utilisation.png)",
        "[c](#sources)",
        "[d](notebooks/01_kv_cache_memory.ipynb)",
        "[e](no/such/file.py)",
        "[f](https://x.org/y)",
        "[g](docs/design.md)",
        "![h](figures/utilisation.png)",
    ):
        assert kept in out


def test_the_lesson_header_offers_colab_or_says_once_why_not(monkeypatch):
    from paged_edu.lessons import setup

    record = {"device": "cpu", "machine": "x", "seconds": 1.0, "executed_at": "now", "ok": True}
    notebook = ROOT / "notebooks" / f"{LESSONS[0]}.ipynb"
    monkeypatch.setattr(setup, "REPO_PUBLISHED", False)
    pending = build_site.header_markdown(notebook, record)
    assert "colab.research.google.com" not in pending and pending.count("not yet") == 1
    monkeypatch.setattr(setup, "REPO_PUBLISHED", True)
    assert f'href="{setup.colab_url(notebook.name)}"' in build_site.header_markdown(notebook, record)


def test_a_lesson_title_loses_its_colab_badge_line_with_the_placeholder_note():
    from paged_edu.lessons.setup import colab_badge

    title = f"# Lesson\n\n{colab_badge('01_x.ipynb')}\n\nText."
    assert build_site.COLAB_BADGE.sub("", title) == "# Lesson\n\n\nText."


# ----------------------------------------------------------------------------------------------
# The built site in Chromium
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site() -> Path:
    """build/site/, built from CPU-executed lessons (copies newer than notebook and library are reused)."""
    pytest.importorskip("myst_nb")
    pytest.importorskip("sphinx")
    assert build_site.build("cpu", out=SITE, timeout=HANG_GUARD_S) == 0, (
        "python3 dev.py site failed; see its output above"
    )
    return SITE


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def url(site):
    """The site behind a plain file server on 127.0.0.1 (stopped at the end of the module)."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", free_port()), functools.partial(_QuietHandler, directory=str(site))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=HANG_GUARD_S)


def _pages(site: Path) -> list[str]:
    return sorted(str(p.relative_to(site)) for p in site.rglob("*.html") if "_static" not in p.parts)


def _open(browser, url: str, path: str):
    """A page at ``path`` with its console errors, page errors, failed and outside requests recorded."""
    page = new_page(browser, viewport={"width": 1300, "height": 900})  # every wait: its condition or the hang guard
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    # net::ERR_ABORTED is the browser cancelling a request itself (the page navigated on while the favicon was still
    # loading), not the server failing one: a missing file shows as an HTTP 404 below, an outside request as its own line
    page.on(
        "requestfailed",
        lambda r: (
            problems.append(f"request failed: {r.url} {r.failure}") if "ERR_ABORTED" not in (r.failure or "") else None
        ),
    )
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)

    def outside(route):  # the site must need nothing from outside (offline, plain file server)
        problems.append(f"outside request: {route.request.url}")
        route.abort()

    page.route(re.compile(r"^(?!http://127\.0\.0\.1:).*"), outside)
    page.goto(f"{url}/{path}", wait_until="load")
    return page, problems


def _ids(html_text: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', html_text))


@needs_chromium
@pytest.mark.timeout(SITE_BUILD_GUARD_S)
def test_every_page_loads_clean_and_every_internal_link_and_image_resolves(site, url, browser):
    pages = _pages(site)
    docs = {f"docs/{p.stem}.html" for p in (ROOT / "docs").glob("*.md")}
    assert {"index.html", "search.html"} | {f"lessons/{name}.html" for name in LESSONS} | docs <= set(pages)
    targets: dict[str, set[str]] = {}
    broken_images = {}
    for path in pages:
        page, problems = _open(browser, url, path)
        try:
            page.wait_for_load_state("networkidle")
            assert not problems, (path, problems)
            links = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
            images = page.eval_on_selector_all("img", "els => els.map(e => [e.src, e.complete && e.naturalWidth > 0])")
        finally:
            page.close()
        broken_images.update({src: path for src, ok in images if not ok})
        for link in links:
            if link.startswith(url):
                target, _, fragment = link[len(url) :].partition("#")
                targets.setdefault(target.split("?")[0] or "/", set()).add(fragment)
    assert not broken_images, broken_images
    assert len(targets) > len(pages) // 2
    for target, fragments in sorted(targets.items()):
        try:
            with urllib.request.urlopen(url + target, timeout=HANG_GUARD_S) as response:
                body = response.read().decode("utf-8", "replace") if target.endswith((".html", "/")) else ""
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{target} -> HTTP {exc.code}") from None
        missing = {f for f in fragments if f and body and urllib.parse.unquote(f) not in _ids(body)}
        assert not missing, f"{target}: no anchors {sorted(missing)}"


@needs_chromium
@pytest.mark.timeout(SITE_BUILD_GUARD_S)
@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_page_draws_plotly_typesets_math_and_folds_solutions(site, url, browser, lesson):
    page, problems = _open(browser, url, f"lessons/{lesson}.html")
    shots = lesson == LESSONS[min(1, len(LESSONS) - 1)]  # screenshots of one lesson page
    try:
        page.wait_for_selector(".js-plotly-plot .main-svg")
        has_math = page.locator(".math").count() > 0  # MyST's math spans and blocks, before MathJax
        if has_math:  # lesson 11 has none
            page.wait_for_selector("mjx-container")
        assert page.locator(".js-plotly-plot").count() >= 1
        if shots:
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / f"{lesson}.png"))
        assert page.locator("mjx-container").count() >= has_math
        from paged_edu.lessons.setup import REPO_PUBLISHED

        if REPO_PUBLISHED:
            colab = page.locator("a", has_text="Open in Colab").first.get_attribute("href")
            assert colab.startswith("https://colab.research.google.com/github/")
        else:  # the Colab place says once that the repository is not published, and links nowhere
            assert page.locator(".lesson-meta .colab-pending").count() == 1
            assert page.locator("a[href*='colab.research.google.com']").count() == 0
        download = page.locator("a", has_text="Download notebook").first.get_attribute("href")
        assert download.endswith(f"{lesson}.ipynb")
        assert page.locator(".lesson-meta .device", has_text="Executed on").count() == 1
        # a widget is never a broken placeholder: a static view and a note saying how to interact
        text = page.inner_text("article")
        assert "Error displaying widget" not in text and "Loading widget" not in text
        if page.locator(".widget-snapshot").count():
            assert "to interact" in page.locator(".widget-snapshot .note").first.inner_text()
        # solutions: folded until their summary is clicked
        solutions = page.locator("details.solution")
        if solutions.count():
            first = solutions.first
            assert first.get_attribute("open") is None and not first.locator("pre").first.is_visible()
            first.locator("summary").click()
            assert first.locator("pre").first.is_visible()
        # a plot answers the mouse: sweep over a plot with hoverable traces until a hover label appears
        hoverable = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].findIndex(
            p => (p.data || []).some(t => t.hoverinfo !== 'skip' && t.hoverinfo !== 'none'))""")
        assert hoverable >= 0, "no plot on the page has a trace that shows hover labels"
        plot = page.locator(".js-plotly-plot").nth(hoverable)
        plot.scroll_into_view_if_needed()
        box = plot.locator(".nsewdrag").first.bounding_box()
        hovered = False
        for fy in (0.5, 0.25, 0.75, 0.9, 0.1):
            for fx in [i / 24 for i in range(1, 24)]:
                page.mouse.move(box["x"] + fx * box["width"], box["y"] + fy * box["height"])
                if plot.locator(".hoverlayer .hovertext").count():
                    hovered = True
                    break
            if hovered:
                break
        assert hovered, f"no hover label on plot {hoverable}"
        if shots:
            page.screenshot(path=str(SHOTS / f"{lesson}_hover.png"))
        assert not problems, problems
    finally:
        page.close()


# What lies outside the article's column (figures, their SVG, images) or scrolls sideways (code).
_OVERFLOW = """() => {
    const column = document.querySelector("article").getBoundingClientRect();
    const wide = [...document.querySelectorAll("article .js-plotly-plot, article .main-svg, article img")]
        .map(e => [e.className.baseVal ?? e.className, e.getBoundingClientRect()])
        .filter(([, r]) => r.width > 0 && (r.left < column.left - 1 || r.right > column.right + 1))
        .map(([name, r]) => `${name} ${Math.round(r.width)} px at ${Math.round(r.left)}`);
    const scrolling = [...document.querySelectorAll("article pre")].filter(p => p.scrollWidth > p.clientWidth + 1)
        .map(p => p.textContent.slice(0, 60));
    return {column: Math.round(column.width), wide, scrolling};
}"""


@needs_chromium
@pytest.mark.parametrize("width, height", [(1366, 768), (800, 900)])
def test_lesson_pages_fit_the_column_and_show_no_test_harness(site, url, browser, width, height):
    """At a laptop's 1366 x 768 and at 800 px wide: no figure or image wider than the article's
    column, no code block scrolling sideways, no test-harness tag on a cell (``nbval-check-output`` ...),
    no papermill injected-parameters cell, and the Colab install cell folded once."""
    for lesson in LESSONS:
        page, problems = _open(browser, url, f"lessons/{lesson}.html")
        try:
            page.set_viewport_size({"width": width, "height": height})
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=HANG_GUARD_S * 1000)
            page.wait_for_timeout(300)  # plotly's responsive resize runs on the window's resize event
            overflow = page.evaluate(_OVERFLOW)
            assert not overflow["wide"], (lesson, overflow)
            assert not overflow["scrolling"], (lesson, overflow)
            text = page.inner_text("article")
            assert "NBVAL_" not in text and "# Parameters" not in text, lesson
            assert page.locator(".tag_injected-parameters").count() == 0, lesson
            harness = page.eval_on_selector_all(
                "[class*='tag_']", "els => els.flatMap(e => [...e.classList].filter(c => c.startsWith('tag_')))"
            )
            assert not [c for c in harness if build_site.HARNESS_TAG.match(c.removeprefix("tag_"))], (lesson, harness)
            assert page.locator("details.colab-install").count() == 1, lesson
            assert page.locator("details.colab-install").get_attribute("open") is None
            if width == 800 and lesson == LESSONS[min(1, len(LESSONS) - 1)]:
                SHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SHOTS / f"{lesson}_800px.png"), full_page=True)
            assert not problems, (lesson, problems)
        finally:
            page.close()


@needs_chromium
@pytest.mark.timeout(SITE_BUILD_GUARD_S)
def test_landing_page_search_and_next_previous(site, url, browser):
    page, problems = _open(browser, url, "index.html")
    try:
        assert page.locator("img").count() >= 2  # the README's figures
        assert page.locator("table").count() >= 2  # its lesson and benchmark tables
        icon = page.locator("link[rel~='icon']").first.get_attribute("href")  # no 404 for /favicon.ico
        with urllib.request.urlopen(urllib.parse.urljoin(f"{url}/index.html", icon), timeout=HANG_GUARD_S) as response:
            assert response.status == 200 and b"<svg" in response.read()
        nxt = page.locator("a.next-page").first
        assert LESSONS[0] in nxt.get_attribute("href")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "index.png"))
        page.wait_for_load_state("networkidle")  # the favicon and images answered (a 404 among them is a problem)
        nxt.click()
        page.wait_for_url(f"**/lessons/{LESSONS[0]}.html")
        assert page.locator("a.prev-page").count() and page.locator("a.next-page").count() == (len(LESSONS) > 1)
        page.goto(f"{url}/search.html?q=allocator")
        page.wait_for_selector("#search-results ul.search li")
        hits = page.eval_on_selector_all("#search-results ul.search li a", "els => els.map(e => e.href)")
        assert any("/lessons/" in h for h in hits), hits
        assert not problems, problems
    finally:
        page.close()


@needs_chromium
@pytest.mark.timeout(SITE_BUILD_GUARD_S)
def test_no_page_links_to_or_quotes_the_placeholder_repository(site):
    """While the repository is not published (``REPO_PUBLISHED``), no page links to its placeholder
    address (on GitHub or through Colab), and neither the pages' text nor the search index carries the
    badge's placeholder sentence; the Colab place of each lesson page names it once instead."""
    from paged_edu.lessons.setup import REPO_PUBLISHED, REPO_URL

    if REPO_PUBLISHED:
        pytest.skip("the repository is published: its address is real")
    path = REPO_URL.removeprefix("https://github.com/")
    dead = {}
    for page in _pages(site):
        text = (site / page).read_text()
        hrefs = re.findall(r'href="([^"]*)"', text)
        dead.update({page: h for h in hrefs if path in h})
        assert "is a placeholder until the course is published" not in text, page
    assert not dead, dead
    index = (site / "searchindex.js").read_text()
    assert "placeholder until the course is published" not in index
    assert all((site / "lessons" / f"{name}.html").read_text().count('class="colab-pending"') == 1 for name in LESSONS)


# The lines of a page's code blocks that wrap: for each, where its first line's code starts and where
# its continuation lines start (px from the block's left edge), and one character's width.
_WRAPPED_LINES = """() => {
    const out = [];
    for (const line of document.querySelectorAll("article pre .code-line")) {
        const text = line.textContent, start = text.search(/\\S/);
        if (start < 0) continue;
        const range = document.createRange();
        range.selectNodeContents(line);
        const rects = [...range.getClientRects()].filter(r => r.width > 0);
        const tops = [...new Set(rects.map(r => Math.round(r.top)))];
        if (tops.length < 2) continue;
        const left = line.closest("pre").getBoundingClientRect().left;
        const minLeft = top => Math.min(...rects.filter(r => Math.round(r.top) === top).map(r => r.left)) - left;
        const probe = document.createElement("span");
        probe.textContent = "0000000000";
        line.closest("pre").appendChild(probe);
        const ch = probe.getBoundingClientRect().width / 10;
        probe.remove();
        out.push({text: text.slice(0, 60), indent: start, first: minLeft(tops[0]), rest: tops.slice(1).map(minLeft), ch});
    }
    return out;
}"""


@needs_chromium
@pytest.mark.timeout(SITE_BUILD_GUARD_S)
def test_code_wraps_with_its_indentation_and_copies_as_written(site, url, browser):
    """At 800 px a long code line wraps, and each continuation starts right of the line's own
    indentation (a hanging indent), never at column 0; the block's text is still the code."""
    lesson = LESSONS[min(3, len(LESSONS) - 1)]
    page, problems = _open(browser, url, f"lessons/{lesson}.html")
    try:
        page.set_viewport_size({"width": 800, "height": 900})
        page.wait_for_selector("article pre .code-line", state="attached")  # the first may sit in a folded <details>
        wrapped = page.evaluate(_WRAPPED_LINES)
        assert wrapped, "no code line wraps at 800 px: nothing was checked"
        for w in wrapped:
            assert all(r >= (w["indent"] + 3.5) * w["ch"] for r in w["rest"]), w
        code = page.locator("article div.cell_input pre").first.inner_text()
        source = json.loads((ROOT / "notebooks" / f"{lesson}.ipynb").read_text())
        sources = ["".join(c["source"]).strip() for c in source["cells"] if c["cell_type"] == "code"]
        assert code.strip() in sources, code[:200]
        assert not problems, problems
    finally:
        page.close()


@needs_chromium
@pytest.mark.timeout(SITE_BUILD_GUARD_S)
def test_a_lesson_prints_as_the_article_alone_full_width(site, url, browser):
    """The print stylesheet: no sidebars, table of contents or navigation, the article across the
    page, code still wrapped with its indentation."""
    page, problems = _open(browser, url, f"lessons/{LESSONS[0]}.html")
    try:
        page.emulate_media(media="print")
        shown = page.evaluate("""() => {
            const visible = s => [...document.querySelectorAll(s)].some(e => e.getClientRects().length > 0
                && getComputedStyle(e).display !== "none" && getComputedStyle(e).visibility !== "hidden");
            return {sidebar: visible(".sidebar-drawer"), toc: visible(".toc-drawer"), nav: visible(".related-pages"),
                    article: document.querySelector("article").getBoundingClientRect().width,
                    page: document.documentElement.clientWidth,
                    wrap: getComputedStyle(document.querySelector("article pre")).whiteSpace};
        }""")
        assert not shown["sidebar"] and not shown["toc"] and not shown["nav"], shown
        assert shown["article"] >= 0.9 * shown["page"] and shown["wrap"] == "pre-wrap", shown
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.pdf(path=str(SHOTS / f"{LESSONS[0]}_print.pdf"))
        assert not problems, problems
    finally:
        page.close()

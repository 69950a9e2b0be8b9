"""The documentation and course site (``make docs``) built as CI builds it and read in Chromium.

The site is built with Sphinx's ``-W`` (a broken link between pages fails the build), served
from a local HTTP server on 127.0.0.1, and opened in Debian's Chromium: the start page, an
area page and an executed lab, whose plotly figures must be drawn (an SVG with traces), with
no console error, no request leaving 127.0.0.1 (the site works offline) and every internal
link of those pages answering 200; then every other course page: executed (a page rendered
without its executed copy fails, naming it), drawing as many figures as its run drew, without an
error or a request off the site. The lab is lab 07 (the planner: no ranks): its executed
copy comes from the suite's run when there is one, else the build executes it (seconds); the
other notebooks' copies come from the notebook tier, which `make test` runs before this one.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.request
import uuid
from urllib.parse import urlparse

import pytest

from .conftest import _need_browser, open_browser
from .helpers import ROOT, STATE, shot

SITE = STATE / "docs-site"
START, AREA, LAB = "index.html", "checkpoints.html", "course/notebooks/lab_07_plan_70b.html"
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / ".state" / "executed-notebooks"  # where the notebook tier keeps its runs (tests/notebook_runs.py)
UNEXECUTED = "This page shows the notebook unexecuted"  # the note docs/_ext/course.py puts on such a page


def expected_figures(stem: str) -> tuple[int, int]:
    """The plotly figures the suite's run of notebook ``stem`` drew and their traces, counted in its
    executed copy: its figure outputs, and the figures inside each widget it showed (a dashboard's box
    of FigureWidgets); (-1, -1) without a copy. The page must draw each, with every trace."""
    path = EXECUTED / f"{stem}.ipynb"
    if not path.is_file():
        return -1, -1
    nb = json.loads(path.read_text())
    state = nb.get("metadata", {}).get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    state = state.get("state", {})

    def figures_in(model_id: str, seen: set) -> list[int]:  # the traces of each figure inside the widget
        model = state.get(model_id)
        if model is None or model_id in seen:
            return []
        seen.add(model_id)
        body = model.get("state", {})
        if "_widget_data" in body:  # plotly 6's FigureWidget
            return [len(body["_widget_data"] or [])]
        if model.get("model_name") == "FigureModel":  # plotly 5's
            return [len(body.get("_data") or [])]
        children = [c for c in body.get("children", []) if isinstance(c, str) and c.startswith("IPY_MODEL_")]
        return [n for c in children for n in figures_in(c.removeprefix("IPY_MODEL_"), seen)]

    traces: list[int] = []
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            if "application/vnd.plotly.v1+json" in data:
                traces.append(len(data["application/vnd.plotly.v1+json"].get("data", [])))
            elif "application/vnd.jupyter.widget-view+json" in data:
                traces += figures_in(data["application/vnd.jupyter.widget-view+json"].get("model_id", ""), set())
    return len(traces), sum(traces)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the test reads statuses, not the server's log
        pass


@pytest.fixture(scope="module")
def site():
    _need_browser()
    shutil.rmtree(SITE, ignore_errors=True)
    env = dict(os.environ, DOCS_EXECUTE="lab_07_plan_70b")  # any other missing notebook: shown unexecuted
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", str(SITE)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, f"the docs build failed:\n{build.stdout[-3000:]}\n{build.stderr[-6000:]}"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(SITE)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def test_start_area_and_lab_pages_draw_offline_and_their_links_answer(site, playwright_driver):
    profile = STATE / "chromium" / uuid.uuid4().hex[:8]
    profile.mkdir(parents=True)
    context, page = open_browser(playwright_driver, profile, width=1300)
    console: list[str] = []
    outside: list[str] = []
    page.on("console", lambda msg: console.append(msg.text[:300]) if msg.type == "error" else None)

    def only_here(route):
        if urlparse(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_here)
    try:
        checked: dict[str, int] = {}
        for path in (START, AREA, LAB):
            reply = page.goto(site + path, wait_until="load")
            assert reply is not None and reply.status == 200, path
            hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
            internal = {h.split("#")[0] for h in hrefs if h.startswith(site)}
            assert len(internal) >= 5, f"{path}: the navigation's links are missing: {internal}"
            for url in internal - checked.keys():
                checked[url] = _status(url)
            if path == START:
                # the dashboard screenshot is there and loaded
                widths = page.eval_on_selector_all("img", "els => els.map(e => e.naturalWidth)")
                assert widths and all(w > 0 for w in widths), widths
            if path == LAB:
                figures = page.locator(".plotly-figure")
                assert figures.count() >= 1, "the lab's figure was not turned into a drawable one"
                page.wait_for_function(
                    "() => [...document.querySelectorAll('.plotly-figure')].every(d => d.querySelector('svg.main-svg'))",
                    timeout=30_000,
                )
                for i in range(figures.count()):
                    drawn = figures.nth(i).locator("svg.main-svg .trace").count()
                    expected = figures.nth(i).evaluate("d => d.data.length")
                    assert expected >= 1 and drawn >= expected, (i, drawn, expected)
                text = page.inner_text("article")
                assert "workbench.labs.check(" in text, "the lab's check cells are shown"
                assert "student version" in text
                student = page.locator("a", has_text="the student version")
                assert checked.get(student.first.evaluate("a => a.href").split("#")[0]) == 200
                figures.first.scroll_into_view_if_needed()
                shot(page, "docs_site_lab_07")
        # every course page (what the notebooks printed and drew, as rendered): executed, each figure
        # its run drew there and drawn, without an error and without asking the network, e.g. for a
        # plotly.js or MathJax on a CDN
        pages = sorted((SITE / "course" / "notebooks").glob("*.html"))
        assert {p.stem for p in pages} == {p.stem for p in NOTEBOOKS.glob("*.ipynb")}, pages
        unexecuted, figures_seen = [], {}
        for lab in pages:
            before = len(console)
            page.goto(f"{site}course/notebooks/{lab.name}", wait_until="load")
            if UNEXECUTED in page.inner_text("article"):
                unexecuted.append(lab.stem)
                continue
            drawn = page.evaluate(  # per figure: drawn (its SVG is there), and the traces it was given
                "[...document.querySelectorAll('.plotly-figure')].map(d => [!!d.querySelector('svg.main-svg'), "
                "(d.data || []).length])"
            )
            figures_seen[lab.stem] = ((len(drawn), sum(n for _, n in drawn)), expected_figures(lab.stem))
            assert all(svg for svg, _ in drawn) and len(console) == before, (lab.name, drawn, console[before:])
        assert unexecuted == [], (
            f"course pages rendered unexecuted (no executed copy in {EXECUTED}: the notebook tier writes them, "
            f"run it first): {unexecuted}"
        )
        wrong = {stem: seen for stem, seen in figures_seen.items() if seen[0] != seen[1]}
        assert wrong == {}, f"(figures, traces) on the page against those its run drew: {wrong}"
        broken = {url: status for url, status in checked.items() if status != 200}
        assert broken == {}, broken
        assert outside == [], f"the site asked the network for: {outside}"
        assert console == [], console
        assert page.js_errors == [], page.js_errors
    finally:
        context.close()
        shutil.rmtree(profile, ignore_errors=True)

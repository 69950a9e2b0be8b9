"""The documentation and course site (``make docs``) built as CI builds it and read in Chromium.

The site is built with Sphinx's ``-W`` (a broken link between pages fails the build), served
from a local HTTP server on 127.0.0.1, and opened in Debian's Chromium: the start page, an
area page and an executed lab, whose plotly figures must be drawn (an SVG with traces), with
no console error, no request leaving 127.0.0.1 (the site works offline) and every internal
link of those pages answering 200; then every other course page, drawn without an error or a
request off the site. The lab is lab 07 (the planner: no ranks): its executed
copy comes from the suite's run when there is one, else the build executes it (seconds).
"""

from __future__ import annotations

import functools
import http.server
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
        # every course page (what the notebooks printed and drew, as rendered): drawn without an
        # error and without asking the network, e.g. for a plotly.js or MathJax on a CDN
        for lab in sorted((SITE / "course" / "notebooks").glob("*.html")):
            before = len(console)
            page.goto(f"{site}course/notebooks/{lab.name}", wait_until="load")
            drawn = page.evaluate("[...document.querySelectorAll('.plotly-figure')].every(d => d.querySelector('svg'))")
            assert drawn and len(console) == before, (lab.name, console[before:])
        broken = {url: status for url, status in checked.items() if status != 200}
        assert broken == {}, broken
        assert outside == [], f"the site asked the network for: {outside}"
        assert console == [], console
        assert page.js_errors == [], page.js_errors
    finally:
        context.close()
        shutil.rmtree(profile, ignore_errors=True)

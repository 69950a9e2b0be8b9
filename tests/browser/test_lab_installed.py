"""The Lab that ``make lab`` serves has the workbench's extensions, from the install alone.

The session's Lab (``conftest.lab``) is started as ``make lab`` starts one: no extension is
linked or enabled on its command line or in its private Jupyter folders, so what it serves
comes from the environment's install (``make`` / ``pip install``).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from .conftest import LABEXT


def _get(lab, path: str, token: bool = True) -> tuple[int, bytes]:
    headers = {"Authorization": f"token {lab.token}"} if token else {}
    req = urllib.request.Request(f"{lab.base}/{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _page_config(lab) -> dict:
    """The Lab page's ``jupyter-config-data``: what the browser is told to load."""
    status, html = _get(lab, "lab")
    assert status == 200, html[:500]
    found = re.search(rb'<script id="jupyter-config-data" type="application/json">(.*?)</script>', html, re.S)
    assert found, html[:1000]
    return json.loads(found.group(1))


def test_lab_lists_the_installed_extension_and_serves_its_handlers(lab):
    status, body = _get(lab, "lab/api/extensions?per_page=100")
    assert status == 200, body[:500]
    listed = {ext["name"]: ext for ext in json.loads(body)}
    assert LABEXT in listed, f"{LABEXT} not among the Lab's extensions: {sorted(listed)}"
    ext = listed[LABEXT]
    assert ext["enabled"] and ext["installed"] and ext["status"] == "ok", ext
    # the page loads it: its remote entry is in the page's config and is served
    federated = {e["name"]: e for e in _page_config(lab)["federated_extensions"]}
    assert LABEXT in federated, sorted(federated)
    entry = f"lab/extensions/{LABEXT}/{federated[LABEXT]['load']}"
    status, script = _get(lab, entry)
    assert status == 200 and LABEXT.encode() in script, (entry, status, script[:200])

    status, body = _get(lab, "workbench/ranksets")
    assert status == 200, (status, body[:500])
    assert isinstance(json.loads(body)["ranksets"], list)
    # the handlers are Jupyter's: without the token the request is refused
    status, _ = _get(lab, "workbench/ranksets", token=False)
    assert status == 403


def test_server_log_names_the_server_extension_loaded(lab):
    log = lab.log.read_text(errors="replace")
    if "workbench.labserver" not in log:
        pytest.fail(f"the Lab's log does not mention workbench.labserver:\n{lab.log_tail()}")
    assert "ranks sidebar handlers at /workbench/ranksets" in log, lab.log_tail()

"""The docs site's generated parts: the labs' pages (docs/_ext/course.py) and the magics reference
(docs/_ext/magics_reference.py). The built site itself is read in a browser by
tests/browser/test_docs_site.py; these check the conversions one by one, on notebooks made here."""

from __future__ import annotations

import argparse
import base64
import json
import pathlib
import struct
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

course = pytest.importorskip("course", reason="the docs extra is not installed (pip install -e '.[docs]')")
import magics_reference  # noqa: E402


def _view(model_id: str) -> dict:
    return {"model_id": model_id, "version_major": 2, "version_minor": 0}


def _figure_json(html: str) -> dict:
    start = html.index('type="application/json"')
    body = html[html.index(">", start) + 1 : html.index("</script>", start)]
    return json.loads(body.replace("<\\/", "</"))


def test_plotly_outputs_become_figures_drawn_from_the_page_and_widget_state_goes():
    traces = [{"type": "scatter", "y": [3, 2, 1], "name": "loss </script> rank 0"}]
    binary = {"type": "scatter", "x": {"dtype": "float64", "shape": [3]}, "y": [1.5, 1.0, 0.5], "name": "mean"}
    steps = base64.b64encode(struct.pack("<3d", 1.0, 2.0, 3.0)).decode()
    state = {
        "box": {
            "model_name": "VBoxModel",
            "state": {"children": ["IPY_MODEL_status", "IPY_MODEL_fig", "IPY_MODEL_btn"]},
        },
        "status": {"model_name": "HTMLModel", "state": {"value": "<b>step 40 of 40</b>"}},
        "fig": {
            "model_name": "AnyModel",
            "state": {"_widget_data": traces + [binary], "_widget_layout": {"title": {"text": "t"}}},
            # a trace's numpy arrays travel as binary buffers beside the state
            "buffers": [{"path": ["_widget_data", 1, "x", "buffer"], "encoding": "base64", "data": steps}],
        },
        "btn": {"model_name": "ButtonModel", "state": {"description": "pause"}},
        "slider": {"model_name": "IntSliderModel", "state": {"value": 3}},
    }
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {course.WIDGET_STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    mime = {"data": [{"type": "bar", "x": ["a"], "y": [1]}], "layout": {}}
    cdn = '<script src="https://cdn.example/plotly.min.js"></script>'  # as plotly's notebook renderer writes
    bootstrap = {"text/html": f"<script>window.PlotlyConfig = {{MathJaxConfig: 'local'}};</script>{cdn}"}
    nb.cells = [
        nbformat.v4.new_code_cell(
            outputs=[
                nbformat.v4.new_output("display_data", bootstrap),
                nbformat.v4.new_output("display_data", {course.PLOTLY_MIME: mime, "text/html": cdn}),
            ]
        ),
        nbformat.v4.new_code_cell(
            outputs=[nbformat.v4.new_output("display_data", {course.WIDGET_VIEW: _view("box"), "text/plain": "VBox"})]
        ),
        nbformat.v4.new_code_cell(
            outputs=[nbformat.v4.new_output("display_data", {course.WIDGET_VIEW: _view("slider"), "text/plain": "3"})]
        ),
    ]
    assert course.static_figures(nb, "t") == 2
    assert len(nb.cells[0].outputs) == 1  # the renderer's bootstrap is gone: nothing points off the site
    first, dashboard, slider = (c.outputs[0].data for c in nb.cells)
    assert "cdn.example" not in first["text/html"]
    assert set(first) == {"text/html"} and _figure_json(first["text/html"])["data"] == mime["data"]
    assert "Plotly.newPlot('fig-t-1'" in first["text/html"]
    # the dashboard: its status line, then its figure with the widget's last traces; no widget view left
    html = dashboard["text/html"]
    assert course.WIDGET_VIEW not in dashboard and html.index("step 40 of 40") < html.index('id="fig-t-2"')
    # a "</script>" in the data cannot end the script early; the buffer is back in place as a list
    assert _figure_json(html)["data"] == traces + [dict(binary, x=[1.0, 2.0, 3.0])]
    assert "</script> rank 0" not in html.split('type="application/json"', 1)[1].split("</script>", 1)[0]
    # a widget that is no figure keeps its text, never a view that would need the widget manager
    assert slider == {"text/plain": "3"}
    assert "widgets" not in nb.metadata


def test_an_executed_copy_is_used_only_while_its_code_is_the_notebooks(tmp_path):
    source = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# L"), nbformat.v4.new_code_cell("x = 1")])
    path = tmp_path / "lab.ipynb"
    nbformat.write(source, path)
    copies = tmp_path / "executed"
    assert course.executed_copy(path, copies) is None
    copies.mkdir()
    ran = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# L (edited prose)"), nbformat.v4.new_code_cell("x = 1")]
    )
    ran.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    nbformat.write(ran, copies / "lab.ipynb")
    assert course.executed_copy(path, copies).cells[1].outputs[0].text == "ran\n"
    source.cells[1].source = "x = 2"  # the notebook changed since the suite ran it: the copy is stale
    nbformat.write(source, path)
    assert course.executed_copy(path, copies) is None


def test_the_magics_reference_prints_every_parser_and_every_option():
    from workbench.notebook import commands

    page = magics_reference.magics_page()
    parsers = {words: p for c in commands.COMMANDS.values() for words, p in c.parsers().items()}
    assert len(parsers) >= 20 and "usage: %%distrain [--ranks RANKS]" in page and "[--session NAME]" in page
    for words, parser in parsers.items():
        assert f"usage: %distrain {words}" in page, words
        for action in parser._actions:
            for option in action.option_strings:
                assert option in page, (words, option)
    assert "usage: %distrain plan --model MODEL --hw HW" in page  # the planner's own parser
    assert isinstance(next(iter(parsers.values())), argparse.ArgumentParser)

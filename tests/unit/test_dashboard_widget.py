"""The dashboard's plot widget without a browser: the fixed plotly module, pacing, the panels.

The browser halves (a view that was removed no longer stops the others; the browser
answers each edit it drew) are in tests/browser/test_lab_widgets.py.
"""

import shutil
import subprocess

import pytest

from workbench.notebook.dashboard import figures, widget

PLOTLY_LIKE = (
    "var TD=class{};var MD=class{};var j4t=()=>({initialize(){},render(){}});"
    "export{TD as FigureModel,MD as FigureView,j4t as default};\n/*! licenses */\n"
)


def test_fixed_esm_wraps_the_default_export_and_keeps_the_others():
    out = widget.fixed_esm(PLOTLY_LIKE)
    assert "export{TD as FigureModel,MD as FigureView};" in out
    assert "const __wbPlotlyWidget = j4t;" in out and out.count("export default") == 1
    assert out.endswith("\n/*! licenses */\n")  # what followed the export is kept


@pytest.mark.parametrize("source", ["var a=1;", "export{a as b};", "export{a as default,b as default};"])
def test_fixed_esm_leaves_a_module_of_another_shape_alone(source):
    assert widget.fixed_esm(source) is None


def test_the_installed_plotly_module_gets_the_fix_and_parses(tmp_path):
    """Fails when a plotly upgrade changes its bundle's shape: then the fix is silently off."""
    esm = widget.widget_class()._esm
    assert "const __wbPlotlyWidget = " in esm and esm.count("export default") == 1
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the fixed module's syntax is checked where it is")
    module = tmp_path / "plotly_widget_fixed.mjs"
    module.write_text(esm, encoding="utf-8")
    result = subprocess.run([node, "--check", str(module)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]


def _lines(n):
    xs = list(range(1, n + 1))
    return {**{k: [] for k in figures.PANEL_KEYS}, "loss": [("rank 0", xs, [1 / x for x in xs], {})]}


def test_view_busy_until_a_view_answers_the_last_edit_or_the_timeout():
    fig = figures.make_figure(widget=True, ranks=[0])
    assert not widget.view_busy(fig, 10)  # nothing sent yet
    figures.draw(fig, _lines(5))
    assert widget.view_busy(fig, 10) and not widget.view_busy(fig, 0)
    # what a view sends once it has drawn the edit (plotly's _sendTraceDeltas)
    fig.set_state(
        {
            "_js2py_traceDeltas": {
                "trace_deltas": [{"uid": t.uid} for t in fig.data],
                "trace_edit_id": fig._last_trace_edit_id,
            }
        }
    )
    assert not widget.view_busy(fig, 10)
    figures.draw(fig, _lines(6))
    assert widget.view_busy(fig, 10)
    figures.draw(fig, _lines(6))  # nothing changed: nothing sent, still waiting for the same edit
    assert widget.view_busy(fig, 10)


def test_widget_opens_with_its_traces_and_each_panel_on_its_own_axes():
    fig = figures.make_figure(widget=True, ranks=[0, 1])
    opened = {t["meta"] for t in fig._widget_data}
    assert {"loss:rank 0", "loss:rank 1", "loss:mean", "throughput:rank 1", "grad_norm:grad_norm"} <= opened
    axes = {
        figures.panel_traces(fig, key)[0].xaxis for key in ("loss", "throughput", "memory", "step_time", "grad_norm")
    }
    assert len(axes) == 5
    assert [a.text for a in fig.layout.annotations] == [p.title for p in figures.PANELS]


def test_a_redraw_sends_every_changed_line_in_one_edit_and_empties_lines_of_another_run():
    import numpy as np

    fig = figures.make_figure(widget=True, ranks=[0, 1])
    xs = np.arange(1.0, 6.0)
    lines = {
        **{k: [] for k in figures.PANEL_KEYS},
        "loss": [("rank 0", xs, 1 / xs, {}), ("rank 1", xs, 2 / xs, {})],
        "throughput": [("rank 0", xs, xs * 100, {})],
    }
    sent = fig._last_trace_edit_id
    assert not figures.draw(fig, lines)  # known traces: restyled, none added
    assert fig._last_trace_edit_id == sent + 1  # three lines changed: one message
    by = {t.meta: t for t in fig.data}
    assert list(by["loss:rank 1"].y) == list(2 / xs) and list(by["throughput:rank 0"].x) == list(xs)
    assert figures.draw(fig, lines) is False and fig._last_trace_edit_id == sent + 1  # unchanged: nothing sent
    # the next run has no rank 1 yet: its old line is emptied, not left standing
    figures.draw(fig, {**{k: [] for k in figures.PANEL_KEYS}, "loss": [("rank 0", xs[:2], xs[:2], {})]})
    by = {t.meta: t for t in fig.data}
    assert len(by["loss:rank 1"].x) == 0 and len(by["throughput:rank 0"].y) == 0
    assert list(by["loss:rank 0"].y) == [1.0, 2.0]
    # a series no trace was made for in advance is added with its data
    assert figures.draw(fig, {**{k: [] for k in figures.PANEL_KEYS}, "comm": [("all_reduce r0", xs, xs, {})]})
    assert list({t.meta: t for t in fig.data}["comm:all_reduce r0"].y) == list(xs)

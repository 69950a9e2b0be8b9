"""The process-role boundary on real ranks: after whatever their group ran on them (cells,
trainers, checkpoints; this file's name puts it near the end of its group), nothing the workbench
runs on a rank imported a module of the notebook side or a widget or plotting library. Every
module's own imports are checked without ranks in tests/unit/test_boundaries.py.

A rank imports the test module of each function applied to it (ipyparallel loads a function back
into its module), so the test modules' imports are there too: tests/rank_import_watch.py, put on
the shared sets when they start, tells those apart from the workbench's."""

import json
import os
import subprocess
import sys

import rank_import_watch


def test_ranks_that_worked_imported_no_notebook_module_themselves(ranks2):
    for watching, before, breaches in ranks2.apply(rank_import_watch.report):
        assert watching, "the shared set was started without the import watch (tests/conftest.py)"
        assert before == [], f"the rank held notebook-side modules as it started: {before}"
        assert breaches == [], f"imported on a rank by rank code: {breaches}"


def test_the_watch_names_a_notebook_import_made_outside_the_tests():
    """The check above can fail: in a plain interpreter with the watch on, an import asked for by
    code outside tests/ is named with the module that asked; one asked for by a test module is not."""
    code = (
        "import rank_import_watch as w\n"
        "w.install()\n"
        "exec(compile('import workbench.notebook.dashboard.timelines', '/srv/rank_code.py', 'exec'), {'__name__': 'rank_code'})\n"
        "exec(compile('import plotly.io', w.TESTS + 'some_test.py', 'exec'), {'__name__': 'some_test'})\n"
        "print(json.dumps([*w.report(), 'plotly.io' in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json, sys\n" + code],
        env={**os.environ, "PYTHONPATH": rank_import_watch.TESTS},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    watching, before, breaches, plotly_loaded = json.loads(out)
    assert watching and before == []
    assert {origin for _, origin, _ in breaches} == {"rank_code"}
    assert "workbench.notebook.dashboard.timelines" in {name for name, _, _ in breaches}
    assert all(place.startswith("/srv/rank_code.py:") for _, _, place in breaches)
    assert plotly_loaded and not any(name.startswith("plotly") for name, _, _ in breaches)

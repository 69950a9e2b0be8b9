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
    code outside tests/ is named with the module that asked, also when a test module had imported
    that module first (a ``sys.modules`` hit), in each form rank code could ask for it; one asked
    for by a test module is not."""
    rank_code = [  # (module that asks, its package, the request)
        ("rank_code", "", "import workbench.notebook.dashboard.timelines"),
        ("rank_from", "", "from workbench.notebook.dashboard import timelines"),
        ("workbench.engine.planted", "workbench.engine", "from ..notebook.dashboard import timelines"),
        ("rank_lazy", "", "import importlib\nimportlib.import_module('workbench.notebook.dashboard.timelines')"),
        ("rank_package", "", "from workbench import notebook"),
    ]
    code = (
        "import rank_import_watch as w\n"
        "w.install()\n"
        # a test module imports the notebook side first, as an applied function's module does on a shared rank
        "exec(compile('import workbench.notebook.dashboard.timelines, plotly.io', w.TESTS + 'some_test.py', 'exec'), "
        "{'__name__': 'some_test'})\n"
        "assert 'workbench.notebook.dashboard.timelines' in sys.modules\n"
        f"for name, package, request in {rank_code!r}:\n"
        "    exec(compile(request, '/srv/' + name + '.py', 'exec'), {'__name__': name, '__package__': package})\n"
        "print(json.dumps(w.report()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json, sys\n" + code],
        env={**os.environ, "PYTHONPATH": rank_import_watch.TESTS},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    watching, before, breaches = json.loads(out)
    assert watching and before == []
    named = {(origin, name) for name, origin, _ in breaches}
    assert {origin for origin, _ in named} == {name for name, _, _ in rank_code}, breaches  # each one, no test
    for origin, _, _ in rank_code:
        assert (
            origin,
            "workbench.notebook.dashboard.timelines" if origin != "rank_package" else "workbench.notebook",
        ) in named
    assert all(place.startswith(f"/srv/{origin}.py:") for _, origin, place in breaches)
    assert not any(name.startswith("plotly") for name, _, _ in breaches)

"""The notebooks of the repository that one test each executes (``NOTEBOOK`` in the test's
module, the test taking ``saved_notebooks``), run two at a time from the first such test."""

from __future__ import annotations

import pytest
from notebook_runs import RunPool, execute_notebook


def _execute_saved(path, state, timeout: float):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"save {path.name} without outputs"
    return execute_notebook(nb, path.name, state, timeout)


@pytest.fixture(scope="session")
def saved_notebooks(request):
    """RunPool keyed by notebook file name: each selected test's ``NOTEBOOK`` (with the module's
    ``TIMEOUT`` per cell), in the order the tests run; ``result(name)`` is its NotebookRun."""
    with RunPool("notebooks") as pool:
        for item in request.session.items:
            module = getattr(item, "module", None)
            if "saved_notebooks" in getattr(item, "fixturenames", ()) and module is not None:
                path = module.NOTEBOOK
                if path.name not in pool:
                    pool.submit(path.name, _execute_saved, path, pool.folder(path.name), module.TIMEOUT)
        yield pool

"""notebooks/00_quickstart.ipynb executed headless (nbclient, python3 kernel): its outputs.

The notebook runs once per session (see ``notebook_runs.quickstart``); each test reads
one part of the executed copy.
"""

from __future__ import annotations

import nbformat
import pytest
from notebook_runs import QUICKSTART, alive, code_cell, errors, quickstart, stream_text, table_column

pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def nb():
    run = quickstart()
    nb = run.notebook()
    assert errors(nb) == [], f"cells failed: {errors(nb)}"
    return nb


def test_saved_without_outputs():
    source = nbformat.read(QUICKSTART, as_version=4)
    nbformat.validate(source)
    code = [c for c in source.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert source.metadata.kernelspec.name == "python3"


def test_every_cell_ran(nb):
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))


def test_start_and_status(nb):
    # the backend that matches the device: NCCL where two GPUs are visible, gloo on CPU
    from workbench.notebook.cluster.gpu_plan import plan_gpus
    from workbench.notebook.cluster.launchers import gpu_ids

    backend = plan_gpus("auto", 2, gpu_ids()).backend
    assert f"2 ranks up ({backend}" in stream_text(code_cell(nb, "%distrain start -n 2"))
    (result,) = code_cell(nb, "%distrain status").outputs
    html = result["data"]["text/html"]
    assert table_column(html, "state") == ["idle", "idle"]
    assert table_column(html, "backend") == [backend, backend]


def test_all_reduce_printed_per_rank(nb):
    text = stream_text(code_cell(nb, "%%distrain\nimport torch"))
    assert "[rank 0] all_reduce sum = 3 (world size 2)" in text
    assert "[rank 1] all_reduce sum = 3 (world size 2)" in text
    assert text.index("[rank 0]") < text.index("[rank 1]")


def test_state_persists(nb):
    text = stream_text(code_cell(nb, "%%distrain\nx *= 10"))
    assert "[rank 0] x is still here, now 30" in text
    assert "[rank 1] x is still here, now 30" in text


def test_subset_of_ranks(nb):
    text = stream_text(code_cell(nb, "%%distrain --ranks 1"))
    assert "[rank 1] rank 1 says: set on rank 1 only" in text
    assert "[rank 0]" not in text


def test_push_and_pull(nb):
    text = stream_text(code_cell(nb, "%%distrain\nscaled"))
    assert "[rank 0] scaled = 0.125" in text and "[rank 1] scaled = 0.25" in text
    assert "pulled from the ranks: [0.125, 0.25]" in stream_text(code_cell(nb, "scaled = %distrain pull"))


def test_rich_table_from_each_rank(nb):
    cell = code_cell(nb, "%%distrain\nimport pandas")
    tables = [o["data"]["text/html"] for o in cell.outputs if o.output_type == "display_data"]
    assert len(tables) == 2
    for html, total in zip(tables, ("6.0", "10.0")):
        assert '<table border="1" class="dataframe">' in html
        assert table_column(html, "sum") == [total], html
        assert table_column(html, "x") == ["30.0"]
    labels = [o["text"] for o in cell.outputs if o.output_type == "stream"]
    assert labels == ["[rank 0] \n", "[rank 1] \n"]


def test_stop_message(nb):
    assert "ranks stopped" in stream_text(code_cell(nb, "%distrain stop"))


def test_stop_is_quiet(nb):
    assert stream_text(code_cell(nb, "%distrain stop")) == "ranks stopped\n"


def test_no_rank_process_left(nb):
    (result,) = code_cell(nb, "%distrain status").outputs
    pids = [int(p) for p in table_column(result["data"]["text/html"], "pid")]
    assert len(pids) == 2
    assert alive(pids) == [], f"rank processes still alive after the notebook ran: {alive(pids)}"

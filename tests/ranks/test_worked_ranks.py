"""The process-role boundary on real ranks: after whatever their group ran on them (cells,
trainers, checkpoints; this file's name puts it near the end of its group), a rank holds no
module of the notebook side and no widget or plotting library. Every module's own imports are
checked without ranks in tests/unit/test_boundaries.py."""


def test_ranks_that_worked_hold_no_notebook_module(ranks2):
    """On real ranks, after whatever the suite ran on them (cells, trainers, checkpoints)."""
    ranks2.execute(
        "import sys, workbench\n_nb = sorted(m for m in sys.modules "
        "if m.startswith(('workbench.notebook', 'workbench.labserver', 'plotly', 'ipywidgets')))\n"
        "_tqdm_widgets = 'tqdm.notebook' in sys.modules"
    )
    # a rank is an ipykernel engine, where tqdm.auto (transformers' download and loading bars)
    # draws with ipywidgets: that import is the user's library's, not the workbench's
    for nb, tqdm_widgets in zip(ranks2.pull("_nb"), ranks2.pull("_tqdm_widgets")):
        if tqdm_widgets:
            nb = [m for m in nb if not (m == "ipywidgets" or m.startswith("ipywidgets."))]
        assert nb == []

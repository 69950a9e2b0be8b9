"""What ipyparallel's client expects of the IPython shell it runs in.

On a rank's comm message (an ipywidget: transformers' progress bars on a rank are widgets) the
client reads ``get_ipython().kernel``, which only a kernel's shell has. In a terminal IPython
the AttributeError in the client's IO thread leaves that call's output never complete, and
the cell waits out its output timeout. ``kernel = None`` is what the client takes for "not a
kernel" (comms ignored, as in a script); a kernel's shell is left alone.
"""

from __future__ import annotations


def mark_kernelless(shell=None) -> None:
    """Give a shell without a kernel ``kernel = None`` (``shell``: the running one by default)."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is not None and not hasattr(shell, "kernel"):
        shell.kernel = None

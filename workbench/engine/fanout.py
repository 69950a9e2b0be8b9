"""A call that reached this rank through the controller's broadcast tree (the notebook's side:
``workbench.notebook.cluster.fanout``).

The tree coalesces the ranks' replies and keeps only each reply's buffers, so a raised
exception would be lost and misalign the others' results: a fanned call never raises here
(:func:`run` returns the error as data), and ends its output with one ``wire.OUTPUT_DONE``
message instead of the kernel's busy/idle pair, which every layer would carry only to drop."""

from __future__ import annotations

import sys

from ..shared.replies import CellRun
from ..shared.wire import OUTPUT_DONE

_installed = False


def run(fn, *args, **kwargs) -> tuple:
    """``fn(*args, **kwargs)`` on this rank: ``(published, error, value)``.

    ``published``: messages this rank sent on IOPub meanwhile (None: not known, a cell whose
    fd output could not be checked); ``error``: None, or ipyparallel's error content.
    """
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is not None and not _installed:
        _quiet_status(kernel)
    session = getattr(kernel, "session", None)
    before = session.message_count if session is not None else None
    error = value = None
    try:
        value = fn(*args, **kwargs)
    except BaseException:  # as the engine's own apply handler: any exception is the caller's to see
        from ipyparallel.error import wrap_exception

        error = wrap_exception()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "flush"):
            stream.flush()  # what was printed goes out before the marker (free when nothing was)
    if isinstance(value, CellRun):  # a cell knows best (its fd output included)
        published = value.published
    else:
        published = None if before is None else session.message_count - before
    if published != 0 and kernel is not None:
        _mark_output_done(kernel)
    return published, error, value


def set_names(namespace: dict) -> None:
    """``%distrain push`` through the tree: the names set in this rank's user namespace (a
    notebook's function arrives canned, ``rpc.SetNames.of``)."""
    from ipyparallel.serialize import uncan
    from IPython import get_ipython

    ns = get_ipython().user_ns
    ns.update({k: uncan(v, ns) for k, v in namespace.items()})


def get_name(name: str):
    """``%distrain pull`` through the tree: a name's value in this rank's user namespace."""
    from IPython import get_ipython

    try:
        return get_ipython().user_ns[name]
    except KeyError:
        raise NameError(f"name '{name}' is not defined") from None


def _mark_output_done(kernel) -> None:
    """One data message after this call's output (the IOPub thread keeps their order)."""
    from ipyparallel.serialize import serialize_object

    kernel.session.send(
        kernel.iopub_socket,
        "data_message",
        content={"keys": [OUTPUT_DONE]},
        parent=kernel.get_parent("shell"),
        buffers=serialize_object({OUTPUT_DONE: True}),
        ident=b"datapub",
    )


def _quiet_status(kernel) -> None:
    """No busy/idle status for calls whose reply the broadcast tree coalesces; no flush
    round trip to the IOPub thread for a stream that holds nothing."""
    global _installed
    for stream in (sys.stdout, sys.stderr):
        _skip_empty_flush(stream)
    publish = kernel._publish_status

    def publish_unless_fanned(status, channel, parent=None):
        header = parent or kernel.get_parent(channel) or {}
        if (header.get("metadata") or {}).get("is_coalescing"):
            return
        publish(status, channel, parent)

    kernel._publish_status = publish_unless_fanned
    _installed = True


def _skip_empty_flush(stream) -> None:
    """The kernel flushes stdout and stderr after every request, each a round trip to its IOPub
    thread (two wake-ups, two context switches) on cores the ranks share. A stream with no
    flush pending and nothing buffered has nothing to send: its flush returns at once."""
    if stream is None or not hasattr(stream, "_flush_pending") or not hasattr(stream, "_buffers"):
        return  # not an ipykernel stream
    flush = stream.flush

    def flush_if_written():
        if stream._flush_pending or getattr(stream, "_subprocess_flush_pending", False):
            return flush()
        with stream._buffer_lock:
            empty = not any(buf.tell() for buf in stream._buffers.values())
        if not empty:
            return flush()
        return None

    stream.flush = flush_if_written

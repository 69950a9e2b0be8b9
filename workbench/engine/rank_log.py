"""Everything this rank prints goes to its log file; of a cell's output the notebook gets a head and a tail.

At bootstrap the kernel's stdout and stderr get a ``write`` that puts each text into
``logs/rank{r}.log`` and passes it on to the notebook. In a cell with a limit (:func:`begin`),
past its head a stream's ``write`` becomes the log file's own (C) ``write``: a flood costs what
writing the file costs. When the cell ends (:func:`end`) the stream sends one cut line
(``shared.output_cut.marker``) and the tail, read back from the file. A quiet cell pays nothing.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time

from ..shared import output_cut

LOG_FLUSH_S = 1.0  # what was printed is in the file (for `%distrain logs`) at most this late
LIVE_FLUSH_S = 0.5  # while a stream floods: the file flushed and the live display told this often
MAX_SKIPS = 256  # another stream's writes passed on during a flood; past this it floods too
READ = 1 << 20

_TEES: list = []
_LOG: dict = {"file": None, "fd": None, "flushed": 0.0, "cell": None}
# the flood of this cell, if any (both streams share the one log): "start" (its first byte in
# the file), "owner" (the stream that began it), "skips" (ranges of the file another stream
# passed on meanwhile, with "skip_lines"), "counted"/"lines" (newlines counted so far)
_FLOOD: dict = {}
_FLOOD_LOCK = threading.Lock()
_FLOODING = threading.Event()
_LIVE: dict = {}


def install(folder: str, rank: int, streams: dict | None = None) -> None:
    """Tee this process's stdout and stderr (ipykernel's streams; ``streams``: name -> stream
    instead) into ``folder/rank{rank}.log``."""
    _LOG.update(folder=folder, rank=rank)
    for name, stream in (streams or {"stdout": sys.stdout, "stderr": sys.stderr}).items():
        if stream is None or any(t.stream is stream for t in _TEES):
            continue
        tee = _Tee(stream, name)
        try:
            stream.write = tee.write
        except AttributeError:  # a stream of C (not a kernel's): left as it is
            continue
        _TEES.append(tee)


def uninstall() -> None:
    """Give the streams their own ``write`` back and close the log (tests)."""
    end()
    for tee in _TEES:
        if tee.stream.write == tee.write:
            tee.stream.write = tee.send
    _TEES.clear()
    if _LOG["file"] is not None:
        _LOG["file"].close()
    _LOG.clear()
    _LOG.update(file=None, fd=None, flushed=0.0, cell=None)


def path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank{rank}.log")


def current_path() -> str | None:
    """This rank's log file (None where the rank keeps none)."""
    return path(_LOG["folder"], _LOG["rank"]) if "folder" in _LOG else None


def begin(limit: int | None) -> None:
    """A cell starts: each stream passes on at most ``limit`` characters (None: all)."""
    _LOG["cell"] = time.strftime("%Y-%m-%d %H:%M:%S")  # written above the cell's first line, if any
    _LIVE.clear()
    for tee in _TEES:
        tee.bound = None if limit is None else _Bound(limit)


def end() -> None:
    """The cell ended: a stream that was cut gets its own ``write`` back and sends its cut line
    and tail; what the cell printed is in the file."""
    _FLOODING.clear()
    for tee in _TEES:
        tee.finish()
    _LOG["cell"] = None
    log = _LOG["file"]
    if log is not None:
        log.flush()
        _LOG["flushed"] = time.monotonic()


def _log():
    """The log (opened at the first write), the cell's header written above its first line."""
    log = _LOG["file"]
    if log is None:
        if "folder" not in _LOG:
            return None
        try:
            os.makedirs(_LOG["folder"], exist_ok=True)
            fd = os.open(path(_LOG["folder"], _LOG["rank"]), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:  # no log: the output goes to the notebook whole, and says why once
            folder = _LOG.pop("folder")
            if _TEES:
                _TEES[-1].send(f"(no log of this rank's output in {folder}: {exc}; nothing is cut)\n")
            return None
        # a FileIO under a BufferedWriter: the text layer's fast path, no Python per write
        log = io.TextIOWrapper(io.BufferedWriter(io.FileIO(fd, "w"), 1 << 16), encoding="utf-8", errors="replace")
        _LOG.update(file=log, fd=fd)
    header = _LOG["cell"]
    if header is not None:
        _LOG["cell"] = None
        log.write(f"──── cell at {header} ────\n")
    return log


def _size() -> int:
    return os.fstat(_LOG["fd"]).st_size


def _log_write(text: str) -> None:
    """A write passed on to the notebook: into the log too (outside a flood's count)."""
    log = _log()
    if log is None:
        return
    if _FLOOD:  # another stream floods: this text is not part of what it cut
        with _FLOOD_LOCK:
            log.flush()
            start = _size()
            log.write(text)
            log.flush()
            _FLOOD["skips"].append((start, _size()))
            _FLOOD["skip_lines"] += text.count("\n")
        return
    log.write(text)
    now = time.monotonic()
    if now - _LOG["flushed"] >= LOG_FLUSH_S:
        _LOG["flushed"] = now
        log.flush()


class _Bound:
    """One stream's share of a cell's output."""

    __slots__ = ("head_left", "tail_max", "newline", "saved")

    def __init__(self, limit: int):
        self.head_left = limit - limit // 2
        self.tail_max = limit // 2
        self.newline = True  # what was passed on ends a line
        self.saved = None  # the stream's write while the log's stands in for it (it floods)


class _Tee:
    """A kernel stream's ``write``: into the log, then on to the notebook within the cell's bound."""

    def __init__(self, stream, name: str):
        self.stream = stream
        self.name = name
        self.send = stream.write
        self.bound: _Bound | None = None

    def write(self, text):
        if not isinstance(text, str):
            return self.send(text)  # the stream's own error for a wrong type
        b = self.bound
        n = len(text)
        if b is None or (b.head_left >= n and b.saved is None):
            if _FLOOD and len(_FLOOD["skips"]) >= MAX_SKIPS and b is not None and _log() is not None:
                b.head_left = 0  # a second flood: this stream joins the first
            else:
                _log_write(text)
                if b is not None and n:
                    b.head_left -= n
                    b.newline = text.endswith("\n")
                return self.send(text)
        log = _log()
        if log is None:
            return self.send(text)
        if b.saved is not None:  # a write that began before the switch (another thread)
            log.write(text)
            return n
        k = text.rfind("\n", 0, b.head_left) + 1  # the head ends at a line's end within the budget
        b.head_left = 0
        if k:
            _log_write(text[:k])
            self.send(text[:k])
            b.newline = True
        self._flood(b, log)
        log.write(text[k:])
        return n

    def _flood(self, b: _Bound, log) -> None:
        """From here on this stream's ``write`` is the log file's (C)."""
        with _FLOOD_LOCK:
            log.flush()  # what came before is not the flood's
            if not _FLOOD:
                start = _size()
                _FLOOD.update(
                    start=start, owner=self, tail_max=b.tail_max, skips=[], skip_lines=0, counted=start, lines=0
                )
            b.saved = self.stream.write
            self.stream.write = log.write
        _FLOODING.set()
        _start_flusher()

    def finish(self) -> None:
        b, self.bound = self.bound, None
        if b is None or b.saved is None:
            return
        self.stream.write = b.saved
        with _FLOOD_LOCK:
            if _FLOOD.get("owner") is not self:  # both streams flooded: the first one sends the tail
                return
            _LOG["file"].flush()
            flood = dict(_FLOOD)
            _FLOOD.clear()
        end = _size()
        _count(flood, end)
        tail = _tail(flood, end)
        total = end - flood["start"] - sum(e - s for s, e in flood["skips"])
        cut_bytes = total - len(tail)
        cut_lines = flood["lines"] - flood["skip_lines"] - tail.count(b"\n")
        text = ("" if b.newline else "\n") + (output_cut.marker(cut_lines, cut_bytes) if cut_bytes else "")
        self.send(text + tail.decode("utf-8", "replace"))


def _count(flood: dict, end: int) -> None:
    """Count the newlines written since the last count (the skipped ranges' included)."""
    fd, pos = _LOG["fd"], flood["counted"]
    while pos < end:
        chunk = os.pread(fd, min(READ, end - pos), pos)
        if not chunk:
            break
        flood["lines"] += chunk.count(b"\n")
        pos += len(chunk)
    flood["counted"] = pos


def _tail(flood: dict, end: int) -> bytes:
    """The flood's last ``tail_max`` bytes, without another stream's, from the start of a line."""
    want, pieces, hi = flood["tail_max"], [], end
    for s, e in [*reversed(flood["skips"]), (flood["start"], flood["start"])]:
        lo = max(e, hi - want)
        if hi > lo:
            pieces.append(os.pread(_LOG["fd"], hi - lo, lo))
            want -= hi - lo
        hi = s
        if want <= 0 or hi <= flood["start"]:
            break
    tail = b"".join(reversed(pieces))
    total = end - flood["start"] - sum(e - s for s, e in flood["skips"])
    if len(tail) < total:  # cut inside a line: start at the next one
        start = tail.find(b"\n")
        if 0 <= start < len(tail) - 1:
            tail = tail[start + 1 :]
    return tail


_FLUSHER: list = []


def _start_flusher() -> None:
    """One thread per process, started at the first flood: while a stream floods, the log is
    flushed and the notebook's live display told how much was cut, every ``LIVE_FLUSH_S``."""
    if _FLUSHER:
        return
    thread = threading.Thread(target=_flush_while_flooding, name="workbench-log-flush", daemon=True)
    _FLUSHER.append(thread)
    thread.start()


def _flush_while_flooding() -> None:
    while True:
        _FLOODING.wait()
        time.sleep(LIVE_FLUSH_S)
        try:
            with _FLOOD_LOCK:
                if not _FLOODING.is_set() or not _FLOOD:
                    continue
                _LOG["file"].flush()
                end = _size()
                _count(_FLOOD, end)
                lines = _FLOOD["lines"] - _FLOOD["skip_lines"]
                cut = end - _FLOOD["start"]
                name = _FLOOD["owner"].name
                last = os.pread(_LOG["fd"], 600, max(_FLOOD["start"], end - 600)).decode("utf-8", "replace")
            last = last.rstrip("\n")
            publish({name: [lines, cut, last[last.rfind("\n") + 1 :][-300:]]})
        except Exception:  # the cell ended meanwhile: the next flood starts over
            pass


def publish(update: dict) -> None:
    """A data message (the client keeps the latest per key: it does not pile up)."""
    from IPython import get_ipython

    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None:
        return
    from ipyparallel.serialize import serialize_object

    _LIVE.update(update)
    kernel.session.send(
        kernel.iopub_socket,
        "data_message",
        content={"keys": [output_cut.LIVE_KEY]},
        parent=kernel.get_parent("shell"),
        buffers=serialize_object({output_cut.LIVE_KEY: dict(_LIVE)}),
        ident=b"datapub",
    )

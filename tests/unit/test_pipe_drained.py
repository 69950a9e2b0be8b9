"""When a rank may skip the marker that waits for C-level output (``cell_runner._pipe_drained``):
only when nothing written to the fd is still on its way. A pipe and a reader thread shaped like
ipykernel's (read, hand over, read again) stand in for a rank's stdout capture."""

import os
import threading
import time

from workbench.engine.cell_runner import _pipe_drained


class Reader:
    """Reads the pipe and hands what it read to ``got``, pausing before the hand-over while
    ``hold`` is clear, as a reader preempted between its read and its write would be."""

    def __init__(self):
        self.rfd, self.wfd = os.pipe()
        self.got, self.hold = [], threading.Event()
        self.hold.set()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        data = os.read(self.rfd, 1000)
        while data:
            self.hold.wait()
            self.got.append(data)
            data = os.read(self.rfd, 1000)

    def close(self):
        self.hold.set()
        os.close(self.wfd)
        self.thread.join(5)
        os.close(self.rfd)


def _until(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.005)
    return check()


def test_an_idle_reader_of_an_empty_pipe_has_handed_over_everything():
    r = Reader()
    try:
        assert _until(lambda: _pipe_drained(r.rfd, r.thread))
        os.write(r.wfd, b"out\n")
        assert _until(lambda: r.got == [b"out\n"])
        assert _until(lambda: _pipe_drained(r.rfd, r.thread))
    finally:
        r.close()


def test_bytes_read_but_not_handed_over_or_still_in_the_pipe_are_on_their_way():
    r = Reader()
    try:
        assert _until(lambda: _pipe_drained(r.rfd, r.thread))
        r.hold.clear()
        os.write(r.wfd, b"first\n")
        # read, not yet handed over: the pipe is empty but its reader is not back in a read
        assert _until(lambda: _pipe_drained(r.rfd, r.thread) is False and r.got == [])
        time.sleep(0.05)
        assert not _pipe_drained(r.rfd, r.thread) and r.got == []
        os.write(r.wfd, b"second\n")  # and now in the pipe as well
        assert not _pipe_drained(r.rfd, r.thread)
        r.hold.set()
        assert _until(lambda: b"".join(r.got) == b"first\nsecond\n")
        assert _until(lambda: _pipe_drained(r.rfd, r.thread))
    finally:
        r.close()


def test_a_reader_that_is_not_a_thread_of_this_process_is_never_taken_as_drained():
    r = Reader()
    try:
        stranger = threading.Thread(target=lambda: None)  # never started: no native id
        assert _pipe_drained(r.rfd, stranger) is False
        assert _pipe_drained(-1, r.thread) is False  # a closed descriptor: not known
    finally:
        r.close()

"""Rank output shown while a cell runs, rank-tagged, in the order it arrives.

In a Jupyter kernel the live lines go into one display, updated in place (a tqdm bar is one
line) and emptied when the cell ends, when the output is shown again grouped per rank: every
line ends up once, in rank order. Where there is no display to update (a terminal, a script)
live lines are printed for good and the end shows only what is left.
"""

from __future__ import annotations

import sys

from ...shared import output_cut

LIVE_POLL_S = 0.1  # how often a running cell looks for new output


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (a frontend that can update a display)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def tag(rank: int, text: str) -> str:
    """Every line under ``[rank N]``, a cut line saying how to see what was cut."""
    return "".join(f"[rank {rank}] {line}\n" for line in output_cut.render(text, str(rank)).splitlines())


def cut_so_far(rank: int, data) -> list[str]:
    """A rank's live line while it cuts its output: how much so far, and its latest line."""
    live = (data or {}).get(output_cut.LIVE_KEY) or {}
    return [
        f"[rank {rank}] … {lines:,} lines ({output_cut.size_text(chars)}) cut so far "
        f"(`%distrain logs --ranks {rank}` shows them); latest: {last}"
        for lines, chars, last in (live.get(name) for name in ("stdout", "stderr") if name in live)
    ]


class LiveOutput:
    """Follows a :class:`RankCall`'s output and shows whole new lines as they arrive.

    ``printed`` holds, per rank, the characters of stdout/stderr already shown for
    good; the end of the cell shows the rest (see ``cell.show``).
    """

    def __init__(self, call, *, regroup: bool):
        self.call = call
        self.regroup = regroup
        self.printed = [[0, 0] for _ in call.ranks]
        self._taken = [[0, 0] for _ in call.ranks]  # what the live display has shown
        self._lines: list[str] = []
        self._shown = ""  # what the live display holds now
        self._handle = None

    def poll(self) -> None:
        outs, errs = self.call.per_rank("stdout"), self.call.per_rank("stderr")
        data = self.call.per_rank("data") if self.regroup else []
        new: list[tuple[int, str]] = []
        tails: list[str] = []
        for i, rank in enumerate(self.call.ranks):
            if data:
                tails.extend(cut_so_far(rank, data[i]))
            for j, text in enumerate((outs[i] or "", errs[i] or "")):
                # a line still being rewritten with carriage returns (a tqdm bar): the
                # client keeps only its latest state, shown live and replaced in place
                tail = text[text.rfind("\n") + 1 :].strip("\r")
                if tail:
                    tails.append(f"[rank {rank}] {tail}")
                seen = self._taken[i][j] if self.regroup else self.printed[i][j]
                fresh = text[seen:]
                cut = fresh.rfind("\n") + 1  # whole lines only while running
                if not cut:
                    continue
                if self.regroup:
                    self._taken[i][j] += cut
                    new.append((j, tag(rank, fresh[:cut])))
                else:
                    self.printed[i][j] += cut
                    (sys.stderr if j else sys.stdout).write(tag(rank, fresh[:cut]))
        if self.regroup:
            self._lines.extend(text for _, text in new)
            shown = "".join(self._lines) + "".join(f"{t}\n" for t in tails)
            if shown and shown != self._shown:
                self._show(shown)
        elif new:
            sys.stdout.flush()
            sys.stderr.flush()

    def flush_rank(self, index: int) -> None:
        """Show for good what one rank printed so far (before its traceback is shown)."""
        outs, errs = self.call.per_rank("stdout"), self.call.per_rank("stderr")
        rank = self.call.ranks[index]
        for j, (text, stream) in enumerate(((outs[index] or "", sys.stdout), (errs[index] or "", sys.stderr))):
            rest = text[self.printed[index][j] :]
            if rest:
                stream.write(tag(rank, rest))
                stream.flush()
                self.printed[index][j] = len(text)

    def _show(self, text: str) -> None:
        from IPython.display import display

        self._shown = text
        bundle = {"text/plain": text.rstrip("\n")}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)

    def close(self) -> None:
        """Empty the live display: the output is about to be shown grouped per rank."""
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)
            self._handle = None

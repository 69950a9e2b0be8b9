"""The notebook's folders on the ranks' other hosts, and their edits before each cell.

A set with ranks on other hosts gets a :class:`CodeSync` (changed only here): each host's
environment checked (:mod:`.host_check`), then the folders walked (:mod:`.code_scan`) and each
host's cache sent what it lacks over the rank set's own connection; the ranks there import
from that copy and run in it. Before each cell, changed files reach every synced rank in one
request that also reloads their modules. Ranks on the notebook's host cost nothing here.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import time
from dataclasses import dataclass, field

from ...engine import rpc
from ...shared.code_tree import FileEntry, FolderEdit, format_size
from ...shared.ranges import format_ranks
from . import host_check
from .code_scan import Folder

DEFAULT_LIMIT = 64 * 2**20  # a file larger than this is named and not sent (--sync-limit)
INLINE = 8 * 2**20  # an edit whose contents fit this rides with the one request that applies it
CHUNK = 16 * 2**20  # contents per request of a first sync
REMOTE_LAUNCHERS = ("ssh", "slurm", "ray")


@dataclass(frozen=True, kw_only=True)
class SyncSettings:
    """``--sync [PATH ...]``, ``--sync-limit SIZE``, ``--no-sync``: which folders reach the other hosts."""

    paths: tuple[str, ...] | None = None  # None: the notebook's working folder
    limit: int = DEFAULT_LIMIT
    off: bool = False

    def validate(self, launcher: str) -> None:
        if self != SyncSettings() and launcher not in REMOTE_LAUNCHERS:
            raise ValueError(
                f"--sync, --sync-limit and --no-sync go with --launcher ssh, slurm or ray (with --launcher {launcher} "
                "the ranks run on this host and import from the notebook's folder itself)"
            )
        if self.off and (self.paths is not None or self.limit != DEFAULT_LIMIT):
            raise ValueError("--no-sync sends nothing: leave out --sync and --sync-limit with it")
        if not isinstance(self.limit, int) or self.limit < 0:
            raise ValueError(f"--sync-limit is a size like 64M or 5G, got {self.limit!r}")
        for path in self.paths or ():
            if not os.path.isdir(path):
                raise ValueError(f"--sync {path}: no such folder here (--sync takes folders of the notebook's host)")

    def folders(self) -> list[str]:
        paths = self.paths if self.paths else (os.getcwd(),)
        return list(dict.fromkeys(os.path.abspath(p) for p in paths))


def folder_key(path: str) -> str:
    """The name of a folder's copy in a host's cache: the same folder of the same notebook host
    keeps one copy across sessions, so a restart sends only what changed."""
    tag = hashlib.sha256(f"{socket.gethostname()}:{path}".encode()).hexdigest()[:16]
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.path.basename(path) or "root")
    return f"{name}-{tag}"


@dataclass
class HostCopy:
    """One synced host: its ranks, where it keeps each folder's copy and which digest it holds."""

    host: str
    ranks: list[int]
    trees: dict[str, str] = field(default_factory=dict)  # folder key -> the copy's path there
    digests: dict[str, str] = field(default_factory=dict)  # folder key -> the digest it holds
    size: int = 0
    files: int = 0
    synced_at: float | None = None

    @property
    def leader(self) -> int:
        return self.ranks[0]


@dataclass
class SyncReport:
    """What one sync moved, per host, and what the ranks reloaded or could not."""

    written: dict[str, list[str]] = field(default_factory=dict)  # host -> paths written
    deleted: dict[str, list[str]] = field(default_factory=dict)
    sent_bytes: int = 0
    reloaded: list[str] = field(default_factory=list)
    not_reloaded: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (module, why) -> ranks
    skipped: list[tuple[str, int]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def moved(self) -> bool:
        return any(self.written.values()) or any(self.deleted.values())

    def lines(self, limit: int) -> list[str]:
        out = []
        for path, size in self.skipped:
            bigger = max(size + 1, 2 * limit)
            out.append(
                f"not sent: {path} ({format_size(size)}, past --sync-limit {format_size(limit)}; "
                f"`--sync-limit {_round_size(bigger)}` at start sends it)"
            )
        paths = sorted({p for ps in self.written.values() for p in ps})
        gone = sorted({p for ps in self.deleted.values() for p in ps})
        hosts = sorted(h for h in self.written if self.written[h] or self.deleted.get(h))
        if paths or gone:
            what = []
            if paths:
                what.append(f"{len(paths)} file{'s' if len(paths) != 1 else ''} ({_names(paths)})")
            if gone:
                what.append(f"deleted {_names(gone)}")
            moved = f", {format_size(self.sent_bytes)} sent" if self.sent_bytes else ""
            line = f"synced {' and '.join(what)} to {', '.join(hosts)} in {self.seconds:.2f} s{moved}"
            if self.reloaded:
                line += f"; reloaded {', '.join(sorted(set(self.reloaded)))}"
            out.append(line)
        for (module, why), ranks in sorted(self.not_reloaded.items()):
            out.append(
                f"not reloaded on ranks {format_ranks(sorted(ranks))}: {module}: {why} "
                "-- `%distrain restart` starts the ranks on the new code"
            )
        return out


def _names(paths: list[str], most: int = 5) -> str:
    return ", ".join(paths[:most]) + (f" and {len(paths) - most} more" if len(paths) > most else "")


def _round_size(n: int) -> str:
    for unit, scale in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("k", 2**10)):
        if n >= scale:
            return f"{-(-n // scale)}{unit}"
    return str(n)


class CodeSync:
    """A rank set's synced hosts and folders (``rankset.code_sync``); see the module docstring."""

    def __init__(self, settings: SyncSettings, warnings: list[str]):
        self.settings = settings
        self.warnings = warnings  # the environment check's, per host
        self.folders: list[Folder] = []
        self.keys: dict[str, Folder] = {}
        self.synced: dict = {}  # folder key -> the Listing the hosts were last given
        self.hosts: dict[str, HostCopy] = {}
        self.cwd: str | None = None  # the folder the ranks run in (the notebook's working folder)
        self.local_ranks: list[int] = []  # ranks on this host: edits reload there too, nothing is sent
        self.first: SyncReport | None = None  # what the start sent
        self.requests = 0  # requests that carried files or edits (nothing when nothing changed)
        self.sent_bytes = 0

    @property
    def active(self) -> bool:
        return bool(self.folders and self.hosts)

    # ------------------------------------------------------------------ the first sync
    def begin(self, rs) -> SyncReport:
        """After the bootstrap: walk the folders and give every other host its copies."""
        here = socket.gethostname()
        for rank, info in enumerate(rs.info):
            host = info.get("host")
            if host and host != here:
                self.hosts.setdefault(host, HostCopy(host, [])).ranks.append(rank)
            else:
                self.local_ranks.append(rank)
        if not self.hosts or self.settings.off:
            self.hosts = {} if self.settings.off else self.hosts
            return SyncReport()
        cwd = os.getcwd()
        for path in self.settings.folders():
            folder = Folder(path, self.settings.limit)
            self.folders.append(folder)
            self.keys[folder_key(path)] = folder
            if path == cwd:
                self.cwd = folder_key(path)
        t0 = time.perf_counter()
        report = SyncReport()
        for folder in self.folders:
            report.skipped += folder.scan().skipped
        self._full(rs, list(self.hosts.values()), report, entering=True)
        report.seconds = time.perf_counter() - t0
        return report

    def _full(self, rs, hosts: list[HostCopy], report: SyncReport, *, entering: bool = False) -> None:
        """Each of ``hosts`` gets what its cache lacks, its copies made to hold the folders, and its
        ranks then import from them (``entering``) and reload what changed."""
        plans = {
            (h.host, key): rs.submit(
                rpc.handle,
                rpc.SyncPlan(key=key, shas=tuple(e.sha for e in f.listing.entries.values())),
                ranks=[h.leader],
            )
            for h in hosts
            for key, f in self.keys.items()
        }
        lacking: dict[str, set[str]] = {}
        for (host, key), call in plans.items():
            planned = call.result(timeout=120)[0]
            self.hosts[host].trees[key] = planned.tree
            lacking.setdefault(host, set()).update(planned.missing)
        self.requests += len(plans)
        self._send_blobs(rs, hosts, lacking, report)
        checkouts = {
            (h.host, key): rs.submit(
                rpc.handle, rpc.SyncCheckout(key=key, entries=tuple(f.listing.entries.values())), ranks=[h.leader]
            )
            for h in hosts
            for key, f in self.keys.items()
        }
        self.requests += len(checkouts)
        changed: dict[str, dict[str, tuple[str, ...]]] = {}
        for (host, key), call in checkouts.items():
            done = call.result(timeout=600)[0]
            h = self.hosts[host]
            h.digests[key] = done.digest
            report.written.setdefault(host, []).extend(done.written)
            report.deleted.setdefault(host, []).extend(done.deleted)
            if done.written or done.deleted:
                changed.setdefault(host, {})[done.tree] = (*done.written, *done.deleted)
        for h in hosts:
            self._synced_now(h)
        for key, f in self.keys.items():
            self.synced[key] = f.listing
        calls = []
        for h in hosts:
            enter = rpc.SyncEnter(
                trees=tuple((self.keys[k].path, t) for k, t in h.trees.items()) if entering else (),
                cwd=h.trees.get(self.cwd) if entering and self.cwd else None,
                changed=tuple(changed.get(h.host, {}).items()) if not entering else (),
            )
            calls.append(rs.submit(rpc.handle, enter, ranks=h.ranks))
        self.requests += len(calls)
        for call in calls:
            for rank, reloaded in zip(call.ranks, call.result(timeout=120)):
                _note_reloads(report, rank, reloaded)

    def _send_blobs(self, rs, hosts: list[HostCopy], lacking: dict[str, set[str]], report: SyncReport) -> None:
        """Contents the hosts lack, in requests of at most ``CHUNK`` bytes, each file read once per batch."""
        where: dict[str, tuple[Folder, FileEntry]] = {}
        for f in self.folders:
            for e in f.listing.entries.values():
                where.setdefault(e.sha, (f, e))
        wanted = [
            sha for sha in dict.fromkeys(s for h in hosts for s in sorted(lacking.get(h.host, ()))) if sha in where
        ]
        batch: list[tuple[str, int, int, int]] = []  # (sha, offset, length, total)
        room = CHUNK
        batches = []
        for sha in wanted:
            size = where[sha][1].size
            offset = 0
            while True:
                take = min(size - offset, room)
                batch.append((sha, offset, take, size))
                offset += take
                room -= take
                if room == 0:
                    batches.append(batch)
                    batch, room = [], CHUNK
                if offset >= size:
                    break
        if batch:
            batches.append(batch)
        for batch in batches:
            parts = []
            for sha, offset, length, total in batch:
                folder, entry = where[sha]
                with open(os.path.join(folder.path, entry.path), "rb") as fh:
                    fh.seek(offset)
                    parts.append((sha, offset, total, fh.read(length)))
            calls = []
            for h in hosts:
                mine = tuple(p for p in parts if p[0] in lacking.get(h.host, ()))
                if mine:
                    calls.append(rs.submit(rpc.handle, rpc.SyncBlobs(parts=mine), ranks=[h.leader]))
                    sent = sum(len(p[3]) for p in mine)
                    report.sent_bytes += sent
                    self.sent_bytes += sent
            self.requests += len(calls)
            for call in calls:
                call.result(timeout=600)

    # ------------------------------------------------------------------ before each cell
    def update(self, rs, cell_ranks: list[int] | None = None) -> SyncReport | Edit | None:
        """Walk the folders again; what changed reaches every synced rank (None: nothing changed).

        With ``cell_ranks`` (the ranks of the cell about to run) the edit may be left in flight
        (an :class:`Edit`, finished after the cell): when it goes to exactly those ranks, each
        rank takes it before the cell, as requests to the same ranks arrive in order."""
        if not self.active:
            return None
        t0 = time.perf_counter()
        report = SyncReport()
        for _attempt in range(3):  # a file written again while it is read: walk once more
            before = dict(self.synced)
            after = {key: f.scan() for key, f in self.keys.items()}
            changed = [k for k in after if after[k].digest != before[k].digest]
            report.skipped = [s for k in changed for s in after[k].skipped if s not in before[k].skipped]
            if not changed:
                return report if report.skipped else None
            edits = []
            for key in changed:
                old, new = before[key], after[key]
                files = [e for p, e in new.entries.items() if old.entries.get(p) != e]
                edits.append((key, old, new, files, [p for p in old.entries if p not in new.entries]))
            current = [h for h in self.hosts.values() if all(h.digests.get(k) == before[k].digest for k in changed)]
            lagging = [h for h in self.hosts.values() if h not in current]
            if sum(e.size for *_, files, _ in edits for e in files) > INLINE:
                lagging, current = list(self.hosts.values()), []
            carried = self._carry(edits, contents=bool(current))
            if carried is None:
                continue
            dead = {d["rank"] for d in rs.dead()}
            ranks = [r for r in sorted([*self.local_ranks, *(r for h in current for r in h.ranks)]) if r not in dead]
            call = rs.submit(rpc.handle, rpc.SyncEdit(edits=tuple(carried), here=socket.gethostname()), ranks=ranks)
            self.requests += 1
            edit = Edit(self, rs, call, current, edits, carried, report, t0)
            if not lagging and cell_ranks is not None and ranks == sorted(cell_ranks):
                return edit
            if lagging:
                self._full(rs, lagging, report)
            return edit.finish()
        report.seconds = time.perf_counter() - t0
        return report

    def _carry(self, edits, *, contents: bool = True) -> list[FolderEdit] | None:
        """The edits with their contents as read now (without: for ranks on this host, which read
        the folder itself); None when a file no longer matches its walk."""
        out = []
        for key, old, new, files, deleted in edits:
            folder = self.keys[key]
            carried = []
            for e in files:
                if not contents:
                    carried.append((e, b""))
                    continue
                try:
                    data = folder.read(e.path)
                except OSError:
                    return None
                if len(data) != e.size or hashlib.sha256(data).hexdigest() != e.sha:
                    return None
                carried.append((e, data))
            out.append(FolderEdit(key, old.digest, new.digest, tuple(carried), tuple(deleted), folder=folder.path))
        return out

    def _synced_now(self, h: HostCopy) -> None:
        h.files = sum(len(f.listing.entries) for f in self.folders)
        h.size = sum(f.listing.size for f in self.folders)
        h.synced_at = time.time()

    # ------------------------------------------------------------------ status
    def status(self) -> list[dict]:
        """One row per synced host: its copy of each folder, their files and size, the last sync."""
        rows = []
        for h in self.hosts.values():
            rows.append(
                {
                    "host": h.host,
                    "ranks": format_ranks(h.ranks),
                    "folder": ", ".join(h.trees.values()),
                    "files": h.files,
                    "size": format_size(h.size),
                    "synced": time.strftime("%H:%M:%S", time.localtime(h.synced_at)) if h.synced_at else "never",
                }
            )
        return rows


class Edit:
    """An edit sent to the ranks (:meth:`CodeSync.update`); :meth:`finish` reads their replies:
    the hosts whose copy was out of step get a full sync, the report is completed."""

    def __init__(self, cs: CodeSync, rs, call, hosts: list[HostCopy], edits, carried, report: SyncReport, t0: float):
        self.cs, self.rs, self.call, self.hosts = cs, rs, call, hosts
        self.edits, self.report, self.t0 = edits, report, t0
        self.sent = sum(len(data) for fe in carried for _, data in fe.files) if hosts else 0
        self.seconds = None

    def finish(self) -> SyncReport:
        cs, report = self.cs, self.report
        by_rank = dict(zip(self.call.ranks, self.call.result(timeout=120)))
        self.seconds = time.perf_counter() - self.t0
        cs.sent_bytes += self.sent
        report.sent_bytes += self.sent
        out_of_step = []
        for h in self.hosts:
            if any("out of step" in dict(by_rank[r].outcomes).values() for r in h.ranks if r in by_rank):
                out_of_step.append(h)
                continue
            for key, _old, new, files, deleted in self.edits:
                h.digests[key] = new.digest
                report.written.setdefault(h.host, []).extend(e.path for e in files)
                report.deleted.setdefault(h.host, []).extend(deleted)
            cs._synced_now(h)
        for key, _old, new, _files, _deleted in self.edits:
            cs.synced[key] = new  # what the hosts hold now (an out-of-step one once synced below)
        for rank, reply in by_rank.items():
            if reply.reloaded is not None:
                _note_reloads(report, rank, reply.reloaded)
        if out_of_step:
            cs._full(self.rs, out_of_step, report)
        report.seconds = self.seconds
        return report


def _note_reloads(report: SyncReport, rank: int, reloaded) -> None:
    report.reloaded += [m for m in reloaded.reloaded if m not in report.reloaded]
    for module, why in reloaded.not_reloaded:
        report.not_reloaded.setdefault((module, why), []).append(rank)


# ---------------------------------------------------------------------- the rank set's hooks
def check_environment(rs) -> None:
    """Before the bootstrap: the other hosts' Python, torch, workbench and packages against the
    notebook's; refused (nothing started) or warned per host; the set's :class:`CodeSync` made."""
    cfg = rs.config
    if not cfg.remote_launch():
        return
    ids = sorted(rs.client.ids)[: cfg.n]
    names = rs.client[ids].apply_async(rpc.handle, rpc.HostName()).get(timeout=120)
    here = socket.gethostname()
    first: dict[str, int] = {}
    for eid, named in zip(ids, names):
        if named.host != here:
            first.setdefault(named.host, eid)
    if not first:
        return
    packages = host_check.imported_distributions()
    mine = host_check.notebook_environment(packages)
    asked = {
        h: rs.client[eid].apply_async(rpc.handle, rpc.HostEnvironment(packages=packages)) for h, eid in first.items()
    }
    refused, warned = [], []
    for host, ar in asked.items():
        r, w = host_check.compare(host, ar.get(timeout=120), mine)
        refused += r
        warned += w
    if refused:
        raise host_check.EnvironmentMismatch(host_check.refusal(refused, cfg.python is not None))
    for line in warned:
        rs.progress(f"warning: {line}")
    rs.code_sync = CodeSync(cfg.sync, warned)


def begin(rs) -> None:
    """After the bootstrap: the first sync (a line says what moved and what was not sent)."""
    if rs.code_sync is None:
        return
    report = rs.code_sync.first = rs.code_sync.begin(rs)
    for line in report.lines(rs.config.sync.limit):
        rs.progress(line)


def before_cell(rs, *, ranks=None, display: bool = True):
    """Before a cell on ``ranks``: the edits since the last one on every synced rank. Returns None
    (nothing changed, or done and said), or an :class:`Edit` in flight ahead of the cell: pass it
    to :func:`after_cell` once the cell has run."""
    cs = rs.code_sync
    if cs is None or not cs.active:
        return None
    out = cs.update(rs, rs.select(ranks))
    if isinstance(out, Edit):
        return (out, display)
    if out is not None and display:
        for line in out.lines(rs.config.sync.limit):
            print(line, flush=True)
    return None


def after_cell(pending) -> None:
    """The edit that went ahead of the cell: its replies read, what moved said."""
    edit, display = pending
    try:
        report = edit.finish()
    except Exception as exc:  # noqa: BLE001 - the cell's own outcome is what the caller sees
        print(f"the edit sent before this cell failed: {exc}", file=sys.stderr, flush=True)
        return
    if display:
        for line in report.lines(edit.rs.config.sync.limit):
            print(line, flush=True)

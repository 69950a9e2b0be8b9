"""The notebook's folder on a host that cannot read it: a second host whose sshd (and Ray worker
node) runs in a mount namespace where this project's folder, the folder the workbench's
editable install points at, the notebook's working folder and ``~/.cache`` are each a fresh
tmpfs, so a rank there sees none of the notebook's files and keeps a cache of its own.

That host has what a real one has after ``pip install``: its own venv outside the hidden
folders, with this machine's third-party packages (their folder bound elsewhere before the
hiding) and the workbench from a copy of the package under test (``remote_python``). Its
venv has a package in another version than the notebook's (a warning), and a second venv
sees a stand-in torch 2.12.0 first on its path (refused before the first cell).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile

import pytest

from workbench.notebook import api, session
from workbench.notebook.cluster import RankSet
from workbench.notebook.cluster.host_check import EnvironmentMismatch

from .daemons import CACHE, SecondHost
from .remote_python import ROOT, dist_info, editable_targets, make_env, shared_site, stand_in

PROFILE = ROOT / ".state" / "test" / "sync-profile"
RAY_PROFILE = ROOT / ".state" / "test" / "sync-ray-profile"

MODEL = """
def answer():
    return {n}


class Net:
    def __init__(self):
        self.width = {n}
"""


@pytest.fixture(scope="module")
def notebook():
    """The notebook's working folder: a module beside it, data, what .gitignore leaves out, a 5 GB file."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="wb-notebook-"))
    (folder / "mymodel.py").write_text(MODEL.format(n=1))
    (folder / "data").mkdir()
    (folder / "data" / "info.txt").write_text("info")
    (folder / "data" / "old.txt").write_text("old")
    (folder / ".gitignore").write_text("scratch/\n")
    (folder / "scratch").mkdir()
    (folder / "scratch" / "notes.txt").write_text("not sent")
    with open(folder / "data" / "big.bin", "wb") as f:  # sparse: 5 GB to the walk, nothing on disk
        f.truncate(5 * 2**30)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def probe_package():
    """A package the notebook imported, 1.0 here and 0.9 on the other host."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="wb-probe-"))
    stand_in(folder, "wbsync_probe", "1.0")
    sys.path.insert(0, str(folder))
    import wbsync_probe  # noqa: F401 - imported by the notebook: compared with the host's

    yield
    sys.path.remove(str(folder))
    sys.modules.pop("wbsync_probe", None)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def hidden_host(notebook, probe_package):
    env = pathlib.Path(tempfile.mkdtemp(prefix="wb-hostc-env-"))
    site_there = env / "site"  # where the host sees this machine's packages
    python = make_env(env / "venv", str(site_there))
    dist_info(
        pathlib.Path(python).parents[1]
        / "lib"
        / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        / "site-packages",
        "wbsync_probe",
        "0.9",
        "wbsync_probe",
    )
    old_torch = make_env(env / "oldtorch", str(site_there), first=stand_in(env / "first", "torch", "2.12.0"))
    hide = dict.fromkeys([str(ROOT), *editable_targets(), str(notebook)])  # and ~/.cache, as every such host
    host = SecondHost(name="hostc", net=232, hide=hide, binds=[(shared_site(), str(site_there))])
    host.python, host.old_torch = python, old_torch
    try:
        yield host
    finally:
        host.close()
        shutil.rmtree(env, ignore_errors=True)


def _start(host, notebook, lines, **kwargs):
    here = os.getcwd()
    os.chdir(notebook)  # the notebook's working folder, as in a notebook opened there
    try:
        return RankSet.start(
            backend="gloo",
            threads=1,
            profile_dir=str(kwargs.pop("profile", PROFILE)),
            progress=lines.append,
            **kwargs,
        )
    finally:
        os.chdir(here)


@pytest.fixture(scope="module")
def synced(hidden_host, notebook):
    lines: list[str] = []
    rs = _start(
        hidden_host,
        notebook,
        lines,
        n=4,
        launcher="ssh",
        hosts=f"localhost:2,root@{hidden_host.addr}:2",
        ssh_config=str(hidden_host.ssh_config),
        python=hidden_host.python,
    )
    rs.lines = lines
    yield rs
    rs.stop()


def _cell(rs, code: str, capsys=None) -> str:
    """Run ``code`` as a ``%%distrain`` cell runs (its sync first); what the notebook printed."""
    with session.using(rs):
        api.run(code, display=capsys is not None, timeout=120)
    return capsys.readouterr().out if capsys is not None else ""


def test_the_other_host_cannot_read_the_notebook_folder_yet_a_module_beside_it_imports_on_both(
    synced, hidden_host, notebook
):
    rs = synced
    assert rs.apply(os.listdir, str(notebook), ranks=[2, 3]) == [[], []]  # hidden there
    assert [d["host"] for d in rs.info][2:] == [hidden_host.hostname] * 2
    _cell(rs, "from mymodel import answer\nimport os\ngot = (answer(), open('data/info.txt').read(), os.getcwd())")
    got = rs.pull("got")
    assert [g[:2] for g in got] == [(1, "info")] * 4
    copy = got[2][2]  # ranks there run in the copy: relative paths mean what they mean here
    assert copy.startswith(os.path.join(CACHE, "workbench", "sync", "trees", notebook.name + "-"))
    assert got[3][2] == copy and got[0][2] == str(notebook)


def test_what_gitignore_leaves_out_and_a_file_past_the_limit_are_not_sent_and_the_big_one_is_named(synced, notebook):
    rs = synced
    assert "not sent: data/big.bin (5.0 GB, past --sync-limit 64.0 MB; `--sync-limit 6G` at start sends it)" in rs.lines
    _cell(rs, "import os\ngot = (os.path.exists('data/big.bin'), os.path.exists('scratch/notes.txt'))")
    assert rs.pull("got") == [(True, True)] * 2 + [(False, False)] * 2


def test_an_edited_module_changes_the_next_cell_on_both_hosts(synced, hidden_host, capsys):
    rs = synced
    _cell(rs, "from mymodel import answer")
    notebook = pathlib.Path(rs.code_sync.folders[0].path)
    (notebook / "mymodel.py").write_text(MODEL.format(n=2))
    out = _cell(rs, "got = answer()", capsys)  # the function imported before the edit
    assert rs.pull("got") == [2] * 4, out
    assert f"synced 1 file (mymodel.py) to {hidden_host.hostname} in " in out and "; reloaded mymodel" in out


def test_a_deleted_file_is_gone_there_too(synced, hidden_host, capsys):
    rs = synced
    notebook = pathlib.Path(rs.code_sync.folders[0].path)
    (notebook / "data" / "old.txt").unlink()
    out = _cell(rs, "import os\ngot = os.path.exists('data/old.txt')", capsys)
    assert rs.pull("got") == [False] * 4
    assert f"synced deleted data/old.txt to {hidden_host.hostname}" in out


def test_an_unchanged_tree_sends_nothing(synced):
    rs = synced
    _cell(rs, "pass")
    requests, sent = rs.code_sync.requests, rs.code_sync.sent_bytes
    for _ in range(3):
        _cell(rs, "x = 1")
    assert (rs.code_sync.requests, rs.code_sync.sent_bytes) == (requests, sent)


def test_a_class_whose_instances_live_on_is_named_with_restart(synced, capsys):
    rs = synced
    _cell(rs, "import mymodel\nnet = mymodel.Net()")
    notebook = pathlib.Path(rs.code_sync.folders[0].path)
    (notebook / "mymodel.py").write_text(MODEL.format(n=3).replace("self.width", "self.depth"))
    out = _cell(rs, "got = mymodel.answer()", capsys)
    assert rs.pull("got") == [3] * 4
    assert (
        "not reloaded on ranks 0-3: mymodel.Net: its __init__ changed; net kept what the old one built "
        "(build them again, or restart the ranks) -- `%distrain restart` starts the ranks on the new code"
    ) in out


def test_sync_by_hand_says_what_moved_and_status_shows_the_host_copy(synced, hidden_host):
    from IPython.testing.globalipapp import get_ipython

    rs = synced
    notebook = pathlib.Path(rs.code_sync.folders[0].path)
    (notebook / "helper.py").write_text("HELP = 'yes'\n")
    ip = get_ipython()
    ip.run_line_magic("load_ext", "workbench")
    with session.using(rs):
        from IPython.utils.capture import capture_output

        with capture_output() as moved:
            ip.run_line_magic("distrain", "sync")
        with capture_output() as again:
            ip.run_line_magic("distrain", "sync")
        with capture_output() as status:
            ip.run_line_magic("distrain", "status")
    assert f"synced 1 file (helper.py) to {hidden_host.hostname} in " in moved.stdout
    assert (
        again.stdout.strip() == f"nothing changed since the last sync: {hidden_host.hostname} hold the notebook's files"
    )
    line = next(x for x in status.stdout.splitlines() if x.startswith(f"host {hidden_host.hostname}"))
    assert f"host {hidden_host.hostname} (ranks 2-3): the notebook's files in {CACHE}/workbench/sync/trees/" in line
    assert ", 4 files, " in line and ", last synced " in line  # .gitignore, mymodel.py, data/info.txt, helper.py


def test_a_package_in_another_version_on_the_host_is_a_warning_at_start(synced, hidden_host):
    assert f"warning: host {hidden_host.hostname}: wbsync_probe 0.9, the notebook 1.0" in synced.lines


def test_after_a_stop_no_temporary_file_is_left_in_the_host_cache(synced, hidden_host):
    synced.stop()
    r = hidden_host.ssh(
        f"find {CACHE}/workbench/sync -type f | sed 's|{CACHE}/workbench/sync/||' | cut -d/ -f1 | sort | uniq -c"
    )
    assert r.returncode == 0, r.stderr
    kinds = {line.split()[1]: int(line.split()[0]) for line in r.stdout.splitlines()}
    assert set(kinds) == {"blobs", "trees"}  # and no "tmp" file
    assert hidden_host.ssh(f"ls -A {CACHE}/workbench/sync/tmp").stdout == ""


def test_a_host_whose_python_sees_another_torch_is_refused_before_the_first_cell(hidden_host, notebook):
    lines: list[str] = []
    with pytest.raises(EnvironmentMismatch) as info:
        _start(
            hidden_host,
            notebook,
            lines,
            n=1,
            launcher="ssh",
            hosts=f"root@{hidden_host.addr}:1",
            ssh_config=str(hidden_host.ssh_config),
            python=hidden_host.old_torch,
        )
    import torch  # noqa: F401 - only for its version in the message below

    assert str(info.value).startswith(f"host {hidden_host.hostname}: torch 2.12.0, the notebook {torch.__version__}: ")
    assert "nothing was started" in str(info.value)


def test_a_ray_worker_node_on_the_host_gets_the_folder_from_the_cache_it_has_and_edits_follow(
    hidden_host, notebook, capsys
):
    pytest.importorskip("ray", reason="Ray is the optional extra .[ray] (make test installs it)")
    from workbench.notebook.cluster.ray_launcher import RayRequest

    from .ray_nodes import RayNodes

    nodes = RayNodes(hidden_host, cpus=1, worker_python=hidden_host.python, join=True)
    rs = None
    try:
        lines: list[str] = []
        rs = _start(
            hidden_host,
            notebook,
            lines,
            n=2,
            launcher="ray",
            ray=RayRequest(address=nodes.address, cpus_per_rank=1),
            profile=RAY_PROFILE,
        )
        hosts = [d["host"] for d in rs.info]
        assert hidden_host.hostname in hosts and len(set(hosts)) == 2
        assert rs.code_sync.sent_bytes == 0  # the host's cache has every file from the ssh ranks' sync
        _cell(rs, "from mymodel import answer\ngot = answer()")
        assert rs.pull("got") == [3, 3]
        (notebook / "mymodel.py").write_text(MODEL.format(n=4))
        out = _cell(rs, "got = answer()", capsys)
        assert rs.pull("got") == [4, 4]
        assert f"synced 1 file (mymodel.py) to {hidden_host.hostname}" in out
    finally:
        if rs is not None:
            rs.stop()
        nodes.close()

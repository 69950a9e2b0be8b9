"""The package as a user installs it: a wheel built from a clean copy of the tree, in a fresh venv.

``python -m build --wheel`` runs the build backend in isolation (hatchling with
hatch-jupyter-builder: npm builds the Lab extension from ``extensions/``), on a copy of what
git tracks (plus files not yet committed, not ignored): no build output of this tree
(``workbench/labextension``, ``node_modules``) can slip in. The venv gets the Makefile's
CPU torch first (this venv's, which ``make`` installed from that pin: linked, not unpacked
again), then the wheel with every dependency it declares resolved and installed by pip; from
a folder outside the tree and without this tree on PYTHONPATH, ``%load_ext workbench`` starts
2 ranks in an IPython shell, and Jupyter lists both extensions as installed and enabled.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest
from conftest import alive

# ~2.5 min on a quiet 2-core machine; npm, two pip installs and the venv's deletion are I/O
# bound and took 14 min at load average 20 here: the limit is for a hang, not for speed
pytestmark = pytest.mark.timeout(2400)

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = ROOT / ".state" / "test" / "install"
TORCH_SPEC = re.search(r"^TORCH_SPEC \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)

SHELL = textwrap.dedent(
    """
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    for line in ("load_ext workbench", "distrain start -n 2 --backend gloo --threads 1"):
        ip.run_line_magic(*line.split(" ", 1))
    import workbench
    ip.run_cell_magic("distrain", "", "from workbench import engine\\nwho = engine.rank * 10")
    out = {"file": workbench.__file__, "who": workbench.pull("who"), "pids": [r["pid"] for r in workbench.status()]}
    ip.run_line_magic("distrain", "stop")
    print("RESULT", json.dumps(out), flush=True)
    """
)


def _run(cmd: list[str], env: dict, cwd: pathlib.Path, timeout: float) -> str:
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{out[-4000:]}"
    return out


def _clean_copy(dest: pathlib.Path) -> None:
    """The files git tracks and those not yet committed that it does not ignore."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the clean copy is made from git's file list")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        src = ROOT / os.fsdecode(name)
        if src.is_file():  # a tracked file deleted in the work tree is left out, as in a commit
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(name))


@pytest.fixture
def place():
    shutil.rmtree(HERE, ignore_errors=True)
    HERE.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    for var, sub in (
        ("IPYTHONDIR", "ipython"),
        ("JUPYTER_CONFIG_DIR", "jupyter/config"),
        ("JUPYTER_DATA_DIR", "jupyter/data"),
        ("JUPYTER_RUNTIME_DIR", "jupyter/runtime"),
    ):
        env[var] = str(HERE / sub)
    env["OMP_NUM_THREADS"] = "1"
    # no bytecode written at install (the build's isolated env, the venv): what is imported is
    # compiled on its first import as it would be, the rest (most of JupyterLab's deps) never is
    env["PIP_COMPILE"] = "0"
    yield HERE, env
    shutil.rmtree(HERE, ignore_errors=True)


def test_wheel_from_a_clean_copy_installs_both_extensions_and_starts_ranks(place):
    here, env = place
    src, dist, venv = here / "src", here / "dist", here / "venv"
    _clean_copy(src)
    assert not (src / "workbench" / "labextension").exists()
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)], env, here, 900)
    (wheel,) = dist.glob("distrain_workbench-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        shipped = {n for n in whl.namelist() if n.startswith("workbench/")}
    package = {str(f.relative_to(src)) for f in (src / "workbench").rglob("*") if f.is_file()}
    assert package - shipped == set(), "files of the package missing from the wheel"

    # pip itself is this venv's, run for the new one (`--python`): the new venv needs none of its own
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env, here, 120)
    site = _link_torch(venv, here / "torch-site")  # the Makefile's pin first: never another torch build
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-compile"]
    _run([*pip, str(wheel)], env, here, 900)
    assert not (site / "torch").exists(), "the wheel's install brought a torch of its own"

    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    out = _run([str(venv / "bin" / "python"), "-c", SHELL], env, here, 600)
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert pathlib.Path(result["file"]).is_relative_to(venv), result  # the installed package, not this tree
    assert result["who"] == [0, 10]
    assert alive(result["pids"]) == []

    # each extension listed under the venv's own folder, enabled and valid
    labext = _plain(_run([str(venv / "bin" / "jupyter"), "labextension", "list"], env, here, 300))
    listed = _section(labext, str(venv / "share" / "jupyter" / "labextensions"))
    assert re.search(r"^\s+distrain-workbench-lab v\S+ enabled OK", listed, re.M), labext
    server = _plain(_run([str(venv / "bin" / "jupyter"), "server", "extension", "list"], env, here, 300))
    listed = _section(server, f"Config dir: {venv / 'etc' / 'jupyter'}")
    assert re.search(r"^\s+workbench\.labserver enabled$", listed, re.M), server
    assert re.search(r"^\s+workbench\.labserver\s+OK$", listed, re.M), server


def _link_torch(venv: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """This venv's torch (the Makefile's pin) seen by ``venv`` as installed: its folders and
    metadata linked into ``dest``, which a .pth adds to the venv's path after its own
    site-packages. Its dependencies are not linked: the wheel's install resolves them. ``dest``
    lies outside the venv, so pip there never uninstalls (deletes through) these links.
    Returns the venv's site-packages."""
    torch = importlib.metadata.distribution("torch")
    assert torch.version.split("+")[0] == TORCH_SPEC.split("==")[1], (torch.version, TORCH_SPEC)
    dest.mkdir()
    for top in sorted({f.parts[0] for f in torch.files if f.parts[0] != ".."}):
        (dest / top).symlink_to(torch.locate_file(top))
    (site,) = map(pathlib.Path, glob.glob(str(venv / "lib" / "python*" / "site-packages")))
    (site / "zz_torch_of_the_suite.pth").write_text(f"{dest}\n")
    return site


def _plain(text: str) -> str:
    """``text`` without terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _section(text: str, heading: str) -> str:
    """The indented (or blank) lines under the line ``heading`` of a `jupyter ... list` output."""
    lines = text.splitlines()
    assert heading in lines, f"no {heading!r} in:\n{text}"
    out = []
    for line in lines[lines.index(heading) + 1 :]:
        if line and not line[0].isspace():
            break
        out.append(line)
    return "\n".join(out)

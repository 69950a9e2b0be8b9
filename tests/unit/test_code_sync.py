"""The parts of code that travels that need no host: the ``.gitignore`` rules, the folder walk
and its size limit, the host cache (a copy made, edited, out of step, its temporaries), the
reload of edited modules as a rank does it, and the environment comparison."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from workbench.engine import code_cache, code_reload
from workbench.notebook.cluster import code_sync, gitignore, host_check
from workbench.notebook.cluster.code_scan import Folder
from workbench.shared import replies
from workbench.shared.code_tree import FolderEdit, format_size, parse_size, tree_digest


# ------------------------------------------------------------------ .gitignore
@pytest.mark.parametrize(
    ("rules", "path", "is_dir", "ignored"),
    [
        ("*.pyc", "a/b/c.pyc", False, True),
        ("*.pyc", "a/b/c.py", False, False),
        ("data/", "data", True, True),
        ("data/", "data", False, False),  # a file named data: the rule names folders only
        ("data/", "x/data", True, True),  # no slash but the last: any depth
        ("/build", "build", True, True),
        ("/build", "x/build", True, False),  # anchored to the file's folder
        ("docs/*.md", "docs/a.md", False, True),
        ("docs/*.md", "docs/x/a.md", False, False),  # * does not cross a slash
        ("**/logs", "a/b/logs", True, True),
        ("logs/**", "logs/a/b.txt", False, True),
        ("a/**/b", "a/x/y/b", False, True),
        ("a/**/b", "a/b", False, True),
        ("*.log\n!keep.log", "keep.log", False, False),  # taken back in
        ("file?.txt", "file1.txt", False, True),
        ("file[0-2].txt", "file3.txt", False, False),
        ("\\#hash", "#hash", False, True),
        ("# a comment\n\n", "# a comment", False, False),
    ],
)
def test_gitignore_rules_match_as_git_reads_them(rules, path, is_dir, ignored):
    assert gitignore.Ignored().below("", rules)(path, is_dir) is ignored


def test_a_deeper_gitignore_applies_below_its_folder_and_wins():
    rules = gitignore.Ignored().below("", "*.csv\n").below("sub", "!keep.csv\n")
    assert rules("a.csv", False) and rules("other/a.csv", False)
    assert not rules("sub/keep.csv", False)
    assert rules("sub/drop.csv", False)


# ------------------------------------------------------------------ the walk
def _tree(root, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def test_the_walk_follows_gitignore_leaves_out_bytecode_and_names_files_past_the_limit(tmp_path):
    _tree(
        tmp_path,
        {
            ".gitignore": "out/\n*.tmp\n",
            "model.py": "x = 1\n",
            "pkg/__init__.py": "",
            "pkg/__pycache__/m.cpython-311.pyc": b"\0",
            "out/result.txt": "ignored",
            "scratch.tmp": "ignored",
            ".git/HEAD": "ref",
            "data/small.bin": b"a" * 100,
        },
    )
    with open(tmp_path / "data" / "big.bin", "wb") as f:  # sparse: big to the walk, nothing on disk
        f.truncate(5 * 2**30)
    listing = Folder(str(tmp_path), parse_size("1M")).scan()
    assert sorted(listing.entries) == [".gitignore", "data/small.bin", "model.py", "pkg/__init__.py"]
    assert listing.skipped == (("data/big.bin", 5 * 2**30),)
    report = code_sync.SyncReport(skipped=list(listing.skipped))
    assert report.lines(parse_size("1M")) == [
        "not sent: data/big.bin (5.0 GB, past --sync-limit 1.0 MB; `--sync-limit 6G` at start sends it)"
    ]


def test_a_second_walk_rehashes_only_touched_files_and_sees_edits_and_deletions(tmp_path, monkeypatch):
    _tree(tmp_path, {"a.py": "a = 1\n", "b.py": "b = 1\n"})
    folder = Folder(str(tmp_path), 2**20)
    first = folder.scan()
    hashed = []
    from workbench.notebook.cluster import code_scan

    real = code_scan.file_sha
    monkeypatch.setattr(code_scan, "file_sha", lambda p: hashed.append(os.path.basename(p)) or real(p))
    assert folder.scan().digest == first.digest and hashed == []  # unchanged: a stat per file, no read
    (tmp_path / "a.py").write_text("a = 2\n")
    (tmp_path / "b.py").unlink()
    second = folder.scan()
    assert hashed == ["a.py"] and sorted(second.entries) == ["a.py"] and second.digest != first.digest


def test_sizes_parse_as_people_write_them():
    assert parse_size("64M") == 64 * 2**20 and parse_size("5G") == 5 * 2**30 and parse_size("1.5GB") == 3 * 2**29
    assert parse_size("500k") == 500 * 1024 and parse_size("123") == 123
    with pytest.raises(ValueError, match="e.g. 64M, 5G"):
        parse_size("lots")
    assert format_size(5 * 2**30) == "5.0 GB" and format_size(12) == "12 B"


# ------------------------------------------------------------------ a host's cache
@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_SYNC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _entries(folder: Folder):
    return tuple(folder.scan().entries.values())


def test_a_copy_is_made_from_the_cache_kept_in_step_and_files_the_ranks_wrote_stay(tmp_path, cache):
    src = tmp_path / "nb"
    _tree(src, {"m.py": "v = 1\n", "sub/d.txt": "data"})
    folder = Folder(str(src), 2**20)
    entries = _entries(folder)
    assert sorted(code_cache.missing(e.sha for e in entries)) == sorted(e.sha for e in entries)
    code_cache.put([(e.sha, 0, e.size, folder.read(e.path)) for e in entries])
    assert code_cache.missing(e.sha for e in entries) == []
    digest, written, deleted, size = code_cache.checkout("nb-1", entries)
    tree = code_cache.tree_path("nb-1")
    assert digest == tree_digest(entries) and sorted(written) == ["m.py", "sub/d.txt"] and size == 10
    assert open(os.path.join(tree, "m.py")).read() == "v = 1\n"
    open(os.path.join(tree, "written-by-a-rank.txt"), "w").close()
    # the same again: nothing written; then a deletion: only that file goes, with its empty folder
    assert code_cache.checkout("nb-1", entries)[1] == []
    (src / "sub" / "d.txt").unlink()
    digest2, written, deleted, _ = code_cache.checkout("nb-1", _entries(folder))
    assert written == [] and deleted == ["sub/d.txt"] and not os.path.exists(os.path.join(tree, "sub"))
    assert os.path.exists(os.path.join(tree, "written-by-a-rank.txt"))
    # an edit carried inline: the first rank applies it, the next finds it applied
    (src / "m.py").write_text("v = 2\n")
    after = folder.scan()
    edit = FolderEdit("nb-1", digest2, after.digest, ((after.entries["m.py"], b"v = 2\n"),))
    assert code_cache.apply_edit(edit) == "applied"
    assert code_cache.apply_edit(edit) == "found"
    assert open(os.path.join(tree, "m.py")).read() == "v = 2\n"
    stale = FolderEdit("nb-1", "another base", "another target", ())
    assert code_cache.apply_edit(stale) == "out of step"
    assert os.listdir(cache / "tmp") == []  # nothing left aside


def test_a_large_file_arrives_in_parts_and_a_changed_one_is_refused(tmp_path, cache):
    import hashlib

    data = os.urandom(3000)
    sha = hashlib.sha256(data).hexdigest()
    code_cache.put([(sha, 0, 3000, data[:1000])])
    assert code_cache.missing([sha]) == [sha]
    code_cache.put([(sha, 1000, 3000, data[1000:2000]), (sha, 2000, 3000, data[2000:])])
    assert code_cache.missing([sha]) == [] and open(code_cache.blob_path(sha), "rb").read() == data
    with pytest.raises(ValueError, match="changed while it was sent"):
        code_cache.put([("0" * 64, 0, 3, b"abc")])
    assert os.listdir(cache / "tmp") == []


def test_temporaries_of_a_writer_that_is_gone_are_swept(cache):
    (cache / "tmp").mkdir(parents=True)
    gone = cache / "tmp" / "999999999.abc.part"  # no such pid
    mine = cache / "tmp" / f"{os.getpid()}.def"
    gone.write_bytes(b"x")
    mine.write_bytes(b"x")
    assert code_cache.sweep() == 1
    assert not gone.exists() and mine.exists()


# ------------------------------------------------------------------ reloads, as on a rank
def test_an_edited_module_is_reloaded_in_place_and_a_class_whose_instances_live_on_is_named(tmp_path):
    tree = tmp_path / "copy"
    tree.mkdir()
    mod = tree / "wbsync_reload_probe.py"
    mod.write_text(
        textwrap.dedent("""
        def answer():
            return 1

        class Net:
            def __init__(self):
                self.layers = 1

            def forward(self):
                return "old"
        """)
    )
    sys.path.insert(0, str(tree))
    try:
        import wbsync_reload_probe as probe

        answer = probe.answer
        ns = {"net": probe.Net(), "answer": answer}
        mod.write_text(
            textwrap.dedent("""
            def answer():
                return 2

            class Net:
                def __init__(self):
                    self.layers = 2

                def forward(self):
                    return "new"
            """)
        )
        got = code_reload.reload_changed({str(tree): {"wbsync_reload_probe.py"}}, namespace=ns)
        assert got.reloaded == ("wbsync_reload_probe",)
        assert answer() == 2  # the function object made before the edit runs the new code
        assert ns["net"].forward() == "new" and ns["net"].layers == 1
        assert got.not_reloaded == (
            (
                "wbsync_reload_probe.Net",
                "its __init__ changed; net kept what the old one built (build them again, or restart the ranks)",
            ),
        )
        mod.write_text("def answer(:\n")
        broken = code_reload.reload_changed({str(tree): {"wbsync_reload_probe.py"}}, namespace=ns)
        assert broken.reloaded == () and "SyntaxError" in broken.not_reloaded[0][1] and answer() == 2
        ext = code_reload.reload_changed({str(tree): {"other.py"}}, namespace=ns)
        assert ext.reloaded == () and ext.not_reloaded == ()  # a file no module came from: nothing
    finally:
        sys.path.remove(str(tree))
        sys.modules.pop("wbsync_reload_probe", None)


# ------------------------------------------------------------------ the environment
def _theirs(python="3.11.7", torch="2.13.0+cu126", workbench="0.1.0", digest="d", **others):
    return replies.HostEnvironment(
        host="nodeB",
        python=python,
        versions={"torch": torch, "distrain-workbench": workbench, **others},
        workbench_digest=digest,
    )


MINE = {
    "python": "3.11.7",
    "versions": {"torch": "2.13.0+cpu", "distrain-workbench": "0.1.0", "numpy": "2.1.0", "pandas": "2.2.3"},
    "workbench_digest": "d",
}


def test_a_host_with_the_same_torch_of_another_build_is_accepted():
    assert host_check.compare("nodeB", _theirs(numpy="2.1.0"), MINE) == ([], [])


def test_another_torch_or_workbench_is_refused_and_another_package_warned():
    refused, warned = host_check.compare("nodeB", _theirs(torch="2.12.0", numpy="1.26.4", pandas=None), MINE)
    assert refused == ["host nodeB: torch 2.12.0, the notebook 2.13.0+cpu"]
    assert warned == ["host nodeB: numpy 1.26.4, the notebook 2.1.0"]  # a package the host lacks is no warning
    refused, _ = host_check.compare("nodeB", _theirs(digest="other"), MINE)
    assert refused == [
        "host nodeB: workbench 0.1.0 from other sources than the notebook's 0.1.0 (install the same build on every host)"
    ]
    refused, warned = host_check.compare("nodeB", _theirs(python="3.12.1"), MINE)
    assert refused == ["host nodeB: Python 3.12.1, the notebook 3.11.7"]
    assert host_check.compare("nodeB", _theirs(python="3.11.9"), MINE)[1] == [
        "host nodeB: Python 3.11.9, the notebook 3.11.7"
    ]


def test_sync_settings_are_refused_with_local_ranks_and_a_missing_folder():
    with pytest.raises(ValueError, match="go with --launcher ssh, slurm or ray"):
        code_sync.SyncSettings(paths=(".",)).validate("local")
    code_sync.SyncSettings().validate("local")  # the default asks nothing of local ranks
    with pytest.raises(ValueError, match="--sync /no/such/folder: no such folder here"):
        code_sync.SyncSettings(paths=("/no/such/folder",)).validate("ssh")
    with pytest.raises(ValueError, match="--no-sync sends nothing"):
        code_sync.SyncSettings(paths=(".",), off=True).validate("ssh")

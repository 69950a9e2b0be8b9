"""No silent wait on a C++ op build: torch's build lock left by a build ended part-way is refused
within seconds, with its age and the command that removes it (DeepSpeed's async I/O op, on a
fresh gloo process); a lock a live build holds is named with that process, and the wait goes on
until the build lets it go."""

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("deepspeed")

from gloo_harness import run_ranks  # noqa: E402

from workbench.strategies.extension_lock import wait_for  # noqa: E402


def check_with_stale_locks(rank, world, swap):
    """``check_nvme`` twice: the pin_memory op's lock stale (the first op DeepSpeed builds for nvme),
    then async_io's with pin_memory taken as loaded (DeepSpeed's per-process cache of it: building it
    in the test's folder would take minutes)."""
    import sys
    import types

    from workbench.strategies import PrepareError
    from workbench.strategies.zero import check_nvme, import_deepspeed

    import_deepspeed("cpu")
    out = []
    for step in ("pin_memory", "async_io"):
        if step == "async_io":
            sys._deepspeed_pin_memory_op_module = types.SimpleNamespace()
        t0 = time.monotonic()
        try:
            check_nvme(types.SimpleNamespace(nvme_path=swap))
            out.append({"error": None, "took": time.monotonic() - t0})
        except PrepareError as exc:
            out.append({"error": str(exc), "took": time.monotonic() - t0})
    return out


def test_a_stale_build_lock_is_refused_with_its_age_and_the_command_that_clears_it(tmp_path, monkeypatch):
    ext = tmp_path / "torch_extensions"
    locks = [ext / op / "lock" for op in ("pin_memory", "async_io")]
    hours_ago = time.time() - 3 * 3600
    for lock in locks:
        lock.parent.mkdir(parents=True)
        lock.touch()
        os.utime(lock, (hours_ago, hours_ago))  # a build killed three hours ago
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    (res,) = run_ranks(check_with_stale_locks, 1, args=(str(tmp_path / "swap"),), timeout=300)
    for lock, got in zip(locks, res):
        assert got["error"] == (
            f"DeepSpeed's async I/O op (for offload to nvme) cannot be built: torch's build lock {lock} is stale "
            "(3.0 h old, and no process on this host holds it: a build was ended part-way). Remove it, then run "
            f"this again: `rm {lock}`"
        )
        assert got["took"] <= 10, got  # named within seconds, not waited on
        assert lock.exists()  # the user's to remove: the message says how


def test_a_lock_a_live_build_holds_is_named_with_its_process_and_waited_for(tmp_path):
    lock = tmp_path / "async_io" / "lock"
    lock.parent.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            f"fd = os.open({str(lock)!r}, os.O_CREAT | os.O_EXCL)\n"
            "print('held', flush=True)\ntime.sleep(3)\nos.close(fd)\n"
            f"os.remove({str(lock)!r})\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        said: list[tuple[float, str]] = []
        t0 = time.monotonic()
        wait_for(str(lock), "the op", lambda text: said.append((time.monotonic() - t0, text)))
        waited = time.monotonic() - t0
        assert len(said) == 1 and said[0][0] <= 2.0, said
        assert f"held by pid {holder.pid} (" in said[0][1] and str(lock) in said[0][1]
        assert said[0][1].startswith("waiting for the op: another process is building it")
        assert waited >= 1.5 and not lock.exists()  # it waited for the build, then went on
    finally:
        holder.kill()
        holder.wait()

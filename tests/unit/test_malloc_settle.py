"""A rank fixes glibc's malloc thresholds at start (``runtime.settle_malloc``), unless the
user set glibc's own malloc variables, which then stay in charge. Each case runs in a fresh
interpreter: the thresholds are process-wide and this process's own must stay untouched."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHECK = "from workbench.engine.runtime import settle_malloc; print(settle_malloc())"


def settle_in_fresh_process(**env) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", CHECK], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_thresholds_set_on_glibc():
    assert settle_in_fresh_process() == "True"


@pytest.mark.parametrize(
    "env",
    [
        {"MALLOC_TRIM_THRESHOLD_": "1048576"},
        {"MALLOC_MMAP_THRESHOLD_": "1048576"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"},
    ],
)
def test_users_malloc_settings_left_alone(env):
    assert settle_in_fresh_process(**env) == "False"


def test_unrelated_tunables_do_not_stop_it():
    assert settle_in_fresh_process(GLIBC_TUNABLES="glibc.cpu.hwcaps=-AVX512F") == "True"

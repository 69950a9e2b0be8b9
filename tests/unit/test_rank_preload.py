"""What the ranks' forking parent does once for all ranks (``engine.preload``): the modules every
engine imports after it registers, imported before the forks, must start no thread (a fork copies
only the thread that forked) and pull in no framework (a JAX rank never imports torch); and
gloo's lazy pair connection is chosen for large sets only (``runtime.lazy_gloo``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workbench.engine import runtime

PRELOAD = (
    "import importlib, json, os, sys\n"
    "from workbench.engine.preload import ENGINE_PRELOADS\n"
    "for m in ENGINE_PRELOADS: importlib.import_module(m)\n"
    "print(json.dumps({'tasks': len(os.listdir('/proc/self/task')), "
    "'frameworks': [m for m in ('torch', 'jax') if m in sys.modules]}))"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_engine_preloads_start_no_thread_and_import_no_framework():
    env = {**os.environ, "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    out = subprocess.run([sys.executable, "-c", PRELOAD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"tasks": 1, "frameworks": []}


@pytest.fixture
def no_lazy_setting(monkeypatch):
    monkeypatch.delenv("TORCH_GLOO_LAZY_INIT", raising=False)


def test_gloo_connects_lazily_from_32_ranks(no_lazy_setting):
    assert runtime.lazy_gloo("gloo", 64) is True
    assert os.environ["TORCH_GLOO_LAZY_INIT"] == "1"


@pytest.mark.parametrize("backend,world", [("gloo", 4), ("gloo", 31), ("nccl", 64)])
def test_small_sets_and_nccl_connect_at_start(no_lazy_setting, backend, world):
    assert runtime.lazy_gloo(backend, world) is False
    assert "TORCH_GLOO_LAZY_INIT" not in os.environ


def test_a_users_own_setting_is_kept(monkeypatch):
    monkeypatch.setenv("TORCH_GLOO_LAZY_INIT", "0")
    assert runtime.lazy_gloo("gloo", 64) is False
    assert os.environ["TORCH_GLOO_LAZY_INIT"] == "0"

"""A stand-in for NVML's Python module (``pynvml``): no GPU can run on the test machines.

It answers the calls :func:`workbench.labserver.monitor.gpu_usage` makes with what the file
named by ``WORKBENCH_NVML_STANDIN`` says (``{"util": 37, "processes": {"<pid>": <MiB>}}``);
without that file, ``nvmlInit`` fails the way it does on a host without a driver. It is
also a Jupyter server extension that installs itself as ``pynvml`` in the server process
only (the kernels and ranks that server starts never see it).
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

ENV = "WORKBENCH_NVML_STANDIN"


class NVMLError(Exception):
    pass


def _state() -> dict:
    path = os.environ.get(ENV)
    if not path or not os.path.exists(path):
        raise NVMLError("Driver Not Loaded")
    with open(path) as fh:
        return json.load(fh)


def nvmlInit() -> None:
    _state()


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return 1


def nvmlDeviceGetHandleByIndex(index: int):
    return index


def nvmlDeviceGetUtilizationRates(handle):
    return SimpleNamespace(gpu=int(_state()["util"]), memory=0)


def nvmlDeviceGetComputeRunningProcesses(handle):
    return [SimpleNamespace(pid=int(pid), usedGpuMemory=int(mib * 2**20)) for pid, mib in _state()["processes"].items()]


def _jupyter_server_extension_points():
    return [{"module": "nvml_standin"}]


def _load_jupyter_server_extension(serverapp) -> None:
    sys.modules["pynvml"] = sys.modules[__name__]
    serverapp.log.info("nvml_standin: answering as pynvml (a test stand-in; no GPU here)")

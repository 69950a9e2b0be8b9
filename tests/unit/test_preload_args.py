"""The forking parent's own arguments (``engine.preload``), taken out before ipengine's."""

from __future__ import annotations

import pytest

from workbench.engine.preload import own_imports


def test_a_spare_imports_the_modules_it_is_given_and_passes_the_rest_on():
    assert own_imports(["--ranks", "2"]) == ((), ["--ranks", "2"])
    assert own_imports(["--import", "torch._dynamo,torchft", "--ranks", "2"]) == (
        ("torch._dynamo", "torchft"),
        ["--ranks", "2"],
    )
    with pytest.raises(SystemExit, match="--import needs module names, comma-separated"):
        own_imports(["--import"])

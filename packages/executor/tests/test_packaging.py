"""elastrain-executor installs without pydantic or torch, and keeps the elastrain namespace open."""

import subprocess
import sys

from elastrain_testutils.packaging import assert_installs_alone, assert_namespace_not_masked


def test_installs_alone() -> None:
    assert_installs_alone(
        "elastrain-executor", forbidden=["pydantic", "torch"], allowed_siblings=["elastrain-discovery"]
    )


def test_namespace_and_public_api() -> None:
    assert_namespace_not_masked("elastrain.executor")


def test_import_pulls_in_neither_ray_torch_nor_horovod() -> None:
    code = "import sys, elastrain.executor; print(sorted({'ray', 'torch', 'horovod', 'pydantic'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "[]\n"

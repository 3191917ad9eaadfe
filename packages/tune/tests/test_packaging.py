"""elastrain-tune installs without torch, and keeps the elastrain namespace open. (Ray Tune's own extra,
``ray[tune]``, brings pydantic; elastrain-tune does not use it.)"""

import subprocess
import sys

from elastrain_testutils.packaging import (
    assert_exceptions_named_publicly,
    assert_installs_alone,
    assert_namespace_not_masked,
)


def test_installs_alone() -> None:
    assert_installs_alone(
        "elastrain-tune",
        forbidden=["torch"],
        allowed_siblings=["elastrain-executor", "elastrain-durable", "elastrain-discovery"],
    )


def test_namespace_and_public_api() -> None:
    assert_namespace_not_masked("elastrain.tune")


def test_exceptions_print_their_public_names() -> None:
    assert_exceptions_named_publicly("elastrain.tune")


def test_the_worker_side_does_not_import_tune() -> None:
    code = "import sys, elastrain.tune; elastrain.tune.trial_persistence; print('ray.tune' in sys.modules)"
    assert subprocess.check_output([sys.executable, "-c", code], text=True).strip() == "False"

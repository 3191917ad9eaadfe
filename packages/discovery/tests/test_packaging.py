"""elastrain-discovery installs alone and keeps the elastrain namespace open."""

from elastrain_testutils.packaging import (
    assert_exceptions_named_publicly,
    assert_installs_alone,
    assert_namespace_not_masked,
)


def test_installs_without_pydantic_torch_or_other_elastrain_packages() -> None:
    assert_installs_alone("elastrain-discovery")


def test_namespace_and_public_api() -> None:
    assert_namespace_not_masked("elastrain.discovery")


def test_import_does_not_import_ray() -> None:
    import subprocess
    import sys

    code = "import sys, elastrain.discovery; print('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_exceptions_print_their_public_names() -> None:
    assert_exceptions_named_publicly("elastrain.discovery")

"""elastrain-durable installs without what it must not need, and keeps the elastrain namespace open."""

from elastrain_testutils.packaging import (
    assert_exceptions_named_publicly,
    assert_installs_alone,
    assert_namespace_not_masked,
)


def test_installs_alone() -> None:
    assert_installs_alone("elastrain-durable", forbidden=["pydantic", "torch"])


def test_namespace_and_public_api() -> None:
    assert_namespace_not_masked("elastrain.durable")


def test_exceptions_print_their_public_names() -> None:
    assert_exceptions_named_publicly("elastrain.durable")

"""elastrain-executor installs without what it must not need, and keeps the elastrain namespace open."""

from elastrain_testutils.packaging import assert_installs_alone, assert_namespace_not_masked


def test_installs_alone() -> None:
    assert_installs_alone(
        "elastrain-executor", forbidden=["pydantic", "torch"], allowed_siblings=["elastrain-discovery"]
    )


def test_namespace_and_public_api() -> None:
    assert_namespace_not_masked("elastrain.executor")

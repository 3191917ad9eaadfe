"""elastrain-trackers installs with no tracker client and no pydantic, and keeps the elastrain namespace open."""

from elastrain_testutils.packaging import assert_installs_alone, assert_namespace_not_masked


def test_installs_alone() -> None:
    assert_installs_alone("elastrain-trackers", forbidden=["torch", "pydantic", "mlflow", "wandb", "tensorboardX"])


def test_namespace_and_public_api() -> None:
    assert_namespace_not_masked("elastrain.trackers")

"""Checks that a distribution installs alone, without masking the shared ``elastrain`` namespace."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import json
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

NAMESPACE = "elastrain"
NAMESPACE_DIST_PREFIX = "elastrain-"
NOT_PRODUCT = {"elastrain-testutils"}


def dependency_closure(dist_name: str, extras: Iterable[str] = ()) -> set[str]:
    """Canonical names of every distribution that installing ``dist_name[extras]`` pulls in, itself included.

    Walks the installed metadata, evaluating environment markers for this interpreter, so it answers for the
    environment the tests run in without creating another.
    """
    seen: set[str] = set()
    pending: list[tuple[str, frozenset[str]]] = [(dist_name, frozenset(extras))]
    while pending:
        name, wanted_extras = pending.pop()
        key = canonicalize_name(name)
        if key in seen and not wanted_extras:
            continue
        seen.add(key)
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is not None:
                contexts = [{"extra": extra} for extra in wanted_extras] or [{"extra": ""}]
                if not any(requirement.marker.evaluate(context) for context in contexts):
                    continue
            pending.append((requirement.name, frozenset(requirement.extras)))
    return seen


def assert_installs_alone(
    dist_name: str, *, forbidden: Iterable[str] = ("pydantic", "torch"), allowed_siblings: Iterable[str] = ()
) -> None:
    """Fail when installing ``dist_name`` pulls a forbidden distribution or an unexpected elastrain sibling."""
    closure = dependency_closure(dist_name)
    pulled = sorted(closure & {canonicalize_name(name) for name in forbidden})
    assert not pulled, f"Installing {dist_name} pulls {pulled}; those must stay optional for it."
    allowed = {canonicalize_name(dist_name)} | {canonicalize_name(name) for name in allowed_siblings}
    siblings = sorted(n for n in closure if n.startswith(NAMESPACE_DIST_PREFIX) and n not in allowed)
    assert not siblings, f"Installing {dist_name} pulls other elastrain distributions: {siblings}."


def assert_namespace_not_masked(module_name: str) -> None:
    """``elastrain`` must stay a PEP 420 namespace: no ``__init__.py``, so every distribution's part is found."""
    namespace = importlib.import_module(NAMESPACE)
    assert getattr(namespace, "__file__", None) is None, (
        f"{NAMESPACE} is a regular package at {namespace.__file__}: some distribution ships "
        f"{NAMESPACE}/__init__.py and masks the other parts of the namespace."
    )
    module = importlib.import_module(module_name)
    assert module.__file__ is not None
    package_dir = Path(module.__file__).parent
    assert (package_dir / "py.typed").is_file(), f"{module_name} has no py.typed marker."
    for name in getattr(module, "__all__", ()):
        assert hasattr(module, name), f"{module_name}.__all__ lists {name!r}, which it does not define."


def assert_exceptions_named_publicly(module_name: str) -> None:
    """Tracebacks and reprs name a class by its ``__module__``: the public exceptions of ``module_name`` must say
    ``module_name`` (``elastrain.executor.WorkerError``), not the private module that defines them."""
    module = importlib.import_module(module_name)
    for name in getattr(module, "__all__", ()):
        value = getattr(module, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert value.__module__ == module_name, (
                f"{module_name}.{name} prints as {value.__module__}.{value.__qualname__}: set its __module__ to "
                f"{module_name!r}."
            )


def check_installed_from_checkout(repo_root: Path) -> list[str]:
    """Problems with elastrain distributions that did not come from ``repo_root`` (e.g. from an index)."""
    problems = []
    root = repo_root.resolve()
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        if not name.startswith(NAMESPACE_DIST_PREFIX):
            continue
        direct_url = dist.read_text("direct_url.json")
        if direct_url is None:
            problems.append(f"{name} {dist.version} was installed from an index, not from this checkout.")
            continue
        url = json.loads(direct_url).get("url", "")
        if not url.startswith("file://"):
            problems.append(f"{name} came from {url}, not from this checkout.")
            continue
        path = Path(url.removeprefix("file://")).resolve()
        if not (path == root or root in path.parents):
            problems.append(f"{name} came from {path}, outside this checkout ({root}).")
    return problems

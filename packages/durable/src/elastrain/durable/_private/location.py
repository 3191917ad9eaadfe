"""Where a store lives: its URI parsed and checked, its backend imported lazily, and secrets kept out of text."""

from __future__ import annotations

import dataclasses
import importlib
import os
import posixpath
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

# Schemes built into fsspec, and the ones an extra of this distribution installs (import name, extra name).
_BUILT_IN = {"file", "local", "memory"}
_EXTRAS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}
# Keys of storage_options whose values are secrets (compared lowercased, as substrings).
_SECRET_KEY_PARTS = ("secret", "token", "password", "key", "credential", "session")
_REDACTED = "***"


@dataclasses.dataclass(frozen=True)
class Location:
    """A store's root. ``root`` keeps the caller's style (a plain path stays a path) so commands understand it."""

    protocol: str
    root: str
    display: str  # the URI with any user:password@ part removed: safe for logs, errors and reprs

    def join(self, *parts: str) -> str:
        if self.protocol in ("file", "local") and "://" not in self.root:
            return os.path.join(self.root, *parts)
        return posixpath.join(self.root, *parts)

    def display_join(self, *parts: str) -> str:
        return posixpath.join(self.display, *parts)

    @property
    def is_local(self) -> bool:
        return self.protocol in ("file", "local")

    def local_path(self, *parts: str) -> str:
        """The filesystem path of a local location."""
        root = self.root[len("file://") :] if self.root.startswith("file://") else self.root
        root = root[len("local://") :] if root.startswith("local://") else root
        return os.path.join(root, *parts)


def parse_location(uri: str | os.PathLike[str]) -> Location:
    """Check ``uri`` and make its :class:`Location`; unknown schemes fail with the list of known ones."""
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f"uri must be a non-empty path or URI such as 's3://bucket/run', got {uri!r}.")
    parsed = urllib.parse.urlsplit(uri)
    scheme = parsed.scheme.lower()
    if len(scheme) <= 1:  # a plain path (or a Windows drive letter)
        path = os.path.abspath(os.path.expanduser(uri))
        return Location("file", path.rstrip(os.sep) or os.sep, path)
    if scheme not in _BUILT_IN and scheme not in _EXTRAS and not _fsspec_knows(scheme):
        known = ", ".join(sorted(_BUILT_IN | set(_EXTRAS)))
        raise ValueError(
            f"Unknown storage scheme {scheme!r} in {_strip_userinfo(uri)!r}: use a local path or one of {known} "
            "(or any scheme fsspec has a filesystem for)."
        )
    if scheme in _EXTRAS and not parsed.netloc:
        raise ValueError(f"{_strip_userinfo(uri)!r} names no bucket: write {scheme}://<bucket>/<prefix>.")
    root = uri.rstrip("/") if parsed.path not in ("", "/") else uri
    return Location(scheme, root, _strip_userinfo(root))


def import_backend(protocol: str) -> None:
    """Import the filesystem library of ``protocol``; a missing one names the extra that installs it."""
    if protocol not in _EXTRAS:
        return
    module, extra = _EXTRAS[protocol]
    if protocol in ("gs", "gcs"):
        # gcsfs probes every bucket over gRPC unless told not to: against emulators each call then waits 60 s.
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{protocol}:// storage needs {module}: pip install 'elastrain-durable[{extra}]'") from error


def secret_values(storage_options: Mapping[str, Any] | None) -> list[str]:
    """The values in ``storage_options`` (nested too) that look like credentials."""
    found: list[str] = []

    def visit(options: Mapping[str, Any]) -> None:
        for key, value in options.items():
            if isinstance(value, Mapping):
                visit(value)
            elif isinstance(value, str) and value and any(part in key.lower() for part in _SECRET_KEY_PARTS):
                found.append(value)

    visit(storage_options or {})
    return found


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced, and any user:password@ of a URL removed."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4:  # shorter values would blank out ordinary words
            text = text.replace(secret, _REDACTED)
    return _strip_userinfo_anywhere(text)


def _strip_userinfo(uri: str) -> str:
    parsed = urllib.parse.urlsplit(uri)
    if "@" not in parsed.netloc:
        return uri
    return urllib.parse.urlunsplit(parsed._replace(netloc=parsed.netloc.rsplit("@", 1)[1]))


def _strip_userinfo_anywhere(text: str) -> str:
    import re

    return re.sub(r"([a-z][a-z0-9+.-]*://)[^/@\s]+@", r"\1", text, flags=re.IGNORECASE)


def _fsspec_knows(scheme: str) -> bool:
    from fsspec.registry import known_implementations, registry

    return scheme in registry or scheme in known_implementations

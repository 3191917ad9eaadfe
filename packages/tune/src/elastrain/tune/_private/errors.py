"""Errors a Tune trial on elastrain raises when its set-up cannot be right."""

from __future__ import annotations


class TuneIntegrationError(RuntimeError):
    """Base class of the errors elastrain.tune raises."""


class StoreInUseError(TuneIntegrationError):
    """The experiment's folder under the base URI belongs to another experiment (not a restore of this one)."""


class TrialIdReusedError(TuneIntegrationError):
    """Another live trial in this Ray cluster already writes this trial's store."""


class StorageUnreachableError(TuneIntegrationError):
    """A trial could not reach its store when it started (wrong endpoint, credentials, bucket)."""

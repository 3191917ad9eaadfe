"""Durable training checkpoints on fsspec URIs: async save and restore, atomic commit, garbage collection.

Not built yet: this distribution is a placeholder that later work fills (see the README).
"""

from elastrain.durable._version import __version__

__all__ = ["__version__"]

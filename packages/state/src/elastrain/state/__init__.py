"""Run state for elastrain: pydantic run schemas, a detached state actor and a run manager.

Not built yet: this distribution is a placeholder that later work fills (see the README).
"""

from elastrain.state._version import __version__

__all__ = ["__version__"]

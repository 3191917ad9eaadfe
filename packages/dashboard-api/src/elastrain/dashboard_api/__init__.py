"""HTTP API and page over elastrain's training run state.

Not built yet: this distribution is a placeholder that later work fills (see the README).
"""

from elastrain.dashboard_api._version import __version__

__all__ = ["__version__"]

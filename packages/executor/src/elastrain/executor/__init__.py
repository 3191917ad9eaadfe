"""RayExecutor: static and elastic distributed PyTorch jobs on Ray, API-compatible with Horovod's.

Not built yet: this distribution is a placeholder that later work fills (see the README).
"""

from elastrain.executor._version import __version__

__all__ = ["__version__"]

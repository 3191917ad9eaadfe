"""HTTP API and page over elastrain's training run state.

```python
from elastrain.dashboard_api import create_app

app = create_app()            # FastAPI; serve with uvicorn inside a process connected to Ray
```

Or run ``elastrain-dashboard --address auto`` (binds 127.0.0.1:8266).
"""

from elastrain.dashboard_api._private.app import Health, Problem, RunsPage, create_app
from elastrain.dashboard_api._private.cli import TOKEN_ENV
from elastrain.dashboard_api._private.source import BadRequest, RaySource, Unavailable
from elastrain.dashboard_api._version import __version__

__all__ = [
    "create_app",
    "RaySource",
    "RunsPage",
    "Problem",
    "Health",
    "Unavailable",
    "BadRequest",
    "TOKEN_ENV",
    "__version__",
]

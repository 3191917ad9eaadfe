"""HTTP API and page over elastrain's training run state.

```python
from elastrain.dashboard_api import create_app

app = create_app()            # FastAPI; serve with uvicorn inside a process connected to Ray
```

Or run ``elastrain-dashboard --address auto`` (binds 127.0.0.1:8266). With a token (``--token-file FILE`` or the
``ELASTRAIN_DASHBOARD_TOKEN`` environment variable), the API requires ``Authorization: Bearer <token>``.
"""

from elastrain.dashboard_api._private.app import Health, Problem, RunsPage, create_app
from elastrain.dashboard_api._private.source import BadRequest, RaySource, Unavailable
from elastrain.dashboard_api._private.tokens import TOKEN_ENV, read_token_file
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
    "read_token_file",
    "__version__",
]

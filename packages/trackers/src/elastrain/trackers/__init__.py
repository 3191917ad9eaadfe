"""elastrain runs in the trackers people already use: MLflow, TensorBoard and Weights & Biases.

Installed, this distribution observes every run of elastrain-executor (through its ``elastrain.executor.observers``
entry point) and records it in the trackers in use: those given to :func:`use`, else those ``ELASTRAIN_TRACKERS``
names (``mlflow``, ``tensorboard``, ``wandb``). Each logs every number workers ``send()``, by step; the run's
parameters; its world size and resets as metrics; resets and worker exits as that tool's events, tags or text; and
the final status. A tracker's calls run on a thread of their own behind a bounded queue: one that is down or slow
never slows training, and what it missed is logged once.
"""

from elastrain.trackers._private.mlflow_tracker import MLflowTracker
from elastrain.trackers._private.observer import TrackersObserver, trackers_in_use, use
from elastrain.trackers._private.tensorboard_tracker import TensorBoardTracker
from elastrain.trackers._private.tracker import Event, Point, RunInfo, RunRecorder, Tracker
from elastrain.trackers._private.wandb_tracker import WandbTracker
from elastrain.trackers._version import __version__

__all__ = [
    "Event",
    "MLflowTracker",
    "Point",
    "RunInfo",
    "RunRecorder",
    "TensorBoardTracker",
    "Tracker",
    "TrackersObserver",
    "WandbTracker",
    "__version__",
    "trackers_in_use",
    "use",
]

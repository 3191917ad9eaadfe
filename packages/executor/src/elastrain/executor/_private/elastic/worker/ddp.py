"""``elastic.DistributedDataParallel``: torch's DDP, re-bound to each new process group of an elastic job.

torch's ``DistributedDataParallel`` binds to the process group it was built with, and building it runs
collectives. Across resets that breaks twice: the old group is gone, and a newcomer building its DDP before the
loop would run collectives the survivors never match. This wrapper holds the module and the arguments; it builds
torch's DDP without collectives (``init_sync=False``: the elastic sync has already made every replica equal)
each time the worker forms a new group, and drops it before the group is left.
"""

from __future__ import annotations

from typing import Any

import torch

from elastrain.executor._private.elastic.worker import runtime


class DistributedDataParallel(torch.nn.Module):
    """Wrap a model once, before ``@elastic.run``: ``model = elastic.DistributedDataParallel(model)``.

    Takes torch's ``DistributedDataParallel`` keywords (``device_ids``, ``find_unused_parameters``,
    ``gradient_as_bucket_view``, ``static_graph``, ...), except ``process_group``/``device_mesh`` (the job's
    group is used) and ``init_sync`` (elastrain syncs). ``state_dict()`` keys carry the ``module.`` prefix as
    with torch's DDP, and ``.module`` is the wrapped model. Comm hooks registered with ``register_comm_hook``
    are registered again on every new group. Outside an elastic job it binds to the default group once.
    """

    # Kept in __dict__, outside nn.Module's registries: the wrapped DDP is not a submodule, so state_dict() keys
    # stay those of torch's DDP ("module.<name>").
    _ddp_kwargs: dict[str, Any]
    _comm_hooks: list[tuple[object, Any]]

    def __init__(self, module: torch.nn.Module, **ddp_kwargs: Any) -> None:
        super().__init__()
        for reserved in ("process_group", "device_mesh"):
            if ddp_kwargs.get(reserved) is not None:
                raise ValueError(
                    f"elastic.DistributedDataParallel always uses the job's current group; drop {reserved}=."
                )
        ddp_kwargs.pop("init_sync", None)
        self.module = module
        self.__dict__["_ddp_kwargs"] = ddp_kwargs
        self.__dict__["_ddp"] = None
        self.__dict__["_comm_hooks"] = []
        job = runtime.current_or_none()
        if job is not None:
            job.add_group_user(self)
        if torch.distributed.is_initialized():
            self.bind()
        elif job is None:
            raise RuntimeError(
                "elastic.DistributedDataParallel needs a process group: call "
                "elastrain.executor.init_process_group() first, or use it inside an elastic RayExecutor job."
            )

    # -- group changes (called by the elastic runtime) --------------------------------------------------------

    def bind(self) -> None:
        """Build torch's DDP on the current default group (no collectives)."""
        self.unbind()
        ddp = torch.nn.parallel.DistributedDataParallel(self.module, init_sync=False, **self._ddp_kwargs)
        ddp.train(self.training)  # type: ignore[no-untyped-call]
        for hook_state, hook in self._comm_hooks:
            ddp.register_comm_hook(hook_state, hook)
        self.__dict__["_ddp"] = ddp

    def unbind(self) -> None:
        """Drop torch's DDP (its reducer and its hold on the old group) before the group goes."""
        self.__dict__["_ddp"] = None

    # -- torch DDP's surface ----------------------------------------------------------------------------------

    @property
    def ddp(self) -> torch.nn.parallel.DistributedDataParallel:
        """The torch ``DistributedDataParallel`` of the current group."""
        ddp = self.__dict__["_ddp"]
        if ddp is None:
            raise RuntimeError(
                "This DistributedDataParallel has no process group yet: the elastic job forms one when the worker "
                "calls init_process_group() or enters its @elastic.run function."
            )
        return ddp  # type: ignore[no-any-return]

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.ddp(*inputs, **kwargs)

    def no_sync(self) -> Any:
        return self.ddp.no_sync()

    def join(self, *args: Any, **kwargs: Any) -> Any:
        return self.ddp.join(*args, **kwargs)

    def register_comm_hook(self, state: object, hook: Any) -> None:
        self._comm_hooks.append((state, hook))
        if self.__dict__["_ddp"] is not None:
            self.ddp.register_comm_hook(state, hook)

    def train(self, mode: bool = True) -> DistributedDataParallel:
        super().train(mode)
        if self.__dict__["_ddp"] is not None:
            self.ddp.train(mode)  # type: ignore[no-untyped-call]
        return self

"""GPU tests: the elastic kill and freeze scenarios and an FSDP2 model on the nccl backend, one device per worker.

They need at least two CUDA devices; elsewhere every test skips and says why (``nox -s tests_gpu`` runs them).
"""

from __future__ import annotations

import pytest


def cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    devices = cuda_devices()
    if devices >= 2:
        return
    reason = (
        f"needs 2 CUDA devices for the nccl scenarios (kill, freeze, FSDP2); this machine has {devices} "
        "(torch.cuda.device_count() with a CUDA build of torch)"
    )
    for item in items:
        item.add_marker(pytest.mark.skip(reason=reason))

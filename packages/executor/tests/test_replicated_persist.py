"""A whole state's committed copy as a DCP checkpoint and back: any nesting, integer keys (an optimizer's state),
tuples and plain values come back as they went in, and torch alone reads the model's weights."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from elastrain.executor._private.elastic.worker.replicated_persist import flatten, read_back

pytest.importorskip("torch.distributed.checkpoint")


def save(state: dict, folder: Path) -> None:
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp_save(state, checkpoint_id=str(folder), no_dist=True)


def test_a_committed_copy_comes_back_whole(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    snapshot = {
        "handlers": {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "sampler": {"epoch": 2}},
        "values": {"step": 7, "pair": (torch.ones(2), "text"), "history": [1.5, torch.zeros(3)]},
    }
    save(flatten(snapshot, commits=7), tmp_path / "checkpoint")
    loaded, commits = read_back(str(tmp_path / "checkpoint"))
    assert commits == 7
    torch.testing.assert_close(loaded["handlers"], snapshot["handlers"], rtol=0, atol=0)
    assert set(loaded["handlers"]["optimizer"]["state"]) == {0, 1, 2, 3}  # integer keys stay integers
    values = loaded["values"]
    assert (values["step"], values["pair"][1], values["history"][0]) == (7, "text", 1.5)
    assert isinstance(values["pair"], tuple)
    torch.testing.assert_close((values["pair"][0], values["history"][1]), (torch.ones(2), torch.zeros(3)))

    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    plain = {"model": torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).state_dict()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp_load(plain, checkpoint_id=str(tmp_path / "checkpoint"), no_dist=True)
    torch.testing.assert_close(plain["model"], model.state_dict(), rtol=0, atol=0)

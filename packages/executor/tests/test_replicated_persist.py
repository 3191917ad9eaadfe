"""A whole state's committed copy as a DCP checkpoint and back: any nesting, integer keys (an optimizer's state),
tuples and plain values come back as they went in, and torch alone reads the model's weights."""

from __future__ import annotations

import collections
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


Pair = collections.namedtuple("Pair", "left right")  # at the top: pickled by name


def test_any_state_snapshot_comes_back_with_its_containers(tmp_path: Path) -> None:
    snapshot = {  # an ObjectState's: its values, as they are
        "epoch": 3,
        "w": torch.ones(2),
        "ordered": collections.OrderedDict(b=torch.zeros(1), a=1),
        "counts": collections.defaultdict(int, {"x": 2}),
        "pair": Pair(torch.full((2,), 5.0), "r"),
    }
    save(flatten(snapshot, commits=5), tmp_path / "checkpoint")
    loaded, commits = read_back(str(tmp_path / "checkpoint"))
    assert commits == 5
    assert loaded["epoch"] == 3
    torch.testing.assert_close(loaded["w"], torch.ones(2))
    assert type(loaded["ordered"]) is collections.OrderedDict
    assert list(loaded["ordered"]) == ["b", "a"]
    assert loaded["counts"]["missing"] == 0  # still a defaultdict(int)
    assert isinstance(loaded["pair"], Pair)
    assert loaded["pair"].right == "r"


def test_two_tensors_that_would_share_a_name_fail_the_commit() -> None:
    with pytest.raises(ValueError, match=r"both be saved as 'elastrain_state\.a\.b'"):
        flatten({"a.b": torch.zeros(1), "a": {"b": torch.ones(1)}}, commits=1)


def test_a_checkpoint_of_another_kind_is_refused(tmp_path: Path) -> None:
    import io
    import pickle

    save({"model.w": torch.ones(1), "elastrain": io.BytesIO(pickle.dumps({"values": {}}))}, tmp_path / "c")
    with pytest.raises(ValueError, match="not written from a whole state"):
        read_back(str(tmp_path / "c"))

"""torch.distributed.checkpoint of recstore.nn models: round trips, cross-loading, row blocks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from recstore.client import checkpoint
from recstore.client.state import TableState, TableWeight

from .test_state import DIM, NUM, _assert_same, _recstore_model, _torch_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DCP without a process group


@pytest.fixture
def blocks_of_seven(monkeypatch) -> None:
    import recstore.client.table_rows as state

    monkeypatch.setattr(state, "STATE_CHUNK_BYTES", 7 * DIM * 4)  # 40 rows: 6 blocks


@pytest.fixture
def never_whole(monkeypatch) -> None:
    """A table is never read into one tensor on these roads."""

    def refuse(self: TableWeight) -> torch.Tensor:
        raise AssertionError(f"{self!r} materialised")

    monkeypatch.setattr(TableWeight, "materialise", refuse)


def test_a_model_round_trips_in_row_blocks(any_client, tmp_path, blocks_of_seven, never_whole):
    source, target = _recstore_model(any_client, 1), _recstore_model(any_client, 2)
    source(torch.tensor([[1, 2]])).sum().backward()
    checkpoint.save(source, tmp_path)
    stored = dcp.FileSystemReader(tmp_path).read_metadata().state_dict_metadata["bag.weight"]
    assert stored.size == torch.Size([NUM, DIM])
    assert [(c.offsets[0], c.sizes[0]) for c in stored.chunks] == [
        (0, 7), (7, 7), (14, 7), (21, 7), (28, 7), (35, 5),
    ]  # fmt: skip
    checkpoint.load(target, tmp_path)
    _assert_same_rows(target, source)


def _assert_same_rows(a, b) -> None:
    torch.testing.assert_close(_rows_of(a), _rows_of(b), atol=0, rtol=0)
    torch.testing.assert_close(a.head.weight, b.head.weight, atol=0, rtol=0)


def _rows_of(model) -> torch.Tensor:
    bag = model.bag
    return bag.read_weights() if isinstance(bag, TableState) else bag.weight.detach()


def test_torch_and_recstore_checkpoints_load_into_each_other(any_client, tmp_path) -> None:
    torch_model, recstore_model = _torch_model(1), _recstore_model(any_client, 2)
    dcp.save(torch_model.state_dict(), checkpoint_id=tmp_path / "torch")  # plain DCP
    checkpoint.load(recstore_model, tmp_path / "torch")
    _assert_same_rows(recstore_model, torch_model)
    recstore_model(torch.tensor([[3, 4]])).sum().backward()
    checkpoint.save(recstore_model, tmp_path / "recstore")
    other = _torch_model(3)
    state = other.state_dict()
    dcp.load(state, checkpoint_id=tmp_path / "recstore")  # plain DCP into torch.nn
    other.load_state_dict(state)
    _assert_same_rows(other, recstore_model)


def test_plain_dcp_works_on_materialised_state_dicts(any_client, tmp_path) -> None:
    source, target = _recstore_model(any_client, 1), _recstore_model(any_client, 2)
    dcp.save(source.state_dict(), checkpoint_id=tmp_path)
    state = target.state_dict()
    dcp.load(state, checkpoint_id=tmp_path)
    target.load_state_dict(state)
    _assert_same(target, source)


def test_a_torch_checkpoint_in_one_piece_is_read_once(local_client, tmp_path, blocks_of_seven):
    dcp.save(_torch_model(1).state_dict(), checkpoint_id=tmp_path)
    model = _recstore_model(local_client, 2)
    pushes: list[int] = []
    push = local_client.push
    local_client.push = lambda n, ids, rows: pushes.append(len(ids)) or push(n, ids, rows)
    checkpoint.load(model, tmp_path)
    assert pushes == [NUM]  # the block is the checkpoint's piece: one read, one write
    _assert_same_rows(model, _torch_model(1))


def test_missing_and_mismatched_tables_are_refused_like_dcp(local_client, tmp_path) -> None:
    dcp.save({"head.weight": torch.zeros(1, DIM)}, checkpoint_id=tmp_path / "no_bag")
    model = _recstore_model(local_client, 1)
    with pytest.raises(CheckpointException, match="Missing key in checkpoint state_dict: bag"):
        checkpoint.load(model, tmp_path / "no_bag")
    from torch import nn

    wider = nn.ModuleDict({"bag": nn.EmbeddingBag(NUM, DIM + 1)})
    dcp.save(wider.state_dict(), checkpoint_id=tmp_path / "wider")
    with pytest.raises(CheckpointException, match="Size mismatch"):
        checkpoint.load(model, tmp_path / "wider", strict=False)
    assert torch.equal(model.bag.read_weights(), _rows_of(_recstore_model(local_client, 1)))

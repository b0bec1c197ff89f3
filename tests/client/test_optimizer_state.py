"""Optimizer state in state_dict, torch.save and DCP: a restored model trains on exactly."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from recstore import nn as rnn
from recstore.client import checkpoint
from recstore.client.table_rows import TableRows

from .conftest import unique_name

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DCP without a process group

NUM, DIM, K = 30, 4, 3
OPTIMIZERS = {
    "adagrad": {"kind": "adagrad", "lr": 0.5},
    "rowwise_adagrad": {"kind": "rowwise_adagrad", "lr": 0.5},
    "adam": {"kind": "adam", "lr": 0.05},
}
STATE_KEYS = {
    "adagrad": {"bag.optimizer.sum": [NUM, DIM]},
    "rowwise_adagrad": {"bag.optimizer.sum": [NUM, 1]},
    "adam": {
        "bag.optimizer.exp_avg": [NUM, DIM],
        "bag.optimizer.exp_avg_sq": [NUM, DIM],
        "bag.optimizer.step": [],
    },
}


class Model(torch.nn.Module):
    def __init__(self, client, optimizer: str, seed: int, **options) -> None:
        super().__init__()
        self.bag = rnn.EmbeddingBag(
            NUM, DIM, mode="sum", client=client, name=unique_name("opt"), seed=seed,
            optimizer=OPTIMIZERS[optimizer], **options,
        )  # fmt: skip

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.bag(ids)


def _train(model: Model, steps: range) -> None:
    for step in steps:
        generator = torch.Generator().manual_seed(step)
        ids = torch.randint(0, NUM, (8, 3), generator=generator)
        target = torch.randn(8, DIM, generator=generator)
        ((model(ids) - target) ** 2).sum().backward()
    model.bag.client.flush()


def _rows(model: Model) -> torch.Tensor:
    return model.bag.read_weights()


@pytest.fixture(params=list(OPTIMIZERS))
def optimizer(request) -> str:
    return request.param


def test_state_dict_leaves_optimizer_state_out_unless_asked(any_client, optimizer) -> None:
    model = Model(any_client, optimizer, 1)
    _train(model, range(K))
    assert list(model.state_dict()) == ["bag.weight"]
    with rnn.optimizer_state(model):
        state = model.state_dict()
    shapes = {key: list(value.shape) for key, value in state.items() if key != "bag.weight"}
    assert shapes == STATE_KEYS[optimizer]
    if optimizer == "adam":
        assert int(state["bag.optimizer.step"]) == K
    assert any(bool(v.abs().sum()) for k, v in state.items() if k.endswith(("sum", "exp_avg")))


def test_torch_save_round_trip_then_training_matches_an_uninterrupted_run(
    any_client, optimizer, tmp_path
) -> None:
    uninterrupted, restored = Model(any_client, optimizer, 1), Model(any_client, optimizer, 2)
    _train(uninterrupted, range(K))
    with rnn.optimizer_state(uninterrupted):
        torch.save(uninterrupted.state_dict(), tmp_path / "model.pt")
    with rnn.optimizer_state(restored):
        restored.load_state_dict(torch.load(tmp_path / "model.pt"))
    assert torch.equal(_rows(restored), _rows(uninterrupted))
    _train(uninterrupted, range(K, 2 * K))
    _train(restored, range(K, 2 * K))
    assert torch.equal(_rows(restored), _rows(uninterrupted))


def test_weights_alone_do_not_resume_training_exactly(any_client, tmp_path) -> None:
    """The control: the optimizer state is what makes the restored run match."""
    uninterrupted, restored = Model(any_client, "adagrad", 1), Model(any_client, "adagrad", 2)
    _train(uninterrupted, range(K))
    restored.load_state_dict(uninterrupted.state_dict())
    _train(uninterrupted, range(K, 2 * K))
    _train(restored, range(K, 2 * K))
    assert not torch.equal(_rows(restored), _rows(uninterrupted))


@pytest.fixture
def small_blocks(monkeypatch) -> None:
    import recstore.client.table_rows as table_rows

    monkeypatch.setattr(table_rows, "STATE_CHUNK_BYTES", 7 * DIM * 4)  # 30 rows: 5 blocks

    def refuse(self: TableRows) -> torch.Tensor:
        raise AssertionError(f"{self!r} materialised")

    monkeypatch.setattr(TableRows, "materialise", refuse)


def test_dcp_round_trip_in_row_blocks_then_training_matches(
    any_client, optimizer, tmp_path, small_blocks
) -> None:
    import torch.distributed.checkpoint as dcp

    uninterrupted, restored = Model(any_client, optimizer, 1), Model(any_client, optimizer, 2)
    _train(uninterrupted, range(K))
    checkpoint.save(uninterrupted, tmp_path, optimizer_state=True)
    stored = dcp.FileSystemReader(tmp_path).read_metadata().state_dict_metadata
    for key, shape in STATE_KEYS[optimizer].items():
        if shape:  # blocks of at most 7 rows x DIM floats
            per = 7 * DIM // shape[1]
            sizes = [min(per, NUM - start) for start in range(0, NUM, per)]
            assert [c.sizes[0] for c in stored[key].chunks] == sizes  # type: ignore[union-attr]
    checkpoint.load(restored, tmp_path, optimizer_state=True)
    _train(uninterrupted, range(K, 2 * K))
    _train(restored, range(K, 2 * K))
    assert torch.equal(_rows(restored), _rows(uninterrupted))


def test_a_checkpoint_without_optimizer_state_is_refused_when_it_is_asked_for(
    any_client, tmp_path
) -> None:
    source, target = Model(any_client, "adam", 1), Model(any_client, "adam", 2)
    before = _rows(target)
    with rnn.optimizer_state(target), pytest.raises(RuntimeError, match="Missing key"):
        target.load_state_dict(source.state_dict())
    assert torch.equal(_rows(target), _rows(source))  # torch's rule: present entries load
    checkpoint.save(source, tmp_path)
    with pytest.raises(CheckpointException):  # "Missing key ...: bag.optimizer.exp_avg"
        checkpoint.load(target, tmp_path, optimizer_state=True)
    assert before.shape == _rows(target).shape


def test_an_inference_model_drops_the_optimizer_state(any_client) -> None:
    trained = Model(any_client, "adagrad", 1)
    _train(trained, range(K))
    serving = Model(any_client, "adagrad", 2, optimize_for_training=False)
    with rnn.optimizer_state(trained):
        state = trained.state_dict()
    serving.load_state_dict(state)  # strict: the state's entries are dropped, not unexpected
    assert torch.equal(_rows(serving), _rows(trained))
    with rnn.optimizer_state(serving):
        assert list(serving.state_dict()) == ["bag.weight"]


def test_entries_of_another_optimizer_are_unexpected(any_client) -> None:
    adam, adagrad = Model(any_client, "adam", 1), Model(any_client, "adagrad", 2)
    with rnn.optimizer_state(adam):
        state = adam.state_dict()
    with pytest.raises(RuntimeError, match=r"Unexpected key.*exp_avg"):
        adagrad.load_state_dict(state)
